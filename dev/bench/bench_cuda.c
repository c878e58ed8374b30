// bench_cuda.c — dev/bench/bench.c on the GPU: ms/step and tokens/s of one full training step of
// ./train_cuda (forward, backward, gradient norm, clipping, AdamW) per residual mode (mhc's
// too), on bench.c's config, the modes interleaved round by round, each overhead the median
// of the paired ratios mode / none. Built by `make gpu-check` (build/bench_cuda).
//
// ./build/bench_cuda [--rounds N] [--cublas] [--variants] [--graph]
//     --cublas: every matmul through cuBLAS; --variants: SPEC's variants too (bench.c's list,
//     each also against the mode it varies); --graph: every config twice, its step queued
//     call by call (./train_cuda --no-graph) and as CUDA graphs (./train_cuda), interleaved,
//     each "graph" line also against its uncaptured twin
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
    int rounds = 50, cublas = 0, n_configs = N_BENCH_MODES, graph = 0;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--rounds") == 0 && i + 1 < argc) { rounds = atoi(argv[++i]); }
        else if (strcmp(argv[i], "--cublas") == 0) { cublas = 1; }
        else if (strcmp(argv[i], "--variants") == 0) { n_configs = N_BENCH_CONFIGS; }
        else if (strcmp(argv[i], "--graph") == 0) { graph = 1; }
        else { fprintf(stderr, "error: unknown argument '%s' (usage: bench_cuda [--rounds N] [--cublas] [--variants] [--graph])\n", argv[i]); return 1; }
    }
    if (rounds < 1) { fprintf(stderr, "error: --rounds must be positive\n"); return 1; }
    if (graph && cublas) { fprintf(stderr, "error: --graph times our matmul (./train_cuda --cublas runs uncaptured)\n"); return 1; }
    const char* problem = cuda_device_problem();
    if (problem != NULL) { fprintf(stderr, "error: %s\n", problem); return 1; }
    model_use_cublas_cuda(cublas);
    const size_t B = BENCH_B, T = BENCH_T;
    printf("bench_cuda: d=256 L=8 H=8 G=4 F=704 V=256 B=%zu T=%zu, matmuls: %s, %d rounds of "
           "one step per config (3 modes, mhc with 4 and 2 streams, %d variants%s), configs "
           "interleaved\n", B, T, cublas ? "cuBLAS" : "ours", rounds, n_configs - N_BENCH_MODES,
           graph ? "; each uncaptured, then as CUDA graphs: \"graph\"" : "");

    // configs [0, n_configs) queued call by call; with --graph, config n_configs + i is
    // config i as CUDA graphs
    const char* names[2 * N_BENCH_CONFIGS];
    char graph_names[N_BENCH_CONFIGS][64];
    int parent[2 * N_BENCH_CONFIGS];
    ModelCuda models[2 * N_BENCH_CONFIGS];
    for (int i = 0; i < (graph ? 2 : 1) * n_configs; i++) {
        int base = i % n_configs;
        ModelConfig c = bench_config_at(base, &names[i], &parent[i]);
        if (i >= n_configs) {
            snprintf(graph_names[base], sizeof(graph_names[base]), "%s graph", names[base]);
            names[i] = graph_names[base];
            parent[i] = base;  // its second overhead: against itself uncaptured
        }
        Model host;
        model_build(&host, &c, 1, 1);
        model_init_params(&host, 1);
        model_build_cuda(&models[i], &c, B, T);
        model_to_device_cuda(&models[i], &host);
        model_use_graph_cuda(&models[i], i >= n_configs);
        model_free(&host);
    }
    if (graph) { n_configs *= 2; }
    Bench bench = {models, mallocCheck(B * T * sizeof(int)), mallocCheck(B * T * sizeof(int)), B, T};
    bench_batch(bench.x, bench.y, B * T);
    double* ms[2 * N_BENCH_CONFIGS];
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
