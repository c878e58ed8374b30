// depth_attention.c — the AttnRes operator: softmax attention over depth, forward and
// backward: first row by row (the naive version, what a reader learns first and the reference
// the fast one is tested against), then in tiles of rows, the version the model runs.
// Per row (position) n, over the sources V_0 .. V_{n_sources-1} (each (N,C)), pseudo-query w
// (`query`) and the key norm's gain g (`norm_weight`), both (C):
//   k_i = rmsnorm(V_i; g) = g * V_i * r_i,  r_i = (mean(V_i^2) + eps)^(-1/2)
//   s_i = w . k_i   (no 1/sqrt(C) scale),  alpha = softmax_i(s),  h = sum_i alpha_i V_i
// Keys are normalised; the values summed are the raw V_i. The backward's derivation is in
// docs/walkthrough.md, section 3.
#include <math.h>
#include <stdlib.h>
#include "layers.h"
#include "util.h"

// r = (mean(v^2) + eps)^(-1/2) of one source row v (C): the key norm's scale
float depth_attention_rstd(const float* v, size_t C) {
    return 1.0f / sqrtf(dot(v, v, C) / (float)C + RMSNORM_EPS);
}

// ---- the naive version ----
// One row at a time, the formulas above in order. Every score, alpha, output and source
// gradient is computed with the same sums in the same order as the tiled version below, so
// the two agree bit for bit; dquery and dnorm_weight sum over the rows in another order
// (tested within the rounding of that order).

// h (N,C); alpha and key_rstd (N,n_sources) are saved for the backward
void depth_attention_forward_naive(float* h, float* alpha, float* key_rstd,
                                   const float* const* sources, const float* query,
                                   const float* norm_weight, size_t n_sources, size_t N,
                                   size_t C) {
    float* wg = mallocCheck(C * sizeof(float));  // w * g: then s_i = (w * g) . V_i * r_i
    for (size_t c = 0; c < C; c++) { wg[c] = query[c] * norm_weight[c]; }
    for (size_t n = 0; n < N; n++) {
        float* a = alpha + n * n_sources;  // the scores s_i, then alpha_i
        float* r = key_rstd + n * n_sources;
        float* o = h + n * C;
        float max_score = -INFINITY, sum = 0.0f;
        for (size_t i = 0; i < n_sources; i++) {  // s_i = w . k_i = (w * g) . V_i * r_i
            r[i] = depth_attention_rstd(sources[i] + n * C, C);
            a[i] = dot(wg, sources[i] + n * C, C) * r[i];
            if (a[i] > max_score) { max_score = a[i]; }
        }
        for (size_t i = 0; i < n_sources; i++) {  // alpha = softmax(s)
            a[i] = expf(a[i] - max_score);
            sum += a[i];
        }
        for (size_t i = 0; i < n_sources; i++) { a[i] /= sum; }
        for (size_t c = 0; c < C; c++) { o[c] = 0.0f; }  // h = sum_i alpha_i V_i
        for (size_t i = 0; i < n_sources; i++) {
            for (size_t c = 0; c < C; c++) { o[c] += a[i] * sources[i][n * C + c]; }
        }
    }
    free(wg);
}

// forward was: h = sum_i alpha_i V_i, alpha = softmax(s), s_i = w . k_i, k_i = g * V_i * r_i.
// Every source receives gradient twice, as a value and as a key:
//   value path:  dV_i += alpha_i dh
//   dalpha_i = dh . V_i ;  ds_i = alpha_i (dalpha_i - sum_j alpha_j dalpha_j)
//   key path:    dk_i = ds_i w, then back through rmsnorm (see rmsnorm.c), using
//                sum_c dk_c g_c V_c = ds_i s_i / r_i:
//                dV_i += ds_i r_i (w * g) - ds_i r_i^3 ((w * g) . V_i) / C * V_i
//   dw += sum_i ds_i k_i,  dg += sum_i ds_i w * V_i * r_i
void depth_attention_backward_naive(float* const* dsources, float* dquery, float* dnorm_weight,
                                    const float* dh, const float* alpha, const float* key_rstd,
                                    const float* const* sources, const float* query,
                                    const float* norm_weight, size_t n_sources, size_t N,
                                    size_t C) {
    float* wg = mallocCheck(C * sizeof(float));          // w * g
    float* ds = mallocCheck(n_sources * sizeof(float));  // dalpha_i, then ds_i, of one token
    for (size_t c = 0; c < C; c++) { wg[c] = query[c] * norm_weight[c]; }
    for (size_t n = 0; n < N; n++) {
        const float* a = alpha + n * n_sources;
        const float* d = dh + n * C;
        float weighted = 0.0f;  // sum_j alpha_j dalpha_j
        for (size_t i = 0; i < n_sources; i++) { ds[i] = dot(d, sources[i] + n * C, C); }
        for (size_t i = 0; i < n_sources; i++) { weighted += a[i] * ds[i]; }
        for (size_t i = 0; i < n_sources; i++) { ds[i] = a[i] * (ds[i] - weighted); }
        for (size_t i = 0; i < n_sources; i++) {
            const float* v = sources[i] + n * C;
            float* dv = dsources[i] + n * C;
            float r = key_rstd[n * n_sources + i];
            float key_scale = ds[i] * r;
            float correction = ds[i] * r * r * r * dot(wg, v, C) / (float)C;
            for (size_t c = 0; c < C; c++) {
                dv[c] += a[i] * d[c] + key_scale * wg[c] - correction * v[c];
                dquery[c] += ds[i] * (norm_weight[c] * v[c] * r);  // ds_i k_i
                dnorm_weight[c] += ds[i] * (query[c] * v[c] * r);  // ds_i w V_i r_i
            }
        }
    }
    free(wg);
    free(ds);
}

// ---- the tiled version ----
// Rows go in tiles of DEPTH_TILE. Each pass over a tile walks one source at a time through
// all the tile's rows (DEPTH_TILE * C contiguous floats) instead of every source for one
// row: a few long streams that the hardware prefetches well, where n_sources streams of
// one row each outran the prefetcher (in full mode the bench model's last input has 17
// sources, L=8; 9 at the default size, L=4), and a tile of every source (17 x 16 KB at the
// bench model's d=256) stays in L2 between the passes. The arithmetic of every output is
// the naive version's (h and dV sum over the sources in order of i).
#define DEPTH_TILE 16

// h (N,C); alpha and key_rstd (N,n_sources) are saved for the backward
void depth_attention_forward(float* h, float* alpha, float* key_rstd,
                             const float* const* sources, const float* query,
                             const float* norm_weight, size_t n_sources, size_t N, size_t C) {
    float* wg = mallocCheck(C * sizeof(float));  // w * g: then s_i = (w * g) . V_i * r_i
    for (size_t c = 0; c < C; c++) { wg[c] = query[c] * norm_weight[c]; }
    size_t n_tiles = (N + DEPTH_TILE - 1) / DEPTH_TILE;
    #pragma omp parallel for
    for (size_t tile = 0; tile < n_tiles; tile++) {
        size_t first = tile * DEPTH_TILE, end = first + DEPTH_TILE < N ? first + DEPTH_TILE : N;
        // 1. the scores s_i = (w * g) . V_i * r_i, kept in alpha until the softmax
        for (size_t i = 0; i < n_sources; i++) {
            for (size_t n = first; n < end; n++) {
                const float* v = sources[i] + n * C;
                float r = depth_attention_rstd(v, C);
                key_rstd[n * n_sources + i] = r;
                alpha[n * n_sources + i] = dot(wg, v, C) * r;
            }
        }
        // 2. alpha = softmax(s), row by row
        for (size_t n = first; n < end; n++) {
            float* a = alpha + n * n_sources;
            float max_score = -INFINITY;
            for (size_t i = 0; i < n_sources; i++) {
                if (a[i] > max_score) { max_score = a[i]; }
            }
            float sum = 0.0f;
            for (size_t i = 0; i < n_sources; i++) {
                a[i] = expf(a[i] - max_score);
                sum += a[i];
            }
            for (size_t i = 0; i < n_sources; i++) { a[i] /= sum; }
        }
        // 3. h = sum_i alpha_i V_i, one source at a time
        for (size_t c = first * C; c < end * C; c++) { h[c] = 0.0f; }
        for (size_t i = 0; i < n_sources; i++) {
            for (size_t n = first; n < end; n++) {
                const float* v = sources[i] + n * C;
                float* o = h + n * C;
                float a = alpha[n * n_sources + i];
                for (size_t c = 0; c < C; c++) { o[c] += a * v[c]; }
            }
        }
    }
    free(wg);
}

// forward was: h = sum_i alpha_i V_i, alpha = softmax(s), s_i = w . (g * V_i * r_i).
// The gradients of depth_attention_backward_naive, in tiles; its weights' gradients are one
// column sum times a gain: dw += sum_i ds_i k_i = g * acc,  dg += sum_i ds_i w * V_i * r_i =
// w * acc, with acc = sum over rows and sources of ds_i r_i V_i
void depth_attention_backward(float* const* dsources, float* dquery, float* dnorm_weight,
                              const float* dh, const float* alpha, const float* key_rstd,
                              const float* const* sources, const float* query,
                              const float* norm_weight, size_t n_sources, size_t N, size_t C) {
    // acc sums over rows: each tile sums into its own partial (C), and the partials are
    // added in tile order, so the result is the same for any number of threads.
    size_t n_tiles = (N + DEPTH_TILE - 1) / DEPTH_TILE;
    float* partials = callocCheck(n_tiles * C, sizeof(float));
    float* dscore = mallocCheck(N * n_sources * sizeof(float));  // dalpha_i, then ds_i
    float* wgv = mallocCheck(N * n_sources * sizeof(float));     // s_i / r_i = (w * g) . V_i
    float* wg = mallocCheck(C * sizeof(float));                   // w * g
    for (size_t c = 0; c < C; c++) { wg[c] = query[c] * norm_weight[c]; }
    #pragma omp parallel for
    for (size_t tile = 0; tile < n_tiles; tile++) {
        size_t first = tile * DEPTH_TILE, end = first + DEPTH_TILE < N ? first + DEPTH_TILE : N;
        float* acc = partials + tile * C;
        // 1. dalpha_i = dh . V_i and (w * g) . V_i, one source at a time
        for (size_t i = 0; i < n_sources; i++) {
            for (size_t n = first; n < end; n++) {
                const float* v = sources[i] + n * C;
                dscore[n * n_sources + i] = dot(dh + n * C, v, C);
                wgv[n * n_sources + i] = dot(wg, v, C);
            }
        }
        // 2. ds_i = alpha_i (dalpha_i - sum_j alpha_j dalpha_j), row by row
        for (size_t n = first; n < end; n++) {
            const float* a = alpha + n * n_sources;
            float* ds = dscore + n * n_sources;
            float weighted = 0.0f;  // sum_j alpha_j dalpha_j
            for (size_t i = 0; i < n_sources; i++) { weighted += a[i] * ds[i]; }
            for (size_t i = 0; i < n_sources; i++) { ds[i] = a[i] * (ds[i] - weighted); }
        }
        // 3. both paths into dV_i, and the tile's part of acc, one source at a time
        for (size_t i = 0; i < n_sources; i++) {
            for (size_t n = first; n < end; n++) {
                const float* v = sources[i] + n * C;
                const float* d = dh + n * C;
                float* dv = dsources[i] + n * C;
                float a = alpha[n * n_sources + i], ds = dscore[n * n_sources + i];
                float r = key_rstd[n * n_sources + i];
                float key_scale = ds * r;
                float correction = ds * r * r * r * wgv[n * n_sources + i] / (float)C;
                for (size_t c = 0; c < C; c++) {
                    dv[c] += a * d[c] + key_scale * wg[c] - correction * v[c];
                    acc[c] += key_scale * v[c];  // ds_i r_i V_i
                }
            }
        }
    }
    for (size_t tile = 1; tile < n_tiles; tile++) {
        for (size_t c = 0; c < C; c++) { partials[c] += partials[tile * C + c]; }
    }
    for (size_t c = 0; c < C; c++) {
        dquery[c] += norm_weight[c] * partials[c];
        dnorm_weight[c] += query[c] * partials[c];
    }
    free(partials);
    free(dscore);
    free(wgv);
    free(wg);
}

// The pair every AttnRes sub-layer runs: the depth attention, then the RMSNorm of its output
// with the sub-layer's input gain `weight` (layers.h). On the CPU the two functions in turn, so
// this is their definition; the GPU (cuda/depth_attention.cu) fuses the norm into the depth
// attention's kernels (one kernel forward; backward two, the rows kernel and the parts' sum)
// and is checked against this.
void depth_attention_rmsnorm_forward(float* xn, float* rstd, float* h, DepthSaved saved,
                                     const float* const* sources, DepthParams params,
                                     const float* weight, size_t n_sources, size_t N, size_t C) {
    depth_attention_forward(h, saved.alpha, saved.key_rstd, sources, params.query, params.norm,
                            n_sources, N, C);
    rmsnorm_forward(xn, rstd, h, weight, N, C);
}

// forward was: h = depth_attention(sources); xn = rmsnorm(h) * weight.
// dh_scratch (N,C) is not an incoming gradient: it is overwritten with h's gradient (the
// norm's input gradient), which the depth attention's backward then reads
void depth_attention_rmsnorm_backward(float* const* dsources, DepthParams grads, float* dweight,
                                      float* dh_scratch, const float* dxn, const float* h,
                                      const float* rstd, const float* weight, DepthSaved saved,
                                      const float* const* sources, DepthParams params,
                                      size_t n_sources, size_t N, size_t C) {
    #pragma omp parallel for
    for (size_t i = 0; i < N * C; i++) { dh_scratch[i] = 0.0f; }  // rmsnorm_backward adds
    rmsnorm_backward(dh_scratch, dweight, dxn, h, weight, rstd, N, C);
    depth_attention_backward(dsources, grads.query, grads.norm, dh_scratch, saved.alpha,
                             saved.key_rstd, sources, params.query, params.norm, n_sources, N, C);
}
