// train.c — the attnres.c trainer: parse flags, build the model and data, train with AdamW or
// Muon (warmup, then cosine or warmup-stable-decay; gradient clipping), evaluate, checkpoint,
// resume. Run `./train --help` for the flags. Start reading at main() at the bottom: its loop
// is one training step after another (batch, forward, zero grad, backward, clip, update), with
// a log line, an evaluation and a checkpoint every so often. Where the step runs is
// src/trainer.c (the CPU, one process or several) or its GPU mirror cuda/trainer.cu, and with
// --pipeline src/pipeline.c, whose stages train with a Trainer each;
// --sample is src/sample.c; --export and --init-from (safetensors files) are src/safetensors.c.
#define _POSIX_C_SOURCE 200809L  // nanosleep
#include <errno.h>
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
#include "distributed.h"
#include "evaluate.h"
#include "inference.h"
#include "layers.h"  // crossentropy_count
#include "model.h"
#include "options.h"
#include "outputs.h"
#include "pipeline.h"
#include "run_record.h"
#include "safetensors.h"
#include "sample.h"
#include "threads.h"
#include "trainer.h"
#include "util.h"

// ---- the flags ---------------------------------------------------------------------------
static Options defaults(void) {
    Options o = {0};
    o.model = (ModelConfig){0, 64, 4, 4, 2, 176, 4};
    o.mode = "block";
    o.streams = 4;
    o.depth_score = "softmax"; o.key_norm = "on"; o.depth_query = "static"; o.mixing = "attention";
    o.task = "reverse";
    o.text_path = NULL;
    o.length = 12; o.symbols = 16; o.eval_examples = 500;
    o.batch = 32; o.microbatches = 1; o.pipeline = 1; o.virtual_stages = 1; o.pipeline_cache = "on";
    o.seq_len = 0; o.steps = 1000; o.warmup = 100; o.threads = 0;
    o.eval_every = 200; o.log_every = 50;
    o.lr = 3e-3f; o.final_lr_frac = 0.1f; o.weight_decay = 0.1f; o.grad_clip = 1.0f;
    o.beta1 = 0.9f; o.beta2 = 0.95f; o.adam_eps = 1e-8f;
    o.schedule = "cosine"; o.decay_frac = 0.2f;
    o.optimizer = "adamw"; o.muon_momentum = 0.95f;
    o.seed = 1337;
    o.checkpoint = NULL;
    o.resume = 0;
    return o;
}

// Every flag: what it sets in o, its help line (--help prints them with their defaults), and
// for a float the values it may take (options.h: the parser refuses the others, by range).
// Fills flags (when not NULL) and returns the count.
static int flag_table(Options* o, Flag* flags) {
    Flag table[] = {
        {"--d", OPT_INT, &o->model.d_model, "model width d"},
        {"--L", OPT_INT, &o->model.n_layers, "transformer layers (2L sub-layers)"},
        {"--H", OPT_INT, &o->model.n_heads, "query heads"},
        {"--G", OPT_INT, &o->model.n_kv_heads, "key/value heads (H % G == 0)"},
        {"--F", OPT_INT, &o->model.ffn_hidden, "SwiGLU hidden width"},
        {"--mode", OPT_STRING, &o->mode, "residual mode: none | full | block | mhc"},
        {"--streams", OPT_INT, &o->streams, "mhc: residual streams m (2 .. 4)"},
        {"--block-size", OPT_INT, &o->model.block_size, "block mode: sub-layers per block S (divides 2L)"},
        {"--depth-score", OPT_STRING, &o->depth_score, "AttnRes variant: softmax | sigmoid weights"},
        {"--key-norm", OPT_STRING, &o->key_norm, "AttnRes variant: on | off (RMSNorm on the keys)"},
        {"--depth-query", OPT_STRING, &o->depth_query, "AttnRes variant: static | input (w + U rmsnorm(V_last))"},
        {"--depth-heads", OPT_INT, &o->model.depth_heads, "AttnRes variant: K heads of d/K channels (0 or 1: one)"},
        {"--depth-window", OPT_INT, &o->model.depth_window, "AttnRes variant, full: x0 + the W latest outputs (0: all)"},
        {"--mixing", OPT_STRING, &o->mixing, "AttnRes variant: attention | static | dense (DenseFormer)"},
        {"--task", OPT_STRING, &o->task, "reverse | copy | sort | text"},
        {"--text", OPT_STRING, &o->text_path, "text file for --task text (bytes, V = 256)"},
        {"--length", OPT_INT, &o->length, "tasks: symbols per prompt (T = 2 * length)"},
        {"--symbols", OPT_INT, &o->symbols, "tasks: distinct symbols (V = symbols + 1)"},
        {"--eval-examples", OPT_INT, &o->eval_examples, "held-out examples (tasks) / max eval sequences (text)"},
        {"--batch", OPT_INT, &o->batch, "batch size B"},
        {"--microbatches", OPT_INT, &o->microbatches, "the step in M parts of B/M sequences, gradients summed"},
        {"--pipeline", OPT_INT, &o->pipeline, "./train_mpi: P pipeline stages (mpirun -np P*D; 1: none)"},
        {"--virtual", OPT_INT, &o->virtual_stages, "--pipeline: V chunks a stage (interleaved 1F1B)"},
        {"--pipeline-cache", OPT_STRING, &o->pipeline_cache, "--pipeline: on | off (AttnRes's blocks cached across stages)"},
        {"--pipeline-trace", OPT_STRING, &o->pipeline_trace, "--pipeline: write each forward and backward's times to FILE (CSV)"},
        {"--seq-len", OPT_INT, &o->seq_len, "sequence length T (text: 0 = 64; tasks: 0 or 2*length)"},
        {"--steps", OPT_INT, &o->steps, "training steps"},
        {"--lr", OPT_FLOAT, &o->lr, "peak learning rate", FLOAT_POSITIVE},
        {"--warmup", OPT_INT, &o->warmup, "linear warmup steps"},
        {"--schedule", OPT_STRING, &o->schedule, "lr after warmup: cosine | wsd (stable, then linear decay)"},
        {"--decay-frac", OPT_FLOAT, &o->decay_frac, "wsd: the share of --steps that decays", FLOAT_OPEN_FRACTION},
        {"--final-lr-frac", OPT_FLOAT, &o->final_lr_frac, "the decay ends at lr * this, in [0, 1]", FLOAT_UNIT},
        {"--weight-decay", OPT_FLOAT, &o->weight_decay, "AdamW weight decay (matrices only)", FLOAT_NON_NEGATIVE},
        {"--optimizer", OPT_STRING, &o->optimizer, "adamw | muon (Muon on the layers' matrices, AdamW on the rest)"},
        {"--muon-momentum", OPT_FLOAT, &o->muon_momentum, "muon: Nesterov momentum mu, in [0, 1)", FLOAT_FRACTION},
        {"--grad-clip", OPT_FLOAT, &o->grad_clip, "clip the global gradient norm (0 = off)", FLOAT_NON_NEGATIVE},
        {"--beta1", OPT_FLOAT, &o->beta1, "AdamW beta1", FLOAT_FRACTION},
        {"--beta2", OPT_FLOAT, &o->beta2, "AdamW beta2", FLOAT_FRACTION},
        {"--seed", OPT_U64, &o->seed, "random seed (init and data; --sample: the draws and the task prompt)"},
        {"--threads", OPT_INT, &o->threads, "OpenMP threads (0 = all cores)"},
        {"--eval-every", OPT_INT, &o->eval_every, "evaluate (and checkpoint) every N steps"},
        {"--log-every", OPT_INT, &o->log_every, "print a training line every N steps"},
        {"--checkpoint", OPT_STRING, &o->checkpoint, "checkpoint file (written at each eval)"},
        {"--resume", OPT_SWITCH, &o->resume, "continue from --checkpoint"},
        {"--init-from", OPT_STRING, &o->init_from, "a new run from a .safetensors file's weights and config"},
        {"--export", OPT_STRING, &o->export_path, "write --checkpoint's weights to a .safetensors file"},
        {"--stop-after", OPT_INT, &o->stop_after, "end this run after N steps (0 = at --steps; lr schedule unchanged)"},
        {"--diagnostics", OPT_STRING, &o->diagnostics, "write loss/magnitude/grad/alpha CSVs into DIR"},
        {"--sample", OPT_SWITCH, &o->sample, "generate from --checkpoint instead of training"},
        {"--prompt", OPT_STRING, &o->prompt, "--sample: text prompt (text models, V = 256)"},
        {"--prompt-tokens", OPT_STRING, &o->prompt_tokens, "--sample: prompt token ids, e.g. 3,1,4"},
        {"--tokens", OPT_INT, &o->sample_tokens, "--sample: tokens to generate (0: answer / 256)"},
        {"--temperature", OPT_FLOAT, &o->temperature, "--sample: softmax temperature (0 = greedy)", FLOAT_NON_NEGATIVE},
        {"--top-k", OPT_INT, &o->top_k, "--sample: draw among the K likeliest (0 = all)"},
        {"--cublas", OPT_SWITCH, &o->cublas, "./train_cuda: every matmul through cuBLAS SGEMM"},
        {"--no-graph", OPT_SWITCH, &o->no_graph, "./train_cuda: queue the step call by call, not as CUDA graphs"},
    };
    int n = (int)(sizeof(table) / sizeof(table[0]));
    if (flags != NULL) { memcpy(flags, table, sizeof(table)); }
    return n;
}

static void print_help(void) {
    Options o = defaults();
    Flag flags[MAX_FLAGS];
    int n = flag_table(&o, flags);
    printf("usage: ./train [flags]    (defaults train block AttnRes on sequence reversal)\n\n");
    options_print(flags, n);
}

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
            if (strcmp(argv[i], flags[j].flag) == 0) { f = &flags[j]; }
        }
        if (f == NULL) { die("unknown flag '%s' (see ./train --help)", argv[i]); }
        if (!option_given(o, f->flag)) { o->given[o->n_given++] = f->flag; }
        if (f->kind == OPT_SWITCH) { *(int*)f->value = 1; continue; }
        if (i + 1 >= argc) { die("flag '%s' needs a value", f->flag); }
        char err[ERROR_MAX];
        if (options_parse_value(f, argv[++i], err, sizeof(err)) != 0) { die("%s", err); }
    }
}

// The learning rate of step s = 0 .. steps-1. Both schedules warm up linearly to lr, as
// lr * (s+1) / warmup for s < warmup, and end at lr * final_lr_frac at the last step.
//   cosine: then cosine decay over the steps after the warmup.
//   wsd (warmup-stable-decay): D = max(1, floor(decay_frac * steps + 0.5)) decay steps; lr while
//     s < steps - D, then lr * (1 - (1 - final_lr_frac) * (s - steps + D + 1) / D).
static float learning_rate(const Options* o, int step) {
    if (step < o->warmup) { return o->lr * (float)(step + 1) / (float)o->warmup; }
    if (o->schedule_kind == SCHEDULE_WSD) {
        int decay_steps = wsd_decay_steps(o);
        if (step < o->steps - decay_steps) { return o->lr; }
        float decayed = (float)(step - o->steps + decay_steps + 1) / (float)decay_steps;
        return o->lr * (1.0f - (1.0f - o->final_lr_frac) * decayed);
    }
    int decay_steps = o->steps - o->warmup;
    float progress = decay_steps > 1 ? (float)(step - o->warmup) / (float)(decay_steps - 1) : 1.0f;
    float cosine = 0.5f * (1.0f + cosf(3.14159265358979f * progress));
    float min_lr = o->lr * o->final_lr_frac;
    return min_lr + (o->lr - min_lr) * cosine;
}

// argv joined by spaces, for the record of a run
static void command_line(char* out, size_t len, int argc, char** argv) {
    size_t used = 0;
    out[0] = '\0';
    for (int i = 0; i < argc && used < len; i++) {
        used += (size_t)snprintf(out + used, len - used, "%s%s", i ? " " : "", argv[i]);
    }
}

// ---- a training run, step by step --------------------------------------------------------
typedef struct {
    Options o;
    Dataset ds;
    Model model;          // on the host: evaluation, decoding, diagnostics, checkpoints
    Decoder decoder;      // rank 0: the evaluation's greedy decoding (decoder_sequences x T)
    Trainer trainer;      // where the training step runs (the host model, or its GPU twin)
    Pipeline* pipeline;   // --pipeline: this process's stage, which trains in the trainer's
                          // place (pipeline.c); NULL without
    Diagnostics diag;
    size_t B, T;          // the training batch
    int *x, *y, *work;    // (B, T) inputs, targets, decoding scratch
    int start_step, end_step;
    ModelConfig init_config;  // --init-from: the file's config and its parameters (until the
    float* init_params;       // model holds them)
    EvalResult last;      // the latest evaluation
    double start_time, window_start, loss_window;  // progress since the last log line
    int window_steps;
    int saved_step;       // the step of the last checkpoint this run wrote (0: none yet)
    int best_step;        // the best validation loss so far (PATH.best) and its step
    float best_val_loss;
    size_t memory_bytes;  // what the run allocates (run_memory_check)
    size_t activation_bytes;  // of which the activations of the B x T tokens
    double step_seconds;  // the training steps' time, evaluation left out
} Run;

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
    if (o->init_from != NULL && r->ds.vocab_size != r->init_config.vocab_size) {
        die("--init-from %s holds a model of vocab_size %d, the data (--task %s) has %d tokens",
            o->init_from, r->init_config.vocab_size, o->task, r->ds.vocab_size);
    }
    o->model.vocab_size = r->ds.vocab_size;
    if (model_config_check(&o->model, err, sizeof(err)) != 0) { die("%s", err); }
}

// --resume: the checkpoint must come from this very run (run_record.h); its best step and
// loss carry on. Version 1 checkpoints record no run: not checked.
static void check_resumed_run(Run* r) {
    char err[ERROR_MAX];
    RunRecord was, now = run_record_of(&r->o, &r->ds, r->best_step, r->best_val_loss);
    int recorded;
    if (run_record_check_resume(r->o.checkpoint, &now, &was, &recorded, err, sizeof(err)) != 0) {
        die("%s", err);
    }
    if (!recorded) {
        printf("note: checkpoint %s (version 1) does not record its run: flags not checked\n",
               r->o.checkpoint);
        return;
    }
    r->best_step = was.best_step;
    r->best_val_loss = was.best_val_loss;
}

// The sequences the evaluation decodes at once: tasks, an evaluation batch of prompts; text,
// the one sample it prints
static size_t decoder_sequences(const Run* r, size_t eval_B) {
    return r->ds.kind == TASK_TEXT ? 1 : eval_B;
}

// the model, initialised or resumed, its trainer, and the batch buffers
static void build_model(Run* r) {
    const Options* o = &r->o;
    char err[ERROR_MAX];
    r->B = (size_t)o->batch;
    r->T = (size_t)r->ds.seq_len;
    size_t eval_B = r->B;  // evaluation runs in batches of the training batch's sequences
    if (run_memory_check(&o->model, eval_B, r->T, decoder_sequences(r, eval_B), &dist,
                         dataset_bytes(&r->ds), &r->memory_bytes, &r->activation_bytes, err,
                         sizeof(err)) != 0) {
        die("%s", err);
    }
    model_build(&r->model, &o->model, eval_B, r->T);
    if (r->init_params != NULL) {  // the file's weights; the optimiser's moments stay zero
        memcpy(r->model.params_memory, r->init_params, r->model.num_params * sizeof(float));
        free(r->init_params);
        r->init_params = NULL;
    } else {
        model_init_params(&r->model, o->seed);
    }
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
        if (o->stop_after > 0 && r->start_step + o->stop_after > o->steps) {
            die("checkpoint %s is at step %d: --stop-after %d would end past --steps %d, so it "
                "would do nothing", o->checkpoint, r->start_step, o->stop_after, o->steps);
        }
    }
    r->x = mallocCheck(eval_B * r->T * sizeof(int));
    r->y = mallocCheck(eval_B * r->T * sizeof(int));
    r->work = mallocCheck(eval_B * r->T * sizeof(int));
    if (dist.rank == 0) { decoder_build(&r->decoder, &r->model, decoder_sequences(r, eval_B), r->T); }
    if (o->pipeline > 1) {  // each process trains its stage's chunks; rank 0 keeps the whole
                            // model for evaluation and checkpoints, the others release theirs
        int replicas = dist.world / o->pipeline;
        r->pipeline = pipeline_create(&r->model, &dist, o->pipeline, o->virtual_stages,
                                      o->microbatches, o->pipeline_cached,
                                      r->B / (size_t)replicas / (size_t)o->microbatches, r->T,
                                      o->optimizer_kind, o->muon_momentum);
        if (dist.rank != 0) { model_free(&r->model); }
    } else {
        trainer_init(&r->trainer, &r->model, &dist, r->B, r->T, o->optimizer_kind, o->muon_momentum);
    }
    // --stop-after interrupts the run early, as a crash would
    r->end_step = o->steps;
    if (o->stop_after > 0 && r->start_step + o->stop_after < o->steps) {
        r->end_step = r->start_step + o->stop_after;
    }
}

static void print_header(const Run* r) {
    const Options* o = &r->o;
    const ModelConfig* c = &o->model;
    char waiting[128];
    threads_describe_waiting(waiting, sizeof(waiting));
    printf("attnres.c | mode %s (%s=%d) | d=%d L=%d H=%d G=%d F=%d V=%d | params %zu | "
           "task %s T=%zu B=%zu | threads %d (%s) | memory %.1f MiB (activations %.1f KiB a "
           "token)", o->mode,
           c->streams ? "m" : "S", c->streams ? c->streams : c->block_size, c->d_model, c->n_layers, c->n_heads, c->n_kv_heads, c->ffn_hidden,
           c->vocab_size, r->model.num_params, o->task, r->T, r->B, omp_get_max_threads(),
           waiting, (double)r->memory_bytes / 1048576.0,
           (double)r->activation_bytes / 1024.0 / (double)(r->B * r->T));
    // the default warmup in a short run (a --warmup given that does not fit is refused)
    int fit = o->steps > 0 ? warmup_fit(o) : WARMUP_FITS;
    if (fit == WARMUP_PAST_STEPS) {
        printf(" | the run ends inside its warmup (--warmup %d, --steps %d)", o->warmup, o->steps);
    } else if (fit == WARMUP_INTO_DECAY) {
        printf(" | the warmup (--warmup %d) reaches into wsd's decay (the last %d of %d steps)",
               o->warmup, wsd_decay_steps(o), o->steps);
    }
    printf("\n");
    char variant[128];
    variant_describe(c, variant, sizeof(variant));
    if (strcmp(variant, "no variant") != 0) { printf("depth-attention variant: %s\n", variant); }
    if (o->optimizer_kind == OPTIMIZER_MUON) {
        printf("optimizer: Muon (momentum %g) on the layers' matrices, AdamW on the rest%s\n",
               (double)o->muon_momentum,
               dist.world > 1 ? "; shards cut between the matrices" : "");
    }
    if (o->pipeline > 1) {
        printf("pipeline: %d stages x %d replica%s (the memory above is the whole model's, which "
               "rank 0 keeps for evaluation; each stage's is printed at the end)\n", o->pipeline,
               dist.world / o->pipeline, dist.world / o->pipeline == 1 ? "" : "s");
    } else if (dist.world > 1) {
        printf("data parallel: %d processes, %d sequences of each batch apiece; ZeRO-1: each keeps "
               "the AdamW moments of 1/%d of the parameters (memory above is per process)\n",
               dist.world, o->batch / dist.world, dist.world);
    }
    if (r->start_step > 0) { printf("resumed from %s at step %d\n", o->checkpoint, r->start_step); }
    if (o->init_from != NULL) {
        printf("initialised from %s (its weights; the optimiser starts fresh)\n", o->init_from);
    }
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

// After the step's backward: stops on a NaN/Inf loss or gradient; on a logged step with
// --diagnostics, measures the layers' raw gradients (before clipping)
static void check_step(Run* r, int done, float loss, float norm) {
    if (!isfinite(loss) || !isfinite(norm)) {
        char detail[64];
        snprintf(detail, sizeof(detail), " (gradient norm %g)", (double)norm);
        stop_on_nan(r, isfinite(loss) ? "loss is finite but the gradient is not" : "loss is NaN/Inf",
                    done, detail);
    }
    if (r->o.diagnostics != NULL && (done % r->o.log_every == 0 || done == r->end_step)) {
        // (options_check refuses --diagnostics with --pipeline: here the trainer trains)
        trainer_host_gradients(&r->trainer, r->x, r->y, r->B, r->T);
        diagnostics_measure_layers(&r->diag, &r->model);
        if (diagnostics_write_layers(&r->diag, done) != 0) { die("%s", r->diag.error); }
    }
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
    RunRecord run = run_record_of(&r->o, &r->ds, r->best_step, r->best_val_loss);
    if ((best && checkpoint_save(&r->model, &run, best_path, done, err, sizeof(err)) != 0) ||
        checkpoint_save(&r->model, &run, r->o.checkpoint, done, err, sizeof(err)) != 0) {
        die("%s", err);
    }
    r->saved_step = done;
}

// --init-from with --steps 0: the file's weights as they are, as a checkpoint at step 0
static void save_imported(Run* r) {
    char err[ERROR_MAX];
    RunRecord run = run_record_of(&r->o, &r->ds, 0, 0.0f);
    if (checkpoint_save(&r->model, &run, r->o.checkpoint, 0, err, sizeof(err)) != 0) {
        die("%s", err);
    }
    printf("checkpoint: %s holds the weights of %s (step 0)\n", r->o.checkpoint, r->o.init_from);
}

// every --eval-every steps: evaluate, checkpoint (never a NaN model), diagnostics
static void evaluate_and_save(Run* r, int done) {
    const Options* o = &r->o;
    double eval_start = now_seconds();
    // several processes: the moments come together on rank 0 (every rank takes part), which
    // alone evaluates and writes; the others go on to the next step and wait for it there
    if (r->pipeline != NULL) {  // the pipeline: the parameters too, as the whole model does not train
        pipeline_gather(r->pipeline, &r->model);
    } else if (o->checkpoint != NULL) {
        trainer_gather_moments(&r->trainer);
    }
    if (dist.rank != 0) { return; }
    if (r->pipeline == NULL) { trainer_to_host(&r->trainer); }
    r->last = evaluate(&r->model, &r->decoder, &r->ds, o, r->x, r->y, r->work);
    char prefix[32];
    snprintf(prefix, sizeof(prefix), "eval step %5d", done);
    print_eval(prefix, &r->last);
    printf("\n");
    fflush(stdout);
    if (!isfinite(r->last.val_loss)) { stop_on_nan(r, "validation loss is NaN/Inf", done, ""); }
    if (o->checkpoint != NULL) {
        save_checkpoints(r, done);
        if (r->pipeline == NULL) { trainer_drop_moments(&r->trainer); }
    }
    if (r->ds.kind == TASK_TEXT) { sample_print_text(&r->decoder, &r->ds, r->x, r->y); }
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
    if (r->pipeline != NULL) {  // every process takes part
        char err[ERROR_MAX];
        pipeline_report(r->pipeline, r->memory_bytes, r->end_step - r->start_step);
        if (r->o.pipeline_trace != NULL &&
            pipeline_write_trace(r->pipeline, r->o.pipeline_trace, err, sizeof(err)) != 0) {
            die("%s", err);
        }
    }
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
    if (dist.world > 1 && steps > 0 && r->pipeline == NULL) {
        // ring reduce-scatter and all-gather: each of the W processes sends (and receives)
        // (W-1)/W of the flat buffer for each
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
    if (r->pipeline != NULL) { pipeline_free(r->pipeline); }
    else { trainer_free(&r->trainer); }
    model_free(&r->model);
    dataset_free(&r->ds);
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

// Several processes (mpirun): the same flags everywhere, a batch they can share, rank 0 alone
// printing
static void check_processes(const Options* o, int argc, char** argv) {
    if (dist.rank != 0 && freopen("/dev/null", "w", stdout) == NULL) {
        die("cannot silence rank %d's output", dist.rank);
    }
    check_same_flags(argc, argv);
    if (o->pipeline > 1) {  // src/pipeline.c: the CPU's, over MPI
        if (trainer_on_gpu()) {
            die("--pipeline runs in the CPU build with MPI (./train_mpi): the GPU builds refuse it");
        }
        if (!dist.mpi) { die("--pipeline needs MPI: mpirun -np P*D ./train_mpi --pipeline P ..."); }
        char err[ERROR_MAX];
        if (pipeline_check(&o->model, o->pipeline, o->virtual_stages, o->microbatches, dist.world,
                           err, sizeof(err)) != 0) {
            die("%s", err);
        }
    }
    int replicas = dist.world / o->pipeline;  // data parallel: each takes B/replicas sequences
    if (o->batch % replicas != 0) {
        die("--batch %d does not divide among %d processes (each takes an equal share of "
            "every batch)", o->batch, replicas);
    }
    int sequences = o->batch / replicas;
    if (sequences % o->microbatches != 0 && o->pipeline > 1) {
        die("--microbatches %d does not divide %d sequences (--batch %d over %d replica%s of %d "
            "stages)", o->microbatches, sequences, o->batch, replicas, replicas == 1 ? "" : "s",
            o->pipeline);
    }
    if (sequences % o->microbatches != 0) {
        die("--microbatches %d does not divide %d sequences (--batch %d over %d process%s)",
            o->microbatches, sequences, o->batch, replicas, replicas == 1 ? "" : "es");
    }
    if (o->microbatches > 1 && trainer_on_gpu()) {
        die("--microbatches runs in the CPU builds (./train, ./train_mpi): the GPU's step "
            "takes its batch whole");
    }
    if (o->sample && dist.world > 1) { die("--sample runs in one process: start it without mpirun"); }
    if (o->export_path != NULL && dist.world > 1) {
        die("--export runs in one process: start it without mpirun");
    }
}

int main(int argc, char** argv) {
    threads_wait_briefly(argv);
    dist_init(&dist, &argc, &argv);
    char err[ERROR_MAX];
    Run r = {0};
    r.o = defaults();
    parse_flags(&r.o, argc, argv);
    // --init-from: the file is read (and checked) first; its config fills the model flags
    // not given, and those given must agree with it
    int init_from = r.o.init_from != NULL && r.o.init_from[0] != '\0' && !r.o.sample &&
                    r.o.export_path == NULL;
    if (init_from) {
        if (safetensors_load(r.o.init_from, &r.init_config, &r.init_params, err, sizeof(err)) != 0) {
            die("%s", err);
        }
        options_take_config(&r.o, &r.init_config);
    }
    if (options_check(&r.o, err, sizeof(err)) != 0) { die("%s", err); }
    if (init_from && options_check_config(&r.o, &r.init_config, err, sizeof(err)) != 0) {
        die("%s", err);
    }
    check_processes(&r.o, argc, argv);
    if (threads_set(r.o.threads, &dist, err, sizeof(err)) != 0) { die("%s", err); }
    // every file the run writes, checked before the data is read or anything written (outputs.h)
    RunPath paths[RUN_PATHS_MAX];
    if (dist.rank == 0 && outputs_check(paths, run_paths(&r.o, paths), err, sizeof(err)) != 0) {
        die("%s", err);
    }
    if (r.o.export_path != NULL) {  // the host reads and writes the files, in every binary
        int step;
        size_t tensors;
        if (safetensors_export_checkpoint(r.o.checkpoint, r.o.export_path, &step, &tensors, err,
                                          sizeof(err)) != 0) {
            die("%s", err);
        }
        printf("exported %s (step %d) to %s: %zu tensors\n", r.o.checkpoint, step,
               r.o.export_path, tensors);
        dist_finalize();
        return exit_status(0);
    }
    if (r.o.sample) {  // decoding runs on the host, in every binary
        if (sample_main(&r.o, err, sizeof(err)) != 0) { die("%s", err); }
        dist_finalize();
        return exit_status(0);
    }
    // the GPU builds: this process's GPU, and NCCL between the processes (MPI build)
    if (trainer_open_device(&dist, r.o.cublas, !r.o.no_graph, err, sizeof(err)) != 0) {
        die("%s", err);
    }
    load_data(&r);
    build_model(&r);
    print_header(&r);
    open_diagnostics(&r, argc, argv);

    setting_up = 0;
    r.last = (EvalResult){NAN, NAN, NAN};
    r.start_time = r.window_start = now_seconds();
    if (r.start_step == r.end_step && dist.rank == 0) {
        r.last = evaluate(&r.model, &r.decoder, &r.ds, &r.o, r.x, r.y, r.work);
        if (r.o.init_from != NULL && r.o.checkpoint != NULL) { save_imported(&r); }
    }
    // every rank draws the same global batch and trains on its replica's B/D sequences of it
    // (D = world/P replicas; without a pipeline every process is one), in --microbatches parts
    // of B/D/M sequences: the gradients add up, zeroed once
    int replicas = dist.world / r.o.pipeline, replica = dist.rank / r.o.pipeline;
    size_t sequences = r.B / (size_t)replicas, first = (size_t)replica * sequences * r.T;
    size_t micro_sequences = sequences / (size_t)r.o.microbatches;
    for (int step = r.start_step; step < r.end_step; step++) {
        int done = step + 1;  // AdamW's step t, from 1
        double step_start = now_seconds();
        dataset_train_batch(&r.ds, r.x, r.y, r.B, (uint64_t)step);
        size_t n_targets = crossentropy_count(r.y, r.B * r.T);
        float norm, loss;
        if (r.pipeline != NULL) {  // every microbatch through the stages (pipeline.c)
            pipeline_step(r.pipeline, r.x + first, r.y + first, n_targets);
            loss = pipeline_loss_and_norm(r.pipeline, &r.model, &norm);
        } else {
            for (int micro = 0; micro < r.o.microbatches; micro++) {
                size_t at = first + (size_t)micro * micro_sequences * r.T;
                trainer_forward(&r.trainer, r.x + at, r.y + at, micro_sequences, r.T, n_targets);
                if (micro == 0) { trainer_zero_grad(&r.trainer); }
                trainer_backward(&r.trainer);
            }
            loss = trainer_loss_and_norm(&r.trainer, &norm);
        }
        check_step(&r, done, loss, norm);
        float lr = learning_rate(&r.o, step);
        if (r.pipeline != NULL) {
            pipeline_clip(r.pipeline, norm, r.o.grad_clip);
            pipeline_update(r.pipeline, lr, r.o.beta1, r.o.beta2, r.o.adam_eps, r.o.weight_decay, done);
        } else {
            trainer_clip(&r.trainer, norm, r.o.grad_clip);
            trainer_update(&r.trainer, lr, r.o.beta1, r.o.beta2, r.o.adam_eps, r.o.weight_decay, done);
        }
        r.step_seconds += now_seconds() - step_start;
        log_progress(&r, done, loss, lr, norm);
        if (done % r.o.eval_every == 0 || done == r.end_step) { evaluate_and_save(&r, done); }
    }
    finish(&r);
    free_run(&r);
    trainer_close_device();
    dist_finalize();
    return exit_status(0);
}
