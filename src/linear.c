// linear.c — y = x W^T (no bias), forward and backward, as one fast matmul kernel.
//
// Everything goes through matmul_accumulate: C (n,m) += A (n,k) . B (k,m), B and C row-major,
// A read through strides so that a transposed A (dout^T in the weight gradient) costs no copy.
// Each thread owns whole TILE_ROWS x TILE_COLS tiles of C and keeps one tile in registers
// while it walks k; the innermost loop runs unit-stride over a row of B, so gcc -O3
// -march=native turns it into vector FMAs. Every C[i][j] is the fmaf chain
// c = fmaf(A[i][p], B[p][j], c) for p = 0, 1, ..., k-1 in that order, whatever the tile
// (full or edge) and whatever the thread count, so results are bit-identical across runs.
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include "layers.h"

#ifndef TILE_ROWS
#define TILE_ROWS 4
#endif
#ifndef TILE_COLS
#define TILE_COLS 32
#endif

// One full tile: C[i][j] += sum_p A[i][p] B[p][j], i < TILE_ROWS, j < TILE_COLS.
static inline void tile_full(float* C, const float* A, const float* B, size_t k, size_t m,
                             size_t a_row, size_t a_col) {
    float acc[TILE_ROWS][TILE_COLS];
    for (size_t i = 0; i < TILE_ROWS; i++)
        for (size_t j = 0; j < TILE_COLS; j++) acc[i][j] = C[i * m + j];
    for (size_t p = 0; p < k; p++) {
        const float* b = B + p * m;
        for (size_t i = 0; i < TILE_ROWS; i++) {
            float a = A[i * a_row + p * a_col];
            for (size_t j = 0; j < TILE_COLS; j++) acc[i][j] = fmaf(a, b[j], acc[i][j]);
        }
    }
    for (size_t i = 0; i < TILE_ROWS; i++)
        for (size_t j = 0; j < TILE_COLS; j++) C[i * m + j] = acc[i][j];
}

// A partial tile at the bottom or right edge (rows x cols), same sum in the same order.
static void tile_edge(float* C, const float* A, const float* B, size_t k, size_t m,
                      size_t a_row, size_t a_col, size_t rows, size_t cols) {
    for (size_t i = 0; i < rows; i++)
        for (size_t j = 0; j < cols; j++) {
            float c = C[i * m + j];
            for (size_t p = 0; p < k; p++) c = fmaf(A[i * a_row + p * a_col], B[p * m + j], c);
            C[i * m + j] = c;
        }
}

// C (n,m) += A (n,k) . B (k,m), with A(i,p) = A[i*a_row + p*a_col].
static void matmul_accumulate(float* C, const float* A, const float* B, size_t n, size_t k,
                              size_t m, size_t a_row, size_t a_col) {
    size_t row_tiles = (n + TILE_ROWS - 1) / TILE_ROWS;
    size_t col_tiles = (m + TILE_COLS - 1) / TILE_COLS;
    #pragma omp parallel for collapse(2) schedule(static)
    for (size_t tc = 0; tc < col_tiles; tc++)
        for (size_t tr = 0; tr < row_tiles; tr++) {
            size_t i0 = tr * TILE_ROWS, j0 = tc * TILE_COLS;
            float* c = C + i0 * m + j0;
            const float* a = A + i0 * a_row;
            const float* b = B + j0;
            size_t rows = n - i0 < TILE_ROWS ? n - i0 : TILE_ROWS;
            size_t cols = m - j0 < TILE_COLS ? m - j0 : TILE_COLS;
            if (rows == TILE_ROWS && cols == TILE_COLS) tile_full(c, a, b, k, m, a_row, a_col);
            else tile_edge(c, a, b, k, m, a_row, a_col, rows, cols);
        }
}

static float* malloc_check(size_t count) {
    float* p = malloc(count * sizeof(float));
    if (p == NULL) {
        fprintf(stderr, "linear.c: out of memory allocating %zu floats\n", count);
        exit(EXIT_FAILURE);
    }
    return p;
}

// out (N,OUT) = inp (N,IN) . weight^T; weight (OUT,IN) is transposed into (IN,OUT) first.
void linear_forward(float* out, const float* inp, const float* weight,
                    size_t N, size_t IN, size_t OUT) {
    float* weight_t = malloc_check(IN * OUT);
    #pragma omp parallel for
    for (size_t o = 0; o < OUT; o++)
        for (size_t i = 0; i < IN; i++) weight_t[i * OUT + o] = weight[o * IN + i];
    #pragma omp parallel for
    for (size_t n = 0; n < N * OUT; n++) out[n] = 0.0f;
    matmul_accumulate(out, inp, weight_t, N, IN, OUT, IN, 1);
    free(weight_t);
}

// forward was: out = inp . weight^T, so
// dinp (N,IN) += dout (N,OUT) . weight (OUT,IN); dweight (OUT,IN) += dout^T (OUT,N) . inp (N,IN)
void linear_backward(float* dinp, float* dweight, const float* dout, const float* inp,
                     const float* weight, size_t N, size_t IN, size_t OUT) {
    matmul_accumulate(dinp, dout, weight, N, OUT, IN, OUT, 1);
    matmul_accumulate(dweight, dout, inp, OUT, N, IN, 1, OUT);  // dout^T(o,n) = dout[n*OUT+o]
}
