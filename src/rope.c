// rope.c — rotary position embedding (interleaved pairs, as in LLaMA's original code).
// Pair j = dims (2j, 2j+1) of every head at position t turns by theta = t * base^(-2j/hs):
//   (a, b) -> (a cos - b sin, a sin + b cos)
// rope_angles is the one place the angles are computed, so the training forward, the
// decoder (rope_forward_at, one position at a time) and the GPU (cuda/rope.cu uploads
// rope_table) turn by bit-identical cos and sin.
#include <math.h>
#include <stdlib.h>
#include "layers.h"
#include "util.h"

// cos and sin of every pair j at one position, each (hs/2); angles in double, rounded once
static void rope_angles(float* cos_row, float* sin_row, size_t position, size_t head_size) {
    for (size_t j = 0; j < head_size / 2; j++) {
        double theta = (double)position * pow(ROPE_BASE, -2.0 * (double)j / (double)head_size);
        cos_row[j] = (float)cos(theta);
        sin_row[j] = (float)sin(theta);
    }
}

// cos and sin of every (t, j), each (T, hs/2)
void rope_table(float* cos_table, float* sin_table, size_t T, size_t head_size) {
    size_t half = head_size / 2;
    for (size_t t = 0; t < T; t++) {
        rope_angles(cos_table + t * half, sin_table + t * half, t, head_size);
    }
}

// one row of n_heads heads: y = R(theta) x with the angles cs, sn of its position
static void rope_rotate_row(float* y, const float* x, const float* cs, const float* sn,
                            size_t n_heads, size_t head_size) {
    for (size_t h = 0; h < n_heads; h++) {
        for (size_t j = 0; j < head_size / 2; j++) {
            size_t i = h * head_size + 2 * j;
            float a = x[i], bb = x[i + 1];
            y[i] = a * cs[j] - bb * sn[j];
            y[i + 1] = a * sn[j] + bb * cs[j];
        }
    }
}

// inp, out (B,T,n_heads*head_size); out may equal inp
void rope_forward(float* out, const float* inp, size_t B, size_t T, size_t n_heads,
                  size_t head_size) {
    size_t half = head_size / 2, C = n_heads * head_size;
    float* cos_table = mallocCheck(2 * T * half * sizeof(float));
    float* sin_table = cos_table + T * half;
    rope_table(cos_table, sin_table, T, head_size);
    #pragma omp parallel for collapse(2)
    for (size_t b = 0; b < B; b++) {
        for (size_t t = 0; t < T; t++) {
            rope_rotate_row(out + (b * T + t) * C, inp + (b * T + t) * C, cos_table + t * half,
                            sin_table + t * half, n_heads, head_size);
        }
    }
    free(cos_table);
}

// inp, out (N,n_heads*head_size), every row at the same position; out may equal inp
void rope_forward_at(float* out, const float* inp, size_t position, size_t N, size_t n_heads,
                     size_t head_size) {
    size_t half = head_size / 2, C = n_heads * head_size;
    float* cos_row = mallocCheck(2 * half * sizeof(float));
    float* sin_row = cos_row + half;
    rope_angles(cos_row, sin_row, position, head_size);
    for (size_t n = 0; n < N; n++) {
        rope_rotate_row(out + n * C, inp + n * C, cos_row, sin_row, n_heads, head_size);
    }
    free(cos_row);
}

// forward was y = R(theta) x, a rotation, so dx += R(theta)^T dy = R(-theta) dy:
//   (da, db) += (dy0 cos + dy1 sin, -dy0 sin + dy1 cos)
void rope_backward(float* dinp, const float* dout, size_t B, size_t T, size_t n_heads,
                   size_t head_size) {
    size_t half = head_size / 2, C = n_heads * head_size;
    float* cos_table = mallocCheck(2 * T * half * sizeof(float));
    float* sin_table = cos_table + T * half;
    rope_table(cos_table, sin_table, T, head_size);
    #pragma omp parallel for collapse(2)
    for (size_t b = 0; b < B; b++) {
        for (size_t t = 0; t < T; t++) {
            const float* dy = dout + (b * T + t) * C;
            float* dx = dinp + (b * T + t) * C;
            const float* cs = cos_table + t * half;
            const float* sn = sin_table + t * half;
            for (size_t h = 0; h < n_heads; h++) {
                for (size_t j = 0; j < half; j++) {
                    size_t i = h * head_size + 2 * j;
                    float d0 = dy[i], d1 = dy[i + 1];
                    dx[i] += d0 * cs[j] + d1 * sn[j];
                    dx[i + 1] += -d0 * sn[j] + d1 * cs[j];
                }
            }
        }
    }
    free(cos_table);
}
