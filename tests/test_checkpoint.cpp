// test_checkpoint.cpp — checkpoints of src/checkpoint.h: a bit-exact round trip, atomic
// replacement, and a one-line reason for every kind of bad file.
#include <doctest/doctest.h>
#include "temp_dir.h"

#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "checkpoint.h"
#include "gradcheck.h"
#include "model.h"

namespace {

namespace fs = std::filesystem;
typedef std::vector<char> Bytes;

Bytes read_bytes(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    return Bytes(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

void write_bytes(const std::string& path, const Bytes& bytes) {
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out.write(bytes.data(), (std::streamsize)bytes.size());
    REQUIRE(out.good());
}

int header_int(const Bytes& file, size_t index) {
    int value;
    std::memcpy(&value, file.data() + index * sizeof(int), sizeof(int));
    return value;
}

void set_header_int(Bytes& file, size_t index, int value) {
    std::memcpy(file.data() + index * sizeof(int), &value, sizeof(int));
}

// A built model with random parameters and AdamW moments, freed on scope exit.
struct RandomModel {
    Model m;
    RandomModel(const ModelConfig& c, uint64_t seed) {
        model_build(&m, &c, 1, 1);
        gradcheck::Rng rng(seed);
        for (size_t i = 0; i < m.num_params; i++) {
            m.params_memory[i] = rng.uniform(-2.0f, 2.0f);
            m.m_memory[i] = rng.uniform(-1e-3f, 1e-3f);
            m.v_memory[i] = rng.uniform(0.0f, 1e-6f);
        }
        // values a lossy or text format would get wrong
        m.params_memory[0] = -0.0f;
        m.params_memory[1] = 1e-40f;  // subnormal
        m.m_memory[0] = 3.4e38f;
    }
    ~RandomModel() { model_free(&m); }
};

bool same_bits(const float* a, const float* b, size_t n) { return std::memcmp(a, b, n * sizeof(float)) == 0; }

bool contains(const std::string& text, const std::string& word) { return text.find(word) != std::string::npos; }

const ModelConfig CONFIG = {7, 8, 2, 2, 1, 12, 2};  // V d L H G F S

// the run record of a text run, every field set
RunRecord text_run() {
    RunRecord run{};
    run.task = 3;
    run.length = 12; run.symbols = 16; run.seq_len = 64; run.batch = 32; run.steps = 1000;
    run.warmup = 100; run.eval_examples = 500; run.seed = 0x123456789abcdefull;
    run.microbatches = 4;
    run.lr = 3e-3f; run.final_lr_frac = 0.1f; run.weight_decay = 0.1f; run.grad_clip = 1.0f;
    run.beta1 = 0.9f; run.beta2 = 0.95f; run.adam_eps = 1e-8f;
    std::snprintf(run.text_name, sizeof run.text_name, "%s", "shakespeare.txt");
    run.text_bytes = 5000000000ull;
    run.best_step = 800; run.best_val_loss = 1.25f;
    return run;
}

}  // namespace

TEST_CASE("save then load restores parameters, AdamW moments and step bit for bit") {
    TempDir dir;
    for (int S : {0, 1, 2, 4}) {
        ModelConfig c = CONFIG;
        c.block_size = S;
        INFO("S=", S);
        std::string path = dir.file("round_trip.ckpt");
        RandomModel saved(c, 100 + (uint64_t)S);
        char err[512] = "";
        REQUIRE_MESSAGE(checkpoint_save(&saved.m, nullptr, path.c_str(), 123, err, sizeof err) == 0, err);
        CHECK(fs::file_size(path) == 256 * sizeof(int) + 3 * saved.m.num_params * sizeof(float));

        ModelConfig header_config;
        int step = -1;
        REQUIRE_MESSAGE(checkpoint_read_config(path.c_str(), &header_config, &step, err, sizeof err) == 0, err);
        CHECK(std::memcmp(&header_config, &c, sizeof c) == 0);
        CHECK(step == 123);

        RandomModel loaded(c, 999);  // different contents, overwritten by the load
        step = -1;
        REQUIRE_MESSAGE(checkpoint_load(&loaded.m, path.c_str(), &step, err, sizeof err) == 0, err);
        CHECK(step == 123);
        size_t n_params = saved.m.num_params;
        CHECK(same_bits(loaded.m.params_memory, saved.m.params_memory, n_params));
        CHECK(same_bits(loaded.m.m_memory, saved.m.m_memory, n_params));
        CHECK(same_bits(loaded.m.v_memory, saved.m.v_memory, n_params));
    }
}

// the names in dir, sorted
std::vector<std::string> file_names(const TempDir& dir) {
    std::vector<std::string> names;
    for (const auto& entry : fs::directory_iterator(dir.path)) names.push_back(entry.path().filename());
    std::sort(names.begin(), names.end());
    return names;
}

// what checkpoint_save writes before its rename, in this process
std::string temp_path_of(const std::string& path) {
    char tmp[4096];
    REQUIRE(checkpoint_temp_path(tmp, sizeof tmp, path.c_str()) == 0);
    return tmp;
}

TEST_CASE("a save replaces the checkpoint by rename and leaves no temporary file behind") {
    TempDir dir;
    std::string path = dir.file("model.ckpt");
    CHECK(temp_path_of(path) == path + ".tmp." + std::to_string(getpid()));
    RandomModel first(CONFIG, 1), second(CONFIG, 2);
    char err[512] = "";
    REQUIRE_MESSAGE(checkpoint_save(&first.m, nullptr, path.c_str(), 10, err, sizeof err) == 0, err);
    CHECK_FALSE(fs::exists(temp_path_of(path)));
    REQUIRE_MESSAGE(checkpoint_save(&second.m, nullptr, path.c_str(), 20, err, sizeof err) == 0, err);
    CHECK_FALSE(fs::exists(temp_path_of(path)));
    RandomModel loaded(CONFIG, 3);
    int step = -1;
    REQUIRE_MESSAGE(checkpoint_load(&loaded.m, path.c_str(), &step, err, sizeof err) == 0, err);
    CHECK(step == 20);
    CHECK(same_bits(loaded.m.params_memory, second.m.params_memory, second.m.num_params));
    CHECK(file_names(dir) == std::vector<std::string>{"model.ckpt"});
}

// Two runs started with the same --checkpoint (twice the same command, say) save into one
// PATH. Each writes its own temporary file, so PATH is always one of the two checkpoints,
// whole; with one shared PATH.tmp each run truncated and overwrote the file the other was
// writing, and a rename could publish the mixture (the right size: it loaded).
TEST_CASE("two runs saving to one PATH at once: PATH is always one of their checkpoints, whole") {
    TempDir dir;
    std::string path = dir.file("model.ckpt");
    const ModelConfig c = {7, 32, 2, 2, 1, 64, 2};  // 360 KB a file: writes that overlap
    RandomModel a(c, 11), b(c, 12);
    const int saves = 100;
    pid_t other = fork();
    REQUIRE(other >= 0);
    if (other == 0) {  // the other run: saves a (step 1) as fast as it can
        char other_err[512];
        int failed = 0;
        for (int i = 0; i < saves; i++)
            failed |= checkpoint_save(&a.m, nullptr, path.c_str(), 1, other_err, sizeof other_err) != 0;
        _exit(failed);
    }
    char err[512] = "";
    int failed_saves = 0, bad_files = 0;
    RandomModel loaded(c, 13);
    for (int i = 0; i < saves; i++) {  // this run saves b (step 2), then reads PATH back
        failed_saves += checkpoint_save(&b.m, nullptr, path.c_str(), 2, err, sizeof err) != 0;
        int step = -1;
        if (checkpoint_load(&loaded.m, path.c_str(), &step, err, sizeof err) != 0) {
            bad_files++;
            continue;
        }
        const Model& saved = step == 1 ? a.m : b.m;
        size_t n_params = saved.num_params;
        bad_files += !(same_bits(loaded.m.params_memory, saved.params_memory, n_params) &&
                       same_bits(loaded.m.m_memory, saved.m_memory, n_params) &&
                       same_bits(loaded.m.v_memory, saved.v_memory, n_params));
    }
    int status = 0;
    REQUIRE(waitpid(other, &status, 0) == other);
    INFO("last error: ", err);
    CHECK(failed_saves == 0);
    CHECK(WIFEXITED(status));
    CHECK(WEXITSTATUS(status) == 0);  // none of the other run's saves failed either
    CHECK(bad_files == 0);
    CHECK(file_names(dir) == std::vector<std::string>{"model.ckpt"});  // no temporary file left
}

// The rename would replace whatever PATH is: as root, --checkpoint /dev/null would have
// replaced the machine's /dev/null by a checkpoint. A pipe stands in for a device here.
TEST_CASE("a save never replaces what is not a regular file: a pipe at PATH is refused, kept") {
    TempDir dir;
    std::string path = dir.file("pipe");
    REQUIRE(mkfifo(path.c_str(), 0600) == 0);
    RandomModel model(CONFIG, 4);
    char err[512] = "";
    CHECK(checkpoint_save(&model.m, nullptr, path.c_str(), 1, err, sizeof err) == -1);
    CHECK(std::string(err) == "cannot write checkpoint " + path + ": it exists and is not a regular file");
    CHECK(fs::is_fifo(path));
    CHECK(file_names(dir) == std::vector<std::string>{"pipe"});  // and no temporary file
}

TEST_CASE("a save into a missing directory fails with a reason and creates nothing") {
    TempDir dir;
    std::string path = dir.file("missing/model.ckpt");
    RandomModel model(CONFIG, 4);
    char err[512] = "";
    CHECK(checkpoint_save(&model.m, nullptr, path.c_str(), 1, err, sizeof err) == -1);
    INFO("err: ", err);
    CHECK(contains(err, "missing/model.ckpt"));
    CHECK(contains(err, "No such file or directory"));
    CHECK(std::strchr(err, '\n') == nullptr);
    CHECK(fs::is_empty(dir.path));
}

TEST_CASE("a failing save leaves the existing checkpoint untouched") {
    TempDir dir;
    std::string path = dir.file("model.ckpt");
    RandomModel old_model(CONFIG, 5), new_model(CONFIG, 6);
    char err[512] = "";
    REQUIRE_MESSAGE(checkpoint_save(&old_model.m, nullptr, path.c_str(), 7, err, sizeof err) == 0, err);
    Bytes before = read_bytes(path);

    SUBCASE("the temporary file cannot be created") {
        fs::create_directory(temp_path_of(path));  // fopen(.., "wb") fails on a directory
        CHECK(checkpoint_save(&new_model.m, nullptr, path.c_str(), 8, err, sizeof err) == -1);
        INFO("err: ", err);
        CHECK(contains(err, "cannot write checkpoint"));
        CHECK(read_bytes(path) == before);
    }
    SUBCASE("the temporary file cannot be renamed over PATH: it is not left behind") {
        std::string dir_path = dir.file("a_directory.ckpt");
        fs::create_directory(dir_path);
        fs::create_directory(dir_path + "/inside");  // a non-empty directory cannot be replaced
        CHECK(checkpoint_save(&new_model.m, nullptr, dir_path.c_str(), 8, err, sizeof err) == -1);
        INFO("err: ", err);
        CHECK(contains(err, "a_directory.ckpt"));
        CHECK_FALSE(fs::exists(temp_path_of(dir_path)));
        CHECK(fs::is_directory(dir_path + "/inside"));
        CHECK(read_bytes(path) == before);
    }
}

TEST_CASE("bad checkpoint files are rejected with a one-line reason naming the problem") {
    TempDir dir;
    std::string good_path = dir.file("good.ckpt");
    RandomModel source(CONFIG, 7);
    char err[512] = "";
    REQUIRE_MESSAGE(checkpoint_save(&source.m, nullptr, good_path.c_str(), 42, err, sizeof err) == 0, err);
    const Bytes good = read_bytes(good_path);
    REQUIRE(header_int(good, 0) == CHECKPOINT_MAGIC);
    REQUIRE(header_int(good, 1) == CHECKPOINT_VERSION);

    struct Case {
        const char* name;
        Bytes bytes;
        std::vector<std::string> words;  // the reason must contain each
    };
    std::vector<Case> cases;
    Bytes b = good;
    set_header_int(b, 0, 12345);
    cases.push_back({"wrong_magic", b, {"magic"}});
    b = good;
    set_header_int(b, 1, CHECKPOINT_VERSION + 1);
    cases.push_back({"wrong_version", b, {"version " + std::to_string(CHECKPOINT_VERSION + 1),
                                          "versions 1 to " + std::to_string(CHECKPOINT_VERSION)}});
    cases.push_back({"truncated_data", Bytes(good.begin(), good.end() - 4),
                     {"truncated", std::to_string(good.size() - 4), std::to_string(good.size())}});
    cases.push_back({"truncated_header", Bytes(good.begin(), good.begin() + 100), {"truncated", "header"}});
    cases.push_back({"empty", Bytes(), {"truncated"}});
    b = good;
    b.insert(b.end(), {0, 0, 0, 0});
    cases.push_back({"too_long", b, {"too long", std::to_string(good.size() + 4), std::to_string(good.size())}});
    b = good;
    set_header_int(b, 5, 3);  // H = 3 does not divide d = 8
    cases.push_back({"invalid_config", b, {"invalid config", "H=3"}});
    b = good;
    set_header_int(b, 8, 3);  // S = 3 does not divide 2L = 4
    cases.push_back({"invalid_block_size", b, {"invalid config", "S=3"}});
    b = good;
    set_header_int(b, 10, header_int(good, 10) + 1);
    cases.push_back({"wrong_parameter_count", b, {"parameter count"}});
    b = good;
    set_header_int(b, 9, -1);
    cases.push_back({"negative_step", b, {"step"}});
    b = good;  // the first parameter (wte) made NaN: checkpoint_load refuses it
    const float nan_value = std::numeric_limits<float>::quiet_NaN();
    std::memcpy(b.data() + 256 * sizeof(int), &nan_value, sizeof(float));
    cases.push_back({"nan_parameter", b, {"NaN", "parameters", "wte"}});
    // the moments too (the file holds n_params parameters, then m, then v): the last float of m
    // (lm_head's) NaN, the first of v (wte's) Inf
    const size_t n_params = source.m.num_params;
    b = good;
    std::memcpy(b.data() + 256 * sizeof(int) + (2 * n_params - 1) * sizeof(float), &nan_value, sizeof(float));
    cases.push_back({"nan_first_moment", b, {"NaN/Inf first moments", "lm_head"}});
    b = good;
    const float inf_value = std::numeric_limits<float>::infinity();
    std::memcpy(b.data() + 256 * sizeof(int) + 2 * n_params * sizeof(float), &inf_value, sizeof(float));
    cases.push_back({"inf_second_moment", b, {"NaN/Inf second moments", "wte"}});

    for (const Case& k : cases) {
        std::string path = dir.file(std::string(k.name) + ".ckpt");
        write_bytes(path, k.bytes);
        const std::string name = k.name;  // only the load refuses a value that is not finite
        bool header_ok = name == "nan_parameter" || name == "nan_first_moment" || name == "inf_second_moment";
        for (int load = header_ok ? 1 : 0; load <= 1; load++) {
            RandomModel target(CONFIG, 8), untouched(CONFIG, 8);
            ModelConfig config;
            int step = -1;
            err[0] = '\0';
            int status = load ? checkpoint_load(&target.m, path.c_str(), &step, err, sizeof err)
                              : checkpoint_read_config(path.c_str(), &config, &step, err, sizeof err);
            INFO(k.name, (load ? ", checkpoint_load" : ", checkpoint_read_config"), ": '", err, "'");
            CHECK(status == -1);
            CHECK(std::strchr(err, '\n') == nullptr);
            CHECK(contains(err, path));
            for (const std::string& word : k.words) CHECK(contains(err, word));
            CHECK(step == -1);
            CHECK(same_bits(target.m.params_memory, untouched.m.params_memory, target.m.num_params));
        }
    }

    RandomModel target(CONFIG, 9);
    int step = -1;
    std::string missing = dir.file("missing.ckpt");
    CHECK(checkpoint_load(&target.m, missing.c_str(), &step, err, sizeof err) == -1);
    CHECK(contains(err, missing));
    CHECK(contains(err, "No such file or directory"));
    CHECK(checkpoint_load(&target.m, dir.path.c_str(), &step, err, sizeof err) == -1);
    CHECK(contains(err, "is a directory"));
}

TEST_CASE("the run record survives a round trip, and version 1 files still load without one") {
    TempDir dir;
    std::string path = dir.file("run.ckpt");
    RandomModel model(CONFIG, 11);
    RunRecord run = text_run();
    char err[512] = "";
    REQUIRE_MESSAGE(checkpoint_save(&model.m, &run, path.c_str(), 900, err, sizeof err) == 0, err);
    RunRecord back{};
    int recorded = 0;
    REQUIRE_MESSAGE(checkpoint_read_run(path.c_str(), &back, &recorded, err, sizeof err) == 0, err);
    CHECK(recorded == 1);
    CHECK(std::memcmp(&back, &run, sizeof run) == 0);

    // the same file as version 1 (no run record): loads, and says it has no record
    Bytes bytes = read_bytes(path);
    set_header_int(bytes, 1, 1);
    std::string old = dir.file("v1.ckpt");
    write_bytes(old, bytes);
    REQUIRE_MESSAGE(checkpoint_read_run(old.c_str(), &back, &recorded, err, sizeof err) == 0, err);
    CHECK(recorded == 0);
    RandomModel loaded(CONFIG, 12);
    int step = -1;
    REQUIRE_MESSAGE(checkpoint_load(&loaded.m, old.c_str(), &step, err, sizeof err) == 0, err);
    CHECK(step == 900);
    CHECK(same_bits(loaded.m.params_memory, model.m.params_memory, model.m.num_params));
}

TEST_CASE("a run record no run could write is refused naming the field") {
    TempDir dir;
    std::string path = dir.file("run.ckpt");
    RandomModel model(CONFIG, 13);
    RunRecord run = text_run();
    char err[512] = "";
    REQUIRE_MESSAGE(checkpoint_save(&model.m, &run, path.c_str(), 10, err, sizeof err) == 0, err);
    const Bytes good = read_bytes(path);
    struct Case { const char* name; size_t slot; int value; std::string word; };
    // slots: [12] the record's flag, [13] task, [14..20] length .. eval_examples, [64..] name
    const Case cases[] = {{"task past the last", 13, 4, "task 4"},
                          {"negative task", 13, -1, "task -1"},
                          {"negative length", 14, -12, "length -12"},
                          {"negative batch", 17, -3, "batch -3"},
                          {"negative eval examples", 20, -500, "eval_examples -500"},
                          {"a flag neither 0 nor 1", 12, 2, "flag is 2"},
                          {"a newline in the text file's name", 64, 0x0a0a4141, "control character"}};
    for (const Case& k : cases) {
        Bytes b = good;
        set_header_int(b, k.slot, k.value);
        std::string bad = dir.file("bad.ckpt");
        write_bytes(bad, b);
        RunRecord back{};
        int recorded = -1;
        err[0] = '\0';
        INFO(k.name, ": '", err, "'");
        CHECK(checkpoint_read_run(bad.c_str(), &back, &recorded, err, sizeof err) == -1);
        CHECK(std::strchr(err, '\n') == nullptr);
        CHECK(contains(err, bad));
        CHECK(contains(err, "corrupt run record"));
        CHECK(contains(err, k.word));
    }
    // the first task and the last (text, the file's) are ones a run can write
    for (int task : {0, 3}) {
        Bytes b = good;
        set_header_int(b, 13, task);
        write_bytes(path, b);
        RunRecord back{};
        int recorded = 0;
        CHECK_MESSAGE(checkpoint_read_run(path.c_str(), &back, &recorded, err, sizeof err) == 0, err);
        CHECK(back.task == task);
    }
}

TEST_CASE("loading a checkpoint into a model of another config fails naming both configs") {
    TempDir dir;
    std::string path = dir.file("model.ckpt");
    RandomModel source(CONFIG, 10);
    char err[512] = "";
    REQUIRE_MESSAGE(checkpoint_save(&source.m, nullptr, path.c_str(), 3, err, sizeof err) == 0, err);
    ModelConfig other = CONFIG;
    SUBCASE("another block size, same number of parameters") { other.block_size = 4; }
    SUBCASE("another width") { other.d_model = 16; }
    SUBCASE("no AttnRes") { other.block_size = 0; }
    RandomModel target(other, 11), untouched(other, 11);
    int step = -1;
    CHECK(checkpoint_load(&target.m, path.c_str(), &step, err, sizeof err) == -1);
    INFO("err: ", err);
    CHECK(contains(err, path));
    CHECK(contains(err, "V=7 d=8 L=2 H=2 G=1 F=12 S=2"));
    char asked[128];
    std::snprintf(asked, sizeof asked, "V=%d d=%d L=%d H=%d G=%d F=%d S=%d", other.vocab_size,
                  other.d_model, other.n_layers, other.n_heads, other.n_kv_heads, other.ffn_hidden,
                  other.block_size);
    CHECK(contains(err, asked));
    CHECK(std::strchr(err, '\n') == nullptr);
    CHECK(step == -1);
    CHECK(same_bits(target.m.params_memory, untouched.m.params_memory, target.m.num_params));
}
