// embedding.c — token embedding: each position looks up its row of wte.
#include <string.h>
#include "layers.h"

// out (N,C) = wte[tokens] ; wte (V,C)
void embedding_forward(float* out, const int* tokens, const float* wte, size_t N, size_t C) {
    #pragma omp parallel for
    for (size_t n = 0; n < N; n++) {
        memcpy(out + n * C, wte + (size_t)tokens[n] * C, C * sizeof(float));
    }
}

// forward was: out[n] = wte[tokens[n]]  =>  dwte[tokens[n]] += dout[n]
// Threads own column chunks, so repeated tokens never race and every row of dwte sums its
// contributions in position order, whatever the thread count.
void embedding_backward(float* dwte, const float* dout, const int* tokens, size_t N, size_t C) {
    const size_t chunk = 32;
    #pragma omp parallel for
    for (size_t c0 = 0; c0 < C; c0 += chunk) {
        size_t c1 = c0 + chunk < C ? c0 + chunk : C;
        for (size_t n = 0; n < N; n++) {
            float* dw = dwte + (size_t)tokens[n] * C;
            const float* d = dout + n * C;
            for (size_t c = c0; c < c1; c++) { dw[c] += d[c]; }
        }
    }
}
