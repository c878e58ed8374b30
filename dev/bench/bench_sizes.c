// bench_sizes.c — how a training step's cost grows with the model: at each size (width d,
// depth L, context T) ms/step, tokens/s and GFLOP/s of one training step in each mode (none,
// full, block S=4), and that rate as a share of the matmul's own rate at that size (and on the
// CPU, of its rate with its operands out of cache, as a step's products find them).
// `make bench-sizes` runs it (dev/bench/bench_sizes.sh, PyTorch beside each size). Built
// twice: build/bench_sizes times ./train's step (as dev/bench/bench.c), build/bench_sizes_cuda
// (-DBENCH_CUDA, `make gpu-check`) ./train_cuda's, as CUDA graphs (as bench_cuda --graph).
//
// ./build/bench_sizes [--size d,L,T]... [--mode none|full|block] [--rounds N] [--threads N]
//                     [--no-rates]
//     (--mode: that mode alone, e.g. under perf; by default all three. --no-rates: the step
//     alone, without the matmul's rates, whose products perf would count as the step's)
//
// A size is the bench model grown: H=8 G=4 heads (head size d/8), F = 8d/3 rounded up to a
// multiple of 64, V=256, and B = 1024/T, so that every size up to T = 1024 trains 1024 tokens a
// step (the matmuls' work grows with d and L alone, the causal attention's with T too); past
// it (T = 2048, 4096: `make bench-context`) B = 1, T tokens a step. Each mode's line ends with
// the memory its model allocates (parameters, gradients, AdamW moments, activations). The modes take
// turns round by round (bench_util.h's time_rounds), each line the median. The matmul rate is
// linear_forward's on the MLP's product (B*T x d)(d x F), best of the rounds, as bench.c
// measures it; GFLOP/s counts what bench_pytorch.py's step_flops counts (the matmuls and the
// attention products, 3x the forward's; the depth attention, norms and AdamW not at all), so
// the share says how much of the step runs at the matmul's rate.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "layers.h"
#include "model.h"
#include "util.h"
#ifdef BENCH_CUDA
#include "layers.cuh"
#include "model.cuh"  // before bench_util.h: its GPU training step
#else
#include <omp.h>
#endif
#include "bench_util.h"

#define MAX_SIZES 32

// one size's model in mode `mode` (0 none, 1 full, 2 block S=4); its batch is tokens_of(T) / T
static ModelConfig size_config(int d, int L, int mode) {
    const int block_sizes[N_MODES] = {0, 1, 4};
    int F = (8 * d + 2) / 3;  // 8d/3 rounded up, then up to a multiple of 64
    ModelConfig c = {256, d, L, 8, 4, (F + 63) / 64 * 64, block_sizes[mode]};
    return c;
}

// FLOPs of one training step: 6 x the matmul parameters x B*T, plus the causal attention's
// two products (QK^T, AV: 2*B*H*T*T*hs each, half of them masked), x 3 for the backward
static double step_flops(const ModelConfig* c, size_t B, size_t T) {
    double d = c->d_model, L = c->n_layers, H = c->n_heads, G = c->n_kv_heads, hs = d / H;
    double matmul_params = L * (d * H * hs + 2.0 * d * G * hs + H * hs * d + 3.0 * d * c->ffn_hidden)
                           + (double)c->vocab_size * d;
    return 6.0 * matmul_params * B * T + 3.0 * L * 2.0 * (2.0 * B * H * T * T * hs) / 2.0;
}

#ifdef BENCH_CUDA
typedef ModelCuda BenchModel;
static Model* host_side(BenchModel* m) { return &m->model; }

static void build(BenchModel* m, const ModelConfig* c, size_t B, size_t T) {
    Model host;
    model_build(&host, c, 1, 1);
    model_init_params(&host, 1);
    model_build_cuda(m, c, B, T);
    model_to_device_cuda(m, &host);
    model_use_graph_cuda(m, 1);  // ./train_cuda's step: CUDA graphs
    model_free(&host);
}

static void release(BenchModel* m) { model_free_cuda(m); }

static void matmul(float* out, const float* inp, const float* weight, size_t N, size_t IN, size_t OUT) {
    linear_forward_cuda(out, inp, weight, N, IN, OUT);
    model_wait_cuda();
}

static double timed_step(BenchModel* m, const int* x, const int* y, size_t B, size_t T, int t) {
    return bench_training_step_cuda(m, x, y, B, T, t);
}
#else
typedef Model BenchModel;
static Model* host_side(BenchModel* m) { return m; }

static void build(BenchModel* m, const ModelConfig* c, size_t B, size_t T) {
    model_build(m, c, B, T);
    model_init_params(m, 1);
}

static void release(BenchModel* m) { model_free(m); }

static void matmul(float* out, const float* inp, const float* weight, size_t N, size_t IN, size_t OUT) {
    linear_forward(out, inp, weight, N, IN, OUT);
}

static double timed_step(BenchModel* m, const int* x, const int* y, size_t B, size_t T, int t) {
    return bench_training_step(m, x, y, B, T, t);
}
#endif

typedef struct {
    BenchModel* models;  // one per mode
    int *x, *y;          // the batch
    size_t B, T;
} Bench;

static double bench_step(void* context, int mode, int t) {
    Bench* b = (Bench*)context;
    return timed_step(&b->models[mode], b->x, b->y, b->B, b->T, t);
}

// GFLOP/s of the matmul (N x d)(d x F), best of `rounds`, on a model's own buffers once its
// timing is done: its AdamW moments as the input, its parameters as the weight, its gradients
// as the output (each holds more than the product needs at every size: checked)
static double matmul_rate(BenchModel* bm, size_t N, size_t d, size_t F, int rounds) {
    Model* m = host_side(bm);
    if (m->num_params < N * F || m->num_params < N * d) {
        fprintf(stderr, "error: bench_sizes: the model's buffers are smaller than the matmul\n");
        exit(1);
    }
    double best = 1e30;
    for (int r = 0; r < rounds + 1; r++) {  // round 0 warms up
        double t0 = now_seconds();
        matmul(m->grads_memory, m->m_memory, m->params_memory, N, d, F);
        double t = now_seconds() - t0;
        if (r > 0 && t < best) { best = t; }
    }
    return 2.0 * N * d * F / best * 1e-9;
}

#ifndef BENCH_CUDA
// The same product with its operands out of cache, as they are in a step: there each product
// reads a weight that AdamW last touched a step ago and an input, and writes an output, among
// the step's 300 MB of activations and training state (at the bench size), far more than the
// cores' caches hold. So the sets (input, weight, output) of COLD_BYTES together are
// multiplied in turn, each gone from the caches before it comes round again. GFLOP/s per
// product, best of `rounds` passes over the sets (a warm-up pass first); *sets_out: how many.
#define COLD_BYTES ((size_t)256 << 20)
static double matmul_rate_cold(size_t N, size_t d, size_t F, int rounds, size_t* sets_out) {
    size_t per_set = N * d + d * F + N * F;
    size_t sets = COLD_BYTES / (per_set * sizeof(float)) + 1;
    float* pool = (float*)mallocCheck(sets * per_set * sizeof(float));
    for (size_t i = 0; i < sets * per_set; i++) { pool[i] = (float)(i % 7) * 0.125f; }
    double best = 1e30;
    for (int r = 0; r < rounds + 1; r++) {
        double t0 = now_seconds();
        for (size_t s = 0; s < sets; s++) {
            float* inp = pool + s * per_set;
            linear_forward(inp + N * d + d * F, inp, inp + N * d, N, d, F);
        }
        double t = (now_seconds() - t0) / (double)sets;
        if (r > 0 && t < best) { best = t; }
    }
    free(pool);
    *sets_out = sets;
    return 2.0 * N * d * F / best * 1e-9;
}
#endif

// modes[0 .. n_modes-1]: the modes to time (0 none, 1 full, 2 block S=4); rates 0: the matmul's
// rates left out
// the tokens of a step at context T: 1024, or T when that is more (B = 1)
static size_t tokens_of(int T) { return T > 1024 ? (size_t)T : 1024; }

// what model_build allocates for c at B x T, in MiB: 4 floats a parameter (the parameters,
// their gradients, AdamW's two moments) and the activations (model.h's size table)
static double model_mib(const ModelConfig* c, size_t B, size_t T) {
    size_t sizes[N_PARAM_TENSORS];
    size_t params = param_sizes(c, sizes);
    Activations sizing;
    sizing.sub = (SubLayer*)mallocCheck((size_t)(2 * c->n_layers + 1) * sizeof(SubLayer));
    size_t activations = point_activations(&sizing, c, B, T, 1, NULL);
    free(sizing.sub);
    return (double)((4 * params + activations) * sizeof(float)) / 1048576.0;
}

static void bench_size(int d, int L, int T, int rounds, const int* modes, int n_modes, int rates) {
    const size_t tokens = tokens_of(T), B = tokens / (size_t)T;
    BenchModel models[N_MODES];
    ModelConfig configs[N_MODES];
    for (int i = 0; i < n_modes; i++) {
        configs[i] = size_config(d, L, modes[i]);
        build(&models[i], &configs[i], B, (size_t)T);
    }
    Bench bench = {models, (int*)mallocCheck(tokens * sizeof(int)), (int*)mallocCheck(tokens * sizeof(int)), B,
                   (size_t)T};
    bench_batch(bench.x, bench.y, tokens);
    double* ms[N_MODES];
    for (int i = 0; i < n_modes; i++) { ms[i] = (double*)mallocCheck((size_t)rounds * sizeof(double)); }
    time_rounds(ms, n_modes, rounds, 1, bench_step, &bench);
    const ModelConfig* c = &configs[0];
    size_t F = (size_t)c->ffn_hidden, sets = 0;
    double rate = 0.0, cold = 0.0;  // 0: not measured
    if (rates) {
        rate = matmul_rate(&models[0], tokens, (size_t)d, F, rounds);
#ifndef BENCH_CUDA
        cold = matmul_rate_cold(tokens, (size_t)d, F, rounds, &sets);
#endif
    }
    printf("size d=%d L=%d T=%d: H=%d G=%d F=%d V=%d B=%zu, %.2f GFLOP/step counted", d, L, T,
           c->n_heads, c->n_kv_heads, c->ffn_hidden, c->vocab_size, B,
           step_flops(c, B, (size_t)T) * 1e-9);
    if (rate > 0.0) {
        printf("; matmul (%zu x %d)(%d x %zu): %.1f GFLOP/s", tokens, d, d, F, rate);
    }
    if (cold > 0.0) {
        printf(", %.1f with its operands out of cache (%zu sets in turn)", cold, sets);
    }
    printf("\n");
    for (int i = 0; i < n_modes; i++) {
        sort_values(ms[i], rounds);
        double median = quantile(ms[i], rounds, 0.5);
        double gflops = step_flops(&configs[i], B, (size_t)T) / (median / 1000.0) * 1e-9;
        printf("%-10s %-27s %9.2f ms/step %9.0f tokens/s %8.1f GFLOP/s", BENCH_MODE_NAMES[modes[i]],
               "attnres.c", median, tokens / (median / 1000.0), gflops);
        if (rate > 0.0) { printf(" %5.1f%% of the matmul", 100.0 * gflops / rate); }
        if (cold > 0.0) { printf(", %.1f%% of it out of cache", 100.0 * gflops / cold); }
        printf(" | memory %.1f MiB\n", model_mib(&configs[i], B, (size_t)T));
        fflush(stdout);
        free(ms[i]);
        release(&models[i]);
    }
    free(bench.x);
    free(bench.y);
}

static const char* const USAGE =
    "usage: bench_sizes [--size d,L,T]... [--mode none|full|block] [--rounds N] [--threads N]\n"
    "                   [--no-rates]\n"
    "  ms/step, tokens/s, GFLOP/s and the share of the matmul's rate per mode at each size\n"
    "  (default 256,8,128; d a multiple of 64, L even, T one of 128, 256, 512, 1024, 2048, 4096)\n";

int main(int argc, char** argv) {
    int rounds = 3, n_sizes = 0, sizes[MAX_SIZES][3], modes[N_MODES] = {0, 1, 2}, n_modes = N_MODES;
    int rates = 1;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--rounds") == 0 && i + 1 < argc) { rounds = atoi(argv[++i]); }
#ifndef BENCH_CUDA
        else if (strcmp(argv[i], "--threads") == 0 && i + 1 < argc) { omp_set_num_threads(atoi(argv[++i])); }
#endif
        else if (strcmp(argv[i], "--mode") == 0 && i + 1 < argc) {
            const char* names[N_MODES] = {"none", "full", "block"};
            n_modes = 0;
            for (int k = 0; k < N_MODES; k++) {
                if (strcmp(argv[i + 1], names[k]) == 0) { modes[n_modes++] = k; }
            }
            if (n_modes == 0) {
                fprintf(stderr, "error: --mode %s: one of none, full, block\n", argv[i + 1]);
                return 1;
            }
            i++;
        }
        else if (strcmp(argv[i], "--size") == 0 && i + 1 < argc) {
            int* s = sizes[n_sizes];
            char end;
            if (n_sizes == MAX_SIZES) { fprintf(stderr, "error: at most %d sizes\n", MAX_SIZES); return 1; }
            if (sscanf(argv[++i], "%d,%d,%d%c", &s[0], &s[1], &s[2], &end) != 3 || s[0] < 64 ||
                s[0] % 64 != 0 || s[1] < 2 || s[1] % 2 != 0 || (s[2] != 128 && s[2] != 256 && s[2] != 512 && s[2] != 1024 && s[2] != 2048 && s[2] != 4096)) {
                fprintf(stderr, "error: --size %s: d,L,T with d a multiple of 64, L even (block S=4), T one of "
                        "128, 256, 512, 1024, 2048, 4096\n", argv[i]);
                return 1;
            }
            n_sizes++;
        }
        else if (strcmp(argv[i], "--no-rates") == 0) { rates = 0; }
        else if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) { printf("%s", USAGE); return 0; }
        else {
            fprintf(stderr, "error: unknown argument '%s' (usage: bench_sizes [--size d,L,T]... "
                    "[--mode M] [--rounds N] [--threads N] [--no-rates])\n", argv[i]);
            return 1;
        }
    }
    if (rounds < 1) { fprintf(stderr, "error: --rounds must be positive\n"); return 1; }
    if (n_sizes == 0) {
        sizes[0][0] = 256, sizes[0][1] = 8, sizes[0][2] = 128;
        n_sizes = 1;
    }
#ifdef BENCH_CUDA
    const char* problem = cuda_device_problem();
    if (problem != NULL) { fprintf(stderr, "error: %s\n", problem); return 1; }
    printf("bench_sizes_cuda: ./train_cuda's step, %d rounds, modes interleaved\n", rounds);
#else
    printf("bench_sizes: ./train's step, %d threads, %d rounds, modes interleaved\n",
           omp_get_max_threads(), rounds);
#endif
    for (int i = 0; i < n_sizes; i++) {
        bench_size(sizes[i][0], sizes[i][1], sizes[i][2], rounds, modes, n_modes, rates);
    }
    return 0;
}
