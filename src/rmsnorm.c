// rmsnorm.c — RMSNorm: out = weight * x / sqrt(mean(x^2) + eps), per row.
#include <math.h>
#include "layers.h"

// inp, out (N,C); weight (C), or NULL for none (all ones: the input-dependent depth query's
// norm); rstd (N) saves 1/sqrt(mean(x^2) + eps) for the backward
void rmsnorm_forward(float* out, float* rstd, const float* inp, const float* weight,
                     size_t N, size_t C) {
    #pragma omp parallel for
    for (size_t n = 0; n < N; n++) {
        const float* x = inp + n * C;
        float* y = out + n * C;
        float sum_sq = 0.0f;
        for (size_t c = 0; c < C; c++) { sum_sq += x[c] * x[c]; }
        float r = 1.0f / sqrtf(sum_sq / (float)C + RMSNORM_EPS);
        if (weight != NULL) {
            for (size_t c = 0; c < C; c++) { y[c] = weight[c] * (x[c] * r); }
        } else {
            for (size_t c = 0; c < C; c++) { y[c] = x[c] * r; }
        }
        rstd[n] = r;
    }
}

// forward was: y_c = w_c * x_c * r, r = (mean(x^2) + eps)^(-1/2), so dr/dx_c = -r^3 x_c / C:
//   dx_c += r * w_c * dy_c - (r^3 / C) * x_c * sum_j(dy_j * w_j * x_j)
//   dw_c += sum over rows of dy_c * x_c * r
// weight NULL: w = 1 and no dweight (pass NULL)
void rmsnorm_backward(float* dinp, float* dweight, const float* dout, const float* inp,
                      const float* weight, const float* rstd, size_t N, size_t C) {
    #pragma omp parallel for
    for (size_t n = 0; n < N; n++) {
        const float* x = inp + n * C;
        const float* dy = dout + n * C;
        float* dx = dinp + n * C;
        float r = rstd[n];
        float dot = 0.0f;  // sum_j dy_j * w_j * x_j
        if (weight != NULL) {
            for (size_t c = 0; c < C; c++) { dot += dy[c] * weight[c] * x[c]; }
        } else {
            for (size_t c = 0; c < C; c++) { dot += dy[c] * x[c]; }
        }
        float correction = r * r * r * dot / (float)C;
        if (weight != NULL) {
            for (size_t c = 0; c < C; c++) { dx[c] += r * weight[c] * dy[c] - correction * x[c]; }
        } else {
            for (size_t c = 0; c < C; c++) { dx[c] += r * dy[c] - correction * x[c]; }
        }
    }
    if (dweight == NULL) { return; }
    // weight gradient: threads own column chunks and sum rows in order (deterministic)
    const size_t chunk = 32;
    #pragma omp parallel for
    for (size_t c0 = 0; c0 < C; c0 += chunk) {
        size_t c1 = c0 + chunk < C ? c0 + chunk : C;
        for (size_t n = 0; n < N; n++) {
            const float* x = inp + n * C;
            const float* dy = dout + n * C;
            float r = rstd[n];
            for (size_t c = c0; c < c1; c++) { dweight[c] += dy[c] * x[c] * r; }
        }
    }
}
