// rope.cu — rotary position embedding on the GPU (mirror of src/rope.c).
#include "common.cuh"
#include "layers.cuh"

// The angle of pair j at position t, theta = t * 10000^(-2j/head_size), in units of pi, in
// float: sincospif reduces it exactly, where sinf/cosf of a large angle would fall back to a
// slow path in double precision and local memory.
__device__ __forceinline__ float rope_angle_over_pi(size_t t, size_t j, size_t head_size) {
    const float inv_pi = 0.318309886183790672f;
    return (float)t * (powf((float)ROPE_BASE, -(float)(2 * j) / (float)head_size) * inv_pi);
}

// Turns pair `pair` (dims 2*pair, 2*pair+1; pair j = pair % (head_size/2) of its head) of a
// row at position t: (a, b) -> (a cos - b sin, a sin + b cos). Reads before it writes, so
// out may equal inp.
__device__ __forceinline__ void rope_rotate_pair(float* out, const float* inp, size_t pair,
                                                 size_t t, size_t head_size) {
    float sin_theta, cos_theta;
    sincospif(rope_angle_over_pi(t, pair % (head_size / 2), head_size), &sin_theta, &cos_theta);
    float a = inp[2 * pair], b = inp[2 * pair + 1];
    out[2 * pair] = a * cos_theta - b * sin_theta;
    out[2 * pair + 1] = a * sin_theta + b * cos_theta;
}

// inp, out (B,T,n_heads*head_size); one thread per pair (2j, 2j+1) of a head:
// (a, b) -> (a cos - b sin, a sin + b cos). out may equal inp: each thread reads its pair first.
__global__ void rope_forward_kernel(float* out, const float* inp, size_t B, size_t T,
                                    size_t n_heads, size_t head_size) {
    size_t pair = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    size_t half = head_size / 2;
    if (pair >= B * T * n_heads * half) return;
    rope_rotate_pair(out, inp, pair, pair / (half * n_heads) % T, head_size);
}

// The same rotation for decoding: inp, out (N,n_heads*head_size), every row at `position`.
__global__ void rope_forward_at_kernel(float* out, const float* inp, size_t position, size_t N,
                                       size_t n_heads, size_t head_size) {
    size_t pair = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    size_t half = head_size / 2;
    if (pair >= N * n_heads * half) return;
    rope_rotate_pair(out, inp, pair, position, head_size);
}

// dinp += R^T dout: (da, db) -> (da cos + db sin, -da sin + db cos)
__global__ void rope_backward_kernel(float* dinp, const float* dout, size_t B, size_t T,
                                     size_t n_heads, size_t head_size) {
    size_t pair = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    size_t half = head_size / 2;
    if (pair >= B * T * n_heads * half) return;
    size_t j = pair % half;
    size_t t = pair / (half * n_heads) % T;
    float sin_theta, cos_theta;
    sincospif(rope_angle_over_pi(t, j, head_size), &sin_theta, &cos_theta);
    float da = dout[2 * pair], db = dout[2 * pair + 1];
    dinp[2 * pair] += da * cos_theta + db * sin_theta;
    dinp[2 * pair + 1] += -da * sin_theta + db * cos_theta;
}

void rope_forward_cuda(float* out, const float* inp, size_t B, size_t T, size_t n_heads,
                       size_t head_size) {
    const size_t block_size = 256;
    size_t n_pairs = B * T * n_heads * (head_size / 2);
    launch_kernel(rope_forward_kernel, ceil_div(n_pairs, block_size), block_size,
                  out, inp, B, T, n_heads, head_size);
}

void rope_forward_at_cuda(float* out, const float* inp, size_t position, size_t N, size_t n_heads,
                          size_t head_size) {
    const size_t block_size = 256;
    size_t n_pairs = N * n_heads * (head_size / 2);
    launch_kernel(rope_forward_at_kernel, ceil_div(n_pairs, block_size), block_size,
                  out, inp, position, N, n_heads, head_size);
}

void rope_backward_cuda(float* dinp, const float* dout, size_t B, size_t T, size_t n_heads,
                        size_t head_size) {
    const size_t block_size = 256;
    size_t n_pairs = B * T * n_heads * (head_size / 2);
    launch_kernel(rope_backward_kernel, ceil_div(n_pairs, block_size), block_size,
                  dinp, dout, B, T, n_heads, head_size);
}
