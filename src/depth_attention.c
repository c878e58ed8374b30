// depth_attention.c — the AttnRes operator: softmax attention over depth.
// Per row (position) n, over sources V_0 .. V_{S-1} (each (N,C)), pseudo-query w and key
// norm gain g (both (C)):
//   k_i = rmsnorm(V_i; g) = g * V_i * r_i,  r_i = (mean(V_i^2) + eps)^(-1/2)
//   s_i = w . k_i   (no 1/sqrt(C) scale),  alpha = softmax_i(s),  out = sum_i alpha_i V_i
// Keys are normalised; the values summed are the raw V_i.
#include <math.h>
#include <stdlib.h>
#include "layers.h"
#include "util.h"

// r = (mean(v^2) + eps)^(-1/2) of one source row v (C): the key norm's scale
float depth_attention_rstd(const float* v, size_t C) {
    return 1.0f / sqrtf(dot(v, v, C) / (float)C + RMSNORM_EPS);
}

// out (N,C); alpha and key_rstd (N,n_sources) are saved for the backward
void depth_attention_forward(float* out, float* alpha, float* key_rstd,
                             const float* const* sources, const float* query,
                             const float* norm_weight, size_t n_sources, size_t N, size_t C) {
    float* wg = mallocCheck(C * sizeof(float));  // w * g: then s_i = (w * g) . V_i * r_i
    for (size_t c = 0; c < C; c++) { wg[c] = query[c] * norm_weight[c]; }
    #pragma omp parallel for
    for (size_t n = 0; n < N; n++) {
        float* a = alpha + n * n_sources;
        float* r = key_rstd + n * n_sources;
        float max_score = -INFINITY;
        for (size_t i = 0; i < n_sources; i++) {
            const float* v = sources[i] + n * C;
            r[i] = depth_attention_rstd(v, C);
            a[i] = dot(wg, v, C) * r[i];  // the score s_i, turned into alpha_i below
            if (a[i] > max_score) { max_score = a[i]; }
        }
        float sum = 0.0f;
        for (size_t i = 0; i < n_sources; i++) {
            a[i] = expf(a[i] - max_score);
            sum += a[i];
        }
        for (size_t i = 0; i < n_sources; i++) { a[i] /= sum; }
        float* o = out + n * C;
        for (size_t c = 0; c < C; c++) { o[c] = 0.0f; }
        for (size_t i = 0; i < n_sources; i++) {
            const float* v = sources[i] + n * C;
            for (size_t c = 0; c < C; c++) { o[c] += a[i] * v[c]; }
        }
    }
    free(wg);
}

// forward was: out = sum_i alpha_i V_i, alpha = softmax(s), s_i = w . (g * V_i * r_i).
// Every source receives gradient twice, as a value and as a key:
//   value path:  dV_i += alpha_i dout
//   dalpha_i = dout . V_i ;  ds_i = alpha_i (dalpha_i - sum_j alpha_j dalpha_j)
//   key path:    dk_i = ds_i w, then back through rmsnorm (see rmsnorm.c), using
//                sum_c dk_c g_c V_c = ds_i s_i / r_i:
//                dV_i += ds_i r_i (w * g) - ds_i r_i^2 s_i / C * V_i
//   dw += sum_i ds_i k_i ;  dg += sum_i ds_i w * V_i * r_i
void depth_attention_backward(float* const* dsources, float* dquery, float* dnorm_weight,
                              const float* dout, const float* alpha, const float* key_rstd,
                              const float* const* sources, const float* query,
                              const float* norm_weight, size_t n_sources, size_t N, size_t C) {
    // dw and dg sum over rows: each block of ROWS rows sums into its own partial (C) pair,
    // and the partials are added in block order, so the result is the same for any number
    // of threads.
    const size_t ROWS = 32;
    size_t n_row_blocks = (N + ROWS - 1) / ROWS;
    float* partials = callocCheck(n_row_blocks * 2 * C, sizeof(float));
    float* dscore = mallocCheck(N * n_sources * sizeof(float));  // ds_i of every row
    float* wg = mallocCheck(C * sizeof(float));                   // w * g
    for (size_t c = 0; c < C; c++) { wg[c] = query[c] * norm_weight[c]; }
    #pragma omp parallel for
    for (size_t block = 0; block < n_row_blocks; block++) {
        float* dw_part = partials + block * 2 * C;
        float* dg_part = dw_part + C;
        size_t end = (block + 1) * ROWS < N ? (block + 1) * ROWS : N;
        for (size_t n = block * ROWS; n < end; n++) {
            const float* a = alpha + n * n_sources;
            const float* r = key_rstd + n * n_sources;
            const float* d = dout + n * C;
            float* ds = dscore + n * n_sources;
            float weighted = 0.0f;  // sum_j alpha_j dalpha_j
            for (size_t i = 0; i < n_sources; i++) {
                ds[i] = dot(d, sources[i] + n * C, C);  // dalpha_i
                weighted += a[i] * ds[i];
            }
            for (size_t i = 0; i < n_sources; i++) { ds[i] = a[i] * (ds[i] - weighted); }
            for (size_t i = 0; i < n_sources; i++) {
                const float* v = sources[i] + n * C;
                float* dv = dsources[i] + n * C;
                float score = dot(wg, v, C);  // s_i / r_i = sum_c w_c g_c v_c
                float key_scale = ds[i] * r[i];
                float correction = ds[i] * r[i] * r[i] * r[i] * score / (float)C;
                for (size_t c = 0; c < C; c++) {
                    dv[c] += a[i] * d[c] + key_scale * wg[c] - correction * v[c];
                    dw_part[c] += key_scale * norm_weight[c] * v[c];  // ds_i k_i
                    dg_part[c] += key_scale * query[c] * v[c];        // ds_i w V_i r_i
                }
            }
        }
    }
    for (size_t block = 0; block < n_row_blocks; block++) {
        const float* dw_part = partials + block * 2 * C;
        for (size_t c = 0; c < C; c++) {
            dquery[c] += dw_part[c];
            dnorm_weight[c] += dw_part[C + c];
        }
    }
    free(partials);
    free(dscore);
    free(wg);
}
