// options.c — reading, printing and checking the flags of train.c's flag table (options.h).
#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "layers.h"   // MHC_MAX_STREAMS
#include "options.h"
#include "trainer.h"  // trainer_on_gpu

#define FAIL(...) do { snprintf(err, err_len, __VA_ARGS__); return -1; } while (0)

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
        // ERANGE for a tiny number is underflow (a subnormal or 0): still a number
        int overflow = errno == ERANGE && fabsf(v) == HUGE_VALF;
        if (s[0] == '\0' || strspn(s, "0123456789+-.eE") != strlen(s) || *end != '\0' ||
            overflow || !isfinite(v)) {
            FAIL("flag '%s' expects a number, got '%s'", f->flag, s);
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

int options_check(Options* o, char* err, size_t err_len) {
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
                              "--eval-examples"};
    int values[] = {o->batch, o->steps, o->eval_every, o->log_every, o->eval_examples};
    for (int i = 0; i < 5; i++) {
        if (values[i] <= 0) { FAIL("%s must be positive", positive[i]); }
    }
    if (o->warmup < 0 || o->threads < 0 || o->seq_len < 0 || o->stop_after < 0) {
        FAIL("--warmup, --threads, --seq-len and --stop-after must not be negative");
    }
    if (o->stop_after > o->steps) {
        FAIL("--stop-after %d is more than --steps %d: the run would end at --steps anyway",
             o->stop_after, o->steps);
    }
    if (!(o->lr > 0.0f) || o->final_lr_frac < 0.0f || o->weight_decay < 0.0f ||
        o->grad_clip < 0.0f) {
        FAIL("--lr must be positive; --final-lr-frac, --weight-decay, --grad-clip non-negative");
    }
    if (!(o->beta1 >= 0.0f && o->beta1 < 1.0f && o->beta2 >= 0.0f && o->beta2 < 1.0f)) {
        FAIL("--beta1 and --beta2 must be in [0, 1)");
    }
    if (strcmp(o->schedule, "cosine") == 0) {
        o->schedule_kind = SCHEDULE_COSINE;
    } else if (strcmp(o->schedule, "wsd") == 0) {
        o->schedule_kind = SCHEDULE_WSD;
    } else {
        FAIL("unknown --schedule '%s' (valid: cosine, wsd)", o->schedule);
    }
    if (!(o->decay_frac > 0.0f && o->decay_frac < 1.0f)) {
        FAIL("--decay-frac must be in (0, 1), got %g", (double)o->decay_frac);
    }
    if (strcmp(o->optimizer, "adamw") == 0) {
        o->optimizer_kind = OPTIMIZER_ADAMW;
    } else if (strcmp(o->optimizer, "muon") == 0) {
        o->optimizer_kind = OPTIMIZER_MUON;
    } else {
        FAIL("unknown --optimizer '%s' (valid: adamw, muon)", o->optimizer);
    }
    if (!(o->muon_momentum >= 0.0f && o->muon_momentum < 1.0f)) {
        FAIL("--muon-momentum must be in [0, 1), got %g", (double)o->muon_momentum);
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
    const char* flag_names[] = {"--depth-score", "--key-norm", "--depth-query", "--mixing"};
    const char* choices[][3] = {{"softmax", "sigmoid", NULL}, {"on", "off", NULL},
                                {"static", "input", NULL}, {"attention", "static", "dense"}};
    int* switches[] = {&o->model.depth_score, &o->model.key_norm_off, &o->model.depth_query,
                       &o->model.mixing};
    for (int i = 0; i < 4; i++) {
        int found = -1;
        for (int j = 0; j < 3 && choices[i][j] != NULL; j++) {
            if (strcmp(*words[i], choices[i][j]) == 0) { found = j; }
        }
        if (found < 0) {
            FAIL("unknown %s '%s' (valid: %s, %s%s%s)", flag_names[i], *words[i], choices[i][0],
                choices[i][1], choices[i][2] ? ", " : "", choices[i][2] ? choices[i][2] : "");
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
    const char* paths[] = {o->checkpoint, o->diagnostics};
    const char* path_flags[] = {"--checkpoint", "--diagnostics"};
    for (int i = 0; i < 2; i++) {
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
