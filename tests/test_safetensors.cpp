// test_safetensors.cpp — safetensors files of src/safetensors.h: the exact header of a small
// model, names and shapes that tile the flat buffer in every mode and variant, a bit-exact
// round trip, one line for every kind of bad file, and a fuzz of truncations and byte flips
// that must end in an error line or a valid load, never a crash (make test also runs this
// file under AddressSanitizer: build/asan/test_safetensors).
#include <doctest/doctest.h>
#include "temp_dir.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "gradcheck.h"
#include "model.h"
#include "safetensors.h"
#include "util.h"  // ERROR_MAX

namespace {

typedef std::vector<unsigned char> Bytes;

// V d L H G F S, then depth_score, key_norm_off, depth_query, depth_heads, depth_window,
// mixing, streams: every mode, each variant switch, both mixings, mHC-lite's m = 2, 3, 4
struct NamedConfig {
    const char* name;
    ModelConfig config;
};
const NamedConfig CONFIGS[] = {
    {"none", {7, 8, 2, 2, 1, 12, 0}},
    {"full", {7, 8, 2, 2, 1, 12, 1}},
    {"block S=2", {7, 8, 2, 2, 1, 12, 2}},
    {"full sigmoid", {7, 8, 2, 2, 1, 12, 1, 1}},
    {"block key norm off", {7, 8, 2, 2, 1, 12, 2, 0, 1}},
    {"full input query", {7, 8, 2, 2, 1, 12, 1, 0, 0, 1}},
    {"block 2 heads", {7, 8, 2, 2, 1, 12, 2, 0, 0, 0, 2}},
    {"full window 2", {7, 8, 2, 2, 1, 12, 1, 0, 0, 0, 0, 2}},
    {"full static mixing", {7, 8, 2, 2, 1, 12, 1, 0, 0, 0, 0, 0, 1}},
    {"block dense mixing", {7, 8, 2, 2, 1, 12, 2, 0, 0, 0, 0, 0, 2}},
    {"mhc m=2", {7, 8, 2, 2, 1, 12, 0, 0, 0, 0, 0, 0, 0, 2}},
    {"mhc m=3", {7, 8, 2, 2, 1, 12, 0, 0, 0, 0, 0, 0, 0, 3}},
    {"mhc m=4", {7, 8, 2, 2, 1, 12, 0, 0, 0, 0, 0, 0, 0, 4}},
};

std::vector<float> random_params(const ModelConfig& c, uint64_t seed) {
    size_t sizes[N_PARAM_TENSORS];
    size_t n_params = param_sizes(&c, sizes);
    gradcheck::Rng rng(seed);
    std::vector<float> params = rng.uniform_vector(n_params, -2.0f, 2.0f);
    params[0] = -0.0f;   // values a lossy or text format would get wrong
    params[1] = 1e-40f;  // subnormal
    params[2] = 3.4e38f;
    return params;
}

Bytes encode(const ModelConfig& c, const std::vector<float>& params) {
    size_t len = 0;
    unsigned char* bytes = safetensors_encode(&c, params.data(), &len);
    Bytes out(bytes, bytes + len);
    std::free(bytes);
    return out;
}

struct Decoded {
    int status;
    ModelConfig config;
    std::vector<float> params;
    std::string err;
};

Decoded decode(const Bytes& file) {
    Decoded d{};
    float* params = nullptr;
    char err[ERROR_MAX] = "";
    d.status = safetensors_decode(file.data(), file.size(), &d.config, &params, err, sizeof err);
    if (params != nullptr) {
        size_t sizes[N_PARAM_TENSORS];
        d.params.assign(params, params + param_sizes(&d.config, sizes));
        std::free(params);
    }
    d.err = err;
    return d;
}

uint64_t header_length(const Bytes& file) {
    uint64_t n = 0;
    for (int i = 0; i < 8; i++) n |= (uint64_t)file[i] << (8 * i);
    return n;
}

// The file's JSON (padding taken off) and its data
std::string json_of(const Bytes& file) {
    std::string json(file.begin() + 8, file.begin() + 8 + (long)header_length(file));
    return json.substr(0, json.find_last_not_of(' ') + 1);
}
Bytes data_of(const Bytes& file) { return Bytes(file.begin() + 8 + (long)header_length(file), file.end()); }

// A file from a JSON header (padded as the writer pads it) and data
Bytes assemble(const std::string& json, const Bytes& data) {
    std::string header = json;
    while ((8 + header.size()) % 8 != 0) header += ' ';
    Bytes file(8);
    for (int i = 0; i < 8; i++) file[i] = (unsigned char)((uint64_t)header.size() >> (8 * i));
    file.insert(file.end(), header.begin(), header.end());
    file.insert(file.end(), data.begin(), data.end());
    return file;
}

std::string replaced(std::string text, const std::string& from, const std::string& to) {
    size_t at = text.find(from);
    REQUIRE_MESSAGE(at != std::string::npos, "'" << from << "' is not in the header");
    return text.replace(at, from.size(), to);
}

// The text of tensor `name`'s entry, ",\"name\":{...}"
std::string entry_of(const std::string& json, const std::string& name) {
    size_t at = json.find(",\"" + name + "\":{");
    REQUIRE(at != std::string::npos);
    return json.substr(at, json.find('}', at) + 1 - at);
}

bool contains(const std::string& text, const std::string& word) { return text.find(word) != std::string::npos; }

// A refused file: status -1, no parameters, one line containing every word
void check_refused(const Decoded& d, const std::vector<std::string>& words) {
    INFO("error: ", d.err);
    CHECK(d.status == -1);
    CHECK(d.params.empty());
    CHECK(!d.err.empty());
    CHECK(d.err.find('\n') == std::string::npos);
    for (const std::string& word : words) CHECK_MESSAGE(contains(d.err, word), "missing '" << word << "'");
}

const ModelConfig SMALL = {7, 16, 1, 2, 1, 32, 2};  // the model of the refusals below

// A header with `from` replaced by `to`, and the words its refusal must contain
struct Edit {
    std::string from, to;
    std::vector<std::string> words;
};

}  // namespace

TEST_CASE("safetensors: the header of a small full-mode model is exactly the documented JSON, padded to 8 bytes") {
    // V = 5, d = 4, L = 1, H = 2, G = 1 (hs = 2: wq is [4,4], wk and wv [2,4]), F = 8, S = 1
    const ModelConfig c = {5, 4, 1, 2, 1, 8, 1};
    std::vector<float> params = random_params(c, 1);
    REQUIRE(params.size() == 220);
    const std::string expected =
        "{\"__metadata__\":{\"format\":\"attnres.c\",\"format_version\":\"1\",\"vocab_size\":\"5\","
        "\"d_model\":\"4\",\"n_layers\":\"1\",\"n_heads\":\"2\",\"n_kv_heads\":\"1\",\"ffn_hidden\":\"8\","
        "\"block_size\":\"1\",\"depth_score\":\"0\",\"key_norm_off\":\"0\",\"depth_query\":\"0\","
        "\"depth_heads\":\"0\",\"depth_window\":\"0\",\"mixing\":\"0\",\"streams\":\"0\"},"
        "\"wte.weight\":{\"dtype\":\"F32\",\"shape\":[5,4],\"data_offsets\":[0,80]},"
        "\"layers.0.attn_norm.weight\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[80,96]},"
        "\"layers.0.attn.wq.weight\":{\"dtype\":\"F32\",\"shape\":[4,4],\"data_offsets\":[96,160]},"
        "\"layers.0.attn.wk.weight\":{\"dtype\":\"F32\",\"shape\":[2,4],\"data_offsets\":[160,192]},"
        "\"layers.0.attn.wv.weight\":{\"dtype\":\"F32\",\"shape\":[2,4],\"data_offsets\":[192,224]},"
        "\"layers.0.attn.wo.weight\":{\"dtype\":\"F32\",\"shape\":[4,4],\"data_offsets\":[224,288]},"
        "\"layers.0.mlp_norm.weight\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[288,304]},"
        "\"layers.0.mlp.wg.weight\":{\"dtype\":\"F32\",\"shape\":[8,4],\"data_offsets\":[304,432]},"
        "\"layers.0.mlp.wu.weight\":{\"dtype\":\"F32\",\"shape\":[8,4],\"data_offsets\":[432,560]},"
        "\"layers.0.mlp.wd.weight\":{\"dtype\":\"F32\",\"shape\":[4,8],\"data_offsets\":[560,688]},"
        "\"res.0.query\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[688,704]},"
        "\"res.1.query\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[704,720]},"
        "\"res.2.query\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[720,736]},"
        "\"res.0.norm.weight\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[736,752]},"
        "\"res.1.norm.weight\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[752,768]},"
        "\"res.2.norm.weight\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[768,784]},"
        "\"final_norm.weight\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[784,800]},"
        "\"lm_head.weight\":{\"dtype\":\"F32\",\"shape\":[5,4],\"data_offsets\":[800,880]}}";
    Bytes file = encode(c, params);
    uint64_t n = header_length(file);
    CHECK((8 + n) % 8 == 0);
    CHECK(n - expected.size() < 8);
    CHECK(json_of(file) == expected);
    CHECK(std::string(file.begin() + 8 + (long)expected.size(), file.begin() + 8 + (long)n) ==
          std::string(n - expected.size(), ' '));
    // the data is the flat parameter buffer, float32 little-endian, byte for byte
    REQUIRE(file.size() == 8 + n + 880);
    CHECK(std::memcmp(file.data() + 8 + n, params.data(), 880) == 0);
}

TEST_CASE("safetensors: mHC-lite and the variants' tensors are named as SPEC names them, rows ascending") {
    struct Named { const char* name; size_t rows, shape0, shape1; };
    char name[64];
    size_t shape[2], rows = 0;
    // mhc m=3, L=2: E = 2m + m! = 12 values a row, 2L = 4 rows of each hc tensor
    const ModelConfig mhc = {7, 8, 2, 2, 1, 12, 0, 0, 0, 0, 0, 0, 0, 3};
    CHECK(safetensors_tensor(&mhc, PARAM_hc_proj, 3, name, sizeof name, shape, &rows) == 2);
    CHECK(std::string(name) == "hc.3.proj.weight");
    CHECK((rows == 4 && shape[0] == 12 && shape[1] == 24));
    CHECK(safetensors_tensor(&mhc, PARAM_hc_norm, 0, name, sizeof name, shape, &rows) == 1);
    CHECK((std::string(name) == "hc.0.norm.weight" && shape[0] == 24));
    CHECK(safetensors_tensor(&mhc, PARAM_hc_bias, 1, name, sizeof name, shape, &rows) == 1);
    CHECK((std::string(name) == "hc.1.bias" && shape[0] == 12));
    CHECK(safetensors_tensor(&mhc, PARAM_hc_scale, 2, name, sizeof name, shape, &rows) == 1);
    CHECK((std::string(name) == "hc.2.scale" && shape[0] == 3));
    safetensors_tensor(&mhc, PARAM_res_query, 0, name, sizeof name, shape, &rows);
    CHECK(rows == 0);  // no depth attention in mhc
    // static mixing: res.{l}.logits [2L+1] for l = 0 .. 2L; the input query: res.{l}.qproj.weight
    const ModelConfig mixing = {7, 8, 2, 2, 1, 12, 1, 0, 0, 0, 0, 0, 1};
    safetensors_tensor(&mixing, PARAM_res_logits, 4, name, sizeof name, shape, &rows);
    CHECK((std::string(name) == "res.4.logits" && rows == 5 && shape[0] == 5));
    safetensors_tensor(&mixing, PARAM_res_query, 0, name, sizeof name, shape, &rows);
    CHECK(rows == 0);
    const ModelConfig dense = {7, 8, 2, 2, 1, 12, 2, 0, 0, 0, 0, 0, 2};
    safetensors_tensor(&dense, PARAM_res_scalars, 2, name, sizeof name, shape, &rows);
    CHECK((std::string(name) == "res.2.scalars" && rows == 5 && shape[0] == 5));
    const ModelConfig input = {7, 8, 2, 2, 1, 12, 1, 0, 0, 1};
    CHECK(safetensors_tensor(&input, PARAM_res_qproj, 1, name, sizeof name, shape, &rows) == 2);
    CHECK((std::string(name) == "res.1.qproj.weight" && rows == 5 && shape[0] == 8 && shape[1] == 8));
    const ModelConfig key_norm_off = {7, 8, 2, 2, 1, 12, 2, 0, 1};
    safetensors_tensor(&key_norm_off, PARAM_res_norm, 0, name, sizeof name, shape, &rows);
    CHECK(rows == 0);
}

TEST_CASE("safetensors: in every mode and variant the tensors' rows times their shapes are the flat buffer's sizes") {
    for (const NamedConfig& k : CONFIGS) {
        INFO(k.name);
        char err[256];
        REQUIRE_MESSAGE(model_config_check(&k.config, err, sizeof err) == 0, err);
        size_t sizes[N_PARAM_TENSORS];
        param_sizes(&k.config, sizes);
        for (int kind = 0; kind < N_PARAM_TENSORS; kind++) {
            char name[64];
            size_t shape[2], rows;
            int rank = safetensors_tensor(&k.config, kind, 0, name, sizeof name, shape, &rows);
            INFO("tensor ", PARAM_INFO[kind].name, " (", name, ")");
            CHECK(rows * shape[0] * (rank == 2 ? shape[1] : 1) == sizes[kind]);
        }
    }
}

TEST_CASE("safetensors: encode then decode gives the config and every parameter bit for bit, and encodes to the same bytes") {
    for (const NamedConfig& k : CONFIGS) {
        INFO(k.name);
        std::vector<float> params = random_params(k.config, 7);
        Bytes file = encode(k.config, params);
        Decoded d = decode(file);
        REQUIRE_MESSAGE(d.status == 0, d.err);
        CHECK(std::memcmp(&d.config, &k.config, sizeof(ModelConfig)) == 0);
        REQUIRE(d.params.size() == params.size());
        CHECK(std::memcmp(d.params.data(), params.data(), params.size() * sizeof(float)) == 0);
        CHECK(encode(d.config, d.params) == file);
    }
}

TEST_CASE("safetensors: a reader takes what another writer may write: tensors and metadata keys in any order, spaces, escapes, unknown metadata") {
    std::vector<float> params = random_params(SMALL, 3);
    Bytes file = encode(SMALL, params);
    std::string json = json_of(file);
    // the last tensor moved first, its data still at the end; whitespace between tokens; an
    // unknown metadata key with escapes; format_version before format
    std::string last = entry_of(json, "lm_head.weight");
    std::string moved = replaced(json, last, "");
    moved = replaced(moved, "\"wte.weight\"", last.substr(1) + " ,\n\t\"wte.weight\"");
    moved = replaced(moved, "\"format\":\"attnres.c\",\"format_version\":\"1\"",
                     "\"format_version\" : \"1\", \"note\":\"caf\\u00e9 \\\"\\u20ac\\\" a\\/b\\n\",\"format\":\"attnres.c\"");
    Decoded d = decode(assemble(moved, data_of(file)));
    REQUIRE_MESSAGE(d.status == 0, d.err);
    CHECK(std::memcmp(d.params.data(), params.data(), params.size() * sizeof(float)) == 0);
    // a depth_heads of 1 and a full-mode window of all sources read as the writer stores them
    const ModelConfig full = {7, 16, 1, 2, 1, 32, 1};
    std::vector<float> full_params = random_params(full, 4);
    Bytes full_file = encode(full, full_params);
    std::string normalised = replaced(json_of(full_file), "\"depth_heads\":\"0\"", "\"depth_heads\":\"1\"");
    normalised = replaced(normalised, "\"depth_window\":\"0\"", "\"depth_window\":\"2\"");
    Decoded n = decode(assemble(normalised, data_of(full_file)));
    REQUIRE_MESSAGE(n.status == 0, n.err);
    CHECK(std::memcmp(&n.config, &full, sizeof full) == 0);
}

TEST_CASE("safetensors: every kind of bad file is refused in one line naming the problem") {
    std::vector<float> params = random_params(SMALL, 5);
    const Bytes good = encode(SMALL, params);
    const std::string json = json_of(good);
    const Bytes data = data_of(good);
    REQUIRE(decode(good).status == 0);
    auto with_json = [&](const std::string& j) { return decode(assemble(j, data)); };
    auto with_header_length = [&](uint64_t n) {
        Bytes file = good;
        for (int i = 0; i < 8; i++) file[i] = (unsigned char)(n >> (8 * i));
        return decode(file);
    };
    // the header's length
    check_refused(decode(Bytes(good.begin(), good.begin() + 5)), {"5 bytes", "too short"});
    check_refused(with_header_length(100000001), {"header length 100000001", "limit of 100000000"});
    check_refused(with_header_length(0xffffffffffffffffull), {"header length", "limit"});
    check_refused(with_header_length(good.size() - 7), {"header length", "past the end of the file"});
    // not JSON, or JSON this reader does not take
    check_refused(with_json("hello"), {"not JSON", "'{'"});
    check_refused(with_json(json.substr(0, json.size() / 2)), {"not JSON"});
    check_refused(with_json(json + "}"), {"not JSON", "after"});
    check_refused(with_json("[1,2]"), {"not JSON", "'{'"});
    for (const Edit& edit : std::vector<Edit>{
        {"\"shape\":[7,16]", "\"shape\":[7.0,16]", {"not JSON", "integer"}},
        {"\"shape\":[7,16]", "\"shape\":[-7,16]", {"not JSON", "negative"}},
        {"\"shape\":[7,16]", "\"shape\":[07,16]", {"not JSON", "leading 0"}},
        {"\"shape\":[7,16]", "\"shape\":[7,99999999999999999999]", {"not JSON", "too large"}},
        {"\"shape\":[7,16]", "\"shape\":[7,[16]]", {"not JSON", "not an integer"}},
        {"\"dtype\":\"F32\"", "\"dtype\":true", {"not JSON", "a value other than"}},
        {"\"format\":\"attnres.c\"", "\"format\":\"attnres.c\",\"x\":{\"y\":{}}", {"not JSON", "nesting"}},
        {"\"format\":\"attnres.c\"", "\"format\":\"attnres.c\",\"x\":\"\\q\"", {"not JSON", "escape"}},
        {"\"format\":\"attnres.c\"", "\"format\":\"attnres.c\",\"x\":\"\\u00\"", {"not JSON", "4 hex digits"}},
        {"\"format\":\"attnres.c\"", "\"format\":\"attnres.c\",\"x\":\"\\u0000\"", {"not JSON", "\\u0000"}},
        {"\"format\":\"attnres.c\"", "\"format\":\"attnres.c\",\"x\":\"a\nb\"", {"not JSON", "control character"}},
        {"\"dtype\":\"F32\"", "\"dtype\" \"F32\"", {"not JSON", "':'"}},
        // the metadata
        {"\"__metadata__\"", "\"__metadata_\"", {"no __metadata__"}},
        {"{\"__metadata__\"", "{\"__metadata__\":\"x\",\"__metadata__\"", {"__metadata__", "twice"}},
        {"\"format\":\"attnres.c\"", "\"format\":\"pt\"", {"format 'pt'", "attnres.c"}},
        {"\"format\":\"attnres.c\",", "", {"no __metadata__ 'format'"}},
        {"\"format_version\":\"1\"", "\"format_version\":\"2\"", {"format_version '2'", "version 1"}},
        {"\"d_model\":\"16\"", "\"d_modell\":\"16\"", {"no __metadata__ 'd_model'"}},
        {"\"d_model\":\"16\"", "\"d_model\":\"16x\"", {"'d_model'", "'16x'", "not a decimal integer"}},
        {"\"d_model\":\"16\"", "\"d_model\":\"-16\"", {"'d_model'", "not a decimal"}},
        {"\"d_model\":\"16\"", "\"d_model\":16", {"'d_model'", "not a string"}},
        {"\"d_model\":\"16\"", "\"d_model\":\"16\",\"d_model\":\"16\"", {"'d_model'", "twice"}},
        {"\"n_heads\":\"2\"", "\"n_heads\":\"3\"", {"invalid config", "H=3"}},
        {"\"streams\":\"0\"", "\"streams\":\"9\"", {"invalid config", "--streams"}},
        {"\"__metadata__\":{", "\"__metadata__\":[1],\"x\":{", {"__metadata__", "not an object"}},
    }) {
        INFO("the header with ", edit.from, " replaced by ", edit.to);
        check_refused(with_json(replaced(json, edit.from, edit.to)), edit.words);
    }
    // the tensors: missing, extra, twice, wrong dtype or shape
    std::string lm_head = entry_of(json, "lm_head.weight");
    check_refused(with_json(replaced(json, lm_head, "")), {"missing tensor 'lm_head.weight'"});
    check_refused(with_json(replaced(json, lm_head, lm_head + ",\"extra.weight\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}")),
                  {"extra tensor 'extra.weight'"});
    check_refused(with_json(replaced(json, lm_head, lm_head + lm_head)), {"tensor 'lm_head.weight'", "twice"});
    check_refused(with_json(replaced(json, "\"dtype\":\"F32\"", "\"dtype\":\"F16\"")), {"'wte.weight'", "dtype F16", "F32"});
    check_refused(with_json(replaced(json, "\"shape\":[7,16]", "\"shape\":[16,7]")), {"'wte.weight'", "shape [16,7]", "[7,16]"});
    check_refused(with_json(replaced(json, "\"shape\":[7,16]", "\"shape\":[112]")), {"'wte.weight'", "shape [112]", "[7,16]"});
    check_refused(with_json(replaced(json, "\"shape\":[7,16]", "\"shape\":\"7x16\"")), {"'wte.weight'", "not an array"});
    check_refused(with_json(replaced(json, "\"shape\":[7,16],", "")), {"'wte.weight'", "no 'shape'"});
    check_refused(with_json(replaced(json, "\"shape\":[7,16]", "\"shape\":[7,16],\"shape\":[7,16]")), {"'wte.weight'", "'shape' twice"});
    check_refused(with_json(replaced(json, "\"shape\":[7,16]", "\"shape\":[7,16],\"bias\":[0]")), {"'wte.weight'", "unknown field 'bias'"});
    check_refused(with_json(replaced(json, "\"wte.weight\":{\"dtype\"", "\"wte.weight\":\"x\",\"y\":{\"dtype\"")), {"'wte.weight'", "not an object"});
    check_refused(with_json(replaced(json, "\"wte.weight\"", "\"wte.we\\u0001ight\"")), {"extra tensor 'wte.we?ight'"});
    // the offsets: the wrong span, reversed, overlapping, leaving a gap, past the end
    check_refused(with_json(replaced(json, "\"data_offsets\":[0,448]", "\"data_offsets\":[0,444]")),
                  {"'wte.weight'", "[0,444]", "444 bytes", "448"});
    check_refused(with_json(replaced(json, "\"data_offsets\":[0,448]", "\"data_offsets\":[448,0]")),
                  {"'wte.weight'", "end before the begin"});
    check_refused(with_json(replaced(json, "\"data_offsets\":[0,448]", "\"data_offsets\":[0,448,0]")),
                  {"'wte.weight'", "not [begin,end]"});
    std::string mlp_norm = entry_of(json, "layers.0.mlp_norm.weight");
    std::string attn_norm_offsets = "\"data_offsets\":[448,512]";
    REQUIRE(contains(entry_of(json, "layers.0.attn_norm.weight"), attn_norm_offsets));
    std::string overlapping = mlp_norm.substr(0, mlp_norm.find("\"data_offsets\"")) + attn_norm_offsets + "}";
    check_refused(with_json(replaced(json, mlp_norm, overlapping)), {"overlap", "layers.0.attn_norm.weight"});
    size_t P4 = params.size() * sizeof(float);
    std::string lm_offsets = "\"data_offsets\":[" + std::to_string(P4 - 448) + "," + std::to_string(P4) + "]";
    std::string shifted = "\"data_offsets\":[" + std::to_string(P4 - 444) + "," + std::to_string(P4 + 4) + "]";
    Bytes longer = data;
    longer.insert(longer.end(), 4, 0);
    check_refused(decode(assemble(replaced(json, lm_offsets, shifted), longer)),
                  {"gap of 4 unused bytes", "'lm_head.weight'"});
    check_refused(decode(assemble(json, longer)), {"4 unused bytes", "after the last"});
    Bytes with_spare = data;
    with_spare.insert(with_spare.end(), 8, 0);
    check_refused(decode(assemble(replaced(json, lm_offsets, "\"data_offsets\":[" + std::to_string(P4 + 4) + "," +
                                                             std::to_string(P4 + 452) + "]"), with_spare)),
                  {"'lm_head.weight'", "past the end of the data"});
    check_refused(decode(assemble(json, Bytes(data.begin(), data.end() - 4))), {"too short", "parameters"});
    // the values
    for (float bad : {NAN, INFINITY, -INFINITY}) {
        Bytes nan = data;
        std::memcpy(nan.data() + 448 + 4 * 3, &bad, sizeof bad);  // layers.0.attn_norm.weight[3]
        check_refused(decode(assemble(json, nan)), {"'layers.0.attn_norm.weight'", "NaN or Inf", "element 3"});
    }
}

TEST_CASE("safetensors fuzz: every truncation and seeded byte flips of a real file give an error line or a valid load, never a crash") {
    // a model with two layers, a variant and its extra tensors; the file is a few KB
    const ModelConfig c = {7, 8, 2, 2, 1, 12, 1, 0, 0, 1};
    std::vector<float> params = random_params(c, 11);
    const Bytes good = encode(c, params);
    const size_t header_end = 8 + header_length(good);
    auto outcome_ok = [](const Decoded& d) {
        if (d.status != 0) return d.status == -1 && !d.err.empty() && d.err.find('\n') == std::string::npos && d.params.empty();
        char err[256];
        if (model_config_check(&d.config, err, sizeof err) != 0) return false;
        for (float x : d.params) if (!std::isfinite(x)) return false;
        return true;
    };
    // a truncated file is never a valid one: its data is short
    size_t truncations = 0;
    for (size_t len = 0; len < good.size(); len++) {
        Decoded d = decode(Bytes(good.begin(), good.begin() + (long)len));
        INFO("truncated to ", len, " of ", good.size(), " bytes: ", d.err);
        REQUIRE(d.status == -1);
        REQUIRE(outcome_ok(d));
        truncations++;
    }
    CHECK(truncations == good.size());
    // flips: half of them in the header, where they change the JSON, half anywhere
    gradcheck::Rng rng(2024);
    int refused = 0, loaded = 0;
    for (int trial = 0; trial < 20000; trial++) {
        Bytes file = good;
        int flips = trial < 10000 ? 1 : 2 + (int)(rng.next() % 7);
        for (int f = 0; f < flips; f++) {
            size_t at = rng.next() % (trial % 2 == 0 ? header_end : file.size());
            unsigned char byte = (unsigned char)(rng.next() & 0xff);
            file[at] = trial % 3 == 0 ? byte : (unsigned char)(file[at] ^ (1u << (rng.next() % 8)));
        }
        Decoded d = decode(file);
        INFO("trial ", trial, ": ", d.err);
        REQUIRE(outcome_ok(d));
        (d.status == 0 ? loaded : refused)++;
    }
    CHECK(refused > 10000);  // most flips in the header break it
    CHECK(loaded > 1000);    // a flip in the data is a valid file with other weights
}

TEST_CASE("safetensors_save writes the file whole through a temporary name; a directory, a pipe or a missing file is refused") {
    TempDir dir;
    std::vector<float> params = random_params(SMALL, 9);
    std::string path = dir.file("model.safetensors");
    char err[ERROR_MAX] = "";
    REQUIRE_MESSAGE(safetensors_save(&SMALL, params.data(), path.c_str(), err, sizeof err) == 0, err);
    std::ifstream in(path, std::ios::binary);
    Bytes written((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    CHECK(written == encode(SMALL, params));
    CHECK(std::distance(std::filesystem::directory_iterator(dir.path), std::filesystem::directory_iterator()) == 1);
    ModelConfig config;
    float* loaded = nullptr;
    REQUIRE_MESSAGE(safetensors_load(path.c_str(), &config, &loaded, err, sizeof err) == 0, err);
    CHECK(std::memcmp(loaded, params.data(), params.size() * sizeof(float)) == 0);
    std::free(loaded);
    // refusals: one line naming the path
    CHECK(safetensors_save(&SMALL, params.data(), dir.path.c_str(), err, sizeof err) == -1);
    CHECK(contains(err, "not a regular file"));
    std::string pipe = dir.file("pipe");
    REQUIRE(mkfifo(pipe.c_str(), 0600) == 0);
    CHECK(safetensors_save(&SMALL, params.data(), pipe.c_str(), err, sizeof err) == -1);
    CHECK(contains(err, "not a regular file"));
    CHECK(safetensors_load(pipe.c_str(), &config, &loaded, err, sizeof err) == -1);
    CHECK((contains(err, pipe) && contains(err, "not a regular file")));
    CHECK(safetensors_load(dir.path.c_str(), &config, &loaded, err, sizeof err) == -1);
    CHECK(contains(err, "is a directory"));
    std::string missing = dir.file("missing.safetensors");
    CHECK(safetensors_load(missing.c_str(), &config, &loaded, err, sizeof err) == -1);
    CHECK((contains(err, missing) && contains(err, "No such file")));
    std::ofstream(dir.file("bad.safetensors")) << "not a safetensors file";
    CHECK(safetensors_load(dir.file("bad.safetensors").c_str(), &config, &loaded, err, sizeof err) == -1);
    CHECK((contains(err, "safetensors file " + dir.file("bad.safetensors")) && contains(err, "header length")));
    CHECK(loaded == nullptr);
}
