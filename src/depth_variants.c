// depth_variants.c — SPEC's variants of the depth attention ("Variants"; the paper's Table 4
// ablations). depth_attention.c is the default operator, kept as it is; this file holds the
// switches, one readable row-by-row version of the operator that takes them all, and the two
// mixings that replace the attention.
//
// The attention, per row (position) n and head k (channels c of group k, Ck = C / heads):
//   q      = w + u_n                (u_n = query_rows[n] with --depth-query input, else 0)
//   r_i    = (mean_{c in k}(V_i^2) + eps)^(-1/2)   (key norm on)   or 1 (--key-norm off)
//   s_i    = sum_{c in k} q_c g_c V_ic r_i          (g = 1 when the key norm is off)
//   alpha  = softmax_i(s)   or   alpha_i = sigmoid(s_i) (--depth-score sigmoid: no normaliser)
//   out_c  = sum_i alpha_i V_ic
// With one head, softmax, the key norm and a static query this is depth_attention_forward.
//
// The mixings, one weight per source for every row (no query, no keys):
//   static: alpha = softmax(c_0 .. c_{n-1})   dense (DenseFormer): beta_i = c_i
//   out = sum_i weight_i V_i
#include <math.h>
#include <stdlib.h>
#include "layers.h"
#include "util.h"

// Rows go in tiles; each tile sums its rows' parameter gradients into its own partial, and
// the partials are added in tile order: the result is the same for any number of threads.
#define VARIANT_TILE 16

static float sigmoidf(float x) { return 1.0f / (1.0f + expf(-x)); }

// alpha[0..n) = softmax(alpha[0..n)), in place
static void softmax_in_place(float* a, size_t n, size_t stride) {
    float max_score = -INFINITY;
    for (size_t i = 0; i < n; i++) {
        if (a[i * stride] > max_score) { max_score = a[i * stride]; }
    }
    float sum = 0.0f;
    for (size_t i = 0; i < n; i++) {
        a[i * stride] = expf(a[i * stride] - max_score);
        sum += a[i * stride];
    }
    for (size_t i = 0; i < n; i++) { a[i * stride] /= sum; }
}

// qg (C) = (w + u_n) * g of row n: the vector a key is dotted with (g = 1 without key norm)
static void row_query(float* qg, float* q, const float* query, const float* query_rows,
                      const float* norm_weight, size_t n, size_t C) {
    for (size_t c = 0; c < C; c++) {
        q[c] = query[c] + (query_rows != NULL ? query_rows[n * C + c] : 0.0f);
        qg[c] = norm_weight != NULL ? q[c] * norm_weight[c] : q[c];
    }
}

// alpha and key_rstd are (N, n_sources, heads): entry (n, i, k) at (n * n_sources + i) * heads + k
void depth_attention_variant_forward(float* out, float* alpha, float* key_rstd,
                                     const float* const* sources, const float* query,
                                     const float* query_rows, const float* norm_weight,
                                     size_t n_sources, size_t N, size_t C, size_t heads,
                                     int sigmoid) {
    size_t Ck = C / heads, S = n_sources;
    #pragma omp parallel
    {
        float* q = mallocCheck(C * sizeof(float));
        float* qg = mallocCheck(C * sizeof(float));
        #pragma omp for
        for (size_t n = 0; n < N; n++) {
            row_query(qg, q, query, query_rows, norm_weight, n, C);
            float* a = alpha + n * S * heads;
            float* rs = key_rstd + n * S * heads;
            for (size_t k = 0; k < heads; k++) {
                // scores s_ik = (q * g) . V_i * r_i over the head's channels
                for (size_t i = 0; i < S; i++) {
                    const float* v = sources[i] + n * C + k * Ck;
                    float r = norm_weight != NULL ? depth_attention_rstd(v, Ck) : 1.0f;
                    rs[i * heads + k] = r;
                    a[i * heads + k] = dot(qg + k * Ck, v, Ck) * r;
                }
                if (sigmoid) {
                    for (size_t i = 0; i < S; i++) { a[i * heads + k] = sigmoidf(a[i * heads + k]); }
                } else {
                    softmax_in_place(a + k, S, heads);
                }
                // out = sum_i alpha_ik V_i over the head's channels
                float* o = out + n * C + k * Ck;
                for (size_t c = 0; c < Ck; c++) { o[c] = 0.0f; }
                for (size_t i = 0; i < S; i++) {
                    const float* v = sources[i] + n * C + k * Ck;
                    float w = a[i * heads + k];
                    for (size_t c = 0; c < Ck; c++) { o[c] += w * v[c]; }
                }
            }
        }
        free(q);
        free(qg);
    }
}

// forward was: out_c = sum_i alpha_i V_ic, alpha = softmax(s) or sigmoid(s),
// s_i = (q * g) . V_i * r_i over the head's channels. Per row and head:
//   value path: dV_i += alpha_i dout
//   dalpha_i = dout . V_i
//   softmax: ds_i = alpha_i (dalpha_i - sum_j alpha_j dalpha_j);  sigmoid: ds_i = dalpha_i alpha_i (1 - alpha_i)
//   key path, key norm on (rmsnorm.c's backward, with sum_c (q g)_c V_c = s_i / r_i):
//       dV_i += ds_i r_i (q * g) - ds_i r_i^3 ((q * g) . V_i) / Ck * V_i
//     key norm off (r = 1, g = 1): dV_i += ds_i q
//   dq += ds_i r_i g * V_i (per row into dquery_rows when the query has a row part; summed
//   over rows into dquery);  dg += ds_i r_i q * V_i
void depth_attention_variant_backward(float* const* dsources, float* dquery, float* dquery_rows,
                                      float* dnorm_weight, const float* dout, const float* alpha,
                                      const float* key_rstd, const float* const* sources,
                                      const float* query, const float* query_rows,
                                      const float* norm_weight, size_t n_sources, size_t N,
                                      size_t C, size_t heads, int sigmoid) {
    size_t Ck = C / heads, S = n_sources;
    size_t n_tiles = (N + VARIANT_TILE - 1) / VARIANT_TILE;
    float* partials = callocCheck(2 * n_tiles * C, sizeof(float));  // per tile: dq, then dg
    #pragma omp parallel
    {
        float* q = mallocCheck(C * sizeof(float));
        float* qg = mallocCheck(C * sizeof(float));
        float* ds = mallocCheck(S * sizeof(float));
        #pragma omp for
        for (size_t tile = 0; tile < n_tiles; tile++) {
            float* pq = partials + 2 * tile * C;
            float* pg = pq + C;
            size_t end = (tile + 1) * VARIANT_TILE < N ? (tile + 1) * VARIANT_TILE : N;
            for (size_t n = tile * VARIANT_TILE; n < end; n++) {
                row_query(qg, q, query, query_rows, norm_weight, n, C);
                const float* a = alpha + n * S * heads;
                const float* rs = key_rstd + n * S * heads;
                const float* d = dout + n * C;
                for (size_t k = 0; k < heads; k++) {
                    size_t c0 = k * Ck;
                    // dalpha_i, then ds_i
                    float weighted = 0.0f;  // sum_j alpha_j dalpha_j (softmax)
                    for (size_t i = 0; i < S; i++) {
                        ds[i] = dot(d + c0, sources[i] + n * C + c0, Ck);
                        weighted += a[i * heads + k] * ds[i];
                    }
                    for (size_t i = 0; i < S; i++) {
                        float ai = a[i * heads + k];
                        ds[i] = sigmoid ? ds[i] * ai * (1.0f - ai) : ai * (ds[i] - weighted);
                    }
                    for (size_t i = 0; i < S; i++) {
                        const float* v = sources[i] + n * C + c0;
                        float* dv = dsources[i] + n * C + c0;
                        float ai = a[i * heads + k], r = rs[i * heads + k];
                        float key_scale = ds[i] * r;
                        float correction = norm_weight != NULL
                            ? ds[i] * r * r * r * dot(qg + c0, v, Ck) / (float)Ck : 0.0f;
                        for (size_t c = 0; c < Ck; c++) {
                            dv[c] += ai * d[c0 + c] + key_scale * qg[c0 + c] - correction * v[c];
                            float g = norm_weight != NULL ? norm_weight[c0 + c] : 1.0f;
                            float dq = key_scale * g * v[c];
                            if (dquery_rows != NULL) { dquery_rows[n * C + c0 + c] += dq; }
                            pq[c0 + c] += dq;
                            if (norm_weight != NULL) { pg[c0 + c] += key_scale * q[c0 + c] * v[c]; }
                        }
                    }
                }
            }
        }
        free(q);
        free(qg);
        free(ds);
    }
    for (size_t tile = 0; tile < n_tiles; tile++) {
        const float* pq = partials + 2 * tile * C;
        for (size_t c = 0; c < C; c++) {
            dquery[c] += pq[c];
            if (dnorm_weight != NULL) { dnorm_weight[c] += pq[C + c]; }
        }
    }
    free(partials);
}

// weights (n_sources) = softmax(coefficients) (normalise, static mixing) or the coefficients
// themselves (DenseFormer); out = sum_i weight_i V_i
void depth_mixing_forward(float* out, float* weights, const float* const* sources,
                          const float* coefficients, size_t n_sources, size_t N, size_t C,
                          int normalise) {
    for (size_t i = 0; i < n_sources; i++) { weights[i] = coefficients[i]; }
    if (normalise) { softmax_in_place(weights, n_sources, 1); }
    #pragma omp parallel for
    for (size_t n = 0; n < N; n++) {
        float* o = out + n * C;
        for (size_t c = 0; c < C; c++) { o[c] = 0.0f; }
        for (size_t i = 0; i < n_sources; i++) {
            const float* v = sources[i] + n * C;
            for (size_t c = 0; c < C; c++) { o[c] += weights[i] * v[c]; }
        }
    }
}

// forward was: out = sum_i weight_i V_i, weight = softmax(c) or c. So
//   dV_i += weight_i dout;  dweight_i = sum over rows of dout . V_i
//   static: dc_i += weight_i (dweight_i - sum_j weight_j dweight_j);  dense: dc_i += dweight_i
void depth_mixing_backward(float* const* dsources, float* dcoefficients, const float* dout,
                           const float* weights, const float* const* sources, size_t n_sources,
                           size_t N, size_t C, int normalise) {
    size_t n_tiles = (N + VARIANT_TILE - 1) / VARIANT_TILE;
    float* partials = callocCheck(n_tiles * n_sources, sizeof(float));  // per tile: dweight
    #pragma omp parallel for
    for (size_t tile = 0; tile < n_tiles; tile++) {
        size_t end = (tile + 1) * VARIANT_TILE < N ? (tile + 1) * VARIANT_TILE : N;
        for (size_t n = tile * VARIANT_TILE; n < end; n++) {
            const float* d = dout + n * C;
            for (size_t i = 0; i < n_sources; i++) {
                const float* v = sources[i] + n * C;
                float* dv = dsources[i] + n * C;
                partials[tile * n_sources + i] += dot(d, v, C);
                for (size_t c = 0; c < C; c++) { dv[c] += weights[i] * d[c]; }
            }
        }
    }
    float* dweight = callocCheck(n_sources, sizeof(float));
    for (size_t tile = 0; tile < n_tiles; tile++) {
        for (size_t i = 0; i < n_sources; i++) { dweight[i] += partials[tile * n_sources + i]; }
    }
    float weighted = 0.0f;  // sum_j weight_j dweight_j
    for (size_t i = 0; i < n_sources; i++) { weighted += weights[i] * dweight[i]; }
    for (size_t i = 0; i < n_sources; i++) {
        dcoefficients[i] += normalise ? weights[i] * (dweight[i] - weighted) : dweight[i];
    }
    free(partials);
    free(dweight);
}
