// embedding.cu — token embedding lookup on the GPU (mirror of src/embedding.c).
#include "common.cuh"
#include "layers.cuh"

// out (N,C) = wte[tokens]; one thread per output element
__global__ void embedding_forward_kernel(float* out, const int* tokens, const float* wte,
                                         size_t N, size_t C) {
    size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= N * C) return;
    size_t n = idx / C, c = idx % C;
    out[idx] = wte[(size_t)tokens[n] * C + c];
}

// dwte[tokens[n]] += dout[n]; one thread per column c walks the rows in order, so rows that
// share a token add up deterministically without atomics
__global__ void embedding_backward_kernel(float* dwte, const float* dout, const int* tokens,
                                          size_t N, size_t C) {
    size_t c = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C) return;
    for (size_t n = 0; n < N; n++) dwte[(size_t)tokens[n] * C + c] += dout[n * C + c];
}

void embedding_forward_cuda(float* out, const int* tokens, const float* wte, size_t N, size_t C) {
    const size_t block_size = 256;
    launch_kernel(embedding_forward_kernel, ceil_div(N * C, block_size), block_size,
                  out, tokens, wte, N, C);
}

void embedding_backward_cuda(float* dwte, const float* dout, const int* tokens, size_t N,
                             size_t C) {
    const size_t block_size = 128;
    launch_kernel(embedding_backward_kernel, ceil_div(C, block_size), block_size,
                  dwte, dout, tokens, N, C);
}
