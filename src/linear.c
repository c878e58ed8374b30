// linear.c — y = x W^T (no bias), forward and backward: first as three plain loops (the
// naive version, what a reader learns first and the reference the fast one is tested
// against), then through one register-tiled matmul kernel, the version the model runs.
//
// ---- the naive version ----
// Each output is one dot product, summed in index order with fmaf: c = fmaf(a, b, c). The
// fast kernel below computes every output as the same chain in the same order, so the two
// agree bit for bit (tested).
//
// ---- the fast version ----
// matmul: C (n,m) += A (n,k) . B (k,m) (or C = A . B), C row-major, A and B read through strides
// so that W^T and dout^T need no separate transpose. B is copied into column panels of
// TILE_COLS columns (zero-padded) that the kernel reads contiguously; A is read in place when
// its rows are contiguous, else (dout^T) copied into row panels of TILE_ROWS rows. Each
// TILE_ROWS x TILE_COLS tile of C belongs to one thread, which keeps it in registers while it
// walks k: tile_any() in matmul_tile.h (attention.c's per-head products use it too), whose
// innermost step is vector FMAs of one panel row (12 x 32 with AVX-512, else 6 x 16).
// k and B's columns are walked in blocks that stay in cache (KC, NC below).
// Every C[i][j] is the chain c = fmaf(A[i][kk], B[kk][j], c) for kk = 0 .. k-1 in order, so
// results are bit-identical for any thread count.
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include "layers.h"
#include "matmul_tile.h"
#include "util.h"

// out (N,OUT) = inp (N,IN) . weight^T: out[n][o] = sum_i inp[n][i] * weight[o][i]
void linear_forward_naive(float* out, const float* inp, const float* weight,
                          size_t N, size_t IN, size_t OUT) {
    for (size_t n = 0; n < N; n++)
        for (size_t o = 0; o < OUT; o++) {
            float sum = 0.0f;
            for (size_t i = 0; i < IN; i++) sum = fmaf(inp[n * IN + i], weight[o * IN + i], sum);
            out[n * OUT + o] = sum;
        }
}

// forward was: out[n][o] = sum_i inp[n][i] * weight[o][i], so
// dinp[n][i] += sum_o dout[n][o] * weight[o][i]; dweight[o][i] += sum_n dout[n][o] * inp[n][i]
void linear_backward_naive(float* dinp, float* dweight, const float* dout, const float* inp,
                           const float* weight, size_t N, size_t IN, size_t OUT) {
    for (size_t n = 0; n < N; n++)
        for (size_t i = 0; i < IN; i++) {
            float sum = dinp[n * IN + i];
            for (size_t o = 0; o < OUT; o++) sum = fmaf(dout[n * OUT + o], weight[o * IN + i], sum);
            dinp[n * IN + i] = sum;
        }
    for (size_t o = 0; o < OUT; o++)
        for (size_t i = 0; i < IN; i++) {
            float sum = dweight[o * IN + i];
            for (size_t n = 0; n < N; n++) sum = fmaf(dout[n * OUT + o], inp[n * IN + i], sum);
            dweight[o * IN + i] = sum;
        }
}

// Packed panels live in one buffer that grows as needed and is kept between calls (util.h),
// one per thread (muon.c runs matmuls on several threads at once)
static _Thread_local Scratch panels;

#define KC 256  // the steps of k a tile walks before its sums go back to C
#define NC 512  // the columns of B a block holds (a multiple of TILE_COLS; KC x NC floats: 512 KB)

// panels (count/width rounded up, k, width): panels[t][kk][w] = X(t*width + w, kk), 0 past
// count, where X(i,kk) = X[i*stride_i + kk*stride_k]: the copy that tile_any() reads
// contiguously. Each thread fills whole panels, row kk after row kk, so its writes run
// contiguously.
static void pack_panels(float* panels, const float* X, size_t stride_i, size_t stride_k,
                        size_t count, size_t k, size_t width) {
    size_t n_panels = (count + width - 1) / width;
    #pragma omp parallel for schedule(static)
    for (size_t t = 0; t < n_panels; t++) {
        size_t valid = min_size(count - t * width, width);
        pack_panel(panels + t * k * width, X + t * width * stride_i, stride_i, stride_k, valid,
                   k, width);
    }
}

// C (n,m) += A (n,k) . B (k,m), A(i,kk) = A[i*a_row + kk*a_col], B(kk,j) = B[kk*b_row + j*b_col];
// accumulate 0: C = A . B, C's old contents never read
static void matmul(float* C, const float* A, size_t a_row, size_t a_col, const float* B,
                   size_t b_row, size_t b_col, size_t n, size_t k, size_t m, int accumulate) {
    size_t row_tiles = (n + TILE_ROWS - 1) / TILE_ROWS;
    size_t col_tiles = (m + TILE_COLS - 1) / TILE_COLS;
    // A is read in place when its rows are contiguous, else copied whole into row panels:
    // a_panels (row_tiles,k,TILE_ROWS), a_panels[t][kk][ii] = A(t*TILE_ROWS + ii, kk).
    int pack_a = a_col != 1;
    float* b_block = scratch_floats(&panels, KC * NC + pack_a * k * row_tiles * TILE_ROWS);
    size_t a_tile = TILE_ROWS * a_row;  // from one row tile of A to the next
    if (pack_a) {
        float* a_panels = b_block + KC * NC;
        pack_panels(a_panels, A, a_row, a_col, n, k, TILE_ROWS);
        A = a_panels;
        a_row = 1;
        a_col = TILE_ROWS;
        a_tile = k * TILE_ROWS;
    }
    // Blocked so that what the tiles read stays in cache: B is copied a block at a time, KC
    // steps of k by NC columns (half a megabyte, well within a core's L2), as column panels
    // b_block[t][kk][jj] = B(k0 + kk, (tc0 + t)*TILE_COLS + jj), and every row tile walks the
    // block before the next is copied. A tile's accumulators go back to C between blocks of
    // k and continue from there, so each C[i][j] is still one chain over kk in order.
    size_t col_tiles_per_block = NC / TILE_COLS;
    #pragma omp parallel
    for (size_t tc0 = 0; tc0 < col_tiles; tc0 += col_tiles_per_block) {
        size_t tc1 = min_size(tc0 + col_tiles_per_block, col_tiles);
        for (size_t k0 = 0; k0 < k; k0 += KC) {
            size_t kb = min_size(k - k0, KC);
            #pragma omp for schedule(static)
            for (size_t tc = tc0; tc < tc1; tc++) {
                size_t j0 = tc * TILE_COLS;
                pack_panel(b_block + (tc - tc0) * kb * TILE_COLS, B + j0 * b_col + k0 * b_row,
                           b_col, b_row, min_size(m - j0, TILE_COLS), kb, TILE_COLS);
            }  // (the loop's end waits for every thread: the block is whole)
            #pragma omp for collapse(2) schedule(static)
            for (size_t tr = 0; tr < row_tiles; tr++)
                for (size_t tc = tc0; tc < tc1; tc++) {
                    size_t i0 = tr * TILE_ROWS, j0 = tc * TILE_COLS;
                    float* c = C + i0 * m + j0;
                    const float* a = A + tr * a_tile + k0 * a_col;
                    const float* b_panel = b_block + (tc - tc0) * kb * TILE_COLS;
                    tile_any(c, a, a_row, a_col, b_panel, kb, m, min_size(n - i0, TILE_ROWS),
                             min_size(m - j0, TILE_COLS), accumulate || k0 > 0);
                }
        }
    }
}

// out (N,OUT) = inp (N,IN) . weight^T, weight (OUT,IN)
void linear_forward(float* out, const float* inp, const float* weight,
                    size_t N, size_t IN, size_t OUT) {
    matmul(out, inp, IN, 1, weight, 1, IN, N, IN, OUT, 0);  // weight^T(kk,j) = w[j][kk]
}

// forward was: out = inp . weight^T, so
// dinp (N,IN) += dout (N,OUT) . weight (OUT,IN); dweight (OUT,IN) += dout^T (OUT,N) . inp (N,IN)
void linear_backward(float* dinp, float* dweight, const float* dout, const float* inp,
                     const float* weight, size_t N, size_t IN, size_t OUT) {
    matmul(dinp, dout, OUT, 1, weight, IN, 1, N, OUT, IN, 1);
    matmul(dweight, dout, 1, OUT, inp, IN, 1, OUT, N, IN, 1);  // dout^T(i,kk) = dout[kk][i]
}

// out (N,M) += a (N,K) . b (K,M), both row-major as they are
void matmul_add(float* out, const float* a, const float* b, size_t N, size_t K, size_t M) {
    matmul(out, a, K, 1, b, M, 1, N, K, M, 1);
}
