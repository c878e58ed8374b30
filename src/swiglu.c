// swiglu.c — the gate of the SwiGLU MLP: out = silu(gate) * up, silu(a) = a * sigmoid(a).
// The MLP around it is linear (Wg, Wu) -> swiglu -> linear (Wd); see model.c.
#include "layers.h"
#include "util.h"  // expf_vectorizable: these loops vectorise

// gate, up, out (N,F)
void swiglu_forward(float* out, const float* gate, const float* up, size_t N, size_t F) {
    size_t n_elements = N * F;
    #pragma omp parallel for
    for (size_t i = 0; i < n_elements; i++) {
        float a = gate[i];
        float sigmoid = 1.0f / (1.0f + expf_vectorizable(-a));
        out[i] = a * sigmoid * up[i];
    }
}

// forward was: out = a * s(a) * u, s = sigmoid; d(a * s(a))/da = s(a) * (1 + a * (1 - s(a)))
//   dgate += dout * u * s * (1 + a * (1 - s)) ;  dup += dout * a * s
void swiglu_backward(float* dgate, float* dup, const float* dout, const float* gate,
                     const float* up, size_t N, size_t F) {
    size_t n_elements = N * F;
    #pragma omp parallel for
    for (size_t i = 0; i < n_elements; i++) {
        float a = gate[i];
        float sigmoid = 1.0f / (1.0f + expf_vectorizable(-a));
        float silu = a * sigmoid;
        float dsilu = sigmoid * (1.0f + a * (1.0f - sigmoid));
        dgate[i] += dout[i] * up[i] * dsilu;
        dup[i] += dout[i] * silu;
    }
}
