// train.c — the attnres.c trainer: parse flags, build the model and data, train with AdamW
// (warmup + cosine decay, gradient clipping), evaluate, checkpoint, resume.
// Run `./train --help` for the flags. Start reading at main() at the bottom.
#define _POSIX_C_SOURCE 200809L  // clock_gettime
#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <omp.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include "checkpoint.h"
#include "dataset.h"
#include "diagnostics.h"
#include "distributed.h"
#include "inference.h"
#include "layers.h"
#include "model.h"
#include "util.h"
#ifdef ATTNRES_CUDA
#include "distributed.cuh"
#include "model.cuh"
#endif

typedef struct {
    ModelConfig model;       // vocab_size is set by the data
    const char* mode;        // none | full | block
    // SPEC's depth-attention variants, as words (validate() sets model's switches)
    const char *depth_score, *key_norm, *depth_query, *mixing;
    const char* task;        // reverse | copy | sort | text
    const char* text_path;
    int length, symbols, eval_examples;
    int batch, seq_len, steps, warmup, threads, eval_every, log_every;
    float lr, final_lr_frac, weight_decay, grad_clip, beta1, beta2, adam_eps;
    unsigned long long seed;
    const char* checkpoint;
    int resume;
    int stop_after;
    const char* diagnostics;  // directory for the CSVs of diagnostics.h, NULL = off
    int sample;                                // --sample: generate from --checkpoint
    const char *prompt, *prompt_tokens;        // NULL = none given
    int sample_tokens, top_k;                  // 0 = default length / all tokens
    float temperature;                         // 0 = greedy
    int cublas;                                // ./train_cuda: matmuls through cuBLAS
    char given[64];                            // given[i]: flag i of flag_table was given
} Options;

typedef enum { OPT_INT, OPT_FLOAT, OPT_STRING, OPT_U64, OPT_SWITCH } OptionKind;
typedef struct {
    const char* flag;
    OptionKind kind;
    void* value;
    const char* help;
} Flag;

static Options defaults(void) {
    Options o = {0};
    o.model = (ModelConfig){0, 64, 4, 4, 2, 176, 4};
    o.mode = "block";
    o.depth_score = "softmax"; o.key_norm = "on"; o.depth_query = "static"; o.mixing = "attention";
    o.task = "reverse";
    o.text_path = NULL;
    o.length = 12; o.symbols = 16; o.eval_examples = 500;
    o.batch = 32; o.seq_len = 0; o.steps = 1000; o.warmup = 100; o.threads = 0;
    o.eval_every = 200; o.log_every = 50;
    o.lr = 3e-3f; o.final_lr_frac = 0.1f; o.weight_decay = 0.1f; o.grad_clip = 1.0f;
    o.beta1 = 0.9f; o.beta2 = 0.95f; o.adam_eps = 1e-8f;
    o.seed = 1337;
    o.checkpoint = NULL;
    o.resume = 0;
    return o;
}

static int flag_table(Options* o, Flag* flags) {
    Flag table[] = {
        {"--d", OPT_INT, &o->model.d_model, "model width d"},
        {"--L", OPT_INT, &o->model.n_layers, "transformer layers (2L sub-layers)"},
        {"--H", OPT_INT, &o->model.n_heads, "query heads"},
        {"--G", OPT_INT, &o->model.n_kv_heads, "key/value heads (H % G == 0)"},
        {"--F", OPT_INT, &o->model.ffn_hidden, "SwiGLU hidden width"},
        {"--mode", OPT_STRING, &o->mode, "residual mode: none | full | block"},
        {"--block-size", OPT_INT, &o->model.block_size, "block mode: sub-layers per block S (divides 2L)"},
        {"--depth-score", OPT_STRING, &o->depth_score, "AttnRes variant: softmax | sigmoid weights"},
        {"--key-norm", OPT_STRING, &o->key_norm, "AttnRes variant: on | off (RMSNorm on the keys)"},
        {"--depth-query", OPT_STRING, &o->depth_query, "AttnRes variant: static | input (w + U rmsnorm(V_last))"},
        {"--depth-heads", OPT_INT, &o->model.depth_heads, "AttnRes variant: K heads of d/K channels (1: one)"},
        {"--depth-window", OPT_INT, &o->model.depth_window, "AttnRes variant, full: x0 + the W latest outputs (0: all)"},
        {"--mixing", OPT_STRING, &o->mixing, "AttnRes variant: attention | static | dense (DenseFormer)"},
        {"--task", OPT_STRING, &o->task, "reverse | copy | sort | text"},
        {"--text", OPT_STRING, &o->text_path, "text file for --task text (bytes, V = 256)"},
        {"--length", OPT_INT, &o->length, "tasks: symbols per prompt (T = 2 * length)"},
        {"--symbols", OPT_INT, &o->symbols, "tasks: distinct symbols (V = symbols + 1)"},
        {"--eval-examples", OPT_INT, &o->eval_examples, "held-out examples (tasks) / max eval rows (text)"},
        {"--batch", OPT_INT, &o->batch, "batch size B"},
        {"--seq-len", OPT_INT, &o->seq_len, "sequence length T (text: 0 = 64; tasks: 0 or 2*length)"},
        {"--steps", OPT_INT, &o->steps, "training steps"},
        {"--lr", OPT_FLOAT, &o->lr, "peak learning rate"},
        {"--warmup", OPT_INT, &o->warmup, "linear warmup steps"},
        {"--final-lr-frac", OPT_FLOAT, &o->final_lr_frac, "cosine decay ends at lr * this"},
        {"--weight-decay", OPT_FLOAT, &o->weight_decay, "AdamW weight decay (matrices only)"},
        {"--grad-clip", OPT_FLOAT, &o->grad_clip, "clip the global gradient norm (0 = off)"},
        {"--beta1", OPT_FLOAT, &o->beta1, "AdamW beta1"},
        {"--beta2", OPT_FLOAT, &o->beta2, "AdamW beta2"},
        {"--seed", OPT_U64, &o->seed, "random seed (init and data; --sample: draws)"},
        {"--threads", OPT_INT, &o->threads, "OpenMP threads (0 = all cores)"},
        {"--eval-every", OPT_INT, &o->eval_every, "evaluate (and checkpoint) every N steps"},
        {"--log-every", OPT_INT, &o->log_every, "print a training line every N steps"},
        {"--checkpoint", OPT_STRING, &o->checkpoint, "checkpoint file (written at each eval)"},
        {"--resume", OPT_SWITCH, &o->resume, "continue from --checkpoint"},
        {"--stop-after", OPT_INT, &o->stop_after, "end this run after N steps (0 = at --steps; lr schedule unchanged)"},
        {"--diagnostics", OPT_STRING, &o->diagnostics, "write loss/magnitude/grad/alpha CSVs into DIR"},
        {"--sample", OPT_SWITCH, &o->sample, "generate from --checkpoint instead of training"},
        {"--prompt", OPT_STRING, &o->prompt, "--sample: text prompt (text models, V = 256)"},
        {"--prompt-tokens", OPT_STRING, &o->prompt_tokens, "--sample: prompt token ids, e.g. 3,1,4"},
        {"--tokens", OPT_INT, &o->sample_tokens, "--sample: tokens to generate (0: answer / 256)"},
        {"--temperature", OPT_FLOAT, &o->temperature, "--sample: softmax temperature (0 = greedy)"},
        {"--top-k", OPT_INT, &o->top_k, "--sample: draw among the K likeliest (0 = all)"},
        {"--cublas", OPT_SWITCH, &o->cublas, "./train_cuda: every matmul through cuBLAS SGEMM"},
    };
    int n = (int)(sizeof(table) / sizeof(table[0]));
    if (flags != NULL) { memcpy(flags, table, sizeof(table)); }
    return n;
}

#define MAX_FLAGS 64

// whether `flag` was on the command line
static int given(const Options* o, const char* flag) {
    Options copy = *o;
    Flag flags[MAX_FLAGS];
    int n = flag_table(&copy, flags);
    for (int i = 0; i < n; i++) {
        if (strcmp(flags[i].flag, flag) == 0) { return o->given[i]; }
    }
    return 0;
}

static void print_help(void) {
    Options o = defaults();
    Flag flags[MAX_FLAGS];
    int n = flag_table(&o, flags);
    printf("usage: ./train [flags]    (defaults train block AttnRes on sequence reversal)\n\n");
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

// One-line error and a non-zero exit.
// This process of a data-parallel run (distributed.h): rank 0 of 1 without mpirun.
static Dist dist = {0, 1, 0, 1};
// While the run is being set up every rank checks the same flags and files, so rank 0
// reports what is wrong (let_rank0_speak); a problem only another rank sees (a file missing
// on its machine) is still reported, a second later. Once training runs, the rank that sees
// a problem reports it at once.
static int setting_up = 1;

// Where every rank meets the same problem, the ranks other than 0 wait a second before they
// end the job, so that rank 0's line is the one printed (its abort ends them meanwhile).
static void let_rank0_speak(void) {
    if (dist.world > 1 && dist.rank != 0) {
        struct timespec second = {1, 0};
        nanosleep(&second, NULL);
    }
}

// One line on stderr (one write, so that other processes' output cannot cut into it), then
// the end of the run (of every rank of it, under mpirun).
static void die(const char* fmt, ...) {
    char message[ERROR_MAX];
    va_list args;
    va_start(args, fmt);
    vsnprintf(message, sizeof(message), fmt, args);
    va_end(args);
    if (setting_up) { let_rank0_speak(); }
    if (dist.world > 1 && dist.rank != 0) {
        fprintf(stderr, "error (rank %d): %s\n", dist.rank, message);
    } else {
        fprintf(stderr, "error: %s\n", message);
    }
    dist_abort(1);
}

// The exit status once the run is done: 1, with one line, if some of what it printed did
// not reach stdout (redirected to a full disk), else `status`
static int exit_status(int status) {
    errno = 0;
    if (fflush(stdout) == 0 && !ferror(stdout)) { return status; }
    fprintf(stderr, "error: cannot write the output%s%s\n", errno != 0 ? ": " : "",
            errno != 0 ? strerror(errno) : "");
    return 1;
}

static void parse_flags(Options* o, int argc, char** argv) {
    Flag flags[MAX_FLAGS];
    int n = flag_table(o, flags);
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
            if (dist.rank == 0) { print_help(); }  // once, under mpirun too
            dist_finalize();
            exit(0);
        }
        const Flag* f = NULL;
        for (int j = 0; j < n; j++) {
            if (strcmp(argv[i], flags[j].flag) == 0) { f = &flags[j]; o->given[j] = 1; }
        }
        if (f == NULL) { die("unknown flag '%s' (see ./train --help)", argv[i]); }
        if (f->kind == OPT_SWITCH) { *(int*)f->value = 1; continue; }
        if (i + 1 >= argc) { die("flag '%s' needs a value", f->flag); }
        const char* s = argv[++i];
        char* end = NULL;
        errno = 0;
        // plain decimal numbers only: no spaces, no hexadecimal, no inf or nan
        if (f->kind == OPT_INT) {
            long v = strtol(s, &end, 10);
            if (!(isdigit((unsigned char)s[0]) || (s[0] == '-' && isdigit((unsigned char)s[1]))) ||
                *end != '\0' || errno != 0 || v < INT_MIN || v > INT_MAX) {
                die("flag '%s' expects an integer, got '%s'", f->flag, s);
            }
            *(int*)f->value = (int)v;
        } else if (f->kind == OPT_U64) {
            unsigned long long v = strtoull(s, &end, 10);
            if (!isdigit((unsigned char)s[0]) || *end != '\0' || errno != 0) {
                die("flag '%s' expects a non-negative integer, got '%s'", f->flag, s);
            }
            *(unsigned long long*)f->value = v;
        } else if (f->kind == OPT_FLOAT) {
            float v = strtof(s, &end);
            // ERANGE for a tiny number is underflow (a subnormal or 0): still a number
            int overflow = errno == ERANGE && fabsf(v) == HUGE_VALF;
            if (s[0] == '\0' || strspn(s, "0123456789+-.eE") != strlen(s) || *end != '\0' ||
                overflow || !isfinite(v)) {
                die("flag '%s' expects a number, got '%s'", f->flag, s);
            }
            *(float*)f->value = v;
        } else {
            *(const char**)f->value = s;
        }
    }
}

// Checks every flag that the model and data do not check themselves.
static void validate(Options* o) {
    const char* positive[] = {"--batch", "--steps", "--eval-every", "--log-every",
                              "--eval-examples"};
    int values[] = {o->batch, o->steps, o->eval_every, o->log_every, o->eval_examples};
    for (int i = 0; i < 5; i++) {
        if (values[i] <= 0) { die("%s must be positive", positive[i]); }
    }
    if (o->warmup < 0 || o->threads < 0 || o->seq_len < 0 || o->stop_after < 0) {
        die("--warmup, --threads, --seq-len and --stop-after must not be negative");
    }
    if (!(o->lr > 0.0f) || o->final_lr_frac < 0.0f || o->weight_decay < 0.0f ||
        o->grad_clip < 0.0f) {
        die("--lr must be positive; --final-lr-frac, --weight-decay, --grad-clip non-negative");
    }
    if (!(o->beta1 >= 0.0f && o->beta1 < 1.0f && o->beta2 >= 0.0f && o->beta2 < 1.0f)) {
        die("--beta1 and --beta2 must be in [0, 1)");
    }
    if (strcmp(o->mode, "none") == 0) {
        o->model.block_size = 0;
    } else if (strcmp(o->mode, "full") == 0) {
        o->model.block_size = 1;
    } else if (strcmp(o->mode, "block") == 0) {
        if (o->model.block_size < 2) {
            die("--mode block needs --block-size >= 2 (S = 1 is --mode full)");
        }
    } else {
        die("unknown --mode '%s' (valid: none, full, block)", o->mode);
    }
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
            die("unknown %s '%s' (valid: %s, %s%s%s)", flag_names[i], *words[i], choices[i][0],
                choices[i][1], choices[i][2] ? ", " : "", choices[i][2] ? choices[i][2] : "");
        }
        *switches[i] = found;
    }
    if (o->resume && o->checkpoint == NULL) { die("--resume needs --checkpoint PATH"); }
    // a flag that would do nothing is a mistake worth one line
    if (given(o, "--block-size") && strcmp(o->mode, "block") != 0) {
        die("--block-size is for --mode block (this run has --mode %s)", o->mode);
    }
    int text = strcmp(o->task, "text") == 0;
    const char* text_only[] = {"--text"}, *task_only[] = {"--length", "--symbols"};
    if (!text && given(o, text_only[0])) { die("--text is for --task text (this run has --task %s)", o->task); }
    for (int i = 0; i < 2; i++) {
        if (text && given(o, task_only[i]) && !o->sample) {
            die("%s is for the tasks, not --task text", task_only[i]);
        }
    }
    const char* sample_only[] = {"--prompt", "--prompt-tokens", "--tokens", "--temperature",
                                 "--top-k"};
    for (int i = 0; i < 5; i++) {
        if (!o->sample && given(o, sample_only[i])) { die("%s is for --sample", sample_only[i]); }
    }
    const char* training_only[] = {"--resume", "--diagnostics", "--stop-after"};
    for (int i = 0; i < 3; i++) {
        if (o->sample && given(o, training_only[i])) {
            die("%s is for training, not --sample", training_only[i]);
        }
    }
    const char* paths[] = {o->checkpoint, o->diagnostics};
    const char* path_flags[] = {"--checkpoint", "--diagnostics"};
    for (int i = 0; i < 2; i++) {
        if (paths[i] != NULL && paths[i][0] == '\0') { die("%s is empty", path_flags[i]); }
    }
#ifndef ATTNRES_CUDA
    if (o->cublas) { die("--cublas is a flag of ./train_cuda (the GPU trainer), not of ./train"); }
#endif
}

// Linear warmup to lr, then cosine decay to lr * final_lr_frac at the last step.
static float learning_rate(const Options* o, int step) {
    if (step < o->warmup) { return o->lr * (float)(step + 1) / (float)o->warmup; }
    int decay_steps = o->steps - o->warmup;
    float progress = decay_steps > 1 ? (float)(step - o->warmup) / (float)(decay_steps - 1) : 1.0f;
    float cosine = 0.5f * (1.0f + cosf(3.14159265358979f * progress));
    float min_lr = o->lr * o->final_lr_frac;
    return min_lr + (o->lr - min_lr) * cosine;
}

static double now_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static size_t argmax(const float* p, size_t n) {
    size_t best = 0;
    for (size_t i = 1; i < n; i++) { if (p[i] > p[best]) { best = i; } }
    return best;
}

typedef struct {
    float val_loss;
    float accuracy;     // next-token accuracy on the scored positions (teacher forcing), %
    float exact_match;  // tasks: whole answers right under greedy decoding, %; text: -1
} EvalResult;

// Greedy decoding of the answers of eval rows x (rows, T): the prompt and separator are given,
// each answer token is the argmax given everything before it, fed back as the next input.
// All rows decode in lockstep with the cached decoder (inference.h): the prompt by one prefill,
// then one position per step.
// Returns the number of rows whose whole answer equals the target in y.
static size_t greedy_exact_matches(Decoder* dec, const Dataset* ds, const int* x, const int* y,
                                   size_t rows, int* work) {
    size_t T = (size_t)ds->seq_len, start = (size_t)ds->answer_start;
    size_t n_prompt = start + 1, n_answer = (size_t)ds->answer_len;  // prompt + separator
    for (size_t r = 0; r < rows; r++) {
        memcpy(work + r * n_prompt, x + r * T, n_prompt * sizeof(int));
    }
    int* answer = mallocCheck(rows * n_answer * sizeof(int));
    decoder_generate(dec, rows, work, n_prompt, answer, n_answer, 0.0f, 0, NULL,  // greedy
                     NULL, NULL);
    size_t matches = 0;
    for (size_t r = 0; r < rows; r++) {
        int ok = 1;
        for (size_t i = 0; i < n_answer; i++) { ok &= answer[r * n_answer + i] == y[r * T + start + i]; }
        matches += (size_t)ok;
    }
    free(answer);
    return matches;
}

static EvalResult evaluate(Model* m, Decoder* dec, const Dataset* ds, const Options* o, int* x,
                           int* y, int* work) {
    size_t T = (size_t)ds->seq_len, V = (size_t)ds->vocab_size;
    size_t rows = dataset_eval_rows(ds);
    if (rows > (size_t)o->eval_examples) { rows = (size_t)o->eval_examples; }
    double loss_sum = 0.0;
    size_t scored = 0, correct = 0, matches = 0;
    for (size_t first = 0; first < rows; first += m->max_B) {
        size_t b = rows - first < m->max_B ? rows - first : m->max_B;
        dataset_eval_batch(ds, x, y, b, first);
        model_forward(m, x, y, b, T);
        const float* probs = model_probs(m);
        size_t count = 0;
        for (size_t i = 0; i < b * T; i++) {
            if (y[i] < 0) { continue; }
            count++;
            correct += argmax(probs + i * V, V) == (size_t)y[i];
        }
        loss_sum += (double)m->loss * (double)count;
        scored += count;
        if (ds->kind != TASK_TEXT) { matches += greedy_exact_matches(dec, ds, x, y, b, work); }
    }
    EvalResult r;
    r.val_loss = (float)(loss_sum / (double)scored);
    r.accuracy = 100.0f * (float)correct / (float)scored;
    r.exact_match = ds->kind == TASK_TEXT ? -1.0f : 100.0f * (float)matches / (float)rows;
    return r;
}

// Depth-attention weights averaged over the tokens of the first evaluation batch.
static void measure_eval_alpha(Model* m, const Dataset* ds, const Options* o, int* x, int* y,
                               Diagnostics* dg) {
    size_t rows = dataset_eval_rows(ds);
    if (rows > (size_t)o->eval_examples) { rows = (size_t)o->eval_examples; }
    if (rows > m->max_B) { rows = m->max_B; }
    dataset_eval_batch(ds, x, y, rows, 0);
    model_forward(m, x, y, rows, (size_t)ds->seq_len);
    diagnostics_measure_alpha(dg, m);
}

// argv joined by spaces, for the record of a run
static void command_line(char* out, size_t len, int argc, char** argv) {
    size_t used = 0;
    out[0] = '\0';
    for (int i = 0; i < argc && used < len; i++) {
        used += (size_t)snprintf(out + used, len - used, "%s%s", i ? " " : "", argv[i]);
    }
}

static const char* const TASK_NAMES[] = {"reverse", "copy", "sort", "text"};  // TaskKind

// ---- the training step: on the CPU (./train) or on the GPU (./train_cuda) -----------------
// ./train_cuda is this file compiled with -DATTNRES_CUDA (make cuda). Its training step
// (forward, backward, gradient norm, clipping, AdamW) runs on a device twin of the model
// (cuda/model.cuh). Everything else (evaluation, decoding, diagnostics, checkpoints) is the CPU
// code of this file, on the host Model, after trainer_to_host has copied the parameters and
// AdamW state there; so evaluation runs at CPU speed in both.
typedef struct {
    Model* host;
#ifdef ATTNRES_CUDA
    ModelCuda device;  // trained; host is refreshed from it by trainer_to_host
#endif
    // Data parallel over several processes (./train_mpi, ./train_cuda_mpi): ZeRO-1. This
    // rank owns the shard [lo, hi) of the flat parameter buffer: the sum over the ranks of
    // its gradients (grad_shard) and its AdamW moments (m_shard, v_shard), on the device
    // that trains; the trained model's full moments are released (NULL), and so are the
    // host's, except on rank 0 while it writes a checkpoint.
    size_t lo, hi;
    float *grad_shard, *m_shard, *v_shard;
    double comm_seconds;  // time spent in the collectives of the steps (waiting included)
} Trainer;

// Whether the step runs sharded: with several processes; and always in the GPU build with
// MPI, so that a run of one process there tests the NCCL path too.
#if defined(ATTNRES_CUDA) && defined(ATTNRES_MPI)
#define SHARDED 1
#else
#define SHARDED (dist.world > 1)
#endif

// the model that trains: the host's, or its GPU twin
static Model* trained_model(Trainer* t) {
#ifdef ATTNRES_CUDA
    return &t->device.model;
#else
    return t->host;
#endif
}

// host holds the initial (or resumed) parameters and moments; B, T is this rank's batch
static void trainer_init(Trainer* t, Model* host, size_t B, size_t T) {
    t->host = host;
#ifdef ATTNRES_CUDA
    model_build_cuda(&t->device, &host->config, B, T);
    model_to_device_cuda(&t->device, host);
#else
    (void)B;
    (void)T;
#endif
    if (!SHARDED) { return; }
    dist_shard(host->num_params, dist.rank, dist.world, &t->lo, &t->hi);
    size_t count = t->hi - t->lo;
#ifdef ATTNRES_CUDA
    t->grad_shard = dist_shard_alloc_cuda(NULL, count);
    t->m_shard = dist_shard_alloc_cuda(host->m_memory + t->lo, count);
    t->v_shard = dist_shard_alloc_cuda(host->v_memory + t->lo, count);
#else
    t->grad_shard = mallocCheck(count * sizeof(float));
    t->m_shard = mallocCheck(count * sizeof(float));
    t->v_shard = mallocCheck(count * sizeof(float));
    memcpy(t->m_shard, host->m_memory + t->lo, count * sizeof(float));
    memcpy(t->v_shard, host->v_memory + t->lo, count * sizeof(float));
#endif
    Model* trained = trained_model(t);
    if (trained != host) {  // the GPU's full moments
        trained->kernels->release(trained->m_memory);
        trained->kernels->release(trained->v_memory);
        trained->m_memory = trained->v_memory = NULL;
    }
    host->kernels->release(host->m_memory);
    host->kernels->release(host->v_memory);
    host->m_memory = host->v_memory = NULL;
}

// sharded, on every rank: the whole moments onto rank 0's host model, for a checkpoint
// (then trainer_drop_moments)
static void trainer_gather_moments(Trainer* t) {
    if (!SHARDED) { return; }
    Model* h = t->host;
    if (dist.rank == 0) {
        h->m_memory = mallocCheck(h->num_params * sizeof(float));
        h->v_memory = mallocCheck(h->num_params * sizeof(float));
    }
    float* shards[2] = {t->m_shard, t->v_shard};
    float* fulls[2] = {h->m_memory, h->v_memory};
    for (int k = 0; k < 2; k++) {
#ifdef ATTNRES_CUDA
        float* shard = mallocCheck((t->hi - t->lo) * sizeof(float));  // from the GPU first
        dist_shard_to_host_cuda(shard, shards[k], t->hi - t->lo);
        dist_gather(&dist, fulls[k], shard, h->num_params);
        free(shard);
#else
        dist_gather(&dist, fulls[k], shards[k], h->num_params);
#endif
    }
}

static void trainer_drop_moments(Trainer* t) {
    if (!SHARDED) { return; }
    free(t->host->m_memory);
    free(t->host->v_memory);
    t->host->m_memory = t->host->v_memory = NULL;
}

// forward and backward on this rank's rows (x, y) of the global batch, which has n_targets
// targets; returns the loss of the global batch, and the global gradient norm in *norm
static float trainer_forward_backward(Trainer* t, const int* x, const int* y, size_t B,
                                      size_t T, size_t n_targets, float* norm) {
    if (SHARDED) {
        // each rank's loss is its rows' share of the global mean (its sum over the global
        // count), so the gradients summed over the ranks are the global batch's
        double local_loss, sum_sq;
#ifdef ATTNRES_CUDA
        model_forward_backward_shard_cuda(&t->device, x, y, n_targets, B, T, &dist,
                                          t->grad_shard, t->lo, t->hi, &local_loss, &sum_sq);
        double start = now_seconds();  // the reduce-scatter ran inside, on the GPU's stream
#else
        Model* h = t->host;
        model_forward_rows(h, x, y, n_targets, B, T);
        local_loss = h->kernels->sum(h->acts.losses, B * T);
        model_zero_grad(h);
        model_backward(h);
        double start = now_seconds();
        dist_reduce_scatter(&dist, t->grad_shard, h->grads_memory, h->num_params);
        sum_sq = sum_of_squares(t->grad_shard, t->hi - t->lo);
#endif
        double loss_sum = dist_sum(&dist, local_loss);
        *norm = (float)sqrt(dist_sum(&dist, sum_sq));
        t->comm_seconds += now_seconds() - start;
        return model_set_loss(trained_model(t), loss_sum);
    }
    (void)n_targets;
#ifdef ATTNRES_CUDA
    float loss;  // the GPU runs the whole step, then loss and norm come back in one read-back
    model_forward_backward_cuda(&t->device, x, y, B, T, &loss, norm);
#else
    float loss = model_forward(t->host, x, y, B, T);
    model_zero_grad(t->host);
    model_backward(t->host);
    *norm = model_grad_norm(t->host);
#endif
    return loss;
}

// clips the gradient to norm grad_clip (0 = off), then AdamW step adam_t (from 1)
static void trainer_update(Trainer* t, const Options* o, float norm, float lr, int adam_t) {
    // ZeRO-1: this rank's shard, then every rank gathers the whole. Unsharded, the shard is
    // the whole flat buffer, and model_update_shard over it is model_update.
    Model* trained = trained_model(t);
    size_t lo = SHARDED ? t->lo : 0, hi = SHARDED ? t->hi : trained->num_params;
    float* g = SHARDED ? t->grad_shard : trained->grads_memory;
    float* m = SHARDED ? t->m_shard : trained->m_memory;
    float* v = SHARDED ? t->v_shard : trained->v_memory;
    if (o->grad_clip > 0.0f && norm > o->grad_clip) {
#ifdef ATTNRES_CUDA
        dist_clip_shard_cuda(g, hi - lo, norm, o->grad_clip);
#else
        float scale = o->grad_clip / norm;
        for (size_t i = 0; i < hi - lo; i++) { g[i] *= scale; }
#endif
    }
    model_update_shard(trained, lo, hi, g, m, v, lr, o->beta1, o->beta2, o->adam_eps,
                       o->weight_decay, adam_t);
    if (!SHARDED) { return; }
    double start = now_seconds();
#ifdef ATTNRES_CUDA
    dist_all_gather_cuda(&dist, trained->params_memory, trained->num_params);
#else
    dist_all_gather(&dist, trained->params_memory, trained->num_params);
#endif
    t->comm_seconds += now_seconds() - start;
}

// the host Model gets the trained parameters and AdamW state (./train: it has them already)
static void trainer_to_host(Trainer* t) {
#ifdef ATTNRES_CUDA
    model_to_host_cuda(t->host, &t->device);
#endif
}

// the activations and raw gradients of the batch (x, y) on the host Model, for the
// diagnostics: ./train_cuda redoes the step's forward and backward there (logged steps only)
// (with several processes: rank 0 redoes the whole global batch, which x, y then are, on its
// host model: the shards' gradients are kept apart, in grad_shard)
static void trainer_host_gradients(Trainer* t, const int* x, const int* y, size_t B, size_t T) {
#ifdef ATTNRES_CUDA
    model_to_host_cuda(t->host, &t->device);
#else
    if (dist.world == 1) { return; }  // the host model trained on this very batch
#endif
    model_forward(t->host, x, y, B, T);
    model_zero_grad(t->host);
    model_backward(t->host);
}

static void trainer_free(Trainer* t) {
#ifdef ATTNRES_CUDA
    model_free_cuda(&t->device);
    float* shards[3] = {t->grad_shard, t->m_shard, t->v_shard};
    for (int k = 0; k < 3; k++) {
        if (shards[k] != NULL) { dist_shard_free_cuda(shards[k]); }
    }
#else
    free(t->grad_shard);
    free(t->m_shard);
    free(t->v_shard);
#endif
}

// "3,1,4" -> tokens (malloc'd), each in [0, V); returns the count or dies.
static size_t parse_token_list(const char* list, int** tokens, int V) {
    size_t n = 1;
    for (const char* c = list; *c; c++) { n += *c == ','; }
    *tokens = mallocCheck(n * sizeof(int));
    const char* s = list;
    for (size_t i = 0; i < n; i++) {
        char* end = NULL;
        errno = 0;
        long v = strtol(s, &end, 10);
        if (end == s || errno != 0 || v < 0 || v >= V || (*end != ',' && *end != '\0')) {
            die("--prompt-tokens '%s': expected token ids in [0, %d) separated by commas", list, V);
        }
        (*tokens)[i] = (int)v;
        s = end + 1;
    }
    return n;
}

// ---- --sample: generate from a checkpoint ------------------------------------------------
// The prompt is --prompt (bytes; V = 256 is read as a byte-level text model), --prompt-tokens,
// or for a task model the first held-out example of --task/--length/--symbols/--seed (pass
// the training's), whose expected answer is printed too.
typedef struct {
    int* prompt;
    size_t n_prompt;
    int* expected;      // the task's answer, NULL for text and --prompt-tokens
    size_t n_expected;
} Prompt;

static void check_sample_flags(const Options* o) {
    if (o->checkpoint == NULL) { die("--sample needs --checkpoint PATH"); }
    if (o->prompt != NULL && o->prompt_tokens != NULL) {
        die("give --prompt or --prompt-tokens, not both");
    }
    if (o->sample_tokens < 0 || o->top_k < 0 || o->temperature < 0.0f) {
        die("--tokens, --top-k and --temperature must not be negative");
    }
}

// the checkpoint's config, then a model built for it with the parameters loaded
static ModelConfig read_config(const char* path) {
    char err[ERROR_MAX];
    ModelConfig config;
    int step;
    if (checkpoint_read_config(path, &config, &step, err, sizeof(err)) != 0) { die("%s", err); }
    return config;
}

// the checkpoint's model (config: its read_config), its buffers for B x T positions
static void load_model(Model* model, const char* path, const ModelConfig* config, size_t B,
                       size_t T) {
    char err[ERROR_MAX];
    int step;
    model_build(model, config, B, T);
    if (checkpoint_load(model, path, &step, err, sizeof(err)) != 0) { die("%s", err); }
}

// the first held-out example of the task the flags describe: its prompt and separator, and
// its answer
static Prompt task_prompt(const Options* o, int V) {
    char err[ERROR_MAX];
    Dataset ds;
    if (dataset_init_task(&ds, o->task, o->length, o->symbols, (size_t)o->eval_examples,
                          o->seed, err, sizeof(err)) != 0) { die("%s", err); }
    if (ds.vocab_size != V) {
        die("checkpoint %s has V = %d, but --task %s --symbols %d gives V = %d", o->checkpoint,
            V, o->task, o->symbols, ds.vocab_size);
    }
    Prompt p;
    size_t T = (size_t)ds.seq_len;
    p.n_prompt = (size_t)ds.answer_start + 1;  // the prompt and the separator
    p.n_expected = (size_t)ds.answer_len;
    p.prompt = mallocCheck(T * sizeof(int));
    int* y = mallocCheck(T * sizeof(int));
    dataset_eval_batch(&ds, p.prompt, y, 1, 0);
    p.expected = mallocCheck(p.n_expected * sizeof(int));
    memcpy(p.expected, y + ds.answer_start, p.n_expected * sizeof(int));
    free(y);
    dataset_free(&ds);
    return p;
}

static Prompt make_prompt(const Options* o, int V, int is_text) {
    Prompt p = {NULL, 0, NULL, 0};
    if (o->prompt != NULL) {
        if (!is_text) {
            die("--prompt needs a text model (V = 256), this one has V = %d: use --prompt-tokens", V);
        }
        p.n_prompt = strlen(o->prompt);
        if (p.n_prompt == 0) { die("--prompt is empty"); }
        p.prompt = mallocCheck(p.n_prompt * sizeof(int));
        for (size_t i = 0; i < p.n_prompt; i++) { p.prompt[i] = (unsigned char)o->prompt[i]; }
    } else if (o->prompt_tokens != NULL) {
        p.n_prompt = parse_token_list(o->prompt_tokens, &p.prompt, V);
    } else if (is_text) {
        die("--sample with a text model needs --prompt \"text\" or --prompt-tokens");
    } else {
        p = task_prompt(o, V);
    }
    return p;
}

// a text model's bytes, printed as they are drawn (decoder_generate's TokenCallback)
static void print_byte(void* context, const int* tokens, size_t B) {
    (void)context;
    (void)B;
    putchar(tokens[0]);
    fflush(stdout);
}

// tasks: the three token lists, one per line
static void print_task_sample(const Prompt* p, const int* generated, size_t n_new) {
    const char* labels[] = {"prompt:   ", "generated:", "expected: "};
    const int* rows[] = {p->prompt, generated, p->expected};
    size_t lengths[] = {p->n_prompt, n_new, p->n_expected};
    for (int r = 0; r < 3 && rows[r] != NULL; r++) {
        printf("%s", labels[r]);
        for (size_t i = 0; i < lengths[r]; i++) { printf(" %d", rows[r][i]); }
        printf("\n");
    }
}

// The checkpoint's run record (version 2) gives --sample its defaults: the task, its length
// and symbols and the seed, when the flags do not say; and T, the context the model was
// trained on, which generation never exceeds. A flag that contradicts the record is refused.
// Returns T (0 for a version 1 checkpoint: no limit known).
static size_t sample_defaults(Options* o) {
    char err[ERROR_MAX];
    RunRecord run;
    int recorded;
    if (checkpoint_read_run(o->checkpoint, &run, &recorded, err, sizeof(err)) != 0) { die("%s", err); }
    if (!recorded) { return 0; }
    const char* trained = TASK_NAMES[run.task];
    if (!given(o, "--task")) { o->task = trained; }
    if (strcmp(o->task, trained) != 0) {
        die("checkpoint %s was trained on --task %s, not %s", o->checkpoint, trained, o->task);
    }
    const char* flags[] = {"--length", "--symbols"};
    int* values[] = {&o->length, &o->symbols};
    int recorded_values[] = {run.length, run.symbols};
    for (int i = 0; i < 2 && run.task != TASK_TEXT; i++) {
        if (!given(o, flags[i])) { *values[i] = recorded_values[i]; }
        if (*values[i] != recorded_values[i]) {
            die("checkpoint %s was trained with %s %d, not %d", o->checkpoint, flags[i],
                recorded_values[i], *values[i]);
        }
    }
    if (!given(o, "--seed")) { o->seed = run.seed; }
    if (!given(o, "--eval-examples")) { o->eval_examples = run.eval_examples; }
    return (size_t)run.seq_len;
}

// --sample reads the variant from the checkpoint; a variant flag that says otherwise is refused
static void check_sample_variant(const Options* o, const ModelConfig* trained) {
    const char* flags[] = {"--depth-score", "--key-norm", "--depth-query", "--depth-heads",
                           "--depth-window", "--mixing"};
    const int asked[] = {o->model.depth_score, o->model.key_norm_off, o->model.depth_query,
                         o->model.depth_heads > 1 ? o->model.depth_heads : 1,
                         o->model.depth_window, o->model.mixing};
    const int have[] = {trained->depth_score, trained->key_norm_off, trained->depth_query,
                        trained->depth_heads > 1 ? trained->depth_heads : 1,
                        trained->depth_window, trained->mixing};
    for (int i = 0; i < 6; i++) {
        if (given(o, flags[i]) && asked[i] != have[i]) {
            char variant[128];
            variant_describe(trained, variant, sizeof(variant));
            die("checkpoint %s was trained with %s (%s disagrees)", o->checkpoint, variant,
                flags[i]);
        }
    }
}

static int sample_main(const Options* flags) {
    Options options = *flags, *o = &options;
    check_sample_flags(o);
    size_t context = sample_defaults(o);
    ModelConfig config = read_config(o->checkpoint);
    check_sample_variant(o, &config);
    int V = config.vocab_size, is_text = V == 256;
    Prompt p = make_prompt(o, V, is_text);
    size_t n_new = o->sample_tokens > 0 ? (size_t)o->sample_tokens
                                        : (is_text ? 256 : (size_t)o->length);
    size_t positions = p.n_prompt + n_new - 1;  // the decoder holds at most the trained T
    size_t max_T = context > 0 && context < positions ? context : positions;
    // the model's buffers hold the longest prefill: the prompt, or a window of max_T once the
    // context slides (a version 1 checkpoint, whose T is not known, never slides)
    size_t prefill = max_T < positions ? max_T : p.n_prompt;
    Model model;
    load_model(&model, o->checkpoint, &config, 1, prefill);
    Decoder dec;
    decoder_build(&dec, &model, 1, max_T);
    int* generated = mallocCheck(n_new * sizeof(int));
    uint64_t rng = o->seed;
    if (is_text) {  // the prompt, then each byte as it comes
        for (size_t i = 0; i < p.n_prompt; i++) { putchar(p.prompt[i]); }
        fflush(stdout);
    }
    decoder_generate(&dec, 1, p.prompt, p.n_prompt, generated, n_new, o->temperature, o->top_k,
                     &rng, is_text ? print_byte : NULL, NULL);
    if (is_text) { putchar('\n'); }
    else { print_task_sample(&p, generated, n_new); }
    free(p.prompt);
    free(p.expected);
    free(generated);
    decoder_free(&dec);
    model_free(&model);
    return 0;
}

// ---- a training run, step by step --------------------------------------------------------
typedef struct {
    Options o;
    Dataset ds;
    Model model;          // on the host: evaluation, decoding, diagnostics, checkpoints
    Decoder decoder;      // rank 0: the evaluation's greedy decoding (decoder_rows x T)
    Trainer trainer;      // where the training step runs (the host model, or its GPU twin)
    Diagnostics diag;
    size_t B, T;          // the training batch
    int *x, *y, *work;    // (max(B, 64), T) inputs, targets, decoding scratch
    int start_step, end_step;
    EvalResult last;      // the latest evaluation
    double start_time, window_start, loss_window;  // progress since the last log line
    int window_steps;
    int saved_step;       // the step of the last checkpoint this run wrote (0: none yet)
    int best_step;        // the best validation loss so far (PATH.best) and its step
    float best_val_loss;
    size_t memory_bytes;  // what the run allocates (check_memory)
    double step_seconds;  // the training steps' time, evaluation left out
} Run;

// MemAvailable of /proc/meminfo in bytes: what can be allocated without swapping; 0 if unknown
static size_t available_memory(void) {
    FILE* f = fopen("/proc/meminfo", "r");
    if (f == NULL) { return 0; }
    char line[256];
    size_t kib = 0;
    while (fgets(line, sizeof(line), f) != NULL) {
        if (sscanf(line, "MemAvailable: %zu kB", &kib) == 1) { break; }
    }
    fclose(f);
    return kib * 1024;
}

// the task or text file fixes V and T
static void load_data(Run* r) {
    Options* o = &r->o;
    char err[ERROR_MAX];
    int status;
    if (strcmp(o->task, "text") == 0) {
        if (o->text_path == NULL) { die("--task text needs --text FILE"); }
        if (o->seq_len == 0) { o->seq_len = 64; }
        status = dataset_init_text(&r->ds, o->text_path, o->seq_len, TEXT_MAX_BYTES, o->seed, err,
                                   sizeof(err));
    } else {
        if (o->seq_len != 0 && o->seq_len != 2 * o->length) {
            die("--seq-len %d does not fit the task: --length %d needs T = 2 * length = %d",
                o->seq_len, o->length, 2 * o->length);
        }
        // the held-out set is built first: one larger than the memory there is is refused
        size_t bytes = dataset_task_bytes(o->length, (size_t)o->eval_examples);
        size_t available = available_memory();
        if (available > 0 && bytes > available) {
            die("--eval-examples %d would take %.2f GiB (with --length %d), more than the %.2f "
                "GiB available", o->eval_examples, (double)bytes / 1073741824.0, o->length,
                (double)available / 1073741824.0);
        }
        status = dataset_init_task(&r->ds, o->task, o->length, o->symbols,
                                   (size_t)o->eval_examples, o->seed, err, sizeof(err));
    }
    if (status != 0) { die("%s", err); }
    o->model.vocab_size = r->ds.vocab_size;
    if (model_config_check(&o->model, err, sizeof(err)) != 0) { die("%s", err); }
}

// what a checkpoint records of this run (checkpoint.h): the settings that make it this run
static RunRecord run_record(const Run* r) {
    const Options* o = &r->o;
    RunRecord run;
    memset(&run, 0, sizeof(run));
    run.task = (int)r->ds.kind;
    int text = r->ds.kind == TASK_TEXT;
    run.length = text ? 0 : o->length;
    run.symbols = text ? 0 : o->symbols;
    run.seq_len = r->ds.seq_len;
    run.batch = o->batch;
    run.steps = o->steps;
    run.warmup = o->warmup;
    run.eval_examples = o->eval_examples;
    run.seed = o->seed;
    run.lr = o->lr;
    run.final_lr_frac = o->final_lr_frac;
    run.weight_decay = o->weight_decay;
    run.grad_clip = o->grad_clip;
    run.beta1 = o->beta1;
    run.beta2 = o->beta2;
    run.adam_eps = o->adam_eps;
    if (text) {
        const char* slash = strrchr(o->text_path, '/');
        snprintf(run.text_name, sizeof(run.text_name), "%s", slash ? slash + 1 : o->text_path);
        run.text_bytes = r->ds.n_text;
    }
    run.best_step = r->best_step;
    run.best_val_loss = r->best_val_loss;
    return run;
}

// --resume: the checkpoint must come from this very run (same task, data, batch, schedule,
// optimiser, seed), or the resumed losses would not continue the interrupted ones. Each
// difference is refused naming its flag. Version 1 checkpoints record no run: not checked.
static void check_resumed_run(Run* r) {
    const Options* o = &r->o;
    char err[ERROR_MAX];
    RunRecord was, now = run_record(r);
    int recorded;
    if (checkpoint_read_run(o->checkpoint, &was, &recorded, err, sizeof(err)) != 0) { die("%s", err); }
    if (!recorded) {
        printf("note: checkpoint %s (version 1) does not record its run: flags not checked\n",
               o->checkpoint);
        return;
    }
    r->best_step = was.best_step;
    r->best_val_loss = was.best_val_loss;
    const char* fix = "resume with the training's flags, or start a new run";
    if (was.task != now.task) {
        die("checkpoint %s was trained on --task %s, this run has --task %s (%s)", o->checkpoint,
            TASK_NAMES[was.task], TASK_NAMES[now.task], fix);
    }
    if (strcmp(was.text_name, now.text_name) != 0 || was.text_bytes != now.text_bytes) {
        die("checkpoint %s was trained on --text %s (%llu bytes), this run reads %s (%llu "
            "bytes) (%s)", o->checkpoint, was.text_name, was.text_bytes, now.text_name,
            now.text_bytes, fix);
    }
    const char* int_flags[] = {"--length", "--symbols", "--seq-len", "--batch", "--steps",
                               "--warmup", "--eval-examples"};
    int int_was[] = {was.length, was.symbols, was.seq_len, was.batch, was.steps, was.warmup,
                     was.eval_examples};
    int int_now[] = {now.length, now.symbols, now.seq_len, now.batch, now.steps, now.warmup,
                     now.eval_examples};
    for (int i = 0; i < 7; i++) {
        if (int_was[i] != int_now[i]) {
            die("checkpoint %s was trained with %s %d, this run has %s %d (%s)", o->checkpoint,
                int_flags[i], int_was[i], int_flags[i], int_now[i], fix);
        }
    }
    if (was.seed != now.seed) {
        die("checkpoint %s was trained with --seed %llu, this run has --seed %llu (%s)",
            o->checkpoint, was.seed, now.seed, fix);
    }
    const char* float_flags[] = {"--lr", "--final-lr-frac", "--weight-decay", "--grad-clip",
                                 "--beta1", "--beta2"};
    float float_was[] = {was.lr, was.final_lr_frac, was.weight_decay, was.grad_clip, was.beta1,
                         was.beta2};
    float float_now[] = {now.lr, now.final_lr_frac, now.weight_decay, now.grad_clip, now.beta1,
                         now.beta2};
    for (int i = 0; i < 6; i++) {
        if (float_was[i] != float_now[i]) {
            die("checkpoint %s was trained with %s %g, this run has %s %g (%s)", o->checkpoint,
                float_flags[i], (double)float_was[i], float_flags[i], (double)float_now[i], fix);
        }
    }
}

// A checkpoint path that cannot be written is found now, not at the first evaluation: write
// and remove PATH.tmp.<pid> (what checkpoint_save writes first).
static void check_checkpoint_path(const char* path) {
    struct stat info;
    if (stat(path, &info) == 0 && S_ISDIR(info.st_mode)) {
        die("--checkpoint %s is a directory, not a file", path);
    }
    if (!replaceable_by_rename(path)) {  // a device, a pipe, a socket
        die("--checkpoint %s is not a regular file: a checkpoint is renamed over its path, and "
            "would replace it", path);
    }
    char tmp[4096];
    if (checkpoint_temp_path(tmp, sizeof(tmp), path) != 0) {
        die("--checkpoint path is too long");
    }
    FILE* f = fopen(tmp, "wb");
    if (f == NULL) { die("cannot write checkpoint %s: %s", tmp, strerror(errno)); }
    fclose(f);
    remove(tmp);
}

// The sequences the evaluation decodes at once: tasks, an evaluation batch of prompts; text,
// the one sample it prints
static size_t decoder_rows(const Run* r, size_t eval_B) {
    return r->ds.kind == TASK_TEXT ? 1 : eval_B;
}

// What the run will allocate, before it does: parameters, gradients and AdamW state (4 floats
// per parameter), the activations of the evaluation batch (the size table of model.h), the
// evaluation's decoder, the batch buffers, and the data (allocated before, counted here). A
// run that does not fit in the memory available is refused: it would swap for minutes (or be
// killed) rather than train.
static void check_memory(Run* r, size_t eval_B) {
    const ModelConfig* c = &r->o.model;
    size_t sizes[N_PARAM_TENSORS];
    size_t params = param_sizes(c, sizes);
    Activations sizing;
    sizing.sub = mallocCheck((size_t)(2 * c->n_layers + 1) * sizeof(SubLayer));
    size_t activations = point_activations(&sizing, c, eval_B, r->T, 1, NULL);
    free(sizing.sub);
    // parameters and gradients whole; the AdamW moments (and, with several processes, the
    // summed gradients) of this process's shard alone
    size_t world = (size_t)dist.world, shard = (params + world - 1) / world;
    size_t state = world == 1 ? 4 * params : 2 * params + 3 * shard;
    // rank 0's decoder for the evaluation
    size_t decoder = dist.rank == 0 ? decoder_floats(c, decoder_rows(r, eval_B), r->T) : 0;
    r->memory_bytes = (state + activations + decoder) * sizeof(float)
                      + 3 * eval_B * r->T * sizeof(int) + dataset_bytes(&r->ds);
    size_t available = available_memory();
    if (available > 0 && r->memory_bytes > available) {
        size_t maps = (size_t)c->n_layers * eval_B * (size_t)c->n_heads * r->T * r->T * sizeof(float);
        die("this run needs %.2f GiB (%.2f GiB of them attention maps, which grow with T^2), "
            "more than the %.2f GiB available: lower --seq-len or --batch (or --d, --L)",
            (double)r->memory_bytes / 1073741824.0, (double)maps / 1073741824.0,
            (double)available / 1073741824.0);
    }
}

// the model, initialised or resumed, its trainer, and the batch buffers
static void build_model(Run* r) {
    const Options* o = &r->o;
    char err[ERROR_MAX];
    r->B = (size_t)o->batch;
    r->T = (size_t)r->ds.seq_len;
    size_t eval_B = r->B < 64 ? 64 : r->B;  // evaluation runs in bigger batches
    check_memory(r, eval_B);
    model_build(&r->model, &o->model, eval_B, r->T);
    model_init_params(&r->model, o->seed);
    r->start_step = 0;
    if (o->resume) {
        if (checkpoint_load(&r->model, o->checkpoint, &r->start_step, err, sizeof(err)) != 0) {
            die("%s", err);
        }
        if (r->start_step > o->steps) {
            die("checkpoint %s is at step %d, beyond --steps %d", o->checkpoint, r->start_step,
                o->steps);
        }
        check_resumed_run(r);
    }
    r->x = mallocCheck(eval_B * r->T * sizeof(int));
    r->y = mallocCheck(eval_B * r->T * sizeof(int));
    r->work = mallocCheck(eval_B * r->T * sizeof(int));
    if (dist.rank == 0) { decoder_build(&r->decoder, &r->model, decoder_rows(r, eval_B), r->T); }
    trainer_init(&r->trainer, &r->model, r->B, r->T);
    // --stop-after interrupts the run early, as a crash would
    r->end_step = o->steps;
    if (o->stop_after > 0 && r->start_step + o->stop_after < o->steps) {
        r->end_step = r->start_step + o->stop_after;
    }
}

// how the threads wait, for the header: the policy the user set, or the spin before sleeping
static void describe_waiting(char* out, size_t len) {
    const char* policy = getenv("OMP_WAIT_POLICY");
    const char* spin = getenv("GOMP_SPINCOUNT");
    if (policy != NULL && spin != NULL) { snprintf(out, len, "%s waiting, spin %s", policy, spin); }
    else if (policy != NULL) { snprintf(out, len, "%s waiting", policy); }
    else if (spin != NULL) { snprintf(out, len, "spin %s, then sleep", spin); }
    else { snprintf(out, len, "libgomp's default waiting"); }
}

static void print_header(const Run* r) {
    const Options* o = &r->o;
    const ModelConfig* c = &o->model;
    char waiting[128];
    describe_waiting(waiting, sizeof(waiting));
    printf("attnres.c | mode %s (S=%d) | d=%d L=%d H=%d G=%d F=%d V=%d | params %zu | "
           "task %s T=%zu B=%zu | threads %d (%s) | memory %.1f MiB\n", o->mode,
           c->block_size, c->d_model, c->n_layers, c->n_heads, c->n_kv_heads, c->ffn_hidden,
           c->vocab_size, r->model.num_params, o->task, r->T, r->B, omp_get_max_threads(),
           waiting, (double)r->memory_bytes / 1048576.0);
    char variant[128];
    variant_describe(c, variant, sizeof(variant));
    if (strcmp(variant, "no variant") != 0) { printf("depth-attention variant: %s\n", variant); }
    if (dist.world > 1) {
        printf("data parallel: %d processes, %d rows of each batch apiece; ZeRO-1: each keeps "
               "the AdamW moments of 1/%d of the parameters (memory above is per process)\n",
               dist.world, o->batch / dist.world, dist.world);
    }
    if (r->start_step > 0) { printf("resumed from %s at step %d\n", o->checkpoint, r->start_step); }
}

static void open_diagnostics(Run* r, int argc, char** argv) {
    diagnostics_init(&r->diag, &r->o.model);
    if (dist.rank != 0) { r->o.diagnostics = NULL; }  // rank 0 measures and writes
    if (r->o.diagnostics == NULL) { return; }
    char command[4096], err[512];
    command_line(command, sizeof(command), argc, argv);
    if (diagnostics_open(&r->diag, r->o.diagnostics, r->o.resume ? r->start_step : -1, command,
                         err, sizeof(err)) != 0) {
        die("%s", err);
    }
}

// "training stopped", and where a good checkpoint is: the last one this run wrote, or the
// one it resumed from (never overwritten by a NaN model)
static void stop_on_nan(const Run* r, const char* what, int step, const char* detail) {
    char where[4200] = "";
    if (r->saved_step > 0) {
        snprintf(where, sizeof(where), "; the last good checkpoint is %s (step %d)",
                 r->o.checkpoint, r->saved_step);
    } else if (r->o.resume) {
        snprintf(where, sizeof(where), "; %s, which it resumed from, is unchanged",
                 r->o.checkpoint);
    }
    if (dist.rank == 0) {  // every rank sees the same loss and norm
        fprintf(stderr, "error: %s at step %d%s; training stopped%s\n", what, step, detail,
                where);
    }
    let_rank0_speak();
    dist_abort(1);
}

// forward, backward, the NaN check, the layer diagnostics (raw gradients), then clipping and
// AdamW; returns the loss
static float train_step(Run* r, int step, float* norm, float* lr) {
    const Options* o = &r->o;
    // every rank draws the same global batch and trains on its own B/world rows of it
    dataset_train_batch(&r->ds, r->x, r->y, r->B, (uint64_t)step);
    size_t rows = r->B / (size_t)dist.world, first = (size_t)dist.rank * rows * r->T;
    float loss = trainer_forward_backward(&r->trainer, r->x + first, r->y + first, rows, r->T,
                                          crossentropy_count(r->y, r->B * r->T), norm);
    if (!isfinite(loss) || !isfinite(*norm)) {
        char detail[64];
        snprintf(detail, sizeof(detail), " (gradient norm %g)", (double)*norm);
        stop_on_nan(r, isfinite(loss) ? "loss is finite but the gradient is not" : "loss is NaN/Inf",
                    step + 1, detail);
    }
    int done = step + 1;
    if (o->diagnostics != NULL && (done % o->log_every == 0 || done == r->end_step)) {
        trainer_host_gradients(&r->trainer, r->x, r->y, r->B, r->T);
        diagnostics_measure_layers(&r->diag, &r->model);  // before clipping: the raw gradients
        if (diagnostics_write_layers(&r->diag, done) != 0) { die("%s", r->diag.error); }
    }
    *lr = learning_rate(o, step);
    trainer_update(&r->trainer, o, *norm, *lr, done);
    return loss;
}

// every --log-every steps: the mean loss since the last line, lr, norm and speed
static void log_progress(Run* r, int done, float loss, float lr, float norm) {
    r->loss_window += loss;
    r->window_steps++;
    if (done % r->o.log_every != 0 && done != r->end_step) { return; }
    double now = now_seconds(), elapsed = now - r->window_start;
    double mean_loss = r->loss_window / r->window_steps;
    double ms_per_step = 1000.0 * elapsed / r->window_steps;
    printf("step %5d/%d | loss %.4f | lr %.2e | norm %6.3f | %8.0f tok/s | %7.2f ms/step\n",
           done, r->o.steps, mean_loss, (double)lr, (double)norm,
           (double)((size_t)r->window_steps * r->B * r->T) / elapsed, ms_per_step);
    fflush(stdout);
    if (diagnostics_write_train(&r->diag, done, (float)mean_loss, lr, norm,
                                (float)ms_per_step) != 0) {
        die("%s", r->diag.error);
    }
    r->loss_window = 0.0;
    r->window_steps = 0;
    r->window_start = now;
}

static void print_eval(const char* prefix, const EvalResult* e) {
    printf("%s | val_loss %.4f | accuracy %.2f%%", prefix, (double)e->val_loss,
           (double)e->accuracy);
    if (e->exact_match >= 0.0f) { printf(" | exact_match %.2f%%", (double)e->exact_match); }
}

// PATH always (the latest), and PATH.best when this evaluation is the best so far
static void save_checkpoints(Run* r, int done) {
    char err[ERROR_MAX], best_path[4200];
    snprintf(best_path, sizeof(best_path), "%s.best", r->o.checkpoint);
    int best = r->best_step == 0 || r->last.val_loss < r->best_val_loss;
    if (best) {
        r->best_step = done;
        r->best_val_loss = r->last.val_loss;
    }
    RunRecord run = run_record(r);
    if ((best && checkpoint_save(&r->model, &run, best_path, done, err, sizeof(err)) != 0) ||
        checkpoint_save(&r->model, &run, r->o.checkpoint, done, err, sizeof(err)) != 0) {
        die("%s", err);
    }
    r->saved_step = done;
}

// text runs: what the model writes now, greedy, after the first bytes of the validation text
static void print_text_sample(Run* r) {
    const size_t n_prompt = 24, n_new = 72;
    if (r->T < n_prompt) { return; }
    dataset_eval_batch(&r->ds, r->x, r->y, 1, 0);
    int out[72];
    decoder_generate(&r->decoder, 1, r->x, n_prompt, out, n_new, 0.0f, 0, NULL, NULL, NULL);
    printf("sample: \"");
    const int* parts[] = {r->x, out};
    size_t lengths[] = {n_prompt, n_new};
    for (int k = 0; k < 2; k++) {
        if (k == 1) { printf("\" -> \""); }
        for (size_t i = 0; i < lengths[k]; i++) {
            int c = parts[k][i];
            if (c == '\n') { printf("\\n"); }
            else if (c == '"' || c == '\\') { printf("\\%c", c); }
            else if (c >= 32 && c < 127) { putchar(c); }
            else { printf("\\x%02x", c); }
        }
    }
    printf("\"\n");
}

// every --eval-every steps: evaluate, checkpoint (never a NaN model), diagnostics
static void evaluate_and_save(Run* r, int done) {
    const Options* o = &r->o;
    double eval_start = now_seconds();
    // several processes: the moments come together on rank 0 (every rank takes part), which
    // alone evaluates and writes; the others go on to the next step and wait for it there
    if (o->checkpoint != NULL) { trainer_gather_moments(&r->trainer); }
    if (dist.rank != 0) { return; }
    trainer_to_host(&r->trainer);
    r->last = evaluate(&r->model, &r->decoder, &r->ds, o, r->x, r->y, r->work);
    char prefix[32];
    snprintf(prefix, sizeof(prefix), "eval step %5d", done);
    print_eval(prefix, &r->last);
    printf("\n");
    fflush(stdout);
    if (!isfinite(r->last.val_loss)) { stop_on_nan(r, "validation loss is NaN/Inf", done, ""); }
    if (o->checkpoint != NULL) {
        save_checkpoints(r, done);
        trainer_drop_moments(&r->trainer);
    }
    if (r->ds.kind == TASK_TEXT) { print_text_sample(r); }
    if (o->diagnostics != NULL) {
        measure_eval_alpha(&r->model, &r->ds, o, r->x, r->y, &r->diag);
        if (diagnostics_write_eval(&r->diag, done, r->last.val_loss, r->last.accuracy,
                                   r->last.exact_match) != 0 ||
            diagnostics_write_alpha(&r->diag, done) != 0) {
            die("%s", r->diag.error);
        }
    }
    r->window_start += now_seconds() - eval_start;  // keep eval time out of ms/step
}

// the final line, then the depth-attention heatmap on the first eval batch
static void finish(Run* r) {
    if (dist.rank != 0) { return; }
    char prefix[32];
    snprintf(prefix, sizeof(prefix), "final | steps %d", r->end_step);
    print_eval(prefix, &r->last);
    printf(" | time %.1f s\n", now_seconds() - r->start_time);
    if (r->o.checkpoint != NULL && r->best_step > 0) {
        printf("checkpoints: %s is the latest (step %d); %s.best the best (val_loss %.4f at "
               "step %d)\n", r->o.checkpoint, r->saved_step > 0 ? r->saved_step : r->start_step,
               r->o.checkpoint, (double)r->best_val_loss, r->best_step);
    }
    int steps = r->end_step - r->start_step;
    if (dist.world > 1 && steps > 0) {
        // ring reduce-scatter and all-gather: each process sends (and receives) (P-1)/P of
        // the flat buffer for each
        double mb = 2.0 * (double)(dist.world - 1) / dist.world * 4.0 * r->model.num_params / 1e6;
        printf("data parallel: %d processes | collectives %.2f ms/step, %.1f%% of the step's "
               "%.2f ms | %.1f MB sent and received by each process per step\n", dist.world,
               1000.0 * r->trainer.comm_seconds / steps,
               100.0 * r->trainer.comm_seconds / r->step_seconds, 1000.0 * r->step_seconds / steps,
               mb);
    }
    if (r->o.model.block_size > 0) {
        measure_eval_alpha(&r->model, &r->ds, &r->o, r->x, r->y, &r->diag);
        diagnostics_print_heatmap(&r->diag, stdout);
    }
}

static void free_run(Run* r) {
    diagnostics_free(&r->diag);
    free(r->x);
    free(r->y);
    free(r->work);
    decoder_free(&r->decoder);
    trainer_free(&r->trainer);
    model_free(&r->model);
    dataset_free(&r->ds);
}

// How OpenMP threads wait for work. libgomp's default spins for ~3 ms before sleeping, and a
// run slows down, or collapses, when other programs keep the cores busy (on 2 cores under
// two busy loops, 100 steps of the default model: 6.0-9.7 s by default, 7.8-22.5 s spinning,
// and 18-33 s and 43-59 s in an earlier measurement). Sleeping at once
// (OMP_WAIT_POLICY=passive) costs a wake-up in every parallel region instead: the default
// model then steps in 18.8-19.3 ms on 2 threads, slower than on 1 (16.3-16.6 ms). A spin of
// 1000 rounds (microseconds) before sleeping: 12.2-12.3 ms a step on a quiet machine, and
// under the two busy loops 4.5-5.3 s for the 100 steps (sleeping at once 2.5-11.2 s).
// Measured 2026-11-27 (README, "Threads and memory"). Unless the user chose (OMP_WAIT_POLICY or
// GOMP_SPINCOUNT), that is what threads do. libgomp reads the variables when it loads,
// before main runs, so the program starts itself again with GOMP_SPINCOUNT set (if that
// fails, it runs on as it is).
static void wait_briefly(char** argv) {
    if (getenv("OMP_WAIT_POLICY") != NULL || getenv("GOMP_SPINCOUNT") != NULL) { return; }
    setenv("GOMP_SPINCOUNT", "1000", 1);
    execv("/proc/self/exe", argv);
}

// Several processes (mpirun): every rank must have been started with the same flags, or
// they would train different runs and wait on each other forever
static void check_same_flags(int argc, char** argv) {
    unsigned long long hash = 14695981039346656037ull;  // FNV-1a over the arguments
    for (int i = 1; i < argc; i++) {
        for (const char* c = argv[i]; ; c++) {
            hash = (hash ^ (unsigned char)*c) * 1099511628211ull;
            if (*c == '\0') { break; }
        }
    }
    int other = 0;
    if (!dist_same(&dist, hash, &other)) {
        die("the processes were started with different flags (rank %d's differ from rank 0's)",
            other);
    }
}

// OpenMP threads: --threads, or all the cores (with several processes on this machine, its
// share of them, within the cores mpirun lets it use); a warning when that is more than the
// cores there are, an error past MAX_THREADS_PER_CORE times the machine's cores: threads
// that take turns on a core wait for each other at every parallel region (on 2 cores, one
// step of a d=16 model took 37 s with 4096 threads), and libgomp itself fails past some tens
// of thousands (a crash at 100000)
#define MAX_THREADS_PER_CORE 8
static void set_threads(const Options* o) {
    int mine = omp_get_num_procs(), machine = (int)sysconf(_SC_NPROCESSORS_ONLN);
    if (machine < mine) { machine = mine; }
    if (o->threads > MAX_THREADS_PER_CORE * machine) {
        die("--threads %d is more than %d per core (%d cores here): at most %d", o->threads,
            MAX_THREADS_PER_CORE, machine, MAX_THREADS_PER_CORE * machine);
    }
    if (o->threads > 0) { omp_set_num_threads(o->threads); }
    else if (dist.local_size > 1) {
        int share = machine / dist.local_size;
        omp_set_num_threads(share < 1 ? 1 : share > mine ? mine : share);
    }
    if (dist.local_size == 1 && o->threads > mine) {
        fprintf(stderr, "warning: --threads %d is more than the %d cores here: expect it to be "
                "slower, not faster\n", o->threads, mine);
    } else if (dist.local_size > 1 && dist.rank == 0 &&
               (o->threads > mine || o->threads * dist.local_size > machine)) {
        fprintf(stderr, "warning: --threads %d in each of %d processes is more than this "
                "machine's %d cores (or the %d each process may use): expect it to be slower, "
                "not faster\n", o->threads, dist.local_size, machine, mine);
    }
}

// Several processes (mpirun): the same flags everywhere, a batch they can share, rank 0 alone
// printing
static void check_processes(const Options* o, int argc, char** argv) {
    if (dist.rank != 0 && freopen("/dev/null", "w", stdout) == NULL) {
        die("cannot silence rank %d's output", dist.rank);
    }
    check_same_flags(argc, argv);
    if (o->batch % dist.world != 0) {
        die("--batch %d does not divide among %d processes (each takes an equal share of "
            "every batch)", o->batch, dist.world);
    }
    if (o->sample && dist.world > 1) { die("--sample runs in one process: start it without mpirun"); }
}

int main(int argc, char** argv) {
    wait_briefly(argv);
    dist_init(&dist, &argc, &argv);
    Run r = {0};
    r.o = defaults();
    parse_flags(&r.o, argc, argv);
    validate(&r.o);
    check_processes(&r.o, argc, argv);
    set_threads(&r.o);
    if (r.o.sample) {  // decoding runs on the host, in every binary
        int status = sample_main(&r.o);
        dist_finalize();
        return exit_status(status);
    }
#ifdef ATTNRES_CUDA
    const char* problem = cuda_device_problem();
    if (problem != NULL) { die("%s", problem); }
    dist_init_cuda(&dist);  // this process's GPU, and NCCL between the processes (MPI build)
    if (r.o.cublas) { model_use_cublas_cuda(1); }
#endif
    if (r.o.checkpoint != NULL && dist.rank == 0) { check_checkpoint_path(r.o.checkpoint); }
    load_data(&r);
    build_model(&r);
    print_header(&r);
    open_diagnostics(&r, argc, argv);

    setting_up = 0;
    r.last = (EvalResult){NAN, NAN, NAN};
    r.start_time = r.window_start = now_seconds();
    if (r.start_step == r.end_step && dist.rank == 0) {
        r.last = evaluate(&r.model, &r.decoder, &r.ds, &r.o, r.x, r.y, r.work);
    }
    for (int step = r.start_step; step < r.end_step; step++) {
        float norm, lr;
        double step_start = now_seconds();
        float loss = train_step(&r, step, &norm, &lr);
        r.step_seconds += now_seconds() - step_start;
        log_progress(&r, step + 1, loss, lr, norm);
        if ((step + 1) % r.o.eval_every == 0 || step + 1 == r.end_step) {
            evaluate_and_save(&r, step + 1);
        }
    }
    finish(&r);
    free_run(&r);
#ifdef ATTNRES_CUDA
    dist_finalize_cuda();
#endif
    dist_finalize();
    return exit_status(0);
}
