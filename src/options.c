// options.c — reading, printing and checking the flags of train.c's flag table (options.h).
#include <ctype.h>
#include <errno.h>
#include <float.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "layers.h"   // MHC_MAX_STREAMS
#include "options.h"
#include "trainer.h"  // trainer_on_gpu

#define FAIL(...) do { snprintf(err, err_len, __VA_ARGS__); return -1; } while (0)

// Each FloatRange's bounds, and whether each bound is left out of it
static const struct {
    double min, max;
    int min_open, max_open;
} FLOAT_RANGES[] = {
    [FLOAT_ANY] = {-FLT_MAX, FLT_MAX, 0, 0},
    [FLOAT_NON_NEGATIVE] = {0.0, FLT_MAX, 0, 0},
    [FLOAT_POSITIVE] = {0.0, FLT_MAX, 1, 0},
    [FLOAT_FRACTION] = {0.0, 1.0, 0, 1},
    [FLOAT_UNIT] = {0.0, 1.0, 0, 0},
    [FLOAT_OPEN_FRACTION] = {0.0, 1.0, 1, 1},
};

// the range as an interval, "[0, 1)", for an error line
static const char* float_range_text(FloatRange range, char* out, size_t len) {
    snprintf(out, len, "%c%g, %g%c", FLOAT_RANGES[range].min_open ? '(' : '[',
             FLOAT_RANGES[range].min, FLOAT_RANGES[range].max,
             FLOAT_RANGES[range].max_open ? ')' : ']');
    return out;
}

static int in_float_range(double x, FloatRange range) {
    double min = FLOAT_RANGES[range].min, max = FLOAT_RANGES[range].max;
    int above_min = FLOAT_RANGES[range].min_open ? x > min : x >= min;
    int below_max = FLOAT_RANGES[range].max_open ? x < max : x <= max;
    return above_min && below_max;
}

int options_parse_value(const Flag* f, const char* s, char* err, size_t err_len) {
    char* end = NULL;
    errno = 0;
    if (f->kind == OPT_INT) {
        long v = strtol(s, &end, 10);
        if (!(isdigit((unsigned char)s[0]) || (s[0] == '-' && isdigit((unsigned char)s[1]))) ||
            *end != '\0') {
            FAIL("flag '%s' expects an integer, got '%s'", f->flag, s);
        }
        if (errno == ERANGE || v < INT_MIN || v > INT_MAX) {
            FAIL("flag '%s' is out of range: %s is not an integer in [%d, %d]", f->flag, s,
                 INT_MIN, INT_MAX);
        }
        *(int*)f->value = (int)v;
    } else if (f->kind == OPT_U64) {
        unsigned long long v = strtoull(s, &end, 10);
        if (!isdigit((unsigned char)s[0]) || *end != '\0') {
            FAIL("flag '%s' expects a non-negative integer, got '%s'", f->flag, s);
        }
        if (errno == ERANGE) {
            FAIL("flag '%s' is out of range: %s is not an integer in [0, %llu]", f->flag, s,
                 ULLONG_MAX);
        }
        *(unsigned long long*)f->value = v;
    } else if (f->kind == OPT_FLOAT) {
        float v = strtof(s, &end);
        if (s[0] == '\0' || strspn(s, "0123456789+-.eE") != strlen(s) || *end != '\0') {
            FAIL("flag '%s' expects a number, got '%s'", f->flag, s);
        }
        // the number as written (to double precision), and the float32 it becomes: a value
        // too large for a float32 becomes inf, a tiny one 0, and 0.99999999999 is 1
        double written = strtod(s, NULL);
        char range[64];
        if (!in_float_range(written, f->range)) {
            FAIL("flag '%s' is out of range: %s is not in %s", f->flag, s,
                 float_range_text(f->range, range, sizeof(range)));
        }
        if (!in_float_range(v, f->range)) {
            FAIL("flag '%s' is out of range: %s is %g as a float32, not in %s", f->flag, s,
                 (double)v, float_range_text(f->range, range, sizeof(range)));
        }
        *(float*)f->value = v;
    } else {
        *(const char**)f->value = s;
    }
    return 0;
}

void options_print(const Flag* flags, int n) {
    for (int i = 0; i < n; i++) {
        char value[64];
        switch (flags[i].kind) {
            case OPT_INT: snprintf(value, sizeof(value), "%d", *(int*)flags[i].value); break;
            case OPT_FLOAT: snprintf(value, sizeof(value), "%g", *(float*)flags[i].value); break;
            case OPT_U64: snprintf(value, sizeof(value), "%llu", *(unsigned long long*)flags[i].value); break;
            case OPT_STRING: {
                const char* s = *(const char**)flags[i].value;
                snprintf(value, sizeof(value), "%s", s ? s : "(none)");
                break;
            }
            case OPT_SWITCH: snprintf(value, sizeof(value), "off"); break;
        }
        printf("  %-16s %-50s [%s]\n", flags[i].flag, flags[i].help, value);
    }
    printf("  %-16s %s\n", "--help", "show this help");
}

// Checks every flag that the model and data do not check themselves.
// The flags --sample reads; it takes everything else (the model, its variant, the task's
// settings) from the checkpoint, and a variant or task flag must agree with it (sample.c)
static const char* const SAMPLE_FLAGS[] = {
    "--sample", "--checkpoint", "--prompt", "--prompt-tokens", "--tokens", "--temperature",
    "--top-k", "--seed", "--threads", "--task", "--length", "--symbols", "--eval-examples",
    "--depth-score", "--key-norm", "--depth-query", "--depth-heads", "--depth-window", "--mixing"};

// The flags --export reads: it writes the checkpoint's weights and does nothing else
static const char* const EXPORT_FLAGS[] = {"--export", "--checkpoint"};

// The variant flags that take words, and their words in the order of ModelConfig's numbers
static const char* const VARIANT_FLAGS[4] = {"--depth-score", "--key-norm", "--depth-query",
                                             "--mixing"};
static const char* const VARIANT_WORDS[4][3] = {{"softmax", "sigmoid", NULL}, {"on", "off", NULL},
                                                {"static", "input", NULL},
                                                {"attention", "static", "dense"}};

static int check_export_flags(const Options* o, char* err, size_t err_len) {
    for (int i = 0; i < o->n_given; i++) {
        int used = 0;
        for (size_t j = 0; j < sizeof(EXPORT_FLAGS) / sizeof(EXPORT_FLAGS[0]); j++) {
            used |= strcmp(o->given[i], EXPORT_FLAGS[j]) == 0;
        }
        if (!used) {
            FAIL("%s does not go with --export, which reads only --checkpoint PATH", o->given[i]);
        }
    }
    if (o->checkpoint == NULL) { FAIL("--export needs --checkpoint PATH, the checkpoint to export"); }
    if (o->export_path[0] == '\0' || o->checkpoint[0] == '\0') {
        FAIL("%s is empty", o->export_path[0] == '\0' ? "--export" : "--checkpoint");
    }
    return 0;
}

int wsd_decay_steps(const Options* o) {
    int decay_steps = (int)floor((double)o->decay_frac * o->steps + 0.5);
    return decay_steps < 1 ? 1 : decay_steps;
}

int warmup_fit(const Options* o) {
    if (o->warmup == 0) { return WARMUP_FITS; }  // no warmup
    if (o->warmup >= o->steps) { return WARMUP_PAST_STEPS; }
    if (o->schedule_kind == SCHEDULE_WSD && o->warmup > o->steps - wsd_decay_steps(o)) {
        return WARMUP_INTO_DECAY;
    }
    return WARMUP_FITS;
}

int options_check(Options* o, char* err, size_t err_len) {
    if (o->export_path != NULL) { return check_export_flags(o, err, err_len); }
    for (int i = 0; i < o->n_given && o->sample; i++) {
        int used = 0;
        for (size_t j = 0; j < sizeof(SAMPLE_FLAGS) / sizeof(SAMPLE_FLAGS[0]); j++) {
            used |= strcmp(o->given[i], SAMPLE_FLAGS[j]) == 0;
        }
        if (!used) {
            FAIL("%s is a training flag; --sample takes the model from the checkpoint",
                 o->given[i]);
        }
    }
    const char* positive[] = {"--batch", "--steps", "--eval-every", "--log-every",
                              "--eval-examples", "--microbatches", "--pipeline", "--virtual"};
    int values[] = {o->batch, o->steps, o->eval_every, o->log_every, o->eval_examples,
                    o->microbatches, o->pipeline, o->virtual_stages};
    for (int i = 0; i < 8; i++) {
        // --init-from with --steps 0 trains nothing: it evaluates the file's weights (and
        // writes them to --checkpoint)
        int imported_as_is = i == 1 && values[i] == 0 && o->init_from != NULL;
        if (values[i] <= 0 && !imported_as_is) { FAIL("%s must be positive", positive[i]); }
    }
    if (o->warmup < 0 || o->threads < 0 || o->seq_len < 0 || o->stop_after < 0) {
        FAIL("--warmup, --threads, --seq-len and --stop-after must not be negative");
    }
    if (o->stop_after > o->steps) {
        FAIL("--stop-after %d is more than --steps %d: the run would end at --steps anyway",
             o->stop_after, o->steps);
    }
    if (strcmp(o->pipeline_cache, "on") != 0 && strcmp(o->pipeline_cache, "off") != 0) {
        FAIL("unknown --pipeline-cache '%s' (valid: on, off)", o->pipeline_cache);
    }
    o->pipeline_cached = strcmp(o->pipeline_cache, "on") == 0;
    const char* pipeline_flags[] = {"--virtual", "--pipeline-cache", "--pipeline-trace"};
    for (int i = 0; i < 3 && o->pipeline == 1; i++) {
        if (option_given(o, pipeline_flags[i])) { FAIL("%s needs --pipeline P (P >= 2)", pipeline_flags[i]); }
    }
    if (o->pipeline > 1 && o->diagnostics != NULL) {
        FAIL("--diagnostics runs without --pipeline: its measures read the whole model's activations");
    }
    if (strcmp(o->schedule, "cosine") == 0) {
        o->schedule_kind = SCHEDULE_COSINE;
    } else if (strcmp(o->schedule, "wsd") == 0) {
        o->schedule_kind = SCHEDULE_WSD;
    } else {
        FAIL("unknown --schedule '%s' (valid: cosine, wsd)", o->schedule);
    }
    int fit = option_given(o, "--warmup") ? warmup_fit(o) : WARMUP_FITS;
    if (fit == WARMUP_PAST_STEPS) {
        FAIL("--warmup %d is not shorter than --steps %d: the run would end inside its warmup, "
             "before the lr decays to lr * --final-lr-frac", o->warmup, o->steps);
    }
    if (fit == WARMUP_INTO_DECAY) {
        FAIL("--warmup %d reaches into --schedule wsd's decay, the last %d of the %d --steps "
             "(--decay-frac %g): a warmup of at most %d steps ends before it", o->warmup,
             wsd_decay_steps(o), o->steps, (double)o->decay_frac,
             o->steps - wsd_decay_steps(o));
    }
    if (strcmp(o->optimizer, "adamw") == 0) {
        o->optimizer_kind = OPTIMIZER_ADAMW;
    } else if (strcmp(o->optimizer, "muon") == 0) {
        o->optimizer_kind = OPTIMIZER_MUON;
    } else {
        FAIL("unknown --optimizer '%s' (valid: adamw, muon)", o->optimizer);
    }
    if (strcmp(o->mode, "none") == 0) {
        o->model.block_size = 0;
    } else if (strcmp(o->mode, "full") == 0) {
        o->model.block_size = 1;
    } else if (strcmp(o->mode, "block") == 0) {
        if (o->model.block_size < 2) {
            FAIL("--mode block needs --block-size >= 2 (S = 1 is --mode full)");
        }
    } else if (strcmp(o->mode, "mhc") == 0) {
        o->model.block_size = 0;
    } else {
        FAIL("unknown --mode '%s' (valid: none, full, block, mhc)", o->mode);
    }
    int mhc = strcmp(o->mode, "mhc") == 0;
    if (option_given(o, "--streams") && !mhc) {
        FAIL("--streams is for --mode mhc (this run has --mode %s)", o->mode);
    }
    if (mhc && (o->streams < 2 || o->streams > MHC_MAX_STREAMS)) {
        FAIL("--streams must be 2 .. %d (got %d)", MHC_MAX_STREAMS, o->streams);
    }
    o->model.streams = mhc ? o->streams : 0;
    // the variants' words; model_config_check then checks modes and combinations
    const char* const* words[] = {&o->depth_score, &o->key_norm, &o->depth_query, &o->mixing};
    int* switches[] = {&o->model.depth_score, &o->model.key_norm_off, &o->model.depth_query,
                       &o->model.mixing};
    for (int i = 0; i < 4; i++) {
        int found = -1;
        for (int j = 0; j < 3 && VARIANT_WORDS[i][j] != NULL; j++) {
            if (strcmp(*words[i], VARIANT_WORDS[i][j]) == 0) { found = j; }
        }
        if (found < 0) {
            FAIL("unknown %s '%s' (valid: %s, %s%s%s)", VARIANT_FLAGS[i], *words[i],
                 VARIANT_WORDS[i][0], VARIANT_WORDS[i][1], VARIANT_WORDS[i][2] ? ", " : "",
                 VARIANT_WORDS[i][2] ? VARIANT_WORDS[i][2] : "");
        }
        *switches[i] = found;
    }
    // SPEC: a window of W >= 2L sources leaves every sub-layer all of them: it is full mode,
    // stored as such (0), so that --resume and --sample take it for what it is
    if (o->model.block_size == 1 && o->model.depth_window >= 2 * o->model.n_layers &&
        !o->sample) {
        o->model.depth_window = 0;
    }
    // one head is one head: --depth-heads 1 is stored as 0, the default, so that a run with
    // it and one without are the same run (resumed, sampled, described alike)
    if (o->model.depth_heads == 1) { o->model.depth_heads = 0; }
    if (o->resume && o->checkpoint == NULL) { FAIL("--resume needs --checkpoint PATH"); }
    if (o->resume && o->init_from != NULL) {
        FAIL("--init-from starts a new run from a file's weights, --resume continues "
             "--checkpoint's run: give one of them");
    }
    // a flag that would do nothing is a mistake worth one line
    if (option_given(o, "--block-size") && strcmp(o->mode, "block") != 0) {
        FAIL("--block-size is for --mode block (this run has --mode %s)", o->mode);
    }
    if (option_given(o, "--decay-frac") && o->schedule_kind != SCHEDULE_WSD) {
        FAIL("--decay-frac is for --schedule wsd (this run has --schedule %s)", o->schedule);
    }
    if (option_given(o, "--muon-momentum") && o->optimizer_kind != OPTIMIZER_MUON) {
        FAIL("--muon-momentum is for --optimizer muon (this run has --optimizer %s)",
             o->optimizer);
    }
    int text = strcmp(o->task, "text") == 0;
    const char* text_only[] = {"--text"}, *task_only[] = {"--length", "--symbols"};
    if (!text && option_given(o, text_only[0])) { FAIL("--text is for --task text (this run has --task %s)", o->task); }
    for (int i = 0; i < 2; i++) {
        if (text && option_given(o, task_only[i]) && !o->sample) {
            FAIL("%s is for the tasks, not --task text", task_only[i]);
        }
    }
    const char* sample_only[] = {"--prompt", "--prompt-tokens", "--tokens", "--temperature",
                                 "--top-k"};
    for (int i = 0; i < 5; i++) {
        if (!o->sample && option_given(o, sample_only[i])) { FAIL("%s is for --sample", sample_only[i]); }
    }
    const char* paths[] = {o->checkpoint, o->diagnostics, o->init_from};
    const char* path_flags[] = {"--checkpoint", "--diagnostics", "--init-from"};
    for (int i = 0; i < 3; i++) {
        if (paths[i] != NULL && paths[i][0] == '\0') { FAIL("%s is empty", path_flags[i]); }
    }
    if (o->cublas && !trainer_on_gpu()) {
        FAIL("--cublas is a flag of ./train_cuda (the GPU trainer), not of ./train");
    }
    if (o->no_graph && !trainer_on_gpu()) {
        FAIL("--no-graph is a flag of ./train_cuda (the GPU trainer), not of ./train");
    }
    return 0;
}

// the --mode word of a config
static const char* mode_of(const ModelConfig* c) {
    if (c->streams != 0) { return "mhc"; }
    return c->block_size == 0 ? "none" : c->block_size == 1 ? "full" : "block";
}

void options_take_config(Options* o, const ModelConfig* held) {
    const char* int_flags[] = {"--d", "--L", "--H", "--G", "--F", "--depth-heads", "--depth-window"};
    int* values[] = {&o->model.d_model, &o->model.n_layers, &o->model.n_heads,
                     &o->model.n_kv_heads, &o->model.ffn_hidden, &o->model.depth_heads,
                     &o->model.depth_window};
    const int held_values[] = {held->d_model, held->n_layers, held->n_heads, held->n_kv_heads,
                               held->ffn_hidden, held->depth_heads, held->depth_window};
    for (int i = 0; i < 7; i++) {
        if (!option_given(o, int_flags[i])) { *values[i] = held_values[i]; }
    }
    if (!option_given(o, "--mode")) { o->mode = mode_of(held); }
    // a block size or a stream count only where the file's mode has one: another mode asked
    // for keeps the default, and is refused by name in options_check_config
    if (!option_given(o, "--block-size") && held->block_size >= 2) {
        o->model.block_size = held->block_size;
    }
    if (!option_given(o, "--streams") && held->streams != 0) { o->streams = held->streams; }
    const char** words[] = {&o->depth_score, &o->key_norm, &o->depth_query, &o->mixing};
    const int held_words[] = {held->depth_score, held->key_norm_off, held->depth_query, held->mixing};
    for (int i = 0; i < 4; i++) {
        if (!option_given(o, VARIANT_FLAGS[i])) { *words[i] = VARIANT_WORDS[i][held_words[i]]; }
    }
}

int options_check_config(const Options* o, const ModelConfig* held, char* err, size_t err_len) {
    const char* fix = "leave the flag out, or give the file's value";
    if (strcmp(o->mode, mode_of(held)) != 0) {
        FAIL("--mode %s contradicts --init-from %s, whose model has mode %s (%s)", o->mode,
             o->init_from, mode_of(held), fix);
    }
    const char* flags[] = {"--d", "--L", "--H", "--G", "--F", "--block-size", "--streams",
                           "--depth-heads", "--depth-window"};
    const char* fields[] = {"d_model", "n_layers", "n_heads", "n_kv_heads", "ffn_hidden",
                            "block_size", "streams", "depth_heads", "depth_window"};
    const ModelConfig* c = &o->model;
    const int asked[] = {c->d_model, c->n_layers, c->n_heads, c->n_kv_heads, c->ffn_hidden,
                         c->block_size, c->streams, c->depth_heads, c->depth_window};
    const int have[] = {held->d_model, held->n_layers, held->n_heads, held->n_kv_heads,
                        held->ffn_hidden, held->block_size, held->streams, held->depth_heads,
                        held->depth_window};
    for (int i = 0; i < 9; i++) {
        if (asked[i] != have[i]) {
            FAIL("%s %d contradicts --init-from %s, whose model has %s %d (%s)", flags[i],
                 asked[i], o->init_from, fields[i], have[i], fix);
        }
    }
    const int asked_words[] = {c->depth_score, c->key_norm_off, c->depth_query, c->mixing};
    const int held_words[] = {held->depth_score, held->key_norm_off, held->depth_query, held->mixing};
    for (int i = 0; i < 4; i++) {
        if (asked_words[i] != held_words[i]) {
            FAIL("%s %s contradicts --init-from %s, whose model has %s %s (%s)", VARIANT_FLAGS[i],
                 VARIANT_WORDS[i][asked_words[i]], o->init_from, VARIANT_FLAGS[i],
                 VARIANT_WORDS[i][held_words[i]], fix);
        }
    }
    return 0;
}
