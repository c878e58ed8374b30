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
// matmul_accumulate: C (n,m) += A (n,k) . B (k,m), C row-major, A and B read through strides
// so that W^T and dout^T need no separate transpose. B is copied into column panels of
// TILE_COLS columns (zero-padded) that the kernel reads contiguously; A is read in place when
// its rows are contiguous, else (dout^T) copied into row panels of TILE_ROWS rows. Each
// TILE_ROWS x TILE_COLS tile of C belongs to one thread, which keeps it in registers while it
// walks k; the innermost loop runs over one panel row, so gcc -O3 -march=native makes it
// vector FMAs (6 x 16 tile = 12 ymm accumulators + 2 for the B row + 1 broadcast of A:
// AVX2's 16 registers, no spills). Every C[i][j] is the chain c = fmaf(A[i][p], B[p][j], c)
// for p = 0 .. k-1 in order, so results are bit-identical for any thread count.
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include "layers.h"

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

#define TILE_ROWS 6
#define TILE_COLS 16

// Packed panels live in one buffer that grows as needed and is kept between calls: a fresh
// malloc each call page-faults, which costs as much as the packing. Not for concurrent calls.
static float* scratch = NULL;
static size_t scratch_count = 0;

static float* scratch_floats(size_t count) {
    if (count > scratch_count) {
        free(scratch);
        scratch = malloc(count * sizeof(float));
        if (scratch == NULL) {
            fprintf(stderr, "linear.c: out of memory allocating %zu floats\n", count);
            exit(EXIT_FAILURE);
        }
        scratch_count = count;
    }
    return scratch;
}

// C (rows,cols) += A (rows,k) . panel (k,TILE_COLS), A(i,p) = A[i*a_row + p*a_col],
// rows <= TILE_ROWS, cols <= TILE_COLS. Full tiles pass constant rows, cols.
static inline void tile(float* C, const float* A, size_t a_row, size_t a_col,
                        const float* panel, size_t k, size_t m, size_t rows, size_t cols) {
    float acc[TILE_ROWS][TILE_COLS] = {{0}};
    for (size_t i = 0; i < rows; i++)
        for (size_t j = 0; j < cols; j++) acc[i][j] = C[i * m + j];
    for (size_t p = 0; p < k; p++)
        for (size_t i = 0; i < rows; i++) {
            float a = A[i * a_row + p * a_col];
            #pragma omp simd
            for (size_t j = 0; j < TILE_COLS; j++)
                acc[i][j] = fmaf(a, panel[p * TILE_COLS + j], acc[i][j]);
        }
    for (size_t i = 0; i < rows; i++)
        for (size_t j = 0; j < cols; j++) C[i * m + j] = acc[i][j];
}

// One panel row: row[w] = x[w*stride] for w < valid, zeros up to width. Called with a
// constant width (TILE_ROWS or TILE_COLS), so that once inlined the copy of a full row with
// stride 1 becomes a few vector moves; with the width a run-time value it stayed a scalar
// loop around every 6 or 16 floats (dout^T's packing ran at 5.6 GB/s).
static inline void pack_row(float* row, const float* x, size_t stride, size_t valid,
                            size_t width) {
    if (valid == width && stride == 1) {
        for (size_t w = 0; w < width; w++) row[w] = x[w];
    } else {
        for (size_t w = 0; w < valid; w++) row[w] = x[w * stride];
        for (size_t w = valid; w < width; w++) row[w] = 0.0f;
    }
}

// panels (count/width rounded up, k, width): panels[t][p][w] = X(t*width + w, p), 0 past
// count, where X(i,p) = X[i*stride_i + p*stride_p]: the copy that tile() reads contiguously.
// Each thread fills whole panels, row p after row p, so its writes run contiguously.
static void pack_panels(float* panels, const float* X, size_t stride_i, size_t stride_p,
                        size_t count, size_t k, size_t width) {
    size_t n_panels = (count + width - 1) / width;
    #pragma omp parallel for schedule(static)
    for (size_t t = 0; t < n_panels; t++) {
        size_t valid = count - t * width < width ? count - t * width : width;
        for (size_t p = 0; p < k; p++) {
            const float* x = X + t * width * stride_i + p * stride_p;
            float* row = panels + (t * k + p) * width;
            if (width == TILE_COLS) pack_row(row, x, stride_i, valid, TILE_COLS);
            else pack_row(row, x, stride_i, valid, TILE_ROWS);
        }
    }
}

// C (n,m) += A (n,k) . B (k,m), A(i,p) = A[i*a_row + p*a_col], B(p,j) = B[p*b_row + j*b_col]
static void matmul_accumulate(float* C, const float* A, size_t a_row, size_t a_col,
                              const float* B, size_t b_row, size_t b_col,
                              size_t n, size_t k, size_t m) {
    size_t row_tiles = (n + TILE_ROWS - 1) / TILE_ROWS;
    size_t col_tiles = (m + TILE_COLS - 1) / TILE_COLS;
    // b_panels (col_tiles,k,TILE_COLS), b_panels[t][p][jj] = B(p, t*TILE_COLS + jj);
    // a_panels (row_tiles,k,TILE_ROWS) likewise, only if A's rows are not contiguous.
    int pack_a = a_col != 1;
    float* b_panels = scratch_floats(k * (col_tiles * TILE_COLS + pack_a * row_tiles * TILE_ROWS));
    pack_panels(b_panels, B, b_col, b_row, m, k, TILE_COLS);
    size_t a_tile = TILE_ROWS * a_row;  // from one row tile of A to the next
    if (pack_a) {
        float* a_panels = b_panels + k * col_tiles * TILE_COLS;
        pack_panels(a_panels, A, a_row, a_col, n, k, TILE_ROWS);
        A = a_panels;
        a_row = 1;
        a_col = TILE_ROWS;
        a_tile = k * TILE_ROWS;
    }
    #pragma omp parallel for collapse(2) schedule(static)
    for (size_t tr = 0; tr < row_tiles; tr++)
        for (size_t tc = 0; tc < col_tiles; tc++) {
            size_t i0 = tr * TILE_ROWS, j0 = tc * TILE_COLS;
            float* c = C + i0 * m + j0;
            const float* a = A + tr * a_tile;
            const float* b_panel = b_panels + tc * k * TILE_COLS;
            if (i0 + TILE_ROWS <= n && j0 + TILE_COLS <= m)
                tile(c, a, a_row, a_col, b_panel, k, m, TILE_ROWS, TILE_COLS);
            else
                tile(c, a, a_row, a_col, b_panel, k, m, n - i0 < TILE_ROWS ? n - i0 : TILE_ROWS,
                     m - j0 < TILE_COLS ? m - j0 : TILE_COLS);
        }
}

// out (N,OUT) = inp (N,IN) . weight^T, weight (OUT,IN)
void linear_forward(float* out, const float* inp, const float* weight,
                    size_t N, size_t IN, size_t OUT) {
    #pragma omp parallel for
    for (size_t i = 0; i < N * OUT; i++) out[i] = 0.0f;
    matmul_accumulate(out, inp, IN, 1, weight, 1, IN, N, IN, OUT);  // weight^T(p,j) = w[j][p]
}

// forward was: out = inp . weight^T, so
// dinp (N,IN) += dout (N,OUT) . weight (OUT,IN); dweight (OUT,IN) += dout^T (OUT,N) . inp (N,IN)
void linear_backward(float* dinp, float* dweight, const float* dout, const float* inp,
                     const float* weight, size_t N, size_t IN, size_t OUT) {
    matmul_accumulate(dinp, dout, OUT, 1, weight, IN, 1, N, OUT, IN);
    matmul_accumulate(dweight, dout, 1, OUT, inp, IN, 1, OUT, N, IN);  // dout^T(i,p) = dout[p][i]
}
