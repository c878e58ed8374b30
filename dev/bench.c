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
#include "util.h"
#include "bench_util.h"


// one training step of m on (x, y); returns its milliseconds
static double timed_step(Model* m, const int* x, const int* y, size_t B, size_t T, int t) {
    double t0 = now_seconds();
    model_forward(m, x, y, B, T);
    model_zero_grad(m);
    model_backward(m);
    model_update(m, 1e-4f, 0.9f, 0.95f, 1e-8f, 0.1f, t);
    return 1000.0 * (now_seconds() - t0);
}

typedef struct {
    Model* models;  // one per mode
    int *x, *y;         // the batch
    size_t B, T;
} Bench;

static double bench_step(void* context, int mode, int t) {
    Bench* b = context;
    return timed_step(&b->models[mode], b->x, b->y, b->B, b->T, t);
}

int main(int argc, char** argv) {
    int rounds = 15;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--rounds") == 0 && i + 1 < argc) { rounds = atoi(argv[++i]); }
        else if (strcmp(argv[i], "--threads") == 0 && i + 1 < argc) { omp_set_num_threads(atoi(argv[++i])); }
        else { fprintf(stderr, "error: unknown argument '%s' (usage: ./bench [--rounds N] [--threads N])\n", argv[i]); return 1; }
    }
    if (rounds < 1) { fprintf(stderr, "error: --rounds must be positive\n"); return 1; }
    const size_t B = BENCH_B, T = BENCH_T;
    printf("bench: d=256 L=8 H=8 G=4 F=704 V=256 B=%zu T=%zu, %d threads, %d rounds of one "
           "step per mode, modes interleaved\n", B, T, omp_get_max_threads(), rounds);

    Model models[N_MODES];
    for (int i = 0; i < N_MODES; i++) {
        ModelConfig c = bench_config(i);
        model_build(&models[i], &c, B, T);
        model_init_params(&models[i], 1);
    }
    Bench bench = {models, mallocCheck(B * T * sizeof(int)), mallocCheck(B * T * sizeof(int)), B, T};
    bench_batch(bench.x, bench.y, B * T);
    double* ms[N_MODES];
    for (int i = 0; i < N_MODES; i++) { ms[i] = mallocCheck((size_t)rounds * sizeof(double)); }
    time_rounds(ms, N_MODES, rounds, 2, bench_step, &bench);
    print_rounds(BENCH_MODE_NAMES, N_MODES, ms, rounds, B * T);
    for (int i = 0; i < N_MODES; i++) {
        free(ms[i]);
        model_free(&models[i]);
    }
    free(bench.x);
    free(bench.y);
    return 0;
}
