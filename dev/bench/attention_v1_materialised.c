// attention_v1_materialised.c — version 1 of src/attention.c's forward and backward: the one
// that saves every layer's softmax probabilities att (B,H,T,T) for the backward, T^2 floats
// per (b, h), where src/attention.c keeps lse (B,H,T) and recomputes them. Kept runnable as
// the earlier idea, timed beside the current one by bench_attention_cpu.c.
//
// q (B,T,H*hs), k and v (B,T,G*hs); query head h reads key/value head h / (H/G).
// For each (b, h, t): s_t' = q_t . k_t' / sqrt(hs) for t' <= t, a = softmax(s),
// out_t = sum_t' a_t' v_t'. att keeps a (zero above the diagonal). Each head is computed as
// small matrix products over tiles of TILE_ROWS queries: scores S = Q K^T, probabilities
// A = softmax(S) row by row, out = A V; and back, dA = dO V^T, dS = softmax's backward of dA,
// dQ = dS K, dK = dS^T Q, dV = A^T dO, on the register tile of src/matmul_tile.h. The
// backward holds a (T,T) scratch of dS per thread beside att.
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "matmul_tile.h"
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
// t = c*TILE_COLS .. (zero past T).
static void pack_by_dimension(float* panels, const float* x, size_t row_stride, size_t T,
                              size_t hs) {
    for (size_t c = 0; c * TILE_COLS < T; c++)
        pack_panel(panels + c * hs * TILE_COLS, x + c * TILE_COLS * row_stride, row_stride, 1,
                   min_size(TILE_COLS, T - c * TILE_COLS), hs, TILE_COLS);
}

// C (rows,cols) += A (rows,k) . X (k,cols), or C = A . X (accumulate 0), X in panels of
// TILE_COLS columns panel_size floats apart, A(i,kk) = A[i*a_row + kk*a_col], C's rows m floats
// apart, rows <= TILE_ROWS
static void product(float* C, size_t m, const float* A, size_t a_row, size_t a_col,
                    const float* panels, size_t panel_size, size_t k, size_t rows, size_t cols,
                    int accumulate) {
    for (size_t j0 = 0; j0 < cols; j0 += TILE_COLS)
        tile_any(C + j0, A, a_row, a_col, panels + (j0 / TILE_COLS) * panel_size, k, m, rows,
                 min_size(TILE_COLS, cols - j0), accumulate);
}

void attention_forward_v1(float* out, float* att, const float* q, const float* k, const float* v,
                       size_t B, size_t T, size_t H, size_t G, size_t hs) {
    size_t q_dim = H * hs, kv_dim = G * hs, kv_mul = H / G;
    size_t by_dimension = round_up(T, TILE_COLS) * hs, by_position = T * round_up(hs, TILE_COLS);
    float scale = 1.0f / sqrtf((float)hs);
    #pragma omp parallel
    {
        float* keys = mallocCheck(by_dimension * sizeof(float));    // K^T, for S = Q K^T
        float* values = mallocCheck(by_position * sizeof(float));   // V, for out = A V
        #pragma omp for collapse(2) schedule(static)
        for (size_t b = 0; b < B; b++) {
            for (size_t h = 0; h < H; h++) {
                size_t kv_offset = b * T * kv_dim + (h / kv_mul) * hs;
                pack_by_dimension(keys, k + kv_offset, kv_dim, T, hs);
                pack_by_position(values, v + kv_offset, kv_dim, T, hs);
                const float* q_bh = q + b * T * q_dim + h * hs;
                float* out_bh = out + b * T * q_dim + h * hs;
                float* att_bh = att + (b * H + h) * T * T;
                for (size_t t0 = 0; t0 < T; t0 += TILE_ROWS) {
                    // queries t0 .. t0 + rows - 1 see the keys before n_keys
                    size_t rows = min_size(TILE_ROWS, T - t0), n_keys = t0 + rows;
                    size_t n_scores = min_size(round_up(n_keys, TILE_COLS), T);  // whole tiles
                    float* a = att_bh + t0 * T;  // the tile's rows of A
                    float* o = out_bh + t0 * q_dim;
                    product(a, T, q_bh + t0 * q_dim, q_dim, 1, keys, hs * TILE_COLS, hs, rows, n_scores, 0);
                    for (size_t r = 0; r < rows; r++) { causal_softmax(a + r * T, t0 + r + 1, T, scale); }
                    product(o, q_dim, a, T, 1, values, T * TILE_COLS, n_keys, rows, hs, 0);
                }
            }
        }
        free(keys);
        free(values);
    }
}

// (B,H,T,T) att. Forward was: s = q.k * scale, a = softmax(s), out = sum a v. Backward, per (b, h, t):
//   dv_t' += a_t' dout_t ;  da_t' = dout_t . v_t'
//   ds_t' = a_t' (da_t' - sum_j a_j da_j)          (softmax Jacobian)
//   dq_t += scale * sum_t' ds_t' k_t' ;  dk_t' += scale * ds_t' q_t
// As products per head, scale folded into ds: dA = dO V^T, then dS row by row, dQ += dS K,
// and once dS is whole, dK += dS^T Q and dV += A^T dO. The query heads that share a
// key/value head run in the same thread, one after another, so dk and dv need no atomics
// and sum in a fixed order.
void attention_backward_v1(float* dq, float* dk, float* dv, const float* dout, const float* att,
                        const float* q, const float* k, const float* v,
                        size_t B, size_t T, size_t H, size_t G, size_t hs) {
    size_t q_dim = H * hs, kv_dim = G * hs, kv_mul = H / G;
    size_t by_dimension = round_up(T, TILE_COLS) * hs, by_position = T * round_up(hs, TILE_COLS);
    float scale = 1.0f / sqrtf((float)hs);
    #pragma omp parallel
    {
        float* keys = mallocCheck(by_position * sizeof(float));       // K, for dQ = dS K
        float* values = mallocCheck(by_dimension * sizeof(float));    // V^T, for dA = dO V^T
        float* queries = mallocCheck(by_position * sizeof(float));    // Q, for dK = dS^T Q
        float* douts = mallocCheck(by_position * sizeof(float));      // dO, for dV = A^T dO
        float* dscore = mallocCheck(T * T * sizeof(float));           // dA, then dS (T,T)
        #pragma omp for collapse(2) schedule(static)
        for (size_t b = 0; b < B; b++) {
            for (size_t g = 0; g < G; g++) {
                size_t kv_offset = b * T * kv_dim + g * hs;
                pack_by_position(keys, k + kv_offset, kv_dim, T, hs);
                pack_by_dimension(values, v + kv_offset, kv_dim, T, hs);
                for (size_t h = g * kv_mul; h < (g + 1) * kv_mul; h++) {
                    size_t q_offset = b * T * q_dim + h * hs;
                    pack_by_position(queries, q + q_offset, q_dim, T, hs);
                    pack_by_position(douts, dout + q_offset, q_dim, T, hs);
                    const float* att_bh = att + (b * H + h) * T * T;
                    for (size_t t0 = 0; t0 < T; t0 += TILE_ROWS) {
                        size_t rows = min_size(TILE_ROWS, T - t0), n_keys = t0 + rows;
                        size_t n_scores = min_size(round_up(n_keys, TILE_COLS), T);
                        const float* a = att_bh + t0 * T;
                        float* ds = dscore + t0 * T;
                        product(ds, T, dout + q_offset + t0 * q_dim, q_dim, 1, values,
                                hs * TILE_COLS, hs, rows, n_scores, 0);  // dA
                        for (size_t r = 0; r < rows; r++) {
                            size_t t = t0 + r;
                            const float* a_t = a + r * T;
                            float* ds_t = ds + r * T;
                            float weighted = dot(a_t, ds_t, t + 1);  // sum_j a_j da_j
                            for (size_t t2 = 0; t2 <= t; t2++) {
                                ds_t[t2] = a_t[t2] * (ds_t[t2] - weighted) * scale;
                            }
                            for (size_t t2 = t + 1; t2 < T; t2++) { ds_t[t2] = 0.0f; }
                        }
                        product(dq + q_offset + t0 * q_dim, q_dim, ds, T, 1, keys, T * TILE_COLS,
                                n_keys, rows, hs, 1);  // dQ += dS K
                    }
                    // keys s0 .. s0 + rows - 1 are seen by the queries from s0 on
                    for (size_t s0 = 0; s0 < T; s0 += TILE_ROWS) {
                        size_t rows = min_size(TILE_ROWS, T - s0);
                        product(dk + kv_offset + s0 * kv_dim, kv_dim, dscore + s0 * T + s0, 1, T,
                                queries + s0 * TILE_COLS, T * TILE_COLS, T - s0, rows, hs, 1);  // dS^T Q
                        product(dv + kv_offset + s0 * kv_dim, kv_dim, att_bh + s0 * T + s0, 1, T,
                                douts + s0 * TILE_COLS, T * TILE_COLS, T - s0, rows, hs, 1);  // A^T dO
                    }
                }
            }
        }
        free(keys);
        free(values);
        free(queries);
        free(douts);
        free(dscore);
    }
}
