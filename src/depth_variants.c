// depth_variants.c — SPEC's variants of the depth attention ("Variants"; the paper's Table 4
// ablations). depth_attention.c is the default operator, kept as it is; this file holds the
// switches, one version of the operator that takes them all (walking its rows in tiles, as
// depth_attention.c does), the two mixings that replace the attention, and, at the end,
// attnres_input_forward and its backward: the one call model.c makes for an AttnRes
// sub-layer's input, which picks the operator (the default one included) and norms its output.
//
// The attention, per row (position) n and head k (channels c of group k, Ck = C / heads):
//   q      = w + u_n                (u_n = token_query[n] with --depth-query input, else 0)
//   r_i    = (mean_{c in k}(V_i^2) + eps)^(-1/2)   (key norm on)   or 1 (--key-norm off)
//   s_i    = sum_{c in k} q_c g_c V_ic r_i          (g = 1 when the key norm is off)
//   alpha  = softmax_i(s)   or   alpha_i = sigmoid(s_i) (--depth-score sigmoid: no normaliser)
//   h_c  = sum_i alpha_i V_ic
// With one head, softmax, the key norm and a static query this is depth_attention_forward.
//
// The mixings, one weight per source for every row (no query, no keys):
//   static: alpha = softmax(c_0 .. c_{n-1})   dense (DenseFormer): beta_i = c_i
//   h = sum_i weight_i V_i
#include <math.h>
#include <stdlib.h>
#include "layers.h"
#include "util.h"

// Rows go in tiles of VARIANT_TILE, walked as depth_attention.c walks them: each pass goes
// one source at a time through all the tile's rows (a few long streams the hardware
// prefetches well, where a row's every source at once outruns it), and the tile of every
// source stays in L2 between the passes. Each tile sums its rows' parameter gradients into
// its own partial, row by row, and the partials are added in tile order: the result is the
// same for any number of threads.
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

// The tile's rows first .. end-1, and each row's query: qg (row n at (n - first) * C) =
// q * g, the vector a key is dotted with (g = 1 without the key norm), and, when q is not
// NULL (the backward's dg needs it), q = w + u_n
static void tile_queries(float* qg, float* q, const float* query, const float* token_query,
                         const float* norm_weight, size_t first, size_t end, size_t C) {
    for (size_t n = first; n < end; n++) {
        float* qgn = qg + (n - first) * C;
        for (size_t c = 0; c < C; c++) {
            float qc = query[c] + (token_query != NULL ? token_query[n * C + c] : 0.0f);
            qgn[c] = norm_weight != NULL ? qc * norm_weight[c] : qc;
            if (q != NULL) { q[(n - first) * C + c] = qc; }
        }
    }
}

// one past the last row of tile `tile` (its rows: tile * VARIANT_TILE .. end - 1)
static size_t tile_end(size_t tile, size_t N) {
    return (tile + 1) * VARIANT_TILE < N ? (tile + 1) * VARIANT_TILE : N;
}

// alpha and key_rstd are (N, n_sources, heads): entry (n, i, k) at (n * n_sources + i) * heads + k
void depth_attention_variant_forward(float* h, float* alpha, float* key_rstd,
                                     const float* const* sources, const float* query,
                                     const float* token_query, const float* norm_weight,
                                     size_t n_sources, size_t N, size_t C, size_t heads,
                                     int sigmoid) {
    size_t Ck = C / heads, S = n_sources;
    size_t n_tiles = (N + VARIANT_TILE - 1) / VARIANT_TILE;
    #pragma omp parallel
    {
        float* qg = mallocCheck(VARIANT_TILE * C * sizeof(float));
        #pragma omp for
        for (size_t tile = 0; tile < n_tiles; tile++) {
            size_t first = tile * VARIANT_TILE, end = tile_end(tile, N);
            tile_queries(qg, NULL, query, token_query, norm_weight, first, end, C);
            // 1. the scores s_ik = (q * g) . V_i * r_i over each head's channels, one source
            //    at a time, kept in alpha until the weights
            for (size_t i = 0; i < S; i++) {
                for (size_t n = first; n < end; n++) {
                    const float* qgn = qg + (n - first) * C;
                    for (size_t k = 0; k < heads; k++) {
                        const float* v = sources[i] + n * C + k * Ck;
                        size_t at = (n * S + i) * heads + k;
                        float r = norm_weight != NULL ? depth_attention_rstd(v, Ck) : 1.0f;
                        key_rstd[at] = r;
                        alpha[at] = dot(qgn + k * Ck, v, Ck) * r;
                    }
                }
            }
            // 2. the weights, per row and head: softmax over the sources, or each a sigmoid
            for (size_t n = first; n < end; n++) {
                float* a = alpha + n * S * heads;
                for (size_t k = 0; k < heads; k++) {
                    if (sigmoid) {
                        for (size_t i = 0; i < S; i++) { a[i * heads + k] = sigmoidf(a[i * heads + k]); }
                    } else {
                        softmax_in_place(a + k, S, heads);
                    }
                }
            }
            // 3. h = sum_i alpha_ik V_i over each head's channels, one source at a time
            for (size_t c = first * C; c < end * C; c++) { h[c] = 0.0f; }
            for (size_t i = 0; i < S; i++) {
                for (size_t n = first; n < end; n++) {
                    for (size_t k = 0; k < heads; k++) {
                        const float* v = sources[i] + n * C + k * Ck;
                        float* o = h + n * C + k * Ck;
                        float w = alpha[(n * S + i) * heads + k];
                        for (size_t c = 0; c < Ck; c++) { o[c] += w * v[c]; }
                    }
                }
            }
        }
        free(qg);
    }
}

// forward was: h_c = sum_i alpha_i V_ic, alpha = softmax(s) or sigmoid(s),
// s_i = (q * g) . V_i * r_i over the head's channels. Per row and head:
//   value path: dV_i += alpha_i dh
//   dalpha_i = dh . V_i
//   softmax: ds_i = alpha_i (dalpha_i - sum_j alpha_j dalpha_j);  sigmoid: ds_i = dalpha_i alpha_i (1 - alpha_i)
//   key path, key norm on (rmsnorm.c's backward, with sum_c (q g)_c V_c = s_i / r_i):
//       dV_i += ds_i r_i (q * g) - ds_i r_i^3 ((q * g) . V_i) / Ck * V_i
//     key norm off (r = 1, g = 1): dV_i += ds_i q
//   dq += ds_i r_i g * V_i (per row into dtoken_query when the query has a per-token part; summed
//   over rows into dquery);  dg += ds_i r_i q * V_i
void depth_attention_variant_backward(float* const* dsources, float* dquery, float* dtoken_query,
                                      float* dnorm_weight, const float* dh, const float* alpha,
                                      const float* key_rstd, const float* const* sources,
                                      const float* query, const float* token_query,
                                      const float* norm_weight, size_t n_sources, size_t N,
                                      size_t C, size_t heads, int sigmoid) {
    size_t Ck = C / heads, S = n_sources;
    size_t n_tiles = (N + VARIANT_TILE - 1) / VARIANT_TILE;
    float* partials = callocCheck(2 * n_tiles * C, sizeof(float));  // per tile: dq, then dg
    float* dscore = mallocCheck(N * S * heads * sizeof(float));     // dalpha_i, then ds_i
    float* key_dot = mallocCheck(N * S * heads * sizeof(float));    // (q * g) . V_i (key norm)
    #pragma omp parallel
    {
        float* q = mallocCheck(VARIANT_TILE * C * sizeof(float));
        float* qg = mallocCheck(VARIANT_TILE * C * sizeof(float));
        #pragma omp for
        for (size_t tile = 0; tile < n_tiles; tile++) {
            size_t first = tile * VARIANT_TILE, end = tile_end(tile, N);
            tile_queries(qg, q, query, token_query, norm_weight, first, end, C);
            // 1. dalpha_i = dh . V_i and (q * g) . V_i per head, one source at a time
            for (size_t i = 0; i < S; i++) {
                for (size_t n = first; n < end; n++) {
                    for (size_t k = 0; k < heads; k++) {
                        const float* v = sources[i] + n * C + k * Ck;
                        size_t at = (n * S + i) * heads + k;
                        dscore[at] = dot(dh + n * C + k * Ck, v, Ck);
                        if (norm_weight != NULL) { key_dot[at] = dot(qg + (n - first) * C + k * Ck, v, Ck); }
                    }
                }
            }
            // 2. ds_i from dalpha_i, per row and head
            for (size_t n = first; n < end; n++) {
                const float* a = alpha + n * S * heads;
                float* ds = dscore + n * S * heads;
                for (size_t k = 0; k < heads; k++) {
                    float weighted = 0.0f;  // sum_j alpha_j dalpha_j (softmax)
                    for (size_t i = 0; i < S; i++) { weighted += a[i * heads + k] * ds[i * heads + k]; }
                    for (size_t i = 0; i < S; i++) {
                        float ai = a[i * heads + k], dai = ds[i * heads + k];
                        ds[i * heads + k] = sigmoid ? dai * ai * (1.0f - ai) : ai * (dai - weighted);
                    }
                }
            }
            // 3. both paths into dV_i, one source at a time
            for (size_t i = 0; i < S; i++) {
                for (size_t n = first; n < end; n++) {
                    const float* qgn = qg + (n - first) * C;
                    for (size_t k = 0; k < heads; k++) {
                        size_t at = (n * S + i) * heads + k, c0 = k * Ck;
                        const float* v = sources[i] + n * C + c0;
                        const float* d = dh + n * C + c0;
                        float* dv = dsources[i] + n * C + c0;
                        float ai = alpha[at], ds = dscore[at], r = key_rstd[at];
                        float key_scale = ds * r;
                        float correction = norm_weight != NULL
                            ? ds * r * r * r * key_dot[at] / (float)Ck : 0.0f;
                        for (size_t c = 0; c < Ck; c++) {
                            dv[c] += ai * d[c] + key_scale * qgn[c0 + c] - correction * v[c];
                        }
                    }
                }
            }
            // 4. the query's gradient (and the gain's), row by row into the tile's partials
            //    (and into the row's own, with a per-token part)
            float* pq = partials + 2 * tile * C;
            float* pg = pq + C;
            for (size_t n = first; n < end; n++) {
                const float* qn = q + (n - first) * C;
                for (size_t k = 0; k < heads; k++) {
                    size_t c0 = k * Ck;
                    for (size_t i = 0; i < S; i++) {
                        size_t at = (n * S + i) * heads + k;
                        const float* v = sources[i] + n * C + c0;
                        float key_scale = dscore[at] * key_rstd[at];
                        if (norm_weight != NULL) {
                            const float* g = norm_weight + c0;
                            for (size_t c = 0; c < Ck; c++) {
                                pq[c0 + c] += key_scale * g[c] * v[c];
                                pg[c0 + c] += key_scale * qn[c0 + c] * v[c];
                            }
                        } else {
                            for (size_t c = 0; c < Ck; c++) { pq[c0 + c] += key_scale * v[c]; }
                        }
                        if (dtoken_query != NULL) {
                            float* dr = dtoken_query + n * C + c0;
                            const float* g = norm_weight != NULL ? norm_weight + c0 : NULL;
                            for (size_t c = 0; c < Ck; c++) {
                                dr[c] += g != NULL ? key_scale * g[c] * v[c] : key_scale * v[c];
                            }
                        }
                    }
                }
            }
        }
        free(q);
        free(qg);
    }
    for (size_t tile = 0; tile < n_tiles; tile++) {
        const float* pq = partials + 2 * tile * C;
        for (size_t c = 0; c < C; c++) {
            dquery[c] += pq[c];
            if (dnorm_weight != NULL) { dnorm_weight[c] += pq[C + c]; }
        }
    }
    free(partials);
    free(dscore);
    free(key_dot);
}

// weights (n_sources) = softmax(coefficients) (normalise, static mixing) or the coefficients
// themselves (DenseFormer); h = sum_i weight_i V_i
void depth_mixing_forward(float* h, float* weights, const float* const* sources,
                          const float* coefficients, size_t n_sources, size_t N, size_t C,
                          int normalise) {
    for (size_t i = 0; i < n_sources; i++) { weights[i] = coefficients[i]; }
    if (normalise) { softmax_in_place(weights, n_sources, 1); }
    #pragma omp parallel for
    for (size_t n = 0; n < N; n++) {
        float* o = h + n * C;
        for (size_t c = 0; c < C; c++) { o[c] = 0.0f; }
        for (size_t i = 0; i < n_sources; i++) {
            const float* v = sources[i] + n * C;
            for (size_t c = 0; c < C; c++) { o[c] += weights[i] * v[c]; }
        }
    }
}

// forward was: h = sum_i weight_i V_i, weight = softmax(c) or c. So
//   dV_i += weight_i dh;  dweight_i = sum over rows of dh . V_i
//   static: dc_i += weight_i (dweight_i - sum_j weight_j dweight_j);  dense: dc_i += dweight_i
void depth_mixing_backward(float* const* dsources, float* dcoefficients, const float* dh,
                           const float* weights, const float* const* sources, size_t n_sources,
                           size_t N, size_t C, int normalise) {
    size_t n_tiles = (N + VARIANT_TILE - 1) / VARIANT_TILE;
    float* partials = callocCheck(n_tiles * n_sources, sizeof(float));  // per tile: dweight
    #pragma omp parallel for
    for (size_t tile = 0; tile < n_tiles; tile++) {
        size_t end = (tile + 1) * VARIANT_TILE < N ? (tile + 1) * VARIANT_TILE : N;
        for (size_t n = tile * VARIANT_TILE; n < end; n++) {
            const float* d = dh + n * C;
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

// ---- the one entry point: any depth attention, then its RMSNorm ---------------------------
// model.c's input_forward makes this one call for every AttnRes sub-layer (and the output);
// the switches pick the operator (layers.h). Every call below is a layer of its own file.

// 1 for the default operator (depth_attention.c): softmax, one head, the key norm, a static
// query, no mixing
static int default_operator(DepthParams params, DepthSwitches switches) {
    return !switches.mixing && switches.heads == 1 && !switches.sigmoid && params.norm != NULL &&
           params.qproj == NULL;
}

static void zero(float* x, size_t n) {
    #pragma omp parallel for
    for (size_t i = 0; i < n; i++) { x[i] = 0.0f; }
}

void attnres_input_forward(float* xn, float* rstd, float* h, DepthSaved saved,
                           const float* const* sources, DepthParams params, const float* weight,
                           size_t n_sources, size_t N, size_t C, DepthSwitches switches) {
    if (default_operator(params, switches) && xn != NULL) {
        depth_attention_rmsnorm_forward(xn, rstd, h, saved, sources, params, weight, n_sources, N,
                                        C);
        return;
    }
    // (without the norm the default operator is the variant with every switch off, the same
    // bits: test_variants.cpp)
    if (switches.mixing) {
        depth_mixing_forward(h, saved.alpha, sources, params.mix, n_sources, N, C,
                             switches.mixing == 1);
    } else {
        const float* token_query = NULL;
        if (params.qproj != NULL) {  // --depth-query input: token_query = U rmsnorm(V_last), no gain
            rmsnorm_forward(saved.last_xn, saved.last_rstd, sources[n_sources - 1], NULL, N, C);
            linear_forward(saved.token_query, saved.last_xn, params.qproj, N, C, C);
            token_query = saved.token_query;
        }
        depth_attention_variant_forward(h, saved.alpha, saved.key_rstd, sources, params.query,
                                        token_query, params.norm, n_sources, N, C, switches.heads,
                                        switches.sigmoid);
    }
    if (xn != NULL) { rmsnorm_forward(xn, rstd, h, weight, N, C); }
}

// forward was: h = DA(sources), xn = rmsnorm(h; weight). dh = rmsnorm's input gradient, then
// the operator's backward from dh into the sources' gradients (with --depth-query input, on
// through token_query = last_xn U^T and last_xn = rmsnorm(V_last) into V_last's gradient)
void attnres_input_backward(float* const* dsources, DepthParams grads, float* dweight,
                            DepthScratch scratch, const float* dxn, const float* h,
                            const float* rstd, DepthSaved saved, const float* const* sources,
                            DepthParams params, const float* weight, size_t n_sources, size_t N,
                            size_t C, DepthSwitches switches) {
    if (default_operator(params, switches)) {
        depth_attention_rmsnorm_backward(dsources, grads, dweight, scratch.dh, dxn, h, rstd,
                                         weight, saved, sources, params, n_sources, N, C);
        return;
    }
    float* dh = scratch.dh;
    zero(dh, N * C);
    rmsnorm_backward(dh, dweight, dxn, h, weight, rstd, N, C);
    if (switches.mixing) {
        depth_mixing_backward(dsources, grads.mix, dh, saved.alpha, sources, n_sources, N, C,
                              switches.mixing == 1);
        return;
    }
    int input_query = params.qproj != NULL;
    if (input_query) { zero(scratch.dtoken_query, N * C); }
    depth_attention_variant_backward(dsources, grads.query,
                                     input_query ? scratch.dtoken_query : NULL, grads.norm, dh,
                                     saved.alpha, saved.key_rstd, sources, params.query,
                                     input_query ? saved.token_query : NULL, params.norm,
                                     n_sources, N, C, switches.heads, switches.sigmoid);
    if (input_query) {
        zero(scratch.dlast_xn, N * C);
        linear_backward(scratch.dlast_xn, grads.qproj, scratch.dtoken_query, saved.last_xn,
                        params.qproj, N, C, C);
        rmsnorm_backward(dsources[n_sources - 1], NULL, scratch.dlast_xn, sources[n_sources - 1],
                         NULL, saved.last_rstd, N, C);
    }
}
