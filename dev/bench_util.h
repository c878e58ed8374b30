// bench_util.h — what dev/bench.c and dev/bench_cuda.c share: the bench model, a clock,
// quantiles, and the report of interleaved rounds (each mode's median ms/step; each overhead the median of the
// paired ratios mode / none of the same round, with the middle half of the rounds).
#ifndef ATTNRES_BENCH_UTIL_H
#define ATTNRES_BENCH_UTIL_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include "model.h"
#include "rng.h"

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

static inline double now_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static inline int compare_doubles(const void* a, const void* b) {
    double x = *(const double*)a, y = *(const double*)b;
    return (x > y) - (x < y);
}

// the q-quantile (0 .. 1) of n values, sorted in place
static inline double quantile(double* values, int n, double q) {
    qsort(values, (size_t)n, sizeof(double), compare_doubles);
    return values[(int)(q * (n - 1) + 0.5)];
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

// ms[i][r]: mode i's step in round r (at most 8 modes), mode 0 the baseline; sorts ms
static inline void print_rounds(const char* const* names, int n_modes, double** ms, int rounds,
                                size_t tokens_per_step) {
    double overhead[8][3];  // per mode: median, 25th and 75th percentile of the ratios
    double* ratio = malloc((size_t)rounds * sizeof(double));
    if (ratio == NULL || n_modes > 8) { fprintf(stderr, "error: print_rounds\n"); exit(1); }
    for (int i = 0; i < n_modes; i++) {  // the ratios first, while the rounds are in order
        for (int r = 0; r < rounds; r++) { ratio[r] = ms[i][r] / ms[0][r]; }
        overhead[i][0] = quantile(ratio, rounds, 0.5);
        overhead[i][1] = quantile(ratio, rounds, 0.25);
        overhead[i][2] = quantile(ratio, rounds, 0.75);
    }
    for (int i = 0; i < n_modes; i++) {
        double median = quantile(ms[i], rounds, 0.5);
        printf("%-10s %9.3f ms/step %10.0f tokens/s", names[i], median,
               (double)tokens_per_step / (median / 1000.0));
        if (i > 0) {
            printf("   overhead vs none %+6.1f%% (middle half of rounds %+.1f%% .. %+.1f%%)",
                   100.0 * (overhead[i][0] - 1.0), 100.0 * (overhead[i][1] - 1.0),
                   100.0 * (overhead[i][2] - 1.0));
        }
        printf("\n");
    }
    free(ratio);
}

#endif
