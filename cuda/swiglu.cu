// swiglu.cu — the SwiGLU gate on the GPU (mirror of src/swiglu.c).
#include <math.h>

#include "common.cuh"
#include "layers.cuh"

// out = silu(gate) * up, silu(a) = a * sigmoid(a); all (N,F), one thread per element
__global__ void swiglu_forward_kernel(float* out, const float* gate, const float* up, size_t n) {
    size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= n) return;
    float a = gate[idx];
    float sigmoid = 1.0f / (1.0f + expf(-a));
    out[idx] = a * sigmoid * up[idx];
}

// forward was: out = a * sigmoid(a) * u, so
// dgate += dout * u * sigmoid(a) * (1 + a * (1 - sigmoid(a))), dup += dout * a * sigmoid(a)
__global__ void swiglu_backward_kernel(float* dgate, float* dup, const float* dout,
                                       const float* gate, const float* up, size_t n) {
    size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= n) return;
    float a = gate[idx];
    float sigmoid = 1.0f / (1.0f + expf(-a));
    dgate[idx] += dout[idx] * up[idx] * sigmoid * (1.0f + a * (1.0f - sigmoid));
    dup[idx] += dout[idx] * a * sigmoid;
}

void swiglu_forward_cuda(float* out, const float* gate, const float* up, size_t N, size_t F) {
    const size_t threads = 256;
    launch_kernel(swiglu_forward_kernel, ceil_div(N * F, threads), threads,
                  out, gate, up, N * F);
}

void swiglu_backward_cuda(float* dgate, float* dup, const float* dout, const float* gate,
                          const float* up, size_t N, size_t F) {
    const size_t threads = 256;
    launch_kernel(swiglu_backward_kernel, ceil_div(N * F, threads), threads,
                  dgate, dup, dout, gate, up, N * F);
}
