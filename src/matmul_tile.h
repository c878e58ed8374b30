// matmul_tile.h — the register tile of the fast matmul, shared by linear.c (the model's
// matrix products) and attention.c (each head's scores and weighted sums).
//
// C (rows,cols) += A (rows,k) . B (k,cols) for one tile of at most TILE_ROWS x TILE_COLS
// outputs, or C = A . B (accumulate 0: the sums start from 0 and C is not read, so it needs
// no zeroing first). B comes as a packed panel: (k, TILE_COLS) contiguous floats, zero-padded
// past its valid columns, so the innermost loop reads one panel row; A is read in place
// through two strides. Every C[i][j] is the chain c = fmaf(A[i][kk], B[kk][j], c) for
// kk = 0 .. k-1 in order, whatever the tile, its shape or the thread, so the results are bit-identical for
// any thread count, on any machine, and equal to the plain loops that compute the same
// chains (linear_forward_naive, attention_query_online).
//
// The tile's shape is the machine's: its accumulators fill the vector registers, so that
// each panel row loaded feeds as many independent FMAs as possible.
//   - AVX-512 (32 registers of 16 floats): 12 x 32, 24 accumulators + 2 for the panel row
//     (+ A's element, broadcast from memory by the FMA itself). Written with intrinsics:
//     gcc prefers 256-bit vectors even where 512-bit ones exist, which halves the rate.
//   - anything else: 6 x 16, the plain loop below, which gcc -O3 -march=native makes AVX2's
//     12 ymm accumulators + 2 for the B row + 1 broadcast of A: 15 of its 16 registers.
#ifndef ATTNRES_MATMUL_TILE_H
#define ATTNRES_MATMUL_TILE_H

#include <math.h>
#include <stddef.h>
#include <string.h>

#ifdef __AVX512F__
#include <immintrin.h>
#define TILE_ROWS 12
#define TILE_COLS 32
#else
#define TILE_ROWS 6
#define TILE_COLS 16
#endif

static inline size_t min_size(size_t a, size_t b) { return a < b ? a : b; }

// C (rows,cols) (+)= A (rows,k) . panel (k,TILE_COLS), A(i,kk) = A[i*a_row + kk*a_col], C's
// rows m floats apart, rows <= TILE_ROWS, cols <= TILE_COLS. The plain version: full tiles pass
// constant rows and cols and gcc keeps acc in registers; any other tile runs it as loops.
static inline void tile_loops(float* C, const float* A, size_t a_row, size_t a_col,
                              const float* panel, size_t k, size_t m, size_t rows, size_t cols,
                              int accumulate) {
    float acc[TILE_ROWS][TILE_COLS] = {{0}};
    if (accumulate)
        for (size_t i = 0; i < rows; i++)
            for (size_t j = 0; j < cols; j++) acc[i][j] = C[i * m + j];
    for (size_t kk = 0; kk < k; kk++)
        for (size_t i = 0; i < rows; i++) {
            float a = A[i * a_row + kk * a_col];
            #pragma omp simd
            for (size_t j = 0; j < TILE_COLS; j++)
                acc[i][j] = fmaf(a, panel[kk * TILE_COLS + j], acc[i][j]);
        }
    for (size_t i = 0; i < rows; i++)
        for (size_t j = 0; j < cols; j++) C[i * m + j] = acc[i][j];
}

#ifdef __AVX512F__
// The same tile, row i's 32 accumulators in two 16-float registers lo[i], hi[i]. Called
// with rows a constant (tile_any's switch), so that the loops over i unroll and lo, hi live
// in registers. Columns past cols are masked off C's loads and stores (the panel is zero
// there, so their sums are never used).
static inline __attribute__((always_inline)) void tile_avx512(
        float* C, const float* A, size_t a_row, size_t a_col, const float* panel, size_t k,
        size_t m, size_t rows, size_t cols, int accumulate) {
    __mmask16 mask_lo = cols >= 16 ? 0xFFFF : (__mmask16)((1u << cols) - 1);
    __mmask16 mask_hi = cols >= 32 ? 0xFFFF : cols <= 16 ? 0 : (__mmask16)((1u << (cols - 16)) - 1);
    __m512 lo[TILE_ROWS], hi[TILE_ROWS];
    #pragma GCC unroll 12
    for (size_t i = 0; i < rows; i++) {
        lo[i] = accumulate ? _mm512_maskz_loadu_ps(mask_lo, C + i * m) : _mm512_setzero_ps();
        hi[i] = accumulate ? _mm512_maskz_loadu_ps(mask_hi, C + i * m + 16) : _mm512_setzero_ps();
    }
    for (size_t kk = 0; kk < k; kk++) {
        __m512 b_lo = _mm512_loadu_ps(panel + kk * TILE_COLS);
        __m512 b_hi = _mm512_loadu_ps(panel + kk * TILE_COLS + 16);
        #pragma GCC unroll 12
        for (size_t i = 0; i < rows; i++) {
            __m512 a = _mm512_set1_ps(A[i * a_row + kk * a_col]);
            lo[i] = _mm512_fmadd_ps(a, b_lo, lo[i]);  // one rounding per step, as fmaf
            hi[i] = _mm512_fmadd_ps(a, b_hi, hi[i]);
        }
    }
    #pragma GCC unroll 12
    for (size_t i = 0; i < rows; i++) {
        _mm512_mask_storeu_ps(C + i * m, mask_lo, lo[i]);
        _mm512_mask_storeu_ps(C + i * m + 16, mask_hi, hi[i]);
    }
}
#endif

// The tile for any rows <= TILE_ROWS and cols <= TILE_COLS.
static inline void tile_any(float* C, const float* A, size_t a_row, size_t a_col,
                            const float* panel, size_t k, size_t m, size_t rows, size_t cols,
                            int accumulate) {
#ifdef __AVX512F__
    switch (rows) {  // each case a copy compiled for its row count
    case 12: tile_avx512(C, A, a_row, a_col, panel, k, m, 12, cols, accumulate); break;
    case 11: tile_avx512(C, A, a_row, a_col, panel, k, m, 11, cols, accumulate); break;
    case 10: tile_avx512(C, A, a_row, a_col, panel, k, m, 10, cols, accumulate); break;
    case 9: tile_avx512(C, A, a_row, a_col, panel, k, m, 9, cols, accumulate); break;
    case 8: tile_avx512(C, A, a_row, a_col, panel, k, m, 8, cols, accumulate); break;
    case 7: tile_avx512(C, A, a_row, a_col, panel, k, m, 7, cols, accumulate); break;
    case 6: tile_avx512(C, A, a_row, a_col, panel, k, m, 6, cols, accumulate); break;
    case 5: tile_avx512(C, A, a_row, a_col, panel, k, m, 5, cols, accumulate); break;
    case 4: tile_avx512(C, A, a_row, a_col, panel, k, m, 4, cols, accumulate); break;
    case 3: tile_avx512(C, A, a_row, a_col, panel, k, m, 3, cols, accumulate); break;
    case 2: tile_avx512(C, A, a_row, a_col, panel, k, m, 2, cols, accumulate); break;
    default: tile_avx512(C, A, a_row, a_col, panel, k, m, 1, cols, accumulate); break;
    }
#else
    if (rows == TILE_ROWS && cols == TILE_COLS)
        tile_loops(C, A, a_row, a_col, panel, k, m, TILE_ROWS, TILE_COLS, accumulate);
    else
        tile_loops(C, A, a_row, a_col, panel, k, m, rows, cols, accumulate);
#endif
}

// One panel row: row[w] = x[w*stride] for w < valid, zeros up to width. Called with a
// constant width (TILE_ROWS or TILE_COLS), so that once inlined the copy of a full row with
// stride 1 becomes a few vector moves; with the width a run-time value it would be a scalar
// loop around every TILE_ROWS or TILE_COLS floats (12 or 32 with AVX-512, 6 or 16 without).
static inline void pack_row(float* row, const float* x, size_t stride, size_t valid,
                            size_t width) {
    if (valid == width && stride == 1) {
        memcpy(row, x, width * sizeof(float));
    } else {
        for (size_t w = 0; w < valid; w++) row[w] = x[w * stride];
        for (size_t w = valid; w < width; w++) row[w] = 0.0f;
    }
}

// One panel (k, width): panel[kk][w] = X(w, kk) for w < valid, 0 up to width, where
// X(i,kk) = X[i*stride_i + kk*stride_k]; written row kk after row kk, contiguously.
static inline void pack_panel(float* panel, const float* X, size_t stride_i, size_t stride_k,
                              size_t valid, size_t k, size_t width) {
    for (size_t kk = 0; kk < k; kk++) {
        if (width == TILE_COLS) pack_row(panel + kk * width, X + kk * stride_k, stride_i, valid, TILE_COLS);
        else pack_row(panel + kk * width, X + kk * stride_k, stride_i, valid, TILE_ROWS);
    }
}

#endif
