// safetensors.c — write and read a model's parameters as safetensors (format in
// safetensors.h): the tensors' names and shapes, the writer, a JSON reader for the subset a
// safetensors header uses (objects, strings, arrays of integers, integers), and the checks
// that turn any other file into one line of error.
#define _POSIX_C_SOURCE 200809L  // stat
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include "checkpoint.h"  // write_file_atomically, checkpoint_load
#include "safetensors.h"
#include "util.h"

#define FAIL(...) do { snprintf(err, err_len, __VA_ARGS__); return -1; } while (0)

// ---- names and shapes ------------------------------------------------------------------
// Each kind's name; %zu is the slice (layer i, depth attention l, or sub-layer l for hc.*)
static const char* const NAME_FORMAT[N_PARAM_TENSORS] = {
    [PARAM_wte] = "wte.weight",
    [PARAM_attn_norm] = "layers.%zu.attn_norm.weight",
    [PARAM_wq] = "layers.%zu.attn.wq.weight",
    [PARAM_wk] = "layers.%zu.attn.wk.weight",
    [PARAM_wv] = "layers.%zu.attn.wv.weight",
    [PARAM_wo] = "layers.%zu.attn.wo.weight",
    [PARAM_mlp_norm] = "layers.%zu.mlp_norm.weight",
    [PARAM_wg] = "layers.%zu.mlp.wg.weight",
    [PARAM_wu] = "layers.%zu.mlp.wu.weight",
    [PARAM_wd] = "layers.%zu.mlp.wd.weight",
    [PARAM_hc_norm] = "hc.%zu.norm.weight",
    [PARAM_hc_proj] = "hc.%zu.proj.weight",
    [PARAM_hc_bias] = "hc.%zu.bias",
    [PARAM_hc_scale] = "hc.%zu.scale",
    [PARAM_res_logits] = "res.%zu.logits",
    [PARAM_res_scalars] = "res.%zu.scalars",
    [PARAM_res_query] = "res.%zu.query",
    [PARAM_res_norm] = "res.%zu.norm.weight",
    [PARAM_res_qproj] = "res.%zu.qproj.weight",
    [PARAM_final_norm] = "final_norm.weight",
    [PARAM_lm_head] = "lm_head.weight",
};

// The shape of one slice of kind (one layer's wq, one depth attention's query); returns its rank
static int slice_shape(const ModelDims* d, int kind, size_t shape[2]) {
    size_t streams_width = d->streams * d->d;  // m*d: mHC-lite's streams side by side
    switch (kind) {
        case PARAM_wte: case PARAM_lm_head: shape[0] = d->V; shape[1] = d->d; return 2;
        case PARAM_wq: shape[0] = d->q_dim; shape[1] = d->d; return 2;
        case PARAM_wk: case PARAM_wv: shape[0] = d->kv_dim; shape[1] = d->d; return 2;
        case PARAM_wo: shape[0] = d->d; shape[1] = d->q_dim; return 2;
        case PARAM_wg: case PARAM_wu: shape[0] = d->F; shape[1] = d->d; return 2;
        case PARAM_wd: shape[0] = d->d; shape[1] = d->F; return 2;
        case PARAM_hc_proj: shape[0] = d->E; shape[1] = streams_width; return 2;
        case PARAM_res_qproj: shape[0] = d->d; shape[1] = d->d; return 2;
        case PARAM_hc_norm: shape[0] = streams_width; return 1;
        case PARAM_hc_bias: shape[0] = d->E; return 1;
        case PARAM_hc_scale: shape[0] = 3; return 1;
        case PARAM_res_logits: case PARAM_res_scalars: shape[0] = d->n_res; return 1;
        default: shape[0] = d->d; return 1;  // the gains, the pseudo-queries
    }
}

int safetensors_tensor(const ModelConfig* c, int kind, size_t slice, char* name, size_t name_len,
                       size_t shape[2], size_t* slices) {
    ModelDims dims = model_dims(c);
    size_t sizes[N_PARAM_TENSORS];
    param_sizes(c, sizes);
    int rank = slice_shape(&dims, kind, shape);
    size_t slice_floats = rank == 2 ? shape[0] * shape[1] : shape[0];
    *slices = sizes[kind] == 0 ? 0 : sizes[kind] / slice_floats;
    snprintf(name, name_len, NAME_FORMAT[kind], slice);
    return rank;
}

// ModelConfig's fields, in struct order, as __metadata__ names them
#define CONFIG_FIELD(field) {#field, offsetof(ModelConfig, field)}
static const struct { const char* name; size_t offset; } CONFIG_FIELDS[] = {
    CONFIG_FIELD(vocab_size), CONFIG_FIELD(d_model), CONFIG_FIELD(n_layers),
    CONFIG_FIELD(n_heads), CONFIG_FIELD(n_kv_heads), CONFIG_FIELD(ffn_hidden),
    CONFIG_FIELD(block_size), CONFIG_FIELD(depth_score), CONFIG_FIELD(key_norm_off),
    CONFIG_FIELD(depth_query), CONFIG_FIELD(depth_heads), CONFIG_FIELD(depth_window),
    CONFIG_FIELD(mixing), CONFIG_FIELD(streams),
};
#undef CONFIG_FIELD
enum { N_CONFIG_FIELDS = sizeof(CONFIG_FIELDS) / sizeof(CONFIG_FIELDS[0]) };
_Static_assert(sizeof(ModelConfig) == N_CONFIG_FIELDS * sizeof(int),
               "every ModelConfig field is written to __metadata__");

static int* config_field(ModelConfig* c, int i) {
    return (int*)((char*)c + CONFIG_FIELDS[i].offset);
}

// n bytes of a little-endian unsigned integer, whatever the host's byte order
static void store_le(unsigned char* out, uint64_t value, int n) {
    for (int i = 0; i < n; i++) { out[i] = (unsigned char)(value >> (8 * i)); }
}
static uint64_t load_le(const unsigned char* in, int n) {
    uint64_t value = 0;
    for (int i = 0; i < n; i++) { value |= (uint64_t)in[i] << (8 * i); }
    return value;
}

// ---- the writer ------------------------------------------------------------------------
// Text that grows as it is written to
typedef struct {
    char* text;
    size_t len, cap;
} Text;

static void text_add(Text* t, const char* format, ...) {
    for (;;) {
        va_list args;
        va_start(args, format);
        int n = vsnprintf(t->text ? t->text + t->len : NULL, t->text ? t->cap - t->len : 0,
                          format, args);
        va_end(args);
        if (t->text != NULL && t->len + (size_t)n < t->cap) {
            t->len += (size_t)n;
            return;
        }
        t->cap = 2 * (t->len + (size_t)n + 64);
        char* grown = mallocCheck(t->cap);
        if (t->text != NULL) { memcpy(grown, t->text, t->len); }
        free(t->text);
        t->text = grown;
    }
}

unsigned char* safetensors_encode(const ModelConfig* c, const float* params, size_t* len) {
    ModelConfig config = *c;
    Text json = {NULL, 0, 0};
    text_add(&json, "{\"__metadata__\":{\"format\":\"%s\",\"format_version\":\"%s\"",
             SAFETENSORS_FORMAT, SAFETENSORS_FORMAT_VERSION);
    for (int i = 0; i < N_CONFIG_FIELDS; i++) {
        text_add(&json, ",\"%s\":\"%d\"", CONFIG_FIELDS[i].name, *config_field(&config, i));
    }
    text_add(&json, "}");
    size_t offset = 0;  // bytes, from the start of the data
    for (int kind = 0; kind < N_PARAM_TENSORS; kind++) {
        size_t shape[2], slices = 1;
        char name[64];
        for (size_t slice = 0; slice < slices; slice++) {
            int rank = safetensors_tensor(c, kind, slice, name, sizeof(name), shape, &slices);
            if (slices == 0) { break; }
            size_t bytes = shape[0] * (rank == 2 ? shape[1] : 1) * sizeof(float);
            text_add(&json, ",\"%s\":{\"dtype\":\"F32\",\"shape\":[%zu", name, shape[0]);
            if (rank == 2) { text_add(&json, ",%zu", shape[1]); }
            text_add(&json, "],\"data_offsets\":[%zu,%zu]}", offset, offset + bytes);
            offset += bytes;
        }
    }
    text_add(&json, "}");
    while ((8 + json.len) % 8 != 0) { text_add(&json, " "); }
    size_t n_params = offset / sizeof(float);
    *len = 8 + json.len + offset;
    unsigned char* out = mallocCheck(*len);
    store_le(out, json.len, 8);
    memcpy(out + 8, json.text, json.len);
    unsigned char* data = out + 8 + json.len;
    for (size_t i = 0; i < n_params; i++) {  // float32 little-endian
        uint32_t bits;
        memcpy(&bits, &params[i], sizeof(bits));
        store_le(data + 4 * i, bits, 4);
    }
    free(json.text);
    return out;
}

int safetensors_save(const ModelConfig* c, const float* params, const char* path, char* err,
                     size_t err_len) {
    size_t len;
    unsigned char* bytes = safetensors_encode(c, params, &len);
    const void* parts[] = {bytes};
    int status = write_file_atomically(path, "safetensors file", parts, &len, 1, err, err_len);
    free(bytes);
    return status;
}

// ---- JSON, the subset a safetensors header uses ---------------------------------------
// The parser turns the header into tokens in document order: an object is followed by its
// members (a key's string token, then its value), an array by its integers. Anything else
// JSON allows (true, false, null, fractions, exponents, negative numbers, arrays of anything
// but integers) is refused, as is nesting deeper than a header's three levels (the header,
// a tensor, its shape).
typedef enum { JSON_OBJECT, JSON_ARRAY, JSON_STRING, JSON_INTEGER } JsonKind;
typedef struct {
    JsonKind kind;
    size_t count;        // object: members; array: integers
    size_t end;          // the token after this value and everything in it
    const char* string;  // string: decoded, NUL-terminated (inside the parser's text)
    uint64_t integer;
} JsonToken;

typedef struct {
    char* text;  // a copy of the header: strings are decoded in place
    size_t len, pos;
    JsonToken* tokens;
    size_t n_tokens, cap;
    char* err;
    size_t err_len;
} Json;

enum { JSON_MAX_DEPTH = 3 };

static int json_fail(Json* j, const char* what) {
    snprintf(j->err, j->err_len, "header is not JSON (or not the part of it safetensors uses): "
             "%s at header byte %zu", what, j->pos);
    return -1;
}

static size_t json_token(Json* j, JsonKind kind) {
    if (j->n_tokens == j->cap) {
        j->cap = j->cap ? 2 * j->cap : 64;
        JsonToken* grown = mallocCheck(j->cap * sizeof(JsonToken));
        if (j->tokens != NULL) { memcpy(grown, j->tokens, j->n_tokens * sizeof(JsonToken)); }
        free(j->tokens);
        j->tokens = grown;
    }
    j->tokens[j->n_tokens] = (JsonToken){kind, 0, 0, NULL, 0};
    return j->n_tokens++;
}

static void json_skip_space(Json* j) {
    while (j->pos < j->len && strchr(" \t\n\r", j->text[j->pos]) != NULL && j->text[j->pos]) {
        j->pos++;
    }
}

// The next character after spaces; '\0' at the end of the header
static char json_peek(Json* j) {
    json_skip_space(j);
    return j->pos < j->len ? j->text[j->pos] : '\0';
}

static int hex_digit(char c) {
    if (c >= '0' && c <= '9') { return c - '0'; }
    if (c >= 'a' && c <= 'f') { return c - 'a' + 10; }
    if (c >= 'A' && c <= 'F') { return c - 'A' + 10; }
    return -1;
}

// A string at j->pos (its opening quote), decoded in place: the decoded bytes are never more
// than the escaped ones, so they fit where the string stood, NUL-terminated before its end
static int json_string(Json* j) {
    size_t t = json_token(j, JSON_STRING);
    char* out = j->text + j->pos;
    j->tokens[t].string = out;
    j->tokens[t].end = t + 1;
    for (j->pos++;; j->pos++) {
        if (j->pos >= j->len) { return json_fail(j, "a string that does not end"); }
        unsigned char c = (unsigned char)j->text[j->pos];
        if (c == '"') { break; }
        if (c < 0x20) { return json_fail(j, "a control character in a string"); }
        if (c != '\\') { *out++ = (char)c; continue; }
        if (++j->pos >= j->len) { return json_fail(j, "a string that does not end"); }
        const char* simple = strchr("\"\\/bfnrt", j->text[j->pos]);
        if (simple != NULL && *simple != '\0') {
            *out++ = "\"\\/\b\f\n\r\t"[simple - "\"\\/bfnrt"];
            continue;
        }
        if (j->text[j->pos] != 'u') { return json_fail(j, "an unknown escape in a string"); }
        unsigned code = 0;
        for (int k = 1; k <= 4; k++) {
            int digit = j->pos + k < j->len ? hex_digit(j->text[j->pos + k]) : -1;
            if (digit < 0) { return json_fail(j, "a \\u escape without 4 hex digits"); }
            code = code * 16 + (unsigned)digit;
        }
        j->pos += 4;
        if (code == 0 || (code >= 0xd800 && code <= 0xdfff)) {
            return json_fail(j, "a \\u0000 or a \\u surrogate in a string (not taken)");
        }
        if (code < 0x80) {  // UTF-8: 1 to 3 bytes, fewer than the 6 of the escape
            *out++ = (char)code;
        } else if (code < 0x800) {
            *out++ = (char)(0xc0 | (code >> 6));
            *out++ = (char)(0x80 | (code & 0x3f));
        } else {
            *out++ = (char)(0xe0 | (code >> 12));
            *out++ = (char)(0x80 | ((code >> 6) & 0x3f));
            *out++ = (char)(0x80 | (code & 0x3f));
        }
    }
    *out = '\0';
    j->pos++;
    return 0;
}

// A non-negative integer in plain decimal (no sign, no leading zero, no fraction or exponent)
static int json_integer(Json* j) {
    size_t t = json_token(j, JSON_INTEGER);
    j->tokens[t].end = t + 1;
    if (j->text[j->pos] == '-') { return json_fail(j, "a negative number"); }
    size_t start = j->pos;
    uint64_t value = 0;
    while (j->pos < j->len && j->text[j->pos] >= '0' && j->text[j->pos] <= '9') {
        unsigned digit = (unsigned)(j->text[j->pos] - '0');
        if (value > (UINT64_MAX - digit) / 10) { return json_fail(j, "a number too large"); }
        value = value * 10 + digit;
        j->pos++;
    }
    if (j->pos - start > 1 && j->text[start] == '0') { return json_fail(j, "a number with a leading 0"); }
    if (j->pos < j->len && strchr(".eE", j->text[j->pos]) != NULL && j->text[j->pos]) {
        return json_fail(j, "a number that is not an integer");
    }
    j->tokens[t].integer = value;
    return 0;
}

static int json_value(Json* j, int depth);

// After an object's member or an array's item: ',' (returns 1: another follows) or `close`
// (returns 0: the end), stepped over; anything else is -1 with `problem`
static int json_after_item(Json* j, char close, const char* problem) {
    char next = json_peek(j);
    if (next != ',' && next != close) { return json_fail(j, problem); }
    j->pos++;
    return next == ',';
}

// An object at j->pos: '{', members "key": value separated by ',', '}'
static int json_object(Json* j, int depth) {
    size_t t = json_token(j, JSON_OBJECT);
    j->pos++;
    int more = json_peek(j) != '}';  // 0: empty
    if (!more) { j->pos++; }
    while (more == 1) {
        if (json_peek(j) != '"') { return json_fail(j, "an object key that is not a string"); }
        if (json_string(j) != 0) { return -1; }
        if (json_peek(j) != ':') { return json_fail(j, "no ':' after an object key"); }
        j->pos++;
        if (json_value(j, depth + 1) != 0) { return -1; }
        j->tokens[t].count++;
        more = json_after_item(j, '}', "no ',' or '}' after an object member");
    }
    if (more < 0) { return -1; }
    j->tokens[t].end = j->n_tokens;
    return 0;
}

// An array of integers at j->pos
static int json_array(Json* j) {
    size_t t = json_token(j, JSON_ARRAY);
    j->pos++;
    int more = json_peek(j) != ']';  // 0: empty
    if (!more) { j->pos++; }
    while (more == 1) {
        char c = json_peek(j);
        if (!(c >= '0' && c <= '9') && c != '-') {
            return json_fail(j, "an array item that is not an integer");
        }
        if (json_integer(j) != 0) { return -1; }
        j->tokens[t].count++;
        more = json_after_item(j, ']', "no ',' or ']' after an array item");
    }
    if (more < 0) { return -1; }
    j->tokens[t].end = j->n_tokens;
    return 0;
}

static int json_value(Json* j, int depth) {
    if (depth > JSON_MAX_DEPTH) { return json_fail(j, "nesting deeper than a safetensors header's"); }
    char c = json_peek(j);
    if (j->pos >= j->len) { return json_fail(j, "the end of the header where a value should be"); }
    if (c == '{') { return json_object(j, depth); }
    if (c == '[') { return json_array(j); }
    if (c == '"') { return json_string(j); }
    if ((c >= '0' && c <= '9') || c == '-') { return json_integer(j); }
    return json_fail(j, "a value other than an object, a string, an array of integers or an integer");
}

// Parses header[0 .. len) into j (its tokens; j->text to free with them): one object, then
// only spaces. 0, or -1 with one line in err.
static int json_parse(Json* j, const unsigned char* header, size_t len, char* err, size_t err_len) {
    *j = (Json){NULL, len, 0, NULL, 0, 0, err, err_len};
    j->text = mallocCheck(len + 1);
    memcpy(j->text, header, len);
    j->text[len] = '\0';
    if (json_peek(j) != '{') { return json_fail(j, "no '{' at the start"); }
    if (json_value(j, 1) != 0) { return -1; }
    json_skip_space(j);
    if (j->pos != j->len) { return json_fail(j, "something after the header's object"); }
    return 0;
}

static void json_free(Json* j) {
    free(j->text);
    free(j->tokens);
}

// The members of object token `object`: key token of member k is keys[k], its value keys[k]+1
static size_t* json_members(const Json* j, size_t object) {
    size_t n = j->tokens[object].count;
    size_t* keys = mallocCheck((n ? n : 1) * sizeof(size_t));
    size_t token = object + 1;
    for (size_t k = 0; k < n; k++) {
        keys[k] = token;
        token = j->tokens[token + 1].end;
    }
    return keys;
}

// ---- the reader ------------------------------------------------------------------------
// s for an error line: at most 64 printable ASCII characters, others as '?', so that a name
// from the file can neither break the line nor fill it
static const char* quoted(const char* s, char* out, size_t len) {
    size_t n = 0;
    for (; s[n] != '\0' && n + 4 < len && n < 64; n++) {
        unsigned char c = (unsigned char)s[n];
        out[n] = c >= 0x20 && c < 0x7f ? (char)c : '?';
    }
    snprintf(out + n, len - n, "%s", s[n] != '\0' ? "..." : "");
    return out;
}

// The value of string-valued key `key` in the metadata object (NULL: absent); -1 with one line
// in err if it is there twice or is not a string
static int metadata_value(const Json* j, const size_t* keys, size_t n, const char* key,
                          const char** value, char* err, size_t err_len) {
    *value = NULL;
    for (size_t k = 0; k < n; k++) {
        if (strcmp(j->tokens[keys[k]].string, key) != 0) { continue; }
        if (*value != NULL) { FAIL("__metadata__ holds '%s' twice", key); }
        if (j->tokens[keys[k] + 1].kind != JSON_STRING) { FAIL("__metadata__ '%s' is not a string", key); }
        *value = j->tokens[keys[k] + 1].string;
    }
    return 0;
}

// The config from the metadata object: format, version and every ModelConfig field
static int read_metadata(const Json* j, size_t object, ModelConfig* c, char* err, size_t err_len) {
    if (j->tokens[object].kind != JSON_OBJECT) { FAIL("__metadata__ is not an object"); }
    size_t n = j->tokens[object].count;
    size_t* keys = json_members(j, object);
    const char* value;
    char shown[80];
    int status = -1;
    if (metadata_value(j, keys, n, "format", &value, err, err_len) != 0) { goto done; }
    if (value == NULL) {
        snprintf(err, err_len, "no __metadata__ 'format' (a file attnres.c writes says '%s')",
                 SAFETENSORS_FORMAT);
        goto done;
    }
    if (strcmp(value, SAFETENSORS_FORMAT) != 0) {
        snprintf(err, err_len, "__metadata__ format '%s', not '%s'", quoted(value, shown, sizeof(shown)),
                 SAFETENSORS_FORMAT);
        goto done;
    }
    if (metadata_value(j, keys, n, "format_version", &value, err, err_len) != 0) { goto done; }
    if (value == NULL || strcmp(value, SAFETENSORS_FORMAT_VERSION) != 0) {
        snprintf(err, err_len, "__metadata__ format_version '%s': this build reads version %s",
                 value ? quoted(value, shown, sizeof(shown)) : "(none)", SAFETENSORS_FORMAT_VERSION);
        goto done;
    }
    for (int i = 0; i < N_CONFIG_FIELDS; i++) {
        const char* name = CONFIG_FIELDS[i].name;
        if (metadata_value(j, keys, n, name, &value, err, err_len) != 0) { goto done; }
        if (value == NULL) {
            snprintf(err, err_len, "no __metadata__ '%s' (the model's config)", name);
            goto done;
        }
        size_t digits = strspn(value, "0123456789");
        if (digits == 0 || digits > 9 || value[digits] != '\0') {
            snprintf(err, err_len, "__metadata__ '%s' is '%s', not a decimal integer", name,
                     quoted(value, shown, sizeof(shown)));
            goto done;
        }
        *config_field(c, i) = atoi(value);
    }
    // one head, and a window of all the sources (W >= 2L in full mode), stored as ./train
    // stores them (options.c)
    if (c->depth_heads == 1) { c->depth_heads = 0; }
    if (c->block_size == 1 && c->depth_window >= 2 * c->n_layers) { c->depth_window = 0; }
    char reason[256];
    if (model_config_check(c, reason, sizeof(reason)) != 0) {
        snprintf(err, err_len, "invalid config in __metadata__: %s", reason);
        goto done;
    }
    status = 0;
done:
    free(keys);
    return status;
}

// One tensor the config has: its name, shape, where it lies in the flat buffer, and where its
// bytes lie in the file's data (found: its entry has been read)
typedef struct {
    char name[64];
    size_t shape[2];
    int rank;
    size_t offset, floats;   // in the flat buffer
    uint64_t begin, end;     // data_offsets
    int found;
} Expected;

static Expected* expected_tensors(const ModelConfig* c, size_t* count) {
    size_t n = 0, capacity = 64;
    Expected* list = mallocCheck(capacity * sizeof(Expected));
    size_t offset = 0;
    for (int kind = 0; kind < N_PARAM_TENSORS; kind++) {
        size_t slices = 1;
        for (size_t slice = 0; slice < slices; slice++) {
            Expected e = {0};
            e.rank = safetensors_tensor(c, kind, slice, e.name, sizeof(e.name), e.shape, &slices);
            if (slices == 0) { break; }
            e.floats = e.shape[0] * (e.rank == 2 ? e.shape[1] : 1);
            e.offset = offset;
            offset += e.floats;
            if (n == capacity) {
                capacity *= 2;
                Expected* grown = mallocCheck(capacity * sizeof(Expected));
                memcpy(grown, list, n * sizeof(Expected));
                free(list);
                list = grown;
            }
            list[n++] = e;
        }
    }
    *count = n;
    return list;
}

static int by_name(const void* a, const void* b) {
    return strcmp((*(const Expected* const*)a)->name, (*(const Expected* const*)b)->name);
}
static int by_begin(const void* a, const void* b) {
    uint64_t x = (*(const Expected* const*)a)->begin, y = (*(const Expected* const*)b)->begin;
    return x < y ? -1 : x > y;
}

// "[a,b,...]" of an array token, for an error line
static const char* array_text(const Json* j, size_t array, char* out, size_t len) {
    size_t used = (size_t)snprintf(out, len, "[");
    for (size_t k = 0; k < j->tokens[array].count && used < len; k++) {
        if (k == 4) { used += (size_t)snprintf(out + used, len - used, ",..."); break; }
        used += (size_t)snprintf(out + used, len - used, "%s%llu", k ? "," : "",
                                 (unsigned long long)j->tokens[array + 1 + k].integer);
    }
    if (used < len) { snprintf(out + used, len - used, "]"); }
    return out;
}

// Tensor entry `value` (the object of e's name): dtype F32, e's shape, data_offsets that hold
// its bytes within data_len; its begin and end into e
static int read_tensor(const Json* j, size_t value, Expected* e, uint64_t data_len, char* err,
                       size_t err_len) {
    if (j->tokens[value].kind != JSON_OBJECT) { FAIL("tensor '%s' is not an object", e->name); }
    static const char* const fields[] = {"dtype", "shape", "data_offsets"};
    size_t found[3] = {0, 0, 0};  // each field's value token (0: absent)
    size_t token = value + 1;
    char shown[80], have[128];
    for (size_t k = 0; k < j->tokens[value].count; k++) {
        int field = -1;
        for (int f = 0; f < 3; f++) {
            if (strcmp(j->tokens[token].string, fields[f]) == 0) { field = f; }
        }
        if (field < 0) {
            FAIL("tensor '%s' has an unknown field '%s'", e->name,
                 quoted(j->tokens[token].string, shown, sizeof(shown)));
        }
        if (found[field] != 0) { FAIL("tensor '%s' has '%s' twice", e->name, fields[field]); }
        found[field] = token + 1;
        token = j->tokens[token + 1].end;
    }
    for (int f = 0; f < 3; f++) {
        if (found[f] == 0) { FAIL("tensor '%s' has no '%s'", e->name, fields[f]); }
    }
    const JsonToken* dtype = &j->tokens[found[0]];
    if (dtype->kind != JSON_STRING || strcmp(dtype->string, "F32") != 0) {
        FAIL("tensor '%s' has dtype %s, not F32", e->name,
             dtype->kind == JSON_STRING ? quoted(dtype->string, shown, sizeof(shown)) : "(not a string)");
    }
    const JsonToken* shape = &j->tokens[found[1]];
    int same = shape->kind == JSON_ARRAY && shape->count == (size_t)e->rank;
    for (int k = 0; same && k < e->rank; k++) { same = shape[1 + k].integer == e->shape[k]; }
    if (!same) {
        char want[64];
        snprintf(want, sizeof(want), e->rank == 2 ? "[%zu,%zu]" : "[%zu]", e->shape[0], e->shape[1]);
        FAIL("tensor '%s' has shape %s, this model's is %s", e->name,
             shape->kind == JSON_ARRAY ? array_text(j, found[1], have, sizeof(have)) : "(not an array)",
             want);
    }
    const JsonToken* offsets = &j->tokens[found[2]];
    if (offsets->kind != JSON_ARRAY || offsets->count != 2) {
        FAIL("tensor '%s' has data_offsets %s, not [begin,end]", e->name,
             offsets->kind == JSON_ARRAY ? array_text(j, found[2], have, sizeof(have)) : "(not an array)");
    }
    e->begin = offsets[1].integer;
    e->end = offsets[2].integer;
    unsigned long long begin = e->begin, end = e->end;
    if (end < begin) { FAIL("tensor '%s' has data_offsets [%llu,%llu]: the end before the begin", e->name, begin, end); }
    if (end - begin != (uint64_t)e->floats * sizeof(float)) {
        FAIL("tensor '%s' has data_offsets [%llu,%llu]: %llu bytes, its shape takes %zu", e->name,
             begin, end, end - begin, e->floats * sizeof(float));
    }
    if (end > data_len) {
        FAIL("tensor '%s' has data_offsets [%llu,%llu], past the end of the data (%llu bytes)",
             e->name, begin, end, (unsigned long long)data_len);
    }
    return 0;
}

// The tensors' data, sorted by where they begin, must tile [0, data_len) exactly
static int check_tiling(Expected* list, size_t n, uint64_t data_len, char* err, size_t err_len) {
    Expected** order = mallocCheck(n * sizeof(Expected*));
    for (size_t i = 0; i < n; i++) { order[i] = &list[i]; }
    qsort(order, n, sizeof(Expected*), by_begin);
    uint64_t covered = 0;
    int status = 0;
    for (size_t i = 0; i < n && status == 0; i++) {
        if (order[i]->begin < covered) {
            snprintf(err, err_len, "tensors '%s' and '%s' overlap in the data", order[i - 1]->name,
                     order[i]->name);
            status = -1;
        } else if (order[i]->begin > covered) {
            snprintf(err, err_len, "a gap of %llu unused bytes in the data before tensor '%s'",
                     (unsigned long long)(order[i]->begin - covered), order[i]->name);
            status = -1;
        }
        covered = order[i]->end;
    }
    if (status == 0 && covered != data_len) {
        snprintf(err, err_len, "%llu unused bytes in the data after the last tensor's",
                 (unsigned long long)(data_len - covered));
        status = -1;
    }
    free(order);
    return status;
}

// Reads the tensors of the top-level object into params (the config's tensors, each once)
static int read_tensors(const Json* j, const ModelConfig* c, const unsigned char* data,
                        uint64_t data_len, float* params, char* err, size_t err_len) {
    size_t n;
    Expected* list = expected_tensors(c, &n);
    Expected** sorted = mallocCheck(n * sizeof(Expected*));
    for (size_t i = 0; i < n; i++) { sorted[i] = &list[i]; }
    qsort(sorted, n, sizeof(Expected*), by_name);
    size_t* keys = json_members(j, 0);
    char shown[80];
    int status = 0;
    for (size_t k = 0; k < j->tokens[0].count && status == 0; k++) {
        const char* name = j->tokens[keys[k]].string;
        if (strcmp(name, "__metadata__") == 0) { continue; }
        Expected key, *probe = &key, **hit = NULL;
        if (strlen(name) < sizeof(key.name)) {
            strcpy(key.name, name);
            hit = bsearch(&probe, sorted, n, sizeof(Expected*), by_name);
        }
        if (hit == NULL) {
            snprintf(err, err_len, "extra tensor '%s': a model of this config has none of that name",
                     quoted(name, shown, sizeof(shown)));
            status = -1;
        } else if ((*hit)->found) {
            snprintf(err, err_len, "tensor '%s' is there twice", name);
            status = -1;
        } else {
            (*hit)->found = 1;
            status = read_tensor(j, keys[k] + 1, *hit, data_len, err, err_len);
        }
    }
    for (size_t i = 0; i < n && status == 0; i++) {
        if (!list[i].found) {
            snprintf(err, err_len, "missing tensor '%s' (a model of this config has %zu tensors)",
                     list[i].name, n);
            status = -1;
        }
    }
    if (status == 0) { status = check_tiling(list, n, data_len, err, err_len); }
    for (size_t i = 0; i < n && status == 0; i++) {  // float32 little-endian
        const unsigned char* bytes = data + list[i].begin;
        float* out = params + list[i].offset;
        for (size_t f = 0; f < list[i].floats; f++) {
            uint32_t bits = (uint32_t)load_le(bytes + 4 * f, 4);
            memcpy(&out[f], &bits, sizeof(float));
            if (!isfinite(out[f])) {
                snprintf(err, err_len, "tensor '%s' holds NaN or Inf (element %zu)", list[i].name, f);
                status = -1;
                break;
            }
        }
    }
    free(keys);
    free(sorted);
    free(list);
    return status;
}

// The header length that a file of len bytes (at least 8) starts with: 0 when it fits, or -1
// with the reason in err.
static int check_header_length(unsigned long long header_len, size_t len, char* err,
                               size_t err_len) {
    if (header_len > SAFETENSORS_MAX_HEADER) {
        FAIL("header length %llu, over the limit of %llu bytes", header_len, SAFETENSORS_MAX_HEADER);
    }
    if (header_len > len - 8) {
        FAIL("header length %llu, past the end of the file (%zu bytes)", header_len, len);
    }
    return 0;
}

int safetensors_decode(const unsigned char* bytes, size_t len, ModelConfig* config,
                       float** params, char* err, size_t err_len) {
    *params = NULL;
    if (len < 8) { FAIL("%zu bytes, too short for the 8-byte header length", len); }
    unsigned long long header_len = load_le(bytes, 8);
    if (check_header_length(header_len, len, err, err_len) != 0) { return -1; }
    Json j;
    int status = json_parse(&j, bytes + 8, (size_t)header_len, err, err_len);
    if (status != 0) {
        json_free(&j);
        return -1;
    }
    size_t* keys = json_members(&j, 0);
    size_t metadata = 0;
    for (size_t k = 0; k < j.tokens[0].count && status == 0; k++) {
        if (strcmp(j.tokens[keys[k]].string, "__metadata__") != 0) { continue; }
        if (metadata != 0) {
            snprintf(err, err_len, "__metadata__ is there twice");
            status = -1;
        }
        metadata = keys[k] + 1;
    }
    free(keys);
    if (status == 0 && metadata == 0) {
        snprintf(err, err_len, "no __metadata__ (a file attnres.c writes holds its config there)");
        status = -1;
    }
    memset(config, 0, sizeof(*config));
    if (status == 0) { status = read_metadata(&j, metadata, config, err, err_len); }
    if (status == 0) {
        size_t sizes[N_PARAM_TENSORS];
        size_t n_params = param_sizes(config, sizes);
        uint64_t data_len = len - 8 - header_len;
        // the tensors must fill the data, checked below; a file too short for them is refused
        // before the parameters are allocated
        if (data_len < (uint64_t)n_params * sizeof(float)) {
            snprintf(err, err_len, "data of %llu bytes, too short for the %zu parameters of its "
                     "config (%zu bytes)", (unsigned long long)data_len, n_params, n_params * sizeof(float));
            status = -1;
        } else {
            *params = mallocCheck(n_params * sizeof(float));
            status = read_tensors(&j, config, bytes + 8 + header_len, data_len, *params, err,
                                  err_len);
        }
    }
    json_free(&j);
    if (status != 0) {
        free(*params);
        *params = NULL;
    }
    return status;
}

int safetensors_load(const char* path, ModelConfig* config, float** params, char* err,
                     size_t err_len) {
    *params = NULL;
    struct stat info;
    if (stat(path, &info) != 0) { FAIL("cannot open %s: %s", path, strerror(errno)); }
    if (S_ISDIR(info.st_mode)) { FAIL("%s is a directory, not a safetensors file", path); }
    if (!S_ISREG(info.st_mode)) { FAIL("%s is not a regular file (a device, pipe or socket)", path); }
    FILE* f = fopen(path, "rb");
    if (f == NULL) { FAIL("cannot open %s: %s", path, strerror(errno)); }
    size_t len = (size_t)info.st_size;
    char reason[ERROR_MAX];
    // the header length first: a large file that is no safetensors file (a text, a model of
    // another format, a file that --export would replace) is refused without being read
    unsigned char first[8];
    if (len >= 8 && fread(first, 1, 8, f) == 8 &&
        check_header_length(load_le(first, 8), len, reason, sizeof(reason)) != 0) {
        fclose(f);
        FAIL("safetensors file %s: %s", path, reason);
    }
    rewind(f);
    unsigned char* bytes = mallocCheck(len);
    int ok = fread(bytes, 1, len, f) == len;
    fclose(f);
    int status = ok ? safetensors_decode(bytes, len, config, params, reason, sizeof(reason)) : -1;
    free(bytes);
    if (!ok) { FAIL("cannot read %s: %s", path, strerror(errno)); }
    if (status != 0) { FAIL("safetensors file %s: %s", path, reason); }
    return 0;
}

int safetensors_export_checkpoint(const char* checkpoint, const char* out, int* step,
                                  size_t* tensors, char* err, size_t err_len) {
    ModelConfig c;
    if (checkpoint_read_config(checkpoint, &c, step, err, err_len) != 0) { return -1; }
    Model m;
    model_build(&m, &c, 1, 1);
    int status = checkpoint_load(&m, checkpoint, step, err, err_len);
    if (status == 0) { status = safetensors_save(&c, m.params_memory, out, err, err_len); }
    free(expected_tensors(&c, tensors));
    model_free(&m);
    return status;
}
