// two_phase.c — block AttnRes depth attention for decoding, in two phases (paper, Algorithm 1;
// SPEC.md "Two-phase inference"). The sequential definition (depth_attention.c) gives
// sub-layer i of block n the softmax over s(b_0) .. s(b_{n-1}) and, when i > 0, s(partial) of
// the block's partial sum. The block's S pseudo-queries are known before it runs, so:
//   phase 1: all S queries against b_0 .. b_{n-1} at once (each block read once per row),
//            keeping per query the max m1, l1 = sum_i e^{s_i - m1}, o1 = sum_i e^{s_i - m1} b_i;
//   phase 2: sub-layer i > 0 scores its query against the partial sum alone (o2 = partial,
//            m2 = s(partial), l2 = 1) and merges by the online-softmax rule, m = max(m1, m2):
//            h = (e^{m1-m} o1 + e^{m2-m} o2) / (e^{m1-m} l1 + e^{m2-m} l2).
// Every exponent is <= 0, so no score, however large, overflows.
// The variants (SPEC "Variants", at the end of this file) keep the two phases: per head, with
// or without the key norm; sigmoid scores and DenseFormer scalars have no normaliser, so
// phase 2 adds the partial's term; static mixing merges logits instead of scores. The
// input-dependent query has no phase 1 (inference.h says why).
#include <math.h>
#include <stdlib.h>
#include "inference.h"
#include "layers.h"
#include "online_softmax.h"
#include "util.h"

// h (C) = (e^{m1-m} o1 + e^{m2-m} o2) / (e^{m1-m} l1 + e^{m2-m} l2), m = max(m1, m2), where
// the second side is a single key (l2 = 1): phase 2's merge (online_softmax.h), then o / l
static void merge_single_key(float* h, const float* o1, float m1, float l1, const float* o2,
                             float m2, size_t C) {
    float m = m1, l = l1;
    for (size_t c = 0; c < C; c++) { h[c] = o1[c]; }
    online_softmax_merge(h, &m, &l, o2, m2, 1.0f, C);
    for (size_t c = 0; c < C; c++) { h[c] /= l; }
}

// wg (count,C) = w * g of each query: scores are s = (w * g) . v * r, as depth_attention.c
// (norm_weights NULL, the key norm off: g = 1)
static float* query_times_gain(const float* queries, const float* norm_weights, size_t count,
                               size_t C) {
    float* wg = mallocCheck(count * C * sizeof(float));
    for (size_t i = 0; i < count * C; i++) {
        wg[i] = norm_weights != NULL ? queries[i] * norm_weights[i] : queries[i];
    }
    return wg;
}

// o (S,N,C), max and sumexp (S,N); blocks[i] (N,C); queries, norm_weights (S,C)
void depth_attention_phase1(float* o, float* max, float* sumexp, const float* const* blocks,
                            const float* queries, const float* norm_weights, size_t n_block_sources,
                            size_t S, size_t N, size_t C) {
    // (N, n_block_sources, S)
    float* scores = mallocCheck(N * n_block_sources * S * sizeof(float));
    float* wg = query_times_gain(queries, norm_weights, S, C);
    #pragma omp parallel for
    for (size_t n = 0; n < N; n++) {
        float* s = scores + n * n_block_sources * S;
        // scores of all S queries against each block: the block's rstd is shared
        for (size_t i = 0; i < n_block_sources; i++) {
            const float* v = blocks[i] + n * C;
            float r = depth_attention_rstd(v, C);
            for (size_t j = 0; j < S; j++) { s[i * S + j] = dot(wg + j * C, v, C) * r; }
        }
        for (size_t j = 0; j < S; j++) {
            float m = -INFINITY;
            for (size_t i = 0; i < n_block_sources; i++) { m = fmaxf(m, s[i * S + j]); }
            max[j * N + n] = m;
            float* oj = o + (j * N + n) * C;
            for (size_t c = 0; c < C; c++) { oj[c] = 0.0f; }
        }
        // e_ij = e^{s_ij - m_j}; l_j = sum_i e_ij; o_j = sum_i e_ij b_i (blocks read once)
        for (size_t j = 0; j < S; j++) { sumexp[j * N + n] = 0.0f; }
        for (size_t i = 0; i < n_block_sources; i++) {
            const float* v = blocks[i] + n * C;
            for (size_t j = 0; j < S; j++) {
                float e = expf(s[i * S + j] - max[j * N + n]);
                sumexp[j * N + n] += e;
                float* oj = o + (j * N + n) * C;
                for (size_t c = 0; c < C; c++) { oj[c] += e * v[c]; }
            }
        }
    }
    free(scores);
    free(wg);
}

// out, o1, partial (N,C); max1, sumexp1 (N); partial NULL: out = o1 / l1
void depth_attention_phase2(float* out, const float* o1, const float* max1,
                            const float* sumexp1, const float* partial, const float* query,
                            const float* norm_weight, size_t N, size_t C) {
    float* wg = query_times_gain(query, norm_weight, 1, C);
    #pragma omp parallel for
    for (size_t n = 0; n < N; n++) {
        const float* o1n = o1 + n * C;
        float* h = out + n * C;
        if (partial == NULL) {
            for (size_t c = 0; c < C; c++) { h[c] = o1n[c] / sumexp1[n]; }
            continue;
        }
        // attention over the partial sum alone: a single key, so o2 = partial,
        // m2 = s(partial), l2 = 1
        const float* o2 = partial + n * C;
        float m2 = dot(wg, o2, C) * depth_attention_rstd(o2, C);
        merge_single_key(h, o1n, max1[n], sumexp1[n], o2, m2, C);
    }
    free(wg);
}

// ---- the variants (SPEC "Variants") -------------------------------------------------------
// The same two phases for the attention of depth_variants.c. Per head k (channels of group k,
// Ck = C / heads), with r = 1 and g = 1 when the key norm is off:
//   s_ik = (w * g)[k] . b_i[k] * r_ik,   r_ik = (mean over head k's channels of b_i^2 + eps)^(-1/2)
// softmax: phase 1 keeps m1, l1 per query, row and head, and o1 over each head's channels;
//          phase 2 merges the partial sum's score per head by the online-softmax rule.
// sigmoid: alpha_ik = sigmoid(s_ik) has no normaliser, so there is nothing to rescale:
//          o1[k] = sum_i sigmoid(s_ik) b_i[k] (m1 = 0, l1 = 1),
//          h[k] = o1[k] + sigmoid(s_pk) partial[k].
// The sums run over the sources in the sequential order (blocks, then the partial sum), so
// sigmoid equals depth_attention_variant_forward bit for bit.

static float sigmoidf(float x) { return 1.0f / (1.0f + expf(-x)); }

// r of head k's Ck channels v of a source row (depth_attention_rstd), 1 with the key norm off
static float head_rstd(const float* v, size_t Ck, int key_norm) {
    return key_norm ? depth_attention_rstd(v, Ck) : 1.0f;
}

// Row n of phase 1 from its scores s (n_block_sources, S, heads), per query j and head k:
//   softmax: m = max_i s_ijk, e_ijk = e^{s_ijk - m}, l = sum_i e_ijk
//   sigmoid: e_ijk = sigmoid(s_ijk), m = 0, l = 1 (no normaliser)
//   o_j[k] = sum_i e_ijk b_i[k]
static void phase1_row(float* o, float* max, float* sumexp, const float* s,
                       const float* const* blocks, size_t n, size_t n_block_sources, size_t S,
                       size_t N, size_t C, size_t heads, int sigmoid) {
    size_t Ck = C / heads;
    for (size_t j = 0; j < S; j++) {
        float* oj = o + (j * N + n) * C;
        for (size_t c = 0; c < C; c++) { oj[c] = 0.0f; }
        for (size_t k = 0; k < heads; k++) {
            const float* sjk = s + j * heads + k;  // s_ijk = sjk[i * S * heads]
            float m = 0.0f, l = 0.0f;
            if (!sigmoid) {
                m = -INFINITY;
                for (size_t i = 0; i < n_block_sources; i++) { m = fmaxf(m, sjk[i * S * heads]); }
            }
            for (size_t i = 0; i < n_block_sources; i++) {
                const float* v = blocks[i] + n * C + k * Ck;
                float score = sjk[i * S * heads];
                float e = sigmoid ? sigmoidf(score) : expf(score - m);
                l += e;
                for (size_t c = 0; c < Ck; c++) { oj[k * Ck + c] += e * v[c]; }
            }
            max[(j * N + n) * heads + k] = m;
            sumexp[(j * N + n) * heads + k] = sigmoid ? 1.0f : l;
        }
    }
}

// o (S,N,C); max and sumexp (S,N,heads); blocks[i] (N,C); queries, norm_weights (S,C)
void depth_attention_variant_phase1(float* o, float* max, float* sumexp,
                                    const float* const* blocks, const float* queries,
                                    const float* norm_weights, size_t n_block_sources, size_t S,
                                    size_t N, size_t C, size_t heads, int sigmoid) {
    size_t Ck = C / heads;
    // (N, n_block_sources, S, heads)
    float* scores = mallocCheck(N * n_block_sources * S * heads * sizeof(float));
    float* wg = query_times_gain(queries, norm_weights, S, C);
    #pragma omp parallel for
    for (size_t n = 0; n < N; n++) {
        float* s = scores + n * n_block_sources * S * heads;
        // all S queries against each head of each block: the head's r is shared
        for (size_t i = 0; i < n_block_sources; i++) {
            for (size_t k = 0; k < heads; k++) {
                const float* v = blocks[i] + n * C + k * Ck;
                float r = head_rstd(v, Ck, norm_weights != NULL);
                for (size_t j = 0; j < S; j++) {
                    s[(i * S + j) * heads + k] = dot(wg + j * C + k * Ck, v, Ck) * r;
                }
            }
        }
        phase1_row(o, max, sumexp, s, blocks, n, n_block_sources, S, N, C, heads, sigmoid);
    }
    free(scores);
    free(wg);
}

// out, o1, partial (N,C); max1, sumexp1 (N,heads); partial NULL: out = o1 / l1 (exact for
// sigmoid's l1 = 1)
void depth_attention_variant_phase2(float* out, const float* o1, const float* max1,
                                    const float* sumexp1, const float* partial,
                                    const float* query, const float* norm_weight, size_t N,
                                    size_t C, size_t heads, int sigmoid) {
    size_t Ck = C / heads;
    float* wg = query_times_gain(query, norm_weight, 1, C);
    #pragma omp parallel for
    for (size_t n = 0; n < N; n++) {
        for (size_t k = 0; k < heads; k++) {
            size_t nk = n * heads + k;
            const float* o1k = o1 + n * C + k * Ck;
            float* h = out + n * C + k * Ck;
            if (partial == NULL) {
                for (size_t c = 0; c < Ck; c++) { h[c] = o1k[c] / sumexp1[nk]; }
                continue;
            }
            // head k of the partial sum: a single key, o2 = partial[k], m2 = s_p, l2 = 1
            const float* partial_k = partial + n * C + k * Ck;
            float s_p = dot(wg + k * Ck, partial_k, Ck) *
                        head_rstd(partial_k, Ck, norm_weight != NULL);
            if (sigmoid) {
                float a = sigmoidf(s_p);
                for (size_t c = 0; c < Ck; c++) { h[c] = o1k[c] + a * partial_k[c]; }
            } else {
                merge_single_key(h, o1k, max1[nk], sumexp1[nk], partial_k, s_p, Ck);
            }
        }
    }
    free(wg);
}

// ---- the mixings: weights without scores --------------------------------------------------
// Row l of the coefficients weighs sub-layer l's sources (the blocks, then the partial sum),
// the same weights for every row n:
//   static (softmax over the logits c): phase 1 keeps per query m1 = max_i c_i over the
//          completed blocks and l1 = sum_i e^{c_i - m1}, and per row o1 = sum_i e^{c_i - m1} b_i;
//          phase 2 merges the partial's logit (o2 = partial, m2 = c_p, l2 = 1) by the
//          online-softmax rule.
//   dense (DenseFormer scalars beta): o1 = sum_i beta_i b_i (m1 = 0, l1 = 1),
//          h = o1 + beta_p partial: depth_mixing_forward's sum in its order, bit for bit.

// o (S,N,C); max and sumexp (S); blocks[i] (N,C); coefficients: S rows `stride` floats apart,
// row j's first n_block_sources entries weigh the blocks
void depth_mixing_phase1(float* o, float* max, float* sumexp, const float* const* blocks,
                         const float* coefficients, size_t stride, size_t n_block_sources, size_t S,
                         size_t N, size_t C, int normalise) {
    float* weights = mallocCheck(S * n_block_sources * sizeof(float));  // (S, n_block_sources)
    for (size_t j = 0; j < S; j++) {
        const float* c = coefficients + j * stride;
        float* w = weights + j * n_block_sources;
        max[j] = 0.0f;
        sumexp[j] = 1.0f;
        for (size_t i = 0; i < n_block_sources; i++) { w[i] = c[i]; }
        if (!normalise) { continue; }
        // static: w_i = e^{c_i - m}, l = sum_i w_i
        float m = -INFINITY, l = 0.0f;
        for (size_t i = 0; i < n_block_sources; i++) { m = fmaxf(m, c[i]); }
        for (size_t i = 0; i < n_block_sources; i++) {
            w[i] = expf(c[i] - m);
            l += w[i];
        }
        max[j] = m;
        sumexp[j] = l;
    }
    #pragma omp parallel for
    for (size_t n = 0; n < N; n++) {
        for (size_t j = 0; j < S; j++) {
            float* oj = o + (j * N + n) * C;
            for (size_t c = 0; c < C; c++) { oj[c] = 0.0f; }
            for (size_t i = 0; i < n_block_sources; i++) {
                const float* v = blocks[i] + n * C;
                float w = weights[j * n_block_sources + i];
                for (size_t c = 0; c < C; c++) { oj[c] += w * v[c]; }
            }
        }
    }
    free(weights);
}

// out, o1, partial (N,C); max1, sumexp1: phase 1's for this query; coefficient: the partial's
// c_p (static) or beta_p (dense); partial NULL: out = o1 / l1 (exact for dense's l1 = 1)
void depth_mixing_phase2(float* out, const float* o1, float max1, float sumexp1,
                         const float* partial, float coefficient, size_t N, size_t C,
                         int normalise) {
    #pragma omp parallel for
    for (size_t n = 0; n < N; n++) {
        const float* o1n = o1 + n * C;
        const float* partial_n = partial != NULL ? partial + n * C : NULL;
        float* h = out + n * C;
        if (partial_n == NULL) {
            for (size_t c = 0; c < C; c++) { h[c] = o1n[c] / sumexp1; }
        } else if (normalise) {
            merge_single_key(h, o1n, max1, sumexp1, partial_n, coefficient, C);
        } else {
            for (size_t c = 0; c < C; c++) { h[c] = o1n[c] + coefficient * partial_n[c]; }
        }
    }
}
