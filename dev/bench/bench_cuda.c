// bench_cuda.c — dev/bench/bench.c on the GPU: ms/step and tokens/s of one full training step of
// ./train_cuda (forward, backward, gradient norm, clipping, AdamW) per residual mode (mhc's
// too), on bench.c's config, the modes interleaved round by round, each overhead the median
// of the paired ratios mode / none. Built by `make gpu-check` (build/bench_cuda).
//
// ./build/bench_cuda [--rounds N] [--cublas] [--variants]
//     --cublas: every matmul through cuBLAS; --variants: SPEC's variants too (bench.c's list,
//     each also against the mode it varies)
#define _POSIX_C_SOURCE 200809L  // clock_gettime
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "model.cuh"
#include "util.h"
#include "bench_util.h"


typedef struct {
    ModelCuda* models;  // one per mode
    int *x, *y;         // the batch
    size_t B, T;
} Bench;

static double bench_step(void* context, int mode, int t) {
    Bench* b = context;
    return bench_training_step_cuda(&b->models[mode], b->x, b->y, b->B, b->T, t);
}

int main(int argc, char** argv) {
    int rounds = 50, cublas = 0, n_configs = N_BENCH_MODES;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--rounds") == 0 && i + 1 < argc) { rounds = atoi(argv[++i]); }
        else if (strcmp(argv[i], "--cublas") == 0) { cublas = 1; }
        else if (strcmp(argv[i], "--variants") == 0) { n_configs = N_BENCH_CONFIGS; }
        else { fprintf(stderr, "error: unknown argument '%s' (usage: bench_cuda [--rounds N] [--cublas] [--variants])\n", argv[i]); return 1; }
    }
    if (rounds < 1) { fprintf(stderr, "error: --rounds must be positive\n"); return 1; }
    const char* problem = cuda_device_problem();
    if (problem != NULL) { fprintf(stderr, "error: %s\n", problem); return 1; }
    model_use_cublas_cuda(cublas);
    const size_t B = BENCH_B, T = BENCH_T;
    printf("bench_cuda: d=256 L=8 H=8 G=4 F=704 V=256 B=%zu T=%zu, matmuls: %s, %d rounds of "
           "one step per config (3 modes, mhc with 4 and 2 streams, %d variants), configs "
           "interleaved\n", B, T, cublas ? "cuBLAS" : "ours", rounds, n_configs - N_BENCH_MODES);

    const char* names[N_BENCH_CONFIGS];
    int parent[N_BENCH_CONFIGS];
    ModelCuda models[N_BENCH_CONFIGS];
    for (int i = 0; i < n_configs; i++) {
        ModelConfig c = bench_config_at(i, &names[i], &parent[i]);
        Model host;
        model_build(&host, &c, 1, 1);
        model_init_params(&host, 1);
        model_build_cuda(&models[i], &c, B, T);
        model_to_device_cuda(&models[i], &host);
        model_free(&host);
    }
    Bench bench = {models, mallocCheck(B * T * sizeof(int)), mallocCheck(B * T * sizeof(int)), B, T};
    bench_batch(bench.x, bench.y, B * T);
    double* ms[N_BENCH_CONFIGS];
    for (int i = 0; i < n_configs; i++) { ms[i] = mallocCheck((size_t)rounds * sizeof(double)); }
    time_rounds(ms, n_configs, rounds, 3, bench_step, &bench);
    print_rounds(names, n_configs, ms, rounds, B * T, parent);
    for (int i = 0; i < n_configs; i++) {
        free(ms[i]);
        model_free_cuda(&models[i]);
    }
    free(bench.x);
    free(bench.y);
    return 0;
}
