// rmsnorm.cu — RMSNorm on the GPU (mirror of src/rmsnorm.c).
#include "common.cuh"
#include "layers.cuh"

// out = weight * x * rstd, rstd = 1/sqrt(mean(x^2) + eps); inp, out (N,C), rstd (N); weight
// (C), or NULL for none (all ones: the input-dependent depth query's norm). One warp per row.
__global__ void rmsnorm_forward_kernel(float* out, float* rstd, const float* inp,
                                       const float* weight, size_t N, size_t C) {
    size_t row = (size_t)blockIdx.x * (blockDim.x / WARP_SIZE) + threadIdx.x / WARP_SIZE;
    unsigned int lane = threadIdx.x % WARP_SIZE;
    if (row >= N) return;  // the whole warp leaves together
    const float* x = inp + row * C;
    float sum_sq = 0.0f;
    for (size_t c = lane; c < C; c += WARP_SIZE) sum_sq += x[c] * x[c];
    sum_sq = warp_sum(sum_sq);
    float s = 1.0f / sqrtf(sum_sq / (float)C + RMSNORM_EPS);
    for (size_t c = lane; c < C; c += WARP_SIZE)
        out[row * C + c] = weight != NULL ? weight[c] * (x[c] * s) : x[c] * s;
    if (lane == 0) rstd[row] = s;
}

// forward was: y = w * x * rstd, so with dot = sum_c dy_c w_c x_c:
// dx = rstd * (w * dy - x * rstd^2 * dot / C), w = 1 when weight is NULL. One warp per row.
__global__ void rmsnorm_backward_inp_kernel(float* dinp, const float* dout, const float* inp,
                                            const float* weight, const float* rstd,
                                            size_t N, size_t C) {
    size_t row = (size_t)blockIdx.x * (blockDim.x / WARP_SIZE) + threadIdx.x / WARP_SIZE;
    unsigned int lane = threadIdx.x % WARP_SIZE;
    if (row >= N) return;
    const float* x = inp + row * C;
    const float* dy = dout + row * C;
    float dot = 0.0f;
    for (size_t c = lane; c < C; c += WARP_SIZE)
        dot += dy[c] * (weight != NULL ? weight[c] : 1.0f) * x[c];
    dot = warp_sum(dot);
    float s = rstd[row];
    for (size_t c = lane; c < C; c += WARP_SIZE) {
        float w = weight != NULL ? weight[c] : 1.0f;
        dinp[row * C + c] += s * (w * dy[c] - x[c] * s * s * dot / (float)C);
    }
}

// dweight_c += sum_n dy_nc x_nc rstd_n, in two deterministic steps (one thread per column
// walking all N rows would leave all but C threads of the GPU idle):
// 1. partial[b][c] = the sum over the ROWS_PER_PART rows of part b, one thread per (b, c);
// 2. dweight_c += sum_b partial[b][c], in order of b (add_column_partials_cuda).
__global__ void rmsnorm_backward_weight_kernel(float* partial, const float* dout,
                                               const float* inp, const float* rstd, size_t N,
                                               size_t C) {
    size_t c = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C) return;
    size_t first = (size_t)blockIdx.y * ROWS_PER_PART;
    size_t last = first + ROWS_PER_PART < N ? first + ROWS_PER_PART : N;
    float sum = 0.0f;
    for (size_t n = first; n < last; n++) sum += dout[n * C + c] * inp[n * C + c] * rstd[n];
    partial[blockIdx.y * C + c] = sum;
}

void rmsnorm_forward_cuda(float* out, float* rstd, const float* inp, const float* weight,
                          size_t N, size_t C) {
    const size_t block_size = 128;  // 4 rows per block
    launch_kernel(rmsnorm_forward_kernel, ceil_div(N * WARP_SIZE, block_size), block_size,
                  out, rstd, inp, weight, N, C);
}

void rmsnorm_backward_cuda(float* dinp, float* dweight, const float* dout, const float* inp,
                           const float* weight, const float* rstd, size_t N, size_t C) {
    const size_t block_size = 128;
    launch_kernel(rmsnorm_backward_inp_kernel, ceil_div(N * WARP_SIZE, block_size), block_size,
                  dinp, dout, inp, weight, rstd, N, C);
    if (dweight == NULL) return;  // no gain (weight NULL): nothing to learn
    unsigned int parts = ceil_div(N, ROWS_PER_PART);
    float* partial = cuda_workspace((size_t)parts * C);
    launch_kernel(rmsnorm_backward_weight_kernel, dim3(ceil_div(C, block_size), parts),
                  block_size, partial, dout, inp, rstd, N, C);
    add_column_partials_cuda(dweight, partial, parts, C);
}
