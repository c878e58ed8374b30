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
    float* dscore = mallocCheck(N * n_sources * sizeof(float));  // ds_i per row, for dw, dg
    float* wg = mallocCheck(C * sizeof(float));                   // w * g
    for (size_t c = 0; c < C; c++) { wg[c] = query[c] * norm_weight[c]; }
    #pragma omp parallel for
    for (size_t n = 0; n < N; n++) {
        const float* a = alpha + n * n_sources;
        const float* r = key_rstd + n * n_sources;
        const float* d = dout + n * C;
        float* ds = dscore + n * n_sources;
        float weighted = 0.0f;  // sum_j alpha_j dalpha_j
        for (size_t i = 0; i < n_sources; i++) {
            float dalpha = dot(d, sources[i] + n * C, C);
            ds[i] = dalpha;
            weighted += a[i] * dalpha;
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
            }
        }
    }
    // dw and dg: threads own column chunks and sum rows in order (deterministic)
    const size_t chunk = 32;
    #pragma omp parallel for
    for (size_t c0 = 0; c0 < C; c0 += chunk) {
        size_t c1 = c0 + chunk < C ? c0 + chunk : C;
        for (size_t n = 0; n < N; n++) {
            for (size_t i = 0; i < n_sources; i++) {
                const float* v = sources[i] + n * C;
                float ds_r = dscore[n * n_sources + i] * key_rstd[n * n_sources + i];
                for (size_t c = c0; c < c1; c++) {
                    dquery[c] += ds_r * norm_weight[c] * v[c];
                    dnorm_weight[c] += ds_r * query[c] * v[c];
                }
            }
        }
    }
    free(dscore);
    free(wg);
}
