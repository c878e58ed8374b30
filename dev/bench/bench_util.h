// bench_util.h — what dev/bench/bench.c and dev/bench/bench_cuda.c share: the bench model in
// each mode (mHC-lite's too) and its variants, their memory, the training step they
// time (./train_cuda's where model.cuh is included first), quantiles, and the report of interleaved rounds (each
// config's median ms/step; each overhead the median of the paired ratios config / none of the
// same round, with the middle half of the rounds and a 95 % confidence interval for the
// median).
#ifndef ATTNRES_BENCH_UTIL_H
#define ATTNRES_BENCH_UTIL_H

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "model.h"
#include "rng.h"
#include "threads.h"  // now_seconds

// The bench model in each mode: d=256 L=8 H=8 G=4 F=704 V=256 (bytes), batch B x T
#define N_MODES 3
#define BENCH_B 8
#define BENCH_T 128
static const char* const BENCH_MODE_NAMES[N_MODES] = {"none", "full", "block S=4"};
static inline ModelConfig bench_config(int mode) {
    const int block_sizes[N_MODES] = {0, 1, 4};
    ModelConfig c = {256, 256, 8, 8, 4, 704, block_sizes[mode]};
    return c;
}

// SPEC's variants on the bench model (the paper's ablation rows), each with the mode it varies
#define N_VARIANTS 8
static const char* const BENCH_VARIANT_NAMES[N_VARIANTS] = {
    "full sigmoid", "full key norm off", "full input query", "full heads 16", "full window 8",
    "full static", "full dense", "block S=4 heads 16"};
static const int BENCH_VARIANT_MODES[N_VARIANTS] = {1, 1, 1, 1, 1, 1, 1, 2};
static inline ModelConfig bench_variant_config(int variant) {
    static const ModelConfig variants[N_VARIANTS] = {
        //  V    d  L  H  G    F  S  score key_norm_off query heads window mixing
        {256, 256, 8, 8, 4, 704, 1, 1, 0, 0, 0, 0, 0},   // sigmoid scores
        {256, 256, 8, 8, 4, 704, 1, 0, 1, 0, 0, 0, 0},   // no RMSNorm on the keys
        {256, 256, 8, 8, 4, 704, 1, 0, 0, 1, 0, 0, 0},   // input-dependent query
        {256, 256, 8, 8, 4, 704, 1, 0, 0, 0, 16, 0, 0},  // 16 heads of 16 channels
        {256, 256, 8, 8, 4, 704, 1, 0, 0, 0, 0, 8, 0},   // window: x0 + the 8 latest outputs
        {256, 256, 8, 8, 4, 704, 1, 0, 0, 0, 0, 0, 1},   // static mixing
        {256, 256, 8, 8, 4, 704, 1, 0, 0, 0, 0, 0, 2},   // DenseFormer
        {256, 256, 8, 8, 4, 704, 4, 0, 0, 0, 16, 0, 0},  // block S=4, 16 heads
    };
    return variants[variant];
}

// mHC-lite (SPEC "mHC-lite") on the bench model: the paper's m = 4 streams, and m = 2
#define N_MHC 2
static const char* const BENCH_MHC_NAMES[N_MHC] = {"mhc m=4", "mhc m=2"};
static inline ModelConfig bench_mhc_config(int k) {
    ModelConfig c = bench_config(0);
    c.streams = k == 0 ? 4 : 2;
    return c;
}

// The benches' list of configs: 0 .. N_MODES-1 the modes, then mHC-lite's (together the
// N_BENCH_MODES residual modes that `--modes` times), then the variants. Config i, its name
// and its parent (the mode it varies: its second overhead is against that one; 0 for the
// modes, whose overhead is against none)
#define N_BENCH_MODES (N_MODES + N_MHC)
#define N_BENCH_CONFIGS (N_BENCH_MODES + N_VARIANTS)
static inline ModelConfig bench_config_at(int i, const char** name, int* parent) {
    *parent = 0;
    if (i < N_MODES) {
        *name = BENCH_MODE_NAMES[i];
        return bench_config(i);
    }
    if (i < N_BENCH_MODES) {
        *name = BENCH_MHC_NAMES[i - N_MODES];
        return bench_mhc_config(i - N_MODES);
    }
    int variant = i - N_BENCH_MODES;
    *name = BENCH_VARIANT_NAMES[variant];
    *parent = BENCH_VARIANT_MODES[variant];
    return bench_variant_config(variant);
}

// The memory a config takes at B x T, in floats: its activations (point_activations' size
// table: what the forward keeps for the backward, and the backward's scratch) and its
// parameters (param_sizes). Training keeps three more floats beside each parameter: its
// gradient and AdamW's two moments.
typedef struct {
    size_t activations, params;
} BenchMemory;
static inline BenchMemory bench_memory(const ModelConfig* c, size_t B, size_t T) {
    Activations a;
    a.sub = (SubLayer*)malloc((2 * (size_t)c->n_layers + 1) * sizeof(SubLayer));
    if (a.sub == NULL) { fprintf(stderr, "error: bench_memory: out of memory\n"); exit(1); }
    size_t sizes[N_PARAM_TENSORS];
    BenchMemory memory = {point_activations(&a, c, B, T, 1, NULL), param_sizes(c, sizes)};
    free(a.sub);
    return memory;
}

// One line per config into out: its activations in MB (float32) and as a multiple of config
// 0's (none), and the training state (parameters, gradients, AdamW's moments: 4 floats per
// parameter) in MB
static inline void print_memory(FILE* out, const char* const* names, const ModelConfig* configs,
                                int n_configs, size_t B, size_t T) {
    int width = 10;  // the names' column
    for (int i = 0; i < n_configs; i++) {
        if ((int)strlen(names[i]) > width) { width = (int)strlen(names[i]); }
    }
    const double MB = 1e6 / sizeof(float);  // floats in a megabyte
    double none = (double)bench_memory(&configs[0], B, T).activations;
    fprintf(out, "memory at B=%zu T=%zu (float32): the activations (point_activations: the "
            "forward's for the backward, and its scratch), and the training state (parameters, "
            "gradients, AdamW's m and v)\n", B, T);
    for (int i = 0; i < n_configs; i++) {
        BenchMemory m = bench_memory(&configs[i], B, T);
        fprintf(out, "%-*s activations %8.1f MB (%.2fx none)   training state %7.1f MB "
                "(%zu parameters)\n", width, names[i], (double)m.activations / MB,
                (double)m.activations / none, 4.0 * (double)m.params / MB, m.params);
    }
}

// One training step of m on (x, y), AdamW step t (from 1), as ./train takes it; its
// milliseconds. bench.c and bench_sizes.c time it.
static inline double bench_training_step(Model* m, const int* x, const int* y, size_t B, size_t T,
                                         int t) {
    double t0 = now_seconds();
    model_forward(m, x, y, B, T);
    model_zero_grad(m);
    model_backward(m);
    model_update(m, 1e-4f, 0.9f, 0.95f, 1e-8f, 0.1f, t);
    return 1000.0 * (now_seconds() - t0);
}

#ifdef ATTNRES_MODEL_CUH
// One training step as ./train_cuda takes it (one read-back, of the loss and the gradient
// norm, then clipping and AdamW; as CUDA graphs after model_use_graph_cuda(m, 1)), waited
// for, so the step has finished on the GPU when this returns; its milliseconds. bench_cuda.c
// and bench_sizes.c (BENCH_CUDA) time it.
static inline double bench_training_step_cuda(ModelCuda* m, const int* x, const int* y, size_t B,
                                              size_t T, int t) {
    double t0 = now_seconds();
    float loss, norm;
    model_forward_backward_cuda(m, x, y, B, T, &loss, &norm);
    ModelUpdate u = {norm, 1.0f, 0, 1e-4f, 0.9f, 0.95f, 1e-8f, 0.1f, 0.0f, t};
    model_update_step_cuda(m, &u);
    model_wait_cuda();
    return 1000.0 * (now_seconds() - t0);
}
#endif

static inline int compare_doubles(const void* a, const void* b) {
    double x = *(const double*)a, y = *(const double*)b;
    return (x > y) - (x < y);
}

static inline void sort_values(double* values, int n) {
    qsort(values, (size_t)n, sizeof(double), compare_doubles);
}

// the q-quantile (0 .. 1) of n values sorted by sort_values
static inline double quantile(const double* sorted, int n, double q) {
    return sorted[(int)(q * (n - 1) + 0.5)];
}

// A 95 % confidence interval for the median of the distribution n values were drawn from
// (sorted by sort_values): between the order statistics n/2 -+ 0.98 sqrt(n), since the number
// of values below the median is Binomial(n, 1/2), whose standard deviation is sqrt(n)/2. It
// assumes nothing about the distribution (the machine's noise is far from normal) and
// narrows as 1/sqrt(n): how many rounds it takes to tell a 4 % overhead from a 5 % one.
static inline void median_interval(const double* sorted, int n, double* lo, double* hi) {
    double half_width = 0.98 * sqrt((double)n);
    int a = (int)floor(0.5 * n - half_width), b = (int)ceil(0.5 * n + half_width) - 1;
    *lo = sorted[a < 0 ? 0 : a];
    *hi = sorted[b > n - 1 ? n - 1 : b];
}

// the bench batch: n random tokens and targets in [0, 256), the same for every mode and run
static inline void bench_batch(int* x, int* y, size_t n) {
    uint64_t state = 7;
    for (size_t i = 0; i < n; i++) {
        x[i] = (int)(rng_next(&state) % 256);
        y[i] = (int)(rng_next(&state) % 256);
    }
}

// ms[i][r] = the milliseconds of mode i's step in round r: `warmup` steps of each mode first,
// then round after round one step of every mode in turn. step(context, mode, t) takes AdamW
// step t (from 1) of that mode's model and returns its milliseconds.
static inline void time_rounds(double** ms, int n_modes, int rounds, int warmup,
                               double (*step)(void* context, int mode, int t), void* context) {
    for (int i = 0; i < n_modes; i++) {
        for (int t = 1; t <= warmup; t++) { step(context, i, t); }
    }
    for (int r = 0; r < rounds; r++) {
        for (int i = 0; i < n_modes; i++) { ms[i][r] = step(context, i, warmup + 1 + r); }
    }
}

// ms[i][r]: config i's step in round r, config 0 the baseline (none); sorts ms. parent[i] >= 1:
// config i varies config parent[i], whose paired overhead is printed too (parent NULL: none).
static inline void print_rounds(const char* const* names, int n_configs, double** ms, int rounds,
                                size_t tokens_per_step, const int* parent) {
    // per config: median, 25th and 75th percentile of the ratios to none, median of the ratios
    // to its parent, the median's 95 % confidence interval
    double* overhead = (double*)malloc((size_t)n_configs * 6 * sizeof(double));
    double* ratio = (double*)malloc((size_t)rounds * sizeof(double));
    if (ratio == NULL || overhead == NULL) { fprintf(stderr, "error: print_rounds: out of memory\n"); exit(1); }
    int width = 10;  // the names' column
    for (int i = 0; i < n_configs; i++) {  // the ratios first, while the rounds are in order
        double* o = overhead + 6 * i;
        for (int r = 0; r < rounds; r++) { ratio[r] = ms[i][r] / ms[0][r]; }
        sort_values(ratio, rounds);
        o[0] = quantile(ratio, rounds, 0.5);
        o[1] = quantile(ratio, rounds, 0.25);
        o[2] = quantile(ratio, rounds, 0.75);
        median_interval(ratio, rounds, &o[4], &o[5]);
        int p = parent != NULL ? parent[i] : 0;
        if (p == 0) {
            o[3] = o[0];  // the parent is none: the same ratios
        } else {
            for (int r = 0; r < rounds; r++) { ratio[r] = ms[i][r] / ms[p][r]; }
            sort_values(ratio, rounds);
            o[3] = quantile(ratio, rounds, 0.5);
        }
        if ((int)strlen(names[i]) > width) { width = (int)strlen(names[i]); }
    }
    for (int i = 0; i < n_configs; i++) {
        sort_values(ms[i], rounds);
        double median = quantile(ms[i], rounds, 0.5);
        printf("%-*s %9.3f ms/step %10.0f tokens/s", width, names[i], median,
               (double)tokens_per_step / (median / 1000.0));
        const double* o = overhead + 6 * i;
        if (i > 0) {
            printf("   overhead vs none %+6.1f%% (middle half of rounds %+.1f%% .. %+.1f%%; "
                   "the median's 95%% interval %+.1f%% .. %+.1f%%)", 100.0 * (o[0] - 1.0),
                   100.0 * (o[1] - 1.0), 100.0 * (o[2] - 1.0), 100.0 * (o[4] - 1.0),
                   100.0 * (o[5] - 1.0));
        }
        if (parent != NULL && parent[i] > 0) {
            printf("   vs %s %+6.1f%%", names[parent[i]], 100.0 * (o[3] - 1.0));
        }
        printf("\n");
    }
    free(ratio);
    free(overhead);
}

#endif
