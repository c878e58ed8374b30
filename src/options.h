// options.h — a run's settings, as ./train's flags set them (train.c's flag table, which says
// what each one does): what the trainer, --sample and the run record's checks read.
#ifndef ATTNRES_OPTIONS_H
#define ATTNRES_OPTIONS_H

#include <stddef.h>
#include <string.h>
#include "model.h"

#define MAX_FLAGS 64

// the learning-rate schedules, numbered as the run record stores them (checkpoint.h)
enum { SCHEDULE_COSINE = 0, SCHEDULE_WSD = 1 };
// the optimisers, numbered as the run record and the state files store them
#define OPTIMIZER_ADAMW 0
#define OPTIMIZER_MUON 1

typedef struct {
    ModelConfig model;       // vocab_size is set by the data
    const char* mode;        // none | full | block | mhc
    int streams;             // --streams: mhc's m (options_check sets model.streams)
    // SPEC's depth-attention variants, as words (options_check sets model's switches)
    const char *depth_score, *key_norm, *depth_query, *mixing;
    const char* task;        // reverse | copy | sort | text
    const char* text_path;
    int length, symbols, eval_examples;
    int batch, seq_len, steps, warmup, threads, eval_every, log_every;
    int microbatches;        // --microbatches M: the step's batch in M parts, gradients summed
    int pipeline, virtual_stages;  // --pipeline P --virtual V (src/pipeline.c); 1: no pipeline
    const char* pipeline_cache;    // on | off (options_check sets pipeline_cached)
    int pipeline_cached;
    const char* pipeline_trace;    // --pipeline-trace FILE, NULL = off
    float lr, final_lr_frac, weight_decay, grad_clip, beta1, beta2, adam_eps;
    const char* schedule;    // cosine | wsd (options_check sets schedule_kind)
    int schedule_kind;       // SCHEDULE_COSINE or SCHEDULE_WSD
    float decay_frac;        // wsd: the share of --steps that decays, in (0, 1)
    const char* optimizer;   // adamw | muon (options_check sets optimizer_kind)
    int optimizer_kind;      // OPTIMIZER_ADAMW or OPTIMIZER_MUON
    float muon_momentum;     // Muon's mu, in [0, 1)
    unsigned long long seed;
    const char* checkpoint;
    int resume;
    const char* export_path;  // --export OUT: write --checkpoint's weights as safetensors
    const char* init_from;    // --init-from IN: a new run from a safetensors file's weights
    int stop_after;
    const char* diagnostics;  // directory for the CSVs of diagnostics.h, NULL = off
    int sample;                                // --sample: generate from --checkpoint
    const char *prompt, *prompt_tokens;        // NULL = none given
    int sample_tokens, top_k;                  // 0 = default length / all tokens
    float temperature;                         // 0 = greedy
    int cublas;                                // ./train_cuda: matmuls through cuBLAS
    int no_graph;                              // ./train_cuda: the step uncaptured
    const char* given[MAX_FLAGS];              // the flags on the command line, each once
    int n_given;
} Options;

// whether `flag` ("--steps") was on the command line
static inline int option_given(const Options* o, const char* flag) {
    for (int i = 0; i < o->n_given; i++) {
        if (strcmp(o->given[i], flag) == 0) { return 1; }
    }
    return 0;
}

// One entry of train.c's flag table: the flag, what its value is, where it goes, its help line,
// and for a number with a fraction the values it may take
typedef enum { OPT_INT, OPT_FLOAT, OPT_STRING, OPT_U64, OPT_SWITCH } OptionKind;
typedef enum {
    FLOAT_ANY,            // any float32: [-3.40282e+38, 3.40282e+38]
    FLOAT_NON_NEGATIVE,   // [0, 3.40282e+38]
    FLOAT_POSITIVE,       // (0, 3.40282e+38]
    FLOAT_FRACTION,       // [0, 1)
    FLOAT_UNIT,           // [0, 1]
    FLOAT_OPEN_FRACTION,  // (0, 1)
} FloatRange;
typedef struct {
    const char* flag;
    OptionKind kind;
    void* value;
    const char* help;
    FloatRange range;     // OPT_FLOAT only
} Flag;

// Reads s, the value given to flag f, into f->value: plain decimal numbers only (no spaces,
// no hexadecimal, no inf or nan), in the range of the flag's type (an int, or for OPT_FLOAT
// f->range, which the value must be in both as written and as the float32 it becomes).
// 0, or -1 with one line in err.
int options_parse_value(const Flag* f, const char* s, char* err, size_t err_len);
// --help: one line per flag, with its default (the value it points to now)
void options_print(const Flag* flags, int n);
// Checks every flag that the model and data do not check themselves (a float flag's range is
// options_parse_value's), and turns the words
// (--mode, the variants') into o->model's numbers. 0, or -1 with one line in err.
int options_check(Options* o, char* err, size_t err_len);
// --schedule wsd's decay steps: D = max(1, floor(decay_frac * steps + 0.5)), the last D of
// --steps
int wsd_decay_steps(const Options* o);
// Whether the warmup fits the schedule: it must end before the last step (or the run never
// decays to lr * final_lr_frac), and under wsd before the decay begins (or the lr would still
// climb inside it). options_check refuses a --warmup given that does not fit; the default one
// is left as it is, and the header says so.
enum { WARMUP_FITS = 0, WARMUP_PAST_STEPS, WARMUP_INTO_DECAY };
int warmup_fit(const Options* o);
// --init-from: the model flags not on the command line take the values of `held`, the file's
// config (before options_check, which turns them into o->model)
void options_take_config(Options* o, const ModelConfig* held);
// --init-from, after options_check: every model flag given agrees with `held` (vocab_size
// aside: the data sets it). 0, or -1 with one line in err naming the first flag that does not.
int options_check_config(const Options* o, const ModelConfig* held, char* err, size_t err_len);

// a TaskKind's name (dataset.h), as --task spells it
static inline const char* task_name(int kind) {
    static const char* const names[] = {"reverse", "copy", "sort", "text"};
    return names[kind];
}

#endif
