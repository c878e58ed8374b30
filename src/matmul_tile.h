// matmul_tile.h — the register tile of the fast matmul, shared by linear.c (the model's
// matrix products) and attention.c (each head's scores and weighted sums).
//
// C (rows,cols) += A (rows,k) . B (k,cols) for one tile of at most TILE_ROWS x TILE_COLS
// outputs. B comes as a packed panel: (k, TILE_COLS) contiguous floats, zero-padded past its
// valid columns, so the innermost loop reads one panel row and gcc -O3 -march=native makes
// it vector FMAs (6 x 16 tile = 12 ymm accumulators + 2 for the B row + 1 broadcast of A:
// AVX2's 16 registers, no spills). A is read in place through two strides. Every C[i][j]
// is the chain c = fmaf(A[i][p], B[p][j], c) for p = 0 .. k-1 in order, whatever the tile
// or thread, so the results are bit-identical for any thread count and equal to the plain
// loops that compute the same chains (linear_forward_naive, attention_query).
#ifndef ATTNRES_MATMUL_TILE_H
#define ATTNRES_MATMUL_TILE_H

#include <math.h>
#include <stddef.h>
#include <string.h>

#define TILE_ROWS 6
#define TILE_COLS 16

// C (rows,cols) += A (rows,k) . panel (k,TILE_COLS), A(i,p) = A[i*a_row + p*a_col], C's rows
// m floats apart, rows <= TILE_ROWS, cols <= TILE_COLS. Full tiles pass constant rows, cols.
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

// tile() for any rows <= TILE_ROWS and cols <= TILE_COLS: a full tile gets the version
// compiled for constant sizes (fully unrolled, in registers), an edge tile the general one.
static inline void tile_any(float* C, const float* A, size_t a_row, size_t a_col,
                            const float* panel, size_t k, size_t m, size_t rows, size_t cols) {
    if (rows == TILE_ROWS && cols == TILE_COLS)
        tile(C, A, a_row, a_col, panel, k, m, TILE_ROWS, TILE_COLS);
    else
        tile(C, A, a_row, a_col, panel, k, m, rows, cols);
}

// One panel row: row[w] = x[w*stride] for w < valid, zeros up to width. Called with a
// constant width (TILE_ROWS or TILE_COLS), so that once inlined the copy of a full row with
// stride 1 becomes a few vector moves; with the width a run-time value it would be a scalar
// loop around every 6 or 16 floats.
static inline void pack_row(float* row, const float* x, size_t stride, size_t valid,
                            size_t width) {
    if (valid == width && stride == 1) {
        memcpy(row, x, width * sizeof(float));
    } else {
        for (size_t w = 0; w < valid; w++) row[w] = x[w * stride];
        for (size_t w = valid; w < width; w++) row[w] = 0.0f;
    }
}

// One panel (k, width): panel[p][w] = X(w, p) for w < valid, 0 up to width, where
// X(i,p) = X[i*stride_i + p*stride_p]; written row p after row p, contiguously.
static inline void pack_panel(float* panel, const float* X, size_t stride_i, size_t stride_p,
                              size_t valid, size_t k, size_t width) {
    for (size_t p = 0; p < k; p++) {
        if (width == TILE_COLS) pack_row(panel + p * width, X + p * stride_p, stride_i, valid, TILE_COLS);
        else pack_row(panel + p * width, X + p * stride_p, stride_i, valid, TILE_ROWS);
    }
}

#endif
