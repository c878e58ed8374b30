// two_phase.c — block AttnRes depth attention for decoding, in two phases (paper, Algorithm 1;
// SPEC.md "Two-phase inference"). The sequential definition (depth_attention.c) gives
// sub-layer i of block n the softmax over s(b_0) .. s(b_{n-1}) and, when i > 0, s(p) of the
// partial sum p. The block's S pseudo-queries are known before it runs, so:
//   phase 1: all S queries against b_0 .. b_{n-1} at once (each block read once per row),
//            keeping per query the max m1, l1 = sum_i e^{s_i - m1}, o1 = sum_i e^{s_i - m1} b_i;
//   phase 2: sub-layer i > 0 scores its query against p alone (o2 = p, m2 = s(p), l2 = 1) and
//            merges by the online-softmax rule, m = max(m1, m2):
//            h = (e^{m1-m} o1 + e^{m2-m} o2) / (e^{m1-m} l1 + e^{m2-m} l2).
// Every exponent is <= 0, so no score, however large, overflows.
#include <math.h>
#include <stdlib.h>
#include "inference.h"
#include "layers.h"
#include "util.h"

// wg (count,C) = w * g of each query: scores are s = (w * g) . v * r, as depth_attention.c
static float* query_times_gain(const float* queries, const float* norm_weights, size_t count,
                               size_t C) {
    float* wg = mallocCheck(count * C * sizeof(float));
    for (size_t i = 0; i < count * C; i++) { wg[i] = queries[i] * norm_weights[i]; }
    return wg;
}

// o (S,N,C), max and sumexp (S,N); blocks[i] (N,C); queries, norm_weights (S,C)
void depth_attention_phase1(float* o, float* max, float* sumexp, const float* const* blocks,
                            const float* queries, const float* norm_weights, size_t n_blocks,
                            size_t S, size_t N, size_t C) {
    float* scores = mallocCheck(N * n_blocks * S * sizeof(float));  // (N, n_blocks, S)
    float* wg = query_times_gain(queries, norm_weights, S, C);
    #pragma omp parallel for
    for (size_t n = 0; n < N; n++) {
        float* s = scores + n * n_blocks * S;
        // scores of all S queries against each block: the block's rstd is shared
        for (size_t i = 0; i < n_blocks; i++) {
            const float* v = blocks[i] + n * C;
            float r = depth_attention_rstd(v, C);
            for (size_t j = 0; j < S; j++) { s[i * S + j] = dot(wg + j * C, v, C) * r; }
        }
        for (size_t j = 0; j < S; j++) {
            float m = -INFINITY;
            for (size_t i = 0; i < n_blocks; i++) { m = fmaxf(m, s[i * S + j]); }
            max[j * N + n] = m;
            float* oj = o + (j * N + n) * C;
            for (size_t c = 0; c < C; c++) { oj[c] = 0.0f; }
        }
        // e_ij = e^{s_ij - m_j}; l_j = sum_i e_ij; o_j = sum_i e_ij b_i (blocks read once)
        for (size_t j = 0; j < S; j++) { sumexp[j * N + n] = 0.0f; }
        for (size_t i = 0; i < n_blocks; i++) {
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
        // attention over the partial sum alone: a single key, so o2 = p, m2 = s(p), l2 = 1
        const float* o2 = partial + n * C;
        float m2 = dot(wg, o2, C) * depth_attention_rstd(o2, C), l2 = 1.0f;
        // online-softmax merge with phase 1
        float m = fmaxf(max1[n], m2);
        float scale1 = expf(max1[n] - m), scale2 = expf(m2 - m);
        float denominator = scale1 * sumexp1[n] + scale2 * l2;
        for (size_t c = 0; c < C; c++) {
            h[c] = (scale1 * o1n[c] + scale2 * o2[c]) / denominator;
        }
    }
    free(wg);
}
