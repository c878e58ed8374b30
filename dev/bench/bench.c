// bench.c — `make bench`: ms/step and tokens/s of one full training step (forward, backward,
// AdamW) in each residual mode on one fixed mid-size config, and the AttnRes overhead; then
// the same for each of SPEC's variants (the paper's ablation rows); then each config's memory
// (activations and training state); then the depth attention alone as full mode calls it,
// the causal attention alone as one layer calls it, and the optimiser step alone, AdamW
// against Muon, with Newton–Schulz's matmul rate.
//
// ./bench [--rounds N] [--threads N] [--modes]     (--modes: the modes only (the three, and
//                                                   mHC-lite with 4 and 2 streams), no variants)
//
// The machine is shared, so its speed drifts from one second to the next. To compare configs
// under the same conditions they take turns: each round times one step of none, then of
// full, then of block, then of mhc, then of each variant (after two warm-up steps each), and each
// overhead is the median over rounds of the paired ratio config / none of the same round,
// printed with the range between its 25th and 75th percentiles; a variant's line adds the
// median paired ratio to the mode it varies.
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "layers.h"
#include "model.h"
#include "util.h"
#include "bench_util.h"


// n floats drawn uniformly from [-0.5, 0.5), freshly allocated
static float* uniform_floats(size_t n, uint64_t* state) {
    float* x = mallocCheck(n * sizeof(float));
    for (size_t i = 0; i < n; i++) { x[i] = (float)rng_uniform(state) - 0.5f; }
    return x;
}

// The depth attention alone, as full mode calls it in one step: sub-layer l (0 .. 2L) attends
// over l + 1 sources of N x d. Prints the best over `rounds` of the forward calls and of the
// backward calls (the cores are shared: the best is the least disturbed).
static void time_depth_attention(size_t n_calls, size_t N, size_t d, int rounds) {
    uint64_t state = 11;
    float *src[n_calls], *dsrc[n_calls];
    for (size_t i = 0; i < n_calls; i++) {
        src[i] = uniform_floats(N * d, &state);
        dsrc[i] = callocCheck(N * d, sizeof(float));
    }
    float* out = mallocCheck(N * d * sizeof(float));
    float* dout = uniform_floats(N * d, &state);
    float* alpha = mallocCheck(n_calls * N * n_calls * sizeof(float));
    float* rstd = mallocCheck(n_calls * N * n_calls * sizeof(float));
    float *query = mallocCheck(d * sizeof(float)), *gain = mallocCheck(d * sizeof(float));
    float *dquery = callocCheck(d, sizeof(float)), *dgain = callocCheck(d, sizeof(float));
    for (size_t c = 0; c < d; c++) {
        query[c] = 0.1f * ((float)rng_uniform(&state) - 0.5f);
        gain[c] = 1.0f;
    }
    double best_forward = 1e30, best_backward = 1e30;
    for (int r = 0; r < rounds; r++) {
        double t0 = now_seconds();
        for (size_t l = 0; l < n_calls; l++) {
            depth_attention_forward(out, alpha + l * N * n_calls, rstd + l * N * n_calls,
                                    (const float* const*)src, query, gain, l + 1, N, d);
        }
        double t1 = now_seconds();
        for (size_t l = n_calls; l-- > 0;) {
            depth_attention_backward(dsrc, dquery, dgain, dout, alpha + l * N * n_calls,
                                     rstd + l * N * n_calls, (const float* const*)src, query,
                                     gain, l + 1, N, d);
        }
        double t2 = now_seconds();
        if (t1 - t0 < best_forward) { best_forward = t1 - t0; }
        if (t2 - t1 < best_backward) { best_backward = t2 - t1; }
    }
    printf("depth attention alone, full mode's %zu calls of one step (1 .. %zu sources of %zu x "
           "%zu): forward %.2f ms, backward %.2f ms (best of %d)\n", n_calls, n_calls, N, d,
           1000.0 * best_forward, 1000.0 * best_backward, rounds);
    for (size_t i = 0; i < n_calls; i++) {
        free(src[i]);
        free(dsrc[i]);
    }
    float* buffers[] = {out, dout, alpha, rstd, query, gain, dquery, dgain};
    for (size_t i = 0; i < sizeof(buffers) / sizeof(buffers[0]); i++) { free(buffers[i]); }
}

// The causal attention alone, as one layer calls it in a step: q (B,T,H*hs), k and v
// (B,T,G*hs). Prints the best over `rounds` of one forward and of one backward.
static void time_attention(size_t B, size_t T, size_t H, size_t G, size_t hs, int rounds) {
    uint64_t state = 12;
    size_t nq = B * T * H * hs, nkv = B * T * G * hs;
    float *q = uniform_floats(nq, &state), *dout = uniform_floats(nq, &state);
    float *k = uniform_floats(nkv, &state), *v = uniform_floats(nkv, &state);
    float *out = mallocCheck(nq * sizeof(float)), *lse = mallocCheck(B * H * T * sizeof(float));
    float *dq = callocCheck(nq, sizeof(float));
    float *dk = callocCheck(nkv, sizeof(float)), *dv = callocCheck(nkv, sizeof(float));
    double best_forward = 1e30, best_backward = 1e30;
    for (int r = 0; r < rounds; r++) {
        double t0 = now_seconds();
        attention_forward(out, lse, q, k, v, B, T, H, G, hs);
        double t1 = now_seconds();
        attention_backward(dq, dk, dv, dout, out, lse, q, k, v, B, T, H, G, hs);
        double t2 = now_seconds();
        if (t1 - t0 < best_forward) { best_forward = t1 - t0; }
        if (t2 - t1 < best_backward) { best_backward = t2 - t1; }
    }
    printf("attention alone, one layer's call (B=%zu T=%zu H=%zu G=%zu hs=%zu): forward %.2f ms, "
           "backward %.2f ms (best of %d)\n", B, T, H, G, hs, 1000.0 * best_forward,
           1000.0 * best_backward, rounds);
    float* buffers[] = {q, dout, k, v, out, lse, dq, dk, dv};
    for (size_t i = 0; i < sizeof(buffers) / sizeof(buffers[0]); i++) { free(buffers[i]); }
}

// Muon's extra time: one AdamW step (model_update) and one Muon step (model_update_shard_muon:
// Newton–Schulz on every layer's 7 matrices, AdamW on the rest) of model m, on random
// gradients, taking turns; then the Muon updates alone (muon_update on each of the 7
// tensors, its L layers at once, as the step calls it), their Newton–Schulz GFLOP/s
// (5 (4 a^2 b + 2 a^3) flops for an a x b matrix, a <= b) against linear_forward's on the MLP's
// (B*T x d) . (d x F), the product bench_linear times first. Best of `rounds` each.
static void time_optimizers(Model* m, size_t N, int rounds) {
    uint64_t state = 13;
    size_t n_params = m->num_params;
    for (size_t i = 0; i < n_params; i++) { m->grads_memory[i] = (float)rng_uniform(&state) - 0.5f; }
    double best_adamw = 1e30, best_muon = 1e30, best_matrices = 1e30, flops = 0.0;
    for (int r = 0; r < rounds + 1; r++) {  // round 0 warms up
        double t0 = now_seconds();
        model_update(m, 1e-4f, 0.9f, 0.95f, 1e-8f, 0.1f, r + 1);
        double t1 = now_seconds();
        model_update_shard_muon(m, 0, n_params, m->grads_memory, m->m_memory, m->v_memory, 1e-4f, 0.9f,
                                0.95f, 1e-8f, 0.1f, r + 1, 0.95f);
        double t2 = now_seconds(), matrices = 0.0;
        size_t offset = 0, rows, cols;
        for (int i = 0; i < N_PARAM_TENSORS; i++) {
            if (muon_matrix_shape(&m->dims, i, &rows, &cols)) {
                double a = (double)(rows < cols ? rows : cols), b = (double)(rows < cols ? cols : rows);
                if (r == 0) { flops += (double)m->dims.L * 5.0 * (4.0 * a * a * b + 2.0 * a * a * a); }
                double t3 = now_seconds();
                muon_update(m->params_memory + offset, m->grads_memory + offset,
                            m->m_memory + offset, m->dims.L, rows, cols, 1e-4f, 0.95f, 0.1f);
                matrices += now_seconds() - t3;
            }
            offset += m->param_sizes[i];
        }
        if (r > 0 && t1 - t0 < best_adamw) { best_adamw = t1 - t0; }
        if (r > 0 && t2 - t1 < best_muon) { best_muon = t2 - t1; }
        if (r > 0 && matrices < best_matrices) { best_matrices = matrices; }
    }
    printf("optimizer step alone (mode none, %zu parameters): AdamW %.2f ms, Muon %.2f ms: "
           "Muon adds %.2f ms a step (best of %d)\n", n_params, 1000.0 * best_adamw, 1000.0 * best_muon,
           1000.0 * (best_muon - best_adamw), rounds);
    size_t d = m->dims.d, F = m->dims.F;
    float* inp = uniform_floats(N * d, &state);
    float* weight = uniform_floats(F * d, &state);
    float* out = mallocCheck(N * F * sizeof(float));
    double best_linear = 1e30;
    for (int r = 0; r < rounds + 1; r++) {
        double t0 = now_seconds();
        linear_forward(out, inp, weight, N, d, F);
        double t = now_seconds() - t0;
        if (r > 0 && t < best_linear) { best_linear = t; }
    }
    double ns_rate = flops / best_matrices * 1e-9, linear_rate = 2.0 * N * d * F / best_linear * 1e-9;
    printf("Muon's matrices alone (%zu x 7, %.1f GFLOP of Newton-Schulz): %.2f ms, %.1f GFLOP/s; "
           "linear_forward (%zu x %zu) . (%zu x %zu): %.1f GFLOP/s; Newton-Schulz at %.0f %% of "
           "the matmul rate (best of %d)\n", m->dims.L, flops * 1e-9, 1000.0 * best_matrices,
           ns_rate, N, d, d, F, linear_rate, 100.0 * ns_rate / linear_rate, rounds);
    free(inp);
    free(weight);
    free(out);
}

typedef struct {
    Model* models;  // one per config
    int *x, *y;         // the batch
    size_t B, T;
} Bench;

static double bench_step(void* context, int mode, int t) {
    Bench* b = context;
    return bench_training_step(&b->models[mode], b->x, b->y, b->B, b->T, t);
}

int main(int argc, char** argv) {
    int rounds = 15, n_configs = N_BENCH_CONFIGS;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--rounds") == 0 && i + 1 < argc) { rounds = atoi(argv[++i]); }
        else if (strcmp(argv[i], "--threads") == 0 && i + 1 < argc) { omp_set_num_threads(atoi(argv[++i])); }
        else if (strcmp(argv[i], "--modes") == 0) { n_configs = N_BENCH_MODES; }
        else if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
            printf("usage: ./bench [--rounds N] [--threads N] [--modes]\n"
                   "  times a training step of the bench model in each mode (--modes: the modes\n"
                   "  alone, mhc's included, else the variants too), configs taking turns each\n"
                   "  round, then prints each config's memory\n");
            return 0;
        }
        else { fprintf(stderr, "error: unknown argument '%s' (usage: ./bench [--rounds N] [--threads N] [--modes])\n", argv[i]); return 1; }
    }
    if (rounds < 1) { fprintf(stderr, "error: --rounds must be positive\n"); return 1; }
    const size_t B = BENCH_B, T = BENCH_T;
    printf("bench: d=256 L=8 H=8 G=4 F=704 V=256 B=%zu T=%zu, %d threads, %d rounds of one "
           "step per config (3 modes, mhc with 4 and 2 streams, %d variants), configs "
           "interleaved\n", B, T, omp_get_max_threads(), rounds, n_configs - N_BENCH_MODES);

    // the configs: the modes, then the variants, each variant's parent the mode it varies
    const char* names[N_BENCH_CONFIGS];
    int parent[N_BENCH_CONFIGS];
    ModelConfig configs[N_BENCH_CONFIGS];
    Model models[N_BENCH_CONFIGS];
    for (int i = 0; i < n_configs; i++) {
        configs[i] = bench_config_at(i, &names[i], &parent[i]);
        model_build(&models[i], &configs[i], B, T);
        model_init_params(&models[i], 1);
    }
    Bench bench = {models, mallocCheck(B * T * sizeof(int)), mallocCheck(B * T * sizeof(int)), B, T};
    bench_batch(bench.x, bench.y, B * T);
    double* ms[N_BENCH_CONFIGS];
    for (int i = 0; i < n_configs; i++) { ms[i] = mallocCheck((size_t)rounds * sizeof(double)); }
    time_rounds(ms, n_configs, rounds, 2, bench_step, &bench);
    print_rounds(names, n_configs, ms, rounds, B * T, parent);
    print_memory(stdout, names, configs, n_configs, B, T);
    ModelConfig full = bench_config(1);
    time_depth_attention(2 * (size_t)full.n_layers + 1, B * T, (size_t)full.d_model, rounds);
    time_attention(B, T, (size_t)full.n_heads, (size_t)full.n_kv_heads,
                   (size_t)(full.d_model / full.n_heads), rounds);
    time_optimizers(&models[0], B * T, rounds);
    for (int i = 0; i < n_configs; i++) {
        free(ms[i]);
        model_free(&models[i]);
    }
    free(bench.x);
    free(bench.y);
    return 0;
}
