// bench.c — `make bench`: ms/step and tokens/s of one full training step (forward, backward,
// AdamW) in each residual mode on one fixed mid-size config, and the AttnRes overhead.
//
// ./bench [--rounds N] [--threads N]
//
// The machine is shared, so its speed drifts from one second to the next. To compare modes
// under the same conditions the modes take turns: each round times one step of none, then
// of full, then of block (after two warm-up steps each), and each overhead is the median
// over rounds of the paired ratio mode / none of the same round, printed with the range
// between its 25th and 75th percentiles.
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "model.h"
#include "rng.h"
#include "util.h"

#define N_MODES 3

static double now_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int compare_doubles(const void* a, const void* b) {
    double x = *(const double*)a, y = *(const double*)b;
    return (x > y) - (x < y);
}

// the q-quantile (0 .. 1) of n values, sorted in place
static double quantile(double* values, int n, double q) {
    qsort(values, (size_t)n, sizeof(double), compare_doubles);
    return values[(int)(q * (n - 1) + 0.5)];
}

// one training step of m on (x, y); returns its milliseconds
static double timed_step(Model* m, const int* x, const int* y, size_t B, size_t T, int t) {
    double t0 = now_seconds();
    model_forward(m, x, y, B, T);
    model_zero_grad(m);
    model_backward(m);
    model_update(m, 1e-4f, 0.9f, 0.95f, 1e-8f, 0.1f, t);
    return 1000.0 * (now_seconds() - t0);
}

int main(int argc, char** argv) {
    int rounds = 15;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--rounds") == 0 && i + 1 < argc) { rounds = atoi(argv[++i]); }
        else if (strcmp(argv[i], "--threads") == 0 && i + 1 < argc) { omp_set_num_threads(atoi(argv[++i])); }
        else { fprintf(stderr, "error: unknown argument '%s' (usage: ./bench [--rounds N] [--threads N])\n", argv[i]); return 1; }
    }
    if (rounds < 1) { fprintf(stderr, "error: --rounds must be positive\n"); return 1; }
    const size_t B = 8, T = 128;
    const char* names[N_MODES] = {"none", "full", "block S=4"};
    const int block_sizes[N_MODES] = {0, 1, 4};
    printf("bench: d=256 L=8 H=8 G=4 F=704 V=256 B=%zu T=%zu, %d threads, %d rounds of one "
           "step per mode, modes interleaved\n", B, T, omp_get_max_threads(), rounds);

    Model models[N_MODES];
    for (int i = 0; i < N_MODES; i++) {
        ModelConfig c = {256, 256, 8, 8, 4, 704, block_sizes[i]};
        model_build(&models[i], &c, B, T);
        model_init_params(&models[i], 1);
    }
    int* x = mallocCheck(B * T * sizeof(int));
    int* y = mallocCheck(B * T * sizeof(int));
    uint64_t state = 7;
    for (size_t i = 0; i < B * T; i++) {
        x[i] = (int)(rng_next(&state) % 256);
        y[i] = (int)(rng_next(&state) % 256);
    }
    double* ms[N_MODES];
    double* ratio[N_MODES];
    for (int i = 0; i < N_MODES; i++) {
        ms[i] = mallocCheck((size_t)rounds * sizeof(double));
        ratio[i] = mallocCheck((size_t)rounds * sizeof(double));
        for (int w = 1; w <= 2; w++) { timed_step(&models[i], x, y, B, T, w); }  // warm-up
    }
    for (int r = 0; r < rounds; r++) {
        for (int i = 0; i < N_MODES; i++) { ms[i][r] = timed_step(&models[i], x, y, B, T, r + 3); }
        for (int i = 0; i < N_MODES; i++) { ratio[i][r] = ms[i][r] / ms[0][r]; }
    }
    for (int i = 0; i < N_MODES; i++) {
        double median = quantile(ms[i], rounds, 0.5);
        printf("%-10s %8.1f ms/step %9.0f tokens/s", names[i], median,
               (double)(B * T) / (median / 1000.0));
        if (i > 0) {
            double low = quantile(ratio[i], rounds, 0.25), high = quantile(ratio[i], rounds, 0.75);
            printf("   overhead vs none %+6.1f%% (middle half of rounds %+.1f%% .. %+.1f%%)",
                   100.0 * (quantile(ratio[i], rounds, 0.5) - 1.0), 100.0 * (low - 1.0),
                   100.0 * (high - 1.0));
        }
        printf("\n");
    }
    for (int i = 0; i < N_MODES; i++) {
        free(ms[i]);
        free(ratio[i]);
        model_free(&models[i]);
    }
    free(x);
    free(y);
    return 0;
}
