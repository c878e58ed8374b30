// rope.cu — rotary position embedding on the GPU (mirror of src/rope.c).
#include "common.cuh"
#include "layers.cuh"

#include <vector>

// The cos and sin of every (position t, pair j), interleaved: cos_sin[2 (t half + j)] and the
// float after it. They are computed on the host by src/rope.c's rope_table (angles in double,
// rounded once) and uploaded, so the GPU turns by the CPU's cos and sin, bit for bit. (Computed
// here in float, t * powf(10000, -2j/hs) errs by a few ulps of an angle up to T, ~1e-5 at
// t = 127, and the rotated values would be off by that. Kernels keep doubles off the GPU.)
// The table grows when a call needs more positions or another head size (cudaFree
// synchronises, so no kernel still reads the old one); model_build_cuda builds the largest a
// training step needs, so steps build nothing.
static const float* rope_table_cuda(size_t n_positions, size_t head_size) {
    static float* table = NULL;
    static size_t positions = 0, size = 0;
    if (n_positions > positions || head_size != size) {
        size_t half = head_size / 2;
        std::vector<float> cos_table(n_positions * half), sin_table(n_positions * half);
        std::vector<float> cos_sin(2 * n_positions * half);
        rope_table(cos_table.data(), sin_table.data(), n_positions, head_size);
        for (size_t i = 0; i < n_positions * half; i++) {
            cos_sin[2 * i] = cos_table[i];
            cos_sin[2 * i + 1] = sin_table[i];
        }
        if (table != NULL) cudaCheck(cudaFree(table));
        table = cuda_malloc_floats(cos_sin.size());
        cudaCheck(cudaMemcpy(table, cos_sin.data(), cos_sin.size() * sizeof(float),
                             cudaMemcpyHostToDevice));
        positions = n_positions;
        size = head_size;
    }
    return table;
}

void rope_prepare_cuda(size_t n_positions, size_t head_size) {
    rope_table_cuda(n_positions, head_size);
}

// Turns pair `pair` (dims 2*pair, 2*pair+1; pair j = pair % (head_size/2) of its head) of a
// row at position t: (a, b) -> (a cos - b sin, a sin + b cos). Reads before it writes, so
// out may equal inp.
__device__ __forceinline__ void rope_rotate_pair(float* out, const float* inp, const float* cos_sin,
                                                 size_t pair, size_t t, size_t head_size) {
    size_t half = head_size / 2;
    const float* cs = cos_sin + 2 * (t * half + pair % half);
    float cos_theta = cs[0], sin_theta = cs[1];
    float a = inp[2 * pair], b = inp[2 * pair + 1];
    out[2 * pair] = a * cos_theta - b * sin_theta;
    out[2 * pair + 1] = a * sin_theta + b * cos_theta;
}

// inp, out (B,T,n_heads*head_size); one thread per pair (2j, 2j+1) of a head:
// (a, b) -> (a cos - b sin, a sin + b cos). out may equal inp: each thread reads its pair first.
__global__ void rope_forward_kernel(float* out, const float* inp, const float* cos_sin, size_t B,
                                    size_t T, size_t n_heads, size_t head_size) {
    size_t pair = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    size_t half = head_size / 2;
    if (pair >= B * T * n_heads * half) return;
    rope_rotate_pair(out, inp, cos_sin, pair, pair / (half * n_heads) % T, head_size);
}

// The same rotation for decoding: inp, out (N,n_heads*head_size), every row at `position`.
__global__ void rope_forward_at_kernel(float* out, const float* inp, const float* cos_sin,
                                       size_t position, size_t N, size_t n_heads,
                                       size_t head_size) {
    size_t pair = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    size_t half = head_size / 2;
    if (pair >= N * n_heads * half) return;
    rope_rotate_pair(out, inp, cos_sin, pair, position, head_size);
}

// dinp += R^T dout: (da, db) -> (da cos + db sin, -da sin + db cos)
__global__ void rope_backward_kernel(float* dinp, const float* dout, const float* cos_sin,
                                     size_t B, size_t T, size_t n_heads, size_t head_size) {
    size_t pair = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    size_t half = head_size / 2;
    if (pair >= B * T * n_heads * half) return;
    size_t j = pair % half;
    size_t t = pair / (half * n_heads) % T;
    const float* cs = cos_sin + 2 * (t * half + j);
    float cos_theta = cs[0], sin_theta = cs[1];
    float da = dout[2 * pair], db = dout[2 * pair + 1];
    dinp[2 * pair] += da * cos_theta + db * sin_theta;
    dinp[2 * pair + 1] += -da * sin_theta + db * cos_theta;
}

void rope_forward_cuda(float* out, const float* inp, size_t B, size_t T, size_t n_heads,
                       size_t head_size) {
    const size_t threads = 256;
    size_t n_pairs = B * T * n_heads * (head_size / 2);
    launch_kernel(rope_forward_kernel, ceil_div(n_pairs, threads), threads,
                  out, inp, rope_table_cuda(T, head_size), B, T, n_heads, head_size);
}

void rope_forward_at_cuda(float* out, const float* inp, size_t position, size_t N, size_t n_heads,
                          size_t head_size) {
    const size_t threads = 256;
    size_t n_pairs = N * n_heads * (head_size / 2);
    launch_kernel(rope_forward_at_kernel, ceil_div(n_pairs, threads), threads,
                  out, inp, rope_table_cuda(position + 1, head_size), position, N, n_heads,
                  head_size);
}

void rope_backward_cuda(float* dinp, const float* dout, size_t B, size_t T, size_t n_heads,
                        size_t head_size) {
    const size_t threads = 256;
    size_t n_pairs = B * T * n_heads * (head_size / 2);
    launch_kernel(rope_backward_kernel, ceil_div(n_pairs, threads), threads,
                  dinp, dout, rope_table_cuda(T, head_size), B, T, n_heads, head_size);
}
