// bench.c — `make bench`: ms/step and tokens/s of one full training step (forward, backward,
// AdamW) in each residual mode on one fixed mid-size config, and the AttnRes overhead.
//
// ./bench [--steps N] [--threads N] [--modes none,full,block]
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "model.h"
#include "rng.h"
#include "util.h"

static double now_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

// the median ms/step of `steps` timed steps after 2 warm-up steps
static double time_mode(int block_size, int steps, size_t B, size_t T) {
    ModelConfig c = {256, 256, 8, 8, 4, 704, block_size};
    Model m;
    model_build(&m, &c, B, T);
    model_init_params(&m, 1);
    int* x = mallocCheck(B * T * sizeof(int));
    int* y = mallocCheck(B * T * sizeof(int));
    uint64_t state = 7;
    for (size_t i = 0; i < B * T; i++) {
        x[i] = (int)(rng_next(&state) % 256);
        y[i] = (int)(rng_next(&state) % 256);
    }
    double* ms = mallocCheck((size_t)steps * sizeof(double));
    for (int s = -2; s < steps; s++) {
        double t0 = now_seconds();
        model_forward(&m, x, y, B, T);
        model_zero_grad(&m);
        model_backward(&m);
        model_update(&m, 1e-4f, 0.9f, 0.95f, 1e-8f, 0.1f, s + 3);
        if (s >= 0) { ms[s] = 1000.0 * (now_seconds() - t0); }
    }
    for (int i = 1; i < steps; i++) {  // insertion sort for the median
        for (int j = i; j > 0 && ms[j] < ms[j - 1]; j--) {
            double t = ms[j]; ms[j] = ms[j - 1]; ms[j - 1] = t;
        }
    }
    double median = ms[steps / 2];
    free(ms);
    free(x);
    free(y);
    model_free(&m);
    return median;
}

int main(int argc, char** argv) {
    int steps = 10;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--steps") == 0 && i + 1 < argc) { steps = atoi(argv[++i]); }
        else if (strcmp(argv[i], "--threads") == 0 && i + 1 < argc) { omp_set_num_threads(atoi(argv[++i])); }
        else { fprintf(stderr, "error: unknown argument '%s' (usage: ./bench [--steps N] [--threads N])\n", argv[i]); return 1; }
    }
    if (steps < 1) { fprintf(stderr, "error: --steps must be positive\n"); return 1; }
    size_t B = 8, T = 128;
    printf("bench: d=256 L=8 H=8 G=4 F=704 V=256 B=%zu T=%zu, %d threads, median of %d steps\n",
           B, T, omp_get_max_threads(), steps);
    const char* names[] = {"none", "full", "block S=4"};
    int block_sizes[] = {0, 1, 4};
    double base = 0.0;
    for (int i = 0; i < 3; i++) {
        double ms = time_mode(block_sizes[i], steps, B, T);
        if (i == 0) { base = ms; }
        printf("%-10s %8.1f ms/step %9.0f tokens/s", names[i], ms, (double)(B * T) / (ms / 1000.0));
        if (i > 0) { printf("   overhead vs none %+6.1f%%", 100.0 * (ms - base) / base); }
        printf("\n");
        fflush(stdout);
    }
    return 0;
}
