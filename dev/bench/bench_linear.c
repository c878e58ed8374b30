// bench_linear.c — checks src/linear.c against a naive double-precision reference and
// across thread counts, then times it (and, once, the naive three loops beside it). Exits 1 if any check fails. Build and run:
//   gcc -O3 -march=native -std=c11 -fopenmp -Isrc dev/bench/bench_linear.c src/linear.c
//       -o /tmp/bench_linear -lm        (one line)
//   /tmp/bench_linear [repeats]         (times are the best of repeats: the cores are shared)
// Errors are |got - ref| / sum_p |term_p|: the float error a sum of k terms can pick up,
// measured against the size of its terms (it stays below k * 2^-24 for any fma order).
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "layers.h"

static float* random_floats(size_t count, unsigned* seed) {
    float* p = malloc(count * sizeof(float));
    if (p == NULL) { fprintf(stderr, "bench_linear: out of memory\n"); exit(EXIT_FAILURE); }
    for (size_t i = 0; i < count; i++) {
        *seed = *seed * 1664525u + 1013904223u;
        p[i] = (float)(*seed >> 8) / (float)(1u << 24) * 2.0f - 1.0f;  // uniform in [-1,1)
    }
    return p;
}

static float* copy_floats(const float* src, size_t count) {
    float* p = malloc(count * sizeof(float));
    if (p == NULL) { fprintf(stderr, "bench_linear: out of memory\n"); exit(EXIT_FAILURE); }
    memcpy(p, src, count * sizeof(float));
    return p;
}

// error of got = init + sum_p a(p) b(p), a(p) = a[p*sa], b(p) = b[p*sb], vs. a double sum
static double term_error(float got, float init, const float* a, size_t sa, const float* b,
                         size_t sb, size_t k) {
    double sum = init, size = fabs(init);
    for (size_t p = 0; p < k; p++) {
        sum += (double)a[p * sa] * b[p * sb];
        size += fabs((double)a[p * sa] * b[p * sb]);
    }
    return size > 0.0 ? fabs(got - sum) / size : fabs(got - sum);
}

// Runs forward and backward on 1 and 2 threads; returns 1 if all is right.
static int check(size_t N, size_t IN, size_t OUT, unsigned seed) {
    float* inp = random_floats(N * IN, &seed);
    float* weight = random_floats(OUT * IN, &seed);
    float* dout = random_floats(N * OUT, &seed);
    float* dinp0 = random_floats(N * IN, &seed);  // backward accumulates into these
    float* dweight0 = random_floats(OUT * IN, &seed);
    float* out[2], *dinp[2], *dweight[2];
    for (int t = 0; t < 2; t++) {
        omp_set_num_threads(t + 1);
        out[t] = random_floats(N * OUT, &seed);  // forward overwrites this garbage
        dinp[t] = copy_floats(dinp0, N * IN);
        dweight[t] = copy_floats(dweight0, OUT * IN);
        linear_forward(out[t], inp, weight, N, IN, OUT);
        linear_backward(dinp[t], dweight[t], dout, inp, weight, N, IN, OUT);
    }
    double err_out = 0.0, err_dinp = 0.0, err_dweight = 0.0;
    for (size_t n = 0; n < N; n++)
        for (size_t o = 0; o < OUT; o++)  // out[n][o] = sum_i inp[n][i] weight[o][i]
            err_out = fmax(err_out, term_error(out[0][n * OUT + o], 0.0f, inp + n * IN, 1,
                                               weight + o * IN, 1, IN));
    for (size_t n = 0; n < N; n++)
        for (size_t i = 0; i < IN; i++)  // dinp[n][i] += sum_o dout[n][o] weight[o][i]
            err_dinp = fmax(err_dinp, term_error(dinp[0][n * IN + i], dinp0[n * IN + i],
                                                 dout + n * OUT, 1, weight + i, IN, OUT));
    for (size_t o = 0; o < OUT; o++)
        for (size_t i = 0; i < IN; i++)  // dweight[o][i] += sum_n dout[n][o] inp[n][i]
            err_dweight = fmax(err_dweight, term_error(dweight[0][o * IN + i],
                                                       dweight0[o * IN + i], dout + o, OUT,
                                                       inp + i, IN, N));
    int same = memcmp(out[0], out[1], N * OUT * sizeof(float)) == 0
            && memcmp(dinp[0], dinp[1], N * IN * sizeof(float)) == 0
            && memcmp(dweight[0], dweight[1], OUT * IN * sizeof(float)) == 0;
    int ok = same && err_out < 1e-5 && err_dinp < 1e-5 && err_dweight < 1e-5;
    printf("N=%5zu IN=%4zu OUT=%4zu  max error: out %.1e dinp %.1e dweight %.1e  "
           "1 vs 2 threads: %s  %s\n", N, IN, OUT, err_out, err_dinp, err_dweight,
           same ? "bit-identical" : "DIFFER", ok ? "OK" : "FAIL");
    free(inp); free(weight); free(dout); free(dinp0); free(dweight0);
    for (int t = 0; t < 2; t++) { free(out[t]); free(dinp[t]); free(dweight[t]); }
    return ok;
}

typedef void (*LinearForward)(float*, const float*, const float*, size_t, size_t, size_t);
typedef void (*LinearBackward)(float*, float*, const float*, const float*, const float*, size_t,
                               size_t, size_t);

// Best-of-repeats GFLOP/s of forward (2*N*IN*OUT flops) and backward (4*N*IN*OUT), of the
// tiled linear or (naive) the three plain loops
static void bench(size_t N, size_t IN, size_t OUT, int threads, int repeats, int naive) {
    LinearForward forward = naive ? linear_forward_naive : linear_forward;
    LinearBackward backward = naive ? linear_backward_naive : linear_backward;
    unsigned seed = 42;
    float* inp = random_floats(N * IN, &seed);
    float* weight = random_floats(OUT * IN, &seed);
    float* dout = random_floats(N * OUT, &seed);
    float* out = random_floats(N * OUT, &seed);
    float* dinp = random_floats(N * IN, &seed);
    float* dweight = random_floats(OUT * IN, &seed);
    omp_set_num_threads(threads);
    double best_fwd = 1e30, best_bwd = 1e30;
    for (int r = 0; r < repeats; r++) {
        double t0 = omp_get_wtime();
        forward(out, inp, weight, N, IN, OUT);
        double t1 = omp_get_wtime();
        backward(dinp, dweight, dout, inp, weight, N, IN, OUT);
        double t2 = omp_get_wtime();
        best_fwd = fmin(best_fwd, t1 - t0);
        best_bwd = fmin(best_bwd, t2 - t1);
    }
    double flops = 2.0 * N * IN * OUT;
    printf("N=%5zu IN=%4zu OUT=%4zu %s%-5s forward %6.1f GFLOP/s (%.3f ms)  "
           "backward %6.1f GFLOP/s (%.3f ms)\n", N, IN, OUT, naive ? "naive" : "threads=",
           naive ? "" : (threads == 1 ? "1" : "2"), flops / best_fwd * 1e-9, best_fwd * 1e3, 2.0 * flops / best_bwd * 1e-9,
           best_bwd * 1e3);
    free(inp); free(weight); free(dout); free(out); free(dinp); free(dweight);
}

int main(int argc, char** argv) {
    int repeats = argc > 1 ? atoi(argv[1]) : 100;
    // (N, IN, OUT): tiny, odd, exact tiles (6 x 16), long sums, and the model's shapes
    size_t checks[][3] = {{1, 1, 1}, {1, 7, 3}, {3, 5, 7}, {5, 33, 37}, {17, 31, 65},
                          {6, 16, 16}, {12, 32, 48}, {37, 100, 130}, {130, 70, 100},
                          {1000, 3, 1}, {7, 1, 40}, {256, 256, 704}, {1024, 256, 17}};
    int ok = 1;
    for (size_t c = 0; c < sizeof(checks) / sizeof(checks[0]); c++)
        ok &= check(checks[c][0], checks[c][1], checks[c][2], 1234u + (unsigned)c);
    // (N, IN, OUT): MLP gate/up (d=256 -> F=704), attention q/k/v/o (d -> d), MLP down
    // (F -> d), lm_head (d -> V=256, byte-level text)
    size_t shapes[][3] = {{1024, 256, 704}, {1024, 256, 256}, {1024, 704, 256},
                          {1024, 256, 256}};
    // the naive loops once, on one thread, 3 runs: the starting point of the tiled kernel
    bench(shapes[0][0], shapes[0][1], shapes[0][2], 1, 3, 1);
    for (size_t s = 0; s < sizeof(shapes) / sizeof(shapes[0]); s++)
        for (int threads = 1; threads <= 2; threads++)
            bench(shapes[s][0], shapes[s][1], shapes[s][2], threads, repeats, 0);
    if (!ok) { printf("FAIL: some check failed\n"); return 1; }
    return 0;
}
