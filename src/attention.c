// attention.c — causal grouped-query self-attention (after RoPE has turned q and k), whose
// memory grows with T, not T^2 (FlashAttention-2's algorithm, on the CPU).
// q (B,T,H*hs), k and v (B,T,G*hs); query head h reads key/value head h / (H/G).
// For each (b, h, t): s_t' = q_t . k_t' * scale (scale = 1/sqrt(hs)) for t' <= t,
// a = softmax(s), out_t = sum_t' a_t' v_t'.
//
// Read top to bottom:
//   attention_query: that definition for one query, as plain loops (the softmax of the whole
//     row of scores, then the weighted sum).
//   attention_query_online: the same query with an online softmax. The keys come a tile of
//     TILE_COLS at a time; each tile is a part (o2, m2, l2): its largest score m2, its sum of
//     exponentials l2 = sum_j e^{s_j - m2} and its weighted sum o2 = sum_j e^{s_j - m2} v_j.
//     online_softmax_merge (online_softmax.h, the merge two_phase.c uses too) folds each part
//     into the running (o, m, l), rescaling what came before by e^{m_old - m_new}. At the end
//     out = o / l and lse = m + log l, the log of the softmax's denominator. The cached
//     decoder (inference.c) runs it, so that its rows are the full forward's bit for bit.
//   attention_forward, what the model runs: attention_query_online for a tile of TILE_ROWS
//     queries at once, the scores S = Q K^T and each part's weighted sum O2 = A V (here
//     A = e^{S scale - m2}, the part's weights before the division by l) as products on
//     linear.c's register tile (matmul_tile.h). The tile computes each score as one fmaf
//     chain over the dimensions in order and each part's sums as one chain over the tile's
//     keys in order, as attention_query_online's loops do, with the same merges, so the two
//     agree bit for bit (tested). A tile of queries takes its products over the keys up to its
//     last query: for its earlier rows, the keys past their own position get e^s = 0 and add
//     nothing (and a key tile wholly past a row is not merged into it).
//   attention_backward: FlashAttention-2's backward, tile by tile (below).
//
// Memory. The forward keeps per query row out_t (hs floats, which the model keeps anyway:
// the sub-layer's y) and lse_t (one float); no row of probabilities. The backward recomputes
// each tile of them, a_t' = e^{s_t' - lse_t}, from q, k and lse. Per thread both hold one
// head's keys and values (and the backward its queries and output gradients) copied into the
// tile's panels, O(T hs), and tiles of scores (TILE_ROWS x TILE_COLS in the forward,
// QUERY_BLOCK x TILE_COLS in the backward): nothing of size T^2.
// dev/bench/attention_v1_materialised.c keeps the version that saved the (B,H,T,T)
// probabilities, and dev/bench/bench_attention_cpu.c times the two.
//
// The backward, from out_t = sum_t' a_t' v_t':
//   dv_t' += a_t' dout_t ;  da_t' = dout_t . v_t'
//   ds_t' = a_t' (da_t' - D_t), D_t = sum_j a_j da_j         (softmax's Jacobian)
//   dq_t += scale sum_t' ds_t' k_t' ;  dk_t' += scale ds_t' q_t
// D_t is a sum over the whole row of a, which is never kept; but since da_j = dout_t . v_j and
// out_t = sum_j a_j v_j, D_t = sum_j a_j (dout_t . v_j) = dout_t . out_t: one dot product of
// two rows the backward already has. So each tile of (queries, keys) stands alone: recompute
// S = Q K^T and A = e^{S scale - lse}, dA = dO V^T, dS = A * (dA - D) * scale, then
// dQ += dS K, dK += dS^T Q, dV += A^T dO.
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "layers.h"
#include "matmul_tile.h"
#include "online_softmax.h"
#include "util.h"

static size_t round_up(size_t n, size_t multiple) { return (n + multiple - 1) / multiple * multiple; }

// row[0..n) = softmax(row * scale) over its first n scores, row[n..len) = 0 (the future)
static void causal_softmax(float* row, size_t n, size_t len, float scale) {
    for (size_t t2 = 0; t2 < n; t2++) { row[t2] *= scale; }
    float max_score = max_of(row, n);
    for (size_t t2 = 0; t2 < n; t2++) { row[t2] = expf_vectorizable(row[t2] - max_score); }
    float sum = sum_of(row, n);
    for (size_t t2 = 0; t2 < n; t2++) { row[t2] /= sum; }
    for (size_t t2 = n; t2 < len; t2++) { row[t2] = 0.0f; }
}

// One query against n_keys keys and values (row t' of each at k + t' * kv_stride):
// a = softmax(q . k_t' * scale) kept in att_row, out = sum_t' a_t' v_t'.
void attention_query(float* out, float* att_row, const float* q, const float* k, const float* v,
                     size_t n_keys, size_t kv_stride, size_t hs) {
    for (size_t t2 = 0; t2 < n_keys; t2++) {
        const float* k_t2 = k + t2 * kv_stride;
        float score = 0.0f;
        for (size_t i = 0; i < hs; i++) { score = fmaf(q[i], k_t2[i], score); }
        att_row[t2] = score;
    }
    causal_softmax(att_row, n_keys, n_keys, 1.0f / sqrtf((float)hs));
    for (size_t i = 0; i < hs; i++) { out[i] = 0.0f; }
    for (size_t t2 = 0; t2 < n_keys; t2++) {
        const float* v_t2 = v + t2 * kv_stride;
        for (size_t i = 0; i < hs; i++) { out[i] = fmaf(att_row[t2], v_t2[i], out[i]); }
    }
}

// A tile's part of one query's softmax: row (n scores) = e^{row * scale - m2} in place;
// returns m2, the largest scaled score, and writes l2 = their sum
static float tile_part(float* row, size_t n, float scale, float* l2) {
    for (size_t j = 0; j < n; j++) { row[j] *= scale; }
    float m2 = max_of(row, n);
    for (size_t j = 0; j < n; j++) { row[j] = expf_vectorizable(row[j] - m2); }
    *l2 = sum_of(row, n);
    return m2;
}

// The same query with an online softmax over tiles of TILE_COLS keys; writes out (hs) and
// lse = log sum_t' e^{s_t'}.
void attention_query_online(float* out, float* lse, const float* q, const float* k,
                            const float* v, size_t n_keys, size_t kv_stride, size_t hs) {
    float scale = 1.0f / sqrtf((float)hs);
    float a[TILE_COLS], o2[hs];
    float m = -INFINITY, l = 0.0f;  // the empty part
    for (size_t i = 0; i < hs; i++) { out[i] = 0.0f; }
    for (size_t k0 = 0; k0 < n_keys; k0 += TILE_COLS) {
        size_t n = min_size(TILE_COLS, n_keys - k0);
        for (size_t j = 0; j < n; j++) {
            const float* k_t2 = k + (k0 + j) * kv_stride;
            float score = 0.0f;
            for (size_t i = 0; i < hs; i++) { score = fmaf(q[i], k_t2[i], score); }
            a[j] = score;
        }
        float l2, m2 = tile_part(a, n, scale, &l2);
        for (size_t i = 0; i < hs; i++) { o2[i] = 0.0f; }
        for (size_t j = 0; j < n; j++) {
            const float* v_t2 = v + (k0 + j) * kv_stride;
            for (size_t i = 0; i < hs; i++) { o2[i] = fmaf(a[j], v_t2[i], o2[i]); }
        }
        online_softmax_merge(out, &m, &l, o2, m2, l2, hs);
    }
    for (size_t i = 0; i < hs; i++) { out[i] /= l; }
    *lse = m + logf(l);
}

// ---- panels: one head's vectors, copied for the tile ----
// x_t (hs floats) for t < T, row_stride floats apart. As positions x dimensions, for a
// product over positions (A V, dS K, dS^T Q, A^T dO): panels (ceil(hs/TILE_COLS), T,
// TILE_COLS), panel c's row t = dimensions c*TILE_COLS .. of x_t.
static void pack_by_position(float* panels, const float* x, size_t row_stride, size_t T,
                             size_t hs) {
    for (size_t c = 0; c * TILE_COLS < hs; c++)
        pack_panel(panels + c * T * TILE_COLS, x + c * TILE_COLS, 1, row_stride,
                   min_size(TILE_COLS, hs - c * TILE_COLS), T, TILE_COLS);
}
// As dimensions x positions (transposed), for a product over dimensions (Q K^T, dO V^T):
// panels (ceil(T/TILE_COLS), hs, TILE_COLS), panel c's row i = dimension i of x_t for
// t = c*TILE_COLS .. (zero past T). Key tile k0 (a multiple of TILE_COLS) is panel
// k0 / TILE_COLS, at k0 * hs.
static void pack_by_dimension(float* panels, const float* x, size_t row_stride, size_t T,
                              size_t hs) {
    for (size_t c = 0; c * TILE_COLS < T; c++)
        pack_panel(panels + c * hs * TILE_COLS, x + c * TILE_COLS * row_stride, row_stride, 1,
                   min_size(TILE_COLS, T - c * TILE_COLS), hs, TILE_COLS);
}

// C (rows,cols) += A (rows,k) . X (k,cols), or C = A . X (accumulate 0), X in panels of
// TILE_COLS columns panel_size floats apart, A(i,kk) = A[i*a_row + kk*a_col], C's rows m
// floats apart, rows <= TILE_ROWS
static void product(float* C, size_t m, const float* A, size_t a_row, size_t a_col,
                    const float* panels, size_t panel_size, size_t k, size_t rows, size_t cols,
                    int accumulate) {
    for (size_t j0 = 0; j0 < cols; j0 += TILE_COLS)
        tile_any(C + j0, A, a_row, a_col, panels + (j0 / TILE_COLS) * panel_size, k, m, rows,
                 min_size(TILE_COLS, cols - j0), accumulate);
}

// Of key tile k0 (keys k0 .. k0 + cols - 1), the keys query t sees: t - k0 + 1 of them,
// capped at cols; none when the tile starts past t
static size_t keys_seen(size_t t, size_t k0, size_t cols) {
    return t < k0 ? 0 : min_size(cols, t - k0 + 1);
}

// out (B,T,H*hs), lse (B,H,T). Per (b, h), per tile of TILE_ROWS queries: the rows' running
// parts start empty (out = 0, m = -inf, l = 0), each key tile's part is merged in, then
// out /= l and lse = m + log l.
void attention_forward(float* out, float* lse, const float* q, const float* k, const float* v,
                       size_t B, size_t T, size_t H, size_t G, size_t hs) {
    size_t q_dim = H * hs, kv_dim = G * hs, kv_mul = H / G;
    size_t by_dimension = round_up(T, TILE_COLS) * hs, by_position = T * round_up(hs, TILE_COLS);
    float scale = 1.0f / sqrtf((float)hs);
    #pragma omp parallel
    {
        float* keys = mallocCheck(by_dimension * sizeof(float));    // K^T, for S = Q K^T
        float* values = mallocCheck(by_position * sizeof(float));   // V, for O2 = A V
        float* a = mallocCheck(TILE_ROWS * TILE_COLS * sizeof(float));  // S, then A = e^{S-m2}
        float* o2 = mallocCheck(TILE_ROWS * hs * sizeof(float));        // the parts' A V
        #pragma omp for collapse(2) schedule(static)
        for (size_t b = 0; b < B; b++) {
            for (size_t h = 0; h < H; h++) {
                size_t kv_offset = b * T * kv_dim + (h / kv_mul) * hs;
                pack_by_dimension(keys, k + kv_offset, kv_dim, T, hs);
                pack_by_position(values, v + kv_offset, kv_dim, T, hs);
                const float* q_bh = q + b * T * q_dim + h * hs;
                float* out_bh = out + b * T * q_dim + h * hs;
                float* lse_bh = lse + (b * H + h) * T;
                for (size_t t0 = 0; t0 < T; t0 += TILE_ROWS) {
                    // queries t0 .. t0 + rows - 1 see the keys before n_keys
                    size_t rows = min_size(TILE_ROWS, T - t0), n_keys = t0 + rows;
                    float m[TILE_ROWS], l[TILE_ROWS], m2[TILE_ROWS], l2[TILE_ROWS];
                    for (size_t r = 0; r < rows; r++) {
                        m[r] = -INFINITY;
                        l[r] = 0.0f;
                        memset(out_bh + (t0 + r) * q_dim, 0, hs * sizeof(float));
                    }
                    for (size_t k0 = 0; k0 < n_keys; k0 += TILE_COLS) {
                        size_t cols = min_size(TILE_COLS, n_keys - k0);
                        tile_any(a, q_bh + t0 * q_dim, q_dim, 1, keys + k0 * hs, hs, TILE_COLS,
                                 rows, cols, 0);  // S
                        for (size_t r = 0; r < rows; r++) {
                            float* a_r = a + r * TILE_COLS;
                            size_t n = keys_seen(t0 + r, k0, cols);
                            if (n > 0) { m2[r] = tile_part(a_r, n, scale, &l2[r]); }
                            for (size_t j = n; j < cols; j++) { a_r[j] = 0.0f; }
                        }
                        product(o2, hs, a, TILE_COLS, 1, values + k0 * TILE_COLS, T * TILE_COLS,
                                cols, rows, hs, 0);  // O2 = A V
                        for (size_t r = 0; r < rows; r++) {
                            if (keys_seen(t0 + r, k0, cols) == 0) { continue; }
                            online_softmax_merge(out_bh + (t0 + r) * q_dim, &m[r], &l[r],
                                                 o2 + r * hs, m2[r], l2[r], hs);
                        }
                    }
                    for (size_t r = 0; r < rows; r++) {
                        float* o = out_bh + (t0 + r) * q_dim;
                        for (size_t i = 0; i < hs; i++) { o[i] /= l[r]; }
                        lse_bh[t0 + r] = m[r] + logf(l[r]);
                    }
                }
            }
        }
        free(keys);
        free(values);
        free(a);
        free(o2);
    }
}

// forward was: out_t = sum_{t' <= t} a_t' v_t', a = softmax_t'(q_t . k_t' scale), and
// lse_t = log sum_{t' <= t} e^{q_t . k_t' scale}.
// The backward (the header's derivation). Per (b, g), the query heads that share key/value
// head g run in the same thread, one after another, so dk and dv need no atomics and sum in
// a fixed order. Per head, per block of QUERY_BLOCK queries and per key tile (TILE_COLS keys,
// up to the block's last query): for each tile of TILE_ROWS queries in the block that sees
// the keys, S = Q K^T, A = e^{S scale - lse}, dA = dO V^T, dS = A * (dA - D) * scale with
// D = rowsum(dO * O), and dQ += dS K; then, at once over the block's queries that see the
// key tile (from `first` on), dK += dS^T Q and dV += A^T dO. The block makes those two
// products' sums up to QUERY_BLOCK long instead of TILE_ROWS, so the register tile loads and stores its accumulators a quarter as
// often; A and dS of a block and a key tile are QUERY_BLOCK x TILE_COLS floats each.
#define QUERY_BLOCK (4 * TILE_ROWS)
void attention_backward(float* dq, float* dk, float* dv, const float* dout, const float* out,
                        const float* lse, const float* q, const float* k, const float* v,
                        size_t B, size_t T, size_t H, size_t G, size_t hs) {
    size_t q_dim = H * hs, kv_dim = G * hs, kv_mul = H / G;
    size_t by_dimension = round_up(T, TILE_COLS) * hs, by_position = T * round_up(hs, TILE_COLS);
    float scale = 1.0f / sqrtf((float)hs);
    #pragma omp parallel
    {
        float* keys_t = mallocCheck(by_dimension * sizeof(float));   // K^T, for S = Q K^T
        float* keys = mallocCheck(by_position * sizeof(float));      // K, for dQ = dS K
        float* values = mallocCheck(by_dimension * sizeof(float));   // V^T, for dA = dO V^T
        float* queries = mallocCheck(by_position * sizeof(float));   // Q, for dK = dS^T Q
        float* douts = mallocCheck(by_position * sizeof(float));     // dO, for dV = A^T dO
        float* a = mallocCheck(QUERY_BLOCK * TILE_COLS * sizeof(float));   // S, then A
        float* ds = mallocCheck(QUERY_BLOCK * TILE_COLS * sizeof(float));  // dA, then dS
        #pragma omp for collapse(2) schedule(static)
        for (size_t b = 0; b < B; b++) {
            for (size_t g = 0; g < G; g++) {
                size_t kv_offset = b * T * kv_dim + g * hs;
                pack_by_dimension(keys_t, k + kv_offset, kv_dim, T, hs);
                pack_by_position(keys, k + kv_offset, kv_dim, T, hs);
                pack_by_dimension(values, v + kv_offset, kv_dim, T, hs);
                for (size_t h = g * kv_mul; h < (g + 1) * kv_mul; h++) {
                    size_t q_offset = b * T * q_dim + h * hs;
                    pack_by_position(queries, q + q_offset, q_dim, T, hs);
                    pack_by_position(douts, dout + q_offset, q_dim, T, hs);
                    const float* lse_bh = lse + (b * H + h) * T;
                    for (size_t b0 = 0; b0 < T; b0 += QUERY_BLOCK) {
                        size_t block_rows = min_size(QUERY_BLOCK, T - b0);
                        float D[QUERY_BLOCK];  // D_t = dout_t . out_t = sum_j a_j da_j
                        for (size_t r = 0; r < block_rows; r++) {
                            size_t at = q_offset + (b0 + r) * q_dim;
                            D[r] = dot(dout + at, out + at, hs);
                        }
                        for (size_t k0 = 0; k0 < b0 + block_rows; k0 += TILE_COLS) {
                            size_t cols = min_size(TILE_COLS, b0 + block_rows - k0);
                            // the block's queries before k0 see none of these keys
                            size_t first = k0 > b0 ? k0 - b0 : 0;
                            for (size_t r0 = first - first % TILE_ROWS; r0 < block_rows; r0 += TILE_ROWS) {
                                size_t t0 = b0 + r0, rows = min_size(TILE_ROWS, block_rows - r0);
                                const float* q_tile = q + q_offset + t0 * q_dim;
                                const float* dout_tile = dout + q_offset + t0 * q_dim;
                                float *a_tile = a + r0 * TILE_COLS, *ds_tile = ds + r0 * TILE_COLS;
                                tile_any(a_tile, q_tile, q_dim, 1, keys_t + k0 * hs, hs, TILE_COLS,
                                         rows, cols, 0);  // S
                                tile_any(ds_tile, dout_tile, q_dim, 1, values + k0 * hs, hs,
                                         TILE_COLS, rows, cols, 0);  // dA
                                for (size_t r = 0; r < rows; r++) {
                                    float *a_r = a_tile + r * TILE_COLS, *ds_r = ds_tile + r * TILE_COLS;
                                    size_t n = keys_seen(t0 + r, k0, cols);
                                    float row_lse = lse_bh[t0 + r], row_D = D[r0 + r];
                                    for (size_t j = 0; j < n; j++) {
                                        float s_minus_lse = a_r[j] * scale - row_lse;
                                        a_r[j] = expf_vectorizable(s_minus_lse);
                                        ds_r[j] = a_r[j] * (ds_r[j] - row_D) * scale;
                                    }
                                    for (size_t j = n; j < cols; j++) {
                                        a_r[j] = 0.0f;
                                        ds_r[j] = 0.0f;
                                    }
                                }
                                product(dq + q_offset + t0 * q_dim, q_dim, ds_tile, TILE_COLS, 1,
                                        keys + k0 * TILE_COLS, T * TILE_COLS, cols, rows, hs, 1);  // dS K
                            }
                            // the key tile's keys TILE_ROWS at a time, over the block's queries
                            // from first on: dS^T and A^T read in place
                            for (size_t j0 = 0; j0 < cols; j0 += TILE_ROWS) {
                                size_t key_rows = min_size(TILE_ROWS, cols - j0);
                                size_t at = kv_offset + (k0 + j0) * kv_dim;
                                size_t from = b0 + first, n_queries = block_rows - first;
                                product(dk + at, kv_dim, ds + first * TILE_COLS + j0, 1, TILE_COLS,
                                        queries + from * TILE_COLS, T * TILE_COLS, n_queries,
                                        key_rows, hs, 1);  // dS^T Q
                                product(dv + at, kv_dim, a + first * TILE_COLS + j0, 1, TILE_COLS,
                                        douts + from * TILE_COLS, T * TILE_COLS, n_queries,
                                        key_rows, hs, 1);  // A^T dO
                            }
                        }
                    }
                }
            }
        }
        free(keys_t);
        free(keys);
        free(values);
        free(queries);
        free(douts);
        free(a);
        free(ds);
    }
}
