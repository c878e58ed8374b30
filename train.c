// train.c — the attnres.c trainer: parse flags, build the model and data, train with AdamW
// (warmup + cosine decay, gradient clipping), evaluate, checkpoint, resume.
// Run `./train --help` for the flags. Start reading at main() at the bottom.
#define _POSIX_C_SOURCE 200809L  // clock_gettime
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <omp.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "checkpoint.h"
#include "dataset.h"
#include "diagnostics.h"
#include "inference.h"
#include "model.h"
#include "util.h"
#ifdef ATTNRES_CUDA
#include "model.cuh"
#endif

typedef struct {
    ModelConfig model;       // vocab_size is set by the data
    const char* mode;        // none | full | block
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
static void die(const char* fmt, ...) {
    va_list args;
    va_start(args, fmt);
    fprintf(stderr, "error: ");
    vfprintf(stderr, fmt, args);
    fprintf(stderr, "\n");
    va_end(args);
    exit(1);
}

static void parse_flags(Options* o, int argc, char** argv) {
    Flag flags[MAX_FLAGS];
    int n = flag_table(o, flags);
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
            print_help();
            exit(0);
        }
        const Flag* f = NULL;
        for (int j = 0; j < n; j++) {
            if (strcmp(argv[i], flags[j].flag) == 0) { f = &flags[j]; }
        }
        if (f == NULL) { die("unknown flag '%s' (see ./train --help)", argv[i]); }
        if (f->kind == OPT_SWITCH) { *(int*)f->value = 1; continue; }
        if (i + 1 >= argc) { die("flag '%s' needs a value", f->flag); }
        const char* s = argv[++i];
        char* end = NULL;
        errno = 0;
        if (f->kind == OPT_INT) {
            long v = strtol(s, &end, 10);
            if (*s == '\0' || *end != '\0' || errno != 0 || v < INT_MIN || v > INT_MAX) {
                die("flag '%s' expects an integer, got '%s'", f->flag, s);
            }
            *(int*)f->value = (int)v;
        } else if (f->kind == OPT_U64) {
            unsigned long long v = strtoull(s, &end, 10);
            if (*s == '\0' || *s == '-' || *end != '\0' || errno != 0) {
                die("flag '%s' expects a non-negative integer, got '%s'", f->flag, s);
            }
            *(unsigned long long*)f->value = v;
        } else if (f->kind == OPT_FLOAT) {
            float v = strtof(s, &end);
            if (*s == '\0' || *end != '\0' || errno != 0 || !isfinite(v)) {
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
    if (o->resume && o->checkpoint == NULL) { die("--resume needs --checkpoint PATH"); }
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
// All rows decode in lockstep with the cached decoder (inference.h), one position per step.
// Returns the number of rows whose whole answer equals the target in y.
static size_t greedy_exact_matches(Model* m, const Dataset* ds, const int* x, const int* y,
                                   size_t rows, int* work) {
    size_t T = (size_t)ds->seq_len, start = (size_t)ds->answer_start;
    size_t n_prompt = start + 1, n_answer = (size_t)ds->answer_len;  // prompt + separator
    for (size_t r = 0; r < rows; r++) {
        memcpy(work + r * n_prompt, x + r * T, n_prompt * sizeof(int));
    }
    int* answer = mallocCheck(rows * n_answer * sizeof(int));
    Decoder dec;
    decoder_build(&dec, m, rows, n_prompt + n_answer - 1);
    decoder_generate(&dec, work, n_prompt, answer, n_answer, 0.0f, 0, NULL);  // greedy
    decoder_free(&dec);
    size_t matches = 0;
    for (size_t r = 0; r < rows; r++) {
        int ok = 1;
        for (size_t i = 0; i < n_answer; i++) { ok &= answer[r * n_answer + i] == y[r * T + start + i]; }
        matches += (size_t)ok;
    }
    free(answer);
    return matches;
}

static EvalResult evaluate(Model* m, const Dataset* ds, const Options* o, int* x, int* y,
                           int* work) {
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
        if (ds->kind != TASK_TEXT) { matches += greedy_exact_matches(m, ds, x, y, b, work); }
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

static void save_checkpoint(const Model* m, const Options* o, int step) {
    char err[512];
    if (checkpoint_save(m, o->checkpoint, step, err, sizeof(err)) != 0) {
        die("%s", err);
    }
}

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
} Trainer;

// host holds the initial (or resumed) parameters; B, T is the training batch
static void trainer_init(Trainer* t, Model* host, size_t B, size_t T) {
    t->host = host;
#ifdef ATTNRES_CUDA
    model_build_cuda(&t->device, &host->config, B, T);
    model_to_device_cuda(&t->device, host);
#endif
}

// forward and backward on the batch (x, y); returns the loss, and the global gradient norm
// in *norm
static float trainer_forward_backward(Trainer* t, const int* x, const int* y, size_t B,
                                      size_t T, float* norm) {
#ifdef ATTNRES_CUDA
    float loss = model_forward_cuda(&t->device, x, y, B, T);
    model_zero_grad_cuda(&t->device);
    model_backward_cuda(&t->device);
    *norm = model_grad_norm_cuda(&t->device);
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
    int clip = o->grad_clip > 0.0f && norm > o->grad_clip;
#ifdef ATTNRES_CUDA
    if (clip) { model_clip_gradients_cuda(&t->device, norm, o->grad_clip); }
    model_update_cuda(&t->device, lr, o->beta1, o->beta2, o->adam_eps, o->weight_decay, adam_t);
#else
    if (clip) {
        float scale = o->grad_clip / norm;
        for (size_t i = 0; i < t->host->num_params; i++) { t->host->grads_memory[i] *= scale; }
    }
    model_update(t->host, lr, o->beta1, o->beta2, o->adam_eps, o->weight_decay, adam_t);
#endif
}

// the host Model gets the trained parameters and AdamW state (./train: it has them already)
static void trainer_to_host(Trainer* t) {
#ifdef ATTNRES_CUDA
    model_to_host_cuda(t->host, &t->device);
#endif
}

// the activations and raw gradients of the batch (x, y) on the host Model, for the
// diagnostics: ./train_cuda redoes the step's forward and backward there (logged steps only)
static void trainer_host_gradients(Trainer* t, const int* x, const int* y, size_t B, size_t T) {
#ifdef ATTNRES_CUDA
    model_to_host_cuda(t->host, &t->device);
    model_forward(t->host, x, y, B, T);
    model_zero_grad(t->host);
    model_backward(t->host);
#endif
}

static void trainer_free(Trainer* t) {
#ifdef ATTNRES_CUDA
    model_free_cuda(&t->device);
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
static void load_model(Model* model, const char* path) {
    char err[512];
    ModelConfig config;
    int step;
    if (checkpoint_read_config(path, &config, &step, err, sizeof(err)) != 0) { die("%s", err); }
    model_build(model, &config, 1, 1);
    if (checkpoint_load(model, path, &step, err, sizeof(err)) != 0) { die("%s", err); }
}

// the first held-out example of the task the flags describe: its prompt and separator, and
// its answer
static Prompt task_prompt(const Options* o, int V) {
    char err[512];
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

// text: the prompt and the generated bytes; tasks: the three token lists, one per line
static void print_sample(const Prompt* p, const int* generated, size_t n_new, int is_text) {
    if (is_text) {
        for (size_t i = 0; i < p->n_prompt; i++) { putchar(p->prompt[i]); }
        for (size_t i = 0; i < n_new; i++) { putchar(generated[i]); }
        putchar('\n');
        return;
    }
    const char* labels[] = {"prompt:   ", "generated:", "expected: "};
    const int* rows[] = {p->prompt, generated, p->expected};
    size_t lengths[] = {p->n_prompt, n_new, p->n_expected};
    for (int r = 0; r < 3 && rows[r] != NULL; r++) {
        printf("%s", labels[r]);
        for (size_t i = 0; i < lengths[r]; i++) { printf(" %d", rows[r][i]); }
        printf("\n");
    }
}

static int sample_main(const Options* o) {
    check_sample_flags(o);
    Model model;
    load_model(&model, o->checkpoint);
    int V = model.config.vocab_size, is_text = V == 256;
    Prompt p = make_prompt(o, V, is_text);
    size_t n_new = o->sample_tokens > 0 ? (size_t)o->sample_tokens
                                        : (is_text ? 256 : (size_t)o->length);
    Decoder dec;
    decoder_build(&dec, &model, 1, p.n_prompt + n_new - 1);
    int* generated = mallocCheck(n_new * sizeof(int));
    uint64_t rng = o->seed;
    decoder_generate(&dec, p.prompt, p.n_prompt, generated, n_new, o->temperature, o->top_k, &rng);
    print_sample(&p, generated, n_new, is_text);
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
    Trainer trainer;      // where the training step runs (the host model, or its GPU twin)
    Diagnostics diag;
    size_t B, T;          // the training batch
    int *x, *y, *work;    // (max(B, 64), T) inputs, targets, decoding scratch
    int start_step, end_step;
    EvalResult last;      // the latest evaluation
    double start_time, window_start, loss_window;  // progress since the last log line
    int window_steps;
} Run;

// the task or text file fixes V and T
static void load_data(Run* r) {
    Options* o = &r->o;
    char err[512];
    int status;
    if (strcmp(o->task, "text") == 0) {
        if (o->text_path == NULL) { die("--task text needs --text FILE"); }
        if (o->seq_len == 0) { o->seq_len = 64; }
        status = dataset_init_text(&r->ds, o->text_path, o->seq_len, o->seed, err, sizeof(err));
    } else {
        if (o->seq_len != 0 && o->seq_len != 2 * o->length) {
            die("--seq-len %d does not fit the task: --length %d needs T = 2 * length = %d",
                o->seq_len, o->length, 2 * o->length);
        }
        status = dataset_init_task(&r->ds, o->task, o->length, o->symbols,
                                   (size_t)o->eval_examples, o->seed, err, sizeof(err));
    }
    if (status != 0) { die("%s", err); }
    o->model.vocab_size = r->ds.vocab_size;
    if (model_config_check(&o->model, err, sizeof(err)) != 0) { die("%s", err); }
}

// the model, initialised or resumed, its trainer, and the batch buffers
static void build_model(Run* r) {
    const Options* o = &r->o;
    char err[512];
    r->B = (size_t)o->batch;
    r->T = (size_t)r->ds.seq_len;
    size_t eval_B = r->B < 64 ? 64 : r->B;  // evaluation runs in bigger batches
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
    }
    r->x = mallocCheck(eval_B * r->T * sizeof(int));
    r->y = mallocCheck(eval_B * r->T * sizeof(int));
    r->work = mallocCheck(eval_B * r->T * sizeof(int));
    trainer_init(&r->trainer, &r->model, r->B, r->T);
    // --stop-after interrupts the run early, as a crash would
    r->end_step = o->steps;
    if (o->stop_after > 0 && r->start_step + o->stop_after < o->steps) {
        r->end_step = r->start_step + o->stop_after;
    }
}

static void print_header(const Run* r) {
    const Options* o = &r->o;
    const ModelConfig* c = &o->model;
    printf("attnres.c | mode %s (S=%d) | d=%d L=%d H=%d G=%d F=%d V=%d | params %zu | "
           "task %s T=%zu B=%zu | threads %d\n", o->mode, c->block_size, c->d_model, c->n_layers,
           c->n_heads, c->n_kv_heads, c->ffn_hidden, c->vocab_size, r->model.num_params, o->task,
           r->T, r->B, omp_get_max_threads());
    if (r->start_step > 0) { printf("resumed from %s at step %d\n", o->checkpoint, r->start_step); }
}

static void open_diagnostics(Run* r, int argc, char** argv) {
    diagnostics_init(&r->diag, &r->o.model);
    if (r->o.diagnostics == NULL) { return; }
    char command[4096], err[512];
    command_line(command, sizeof(command), argc, argv);
    if (diagnostics_open(&r->diag, r->o.diagnostics, r->o.resume, command, err,
                         sizeof(err)) != 0) {
        die("%s", err);
    }
}

// "training stopped" and where the last good checkpoint is
static void stop_on_nan(const Options* o, const char* what, int step, const char* detail) {
    fprintf(stderr, "error: %s at step %d%s; training stopped%s%s\n", what, step, detail,
            o->checkpoint ? ", last good checkpoint kept at " : "",
            o->checkpoint ? o->checkpoint : "");
    exit(1);
}

// forward, backward, the NaN check, the layer diagnostics (raw gradients), then clipping and
// AdamW; returns the loss
static float train_step(Run* r, int step, float* norm, float* lr) {
    const Options* o = &r->o;
    dataset_train_batch(&r->ds, r->x, r->y, r->B, (uint64_t)step);
    float loss = trainer_forward_backward(&r->trainer, r->x, r->y, r->B, r->T, norm);
    if (!isfinite(loss) || !isfinite(*norm)) {
        char detail[64];
        snprintf(detail, sizeof(detail), " (gradient norm %g)", (double)*norm);
        stop_on_nan(o, isfinite(loss) ? "loss is finite but the gradient is not" : "loss is NaN/Inf",
                    step + 1, detail);
    }
    int done = step + 1;
    if (o->diagnostics != NULL && (done % o->log_every == 0 || done == r->end_step)) {
        trainer_host_gradients(&r->trainer, r->x, r->y, r->B, r->T);
        diagnostics_measure_layers(&r->diag, &r->model);  // before clipping: the raw gradients
        diagnostics_write_layers(&r->diag, done);
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
    diagnostics_write_train(&r->diag, done, (float)mean_loss, lr, norm, (float)ms_per_step);
    r->loss_window = 0.0;
    r->window_steps = 0;
    r->window_start = now;
}

static void print_eval(const char* prefix, const EvalResult* e) {
    printf("%s | val_loss %.4f | accuracy %.2f%%", prefix, (double)e->val_loss,
           (double)e->accuracy);
    if (e->exact_match >= 0.0f) { printf(" | exact_match %.2f%%", (double)e->exact_match); }
}

// every --eval-every steps: evaluate, checkpoint (never a NaN model), diagnostics
static void evaluate_and_save(Run* r, int done) {
    const Options* o = &r->o;
    double eval_start = now_seconds();
    trainer_to_host(&r->trainer);
    r->last = evaluate(&r->model, &r->ds, o, r->x, r->y, r->work);
    char prefix[32];
    snprintf(prefix, sizeof(prefix), "eval step %5d", done);
    print_eval(prefix, &r->last);
    printf("\n");
    fflush(stdout);
    if (!isfinite(r->last.val_loss)) { stop_on_nan(o, "validation loss is NaN/Inf", done, ""); }
    if (o->checkpoint != NULL) { save_checkpoint(&r->model, o, done); }
    if (o->diagnostics != NULL) {
        diagnostics_write_eval(&r->diag, done, r->last.val_loss, r->last.accuracy,
                               r->last.exact_match);
        measure_eval_alpha(&r->model, &r->ds, o, r->x, r->y, &r->diag);
        diagnostics_write_alpha(&r->diag, done);
    }
    r->window_start += now_seconds() - eval_start;  // keep eval time out of ms/step
}

// the final line, then the depth-attention heatmap on the first eval batch
static void finish(Run* r) {
    char prefix[32];
    snprintf(prefix, sizeof(prefix), "final | steps %d", r->end_step);
    print_eval(prefix, &r->last);
    printf(" | time %.1f s\n", now_seconds() - r->start_time);
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
    trainer_free(&r->trainer);
    model_free(&r->model);
    dataset_free(&r->ds);
}

int main(int argc, char** argv) {
    Run r = {0};
    r.o = defaults();
    parse_flags(&r.o, argc, argv);
    validate(&r.o);
    if (r.o.threads > 0) { omp_set_num_threads(r.o.threads); }
    if (r.o.sample) { return sample_main(&r.o); }  // decoding runs on the host, in both binaries
#ifdef ATTNRES_CUDA
    const char* problem = cuda_device_problem();
    if (problem != NULL) { die("%s", problem); }
    if (r.o.cublas) { model_use_cublas_cuda(1); }
#endif
    load_data(&r);
    build_model(&r);
    print_header(&r);
    open_diagnostics(&r, argc, argv);

    r.last = (EvalResult){NAN, NAN, NAN};
    r.start_time = r.window_start = now_seconds();
    if (r.start_step == r.end_step) { r.last = evaluate(&r.model, &r.ds, &r.o, r.x, r.y, r.work); }
    for (int step = r.start_step; step < r.end_step; step++) {
        float norm, lr;
        float loss = train_step(&r, step, &norm, &lr);
        log_progress(&r, step + 1, loss, lr, norm);
        if ((step + 1) % r.o.eval_every == 0 || step + 1 == r.end_step) {
            evaluate_and_save(&r, step + 1);
        }
    }
    finish(&r);
    free_run(&r);
    return 0;
}
