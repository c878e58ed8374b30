// rmsnorm.cu — RMSNorm on the GPU (mirror of src/rmsnorm.c).
#include "common.cuh"
#include "layers.cuh"

// One warp per row; lane l takes the columns c = l, l + 32, l + 64, ... A lane loads
// ROW_CHUNK of its columns at once (the whole row at C = 256: 8 per lane), all loads issued
// before any arithmetic waits on them. With B*T = 1024 rows the GPU has one warp per row, 8
// per multiprocessor, too few to hide a memory latency behind another: a lane that loads
// one column, uses it and only then loads the next waits out a latency per column (16 in
// the forward at C = 256). Out-of-range columns load as 0, which leaves every sum as it was.
#define ROW_CHUNK 8

// v[k] = row[first + lane + 32 k] for the k whose column is below C, else 0
__device__ __forceinline__ void load_lane_columns(float v[ROW_CHUNK], const float* row,
                                                  size_t first, size_t C, unsigned int lane) {
#pragma unroll
    for (int k = 0; k < ROW_CHUNK; k++) {
        size_t c = first + lane + (size_t)k * WARP_SIZE;
        v[k] = c < C ? row[c] : 0.0f;
    }
}

// the weight at those columns: 1 when weight is NULL (no gain)
__device__ __forceinline__ void load_lane_weights(float w[ROW_CHUNK], const float* weight,
                                                  size_t first, size_t C, unsigned int lane) {
    if (weight != NULL) {
        load_lane_columns(w, weight, first, C, lane);
    } else {
#pragma unroll
        for (int k = 0; k < ROW_CHUNK; k++) w[k] = 1.0f;
    }
}

// out = weight * x * rstd, rstd = 1/sqrt(mean(x^2) + eps); inp, out (N,C), rstd (N); weight
// (C), or NULL for none (all ones: the input-dependent depth query's norm).
__global__ void rmsnorm_forward_kernel(float* out, float* rstd, const float* inp,
                                       const float* weight, size_t N, size_t C) {
    size_t row = (size_t)blockIdx.x * (blockDim.x / WARP_SIZE) + threadIdx.x / WARP_SIZE;
    unsigned int lane = threadIdx.x % WARP_SIZE;
    if (row >= N) return;  // the whole warp leaves together
    const float* x = inp + row * C;
    const size_t step = (size_t)WARP_SIZE * ROW_CHUNK;
    float sum_sq = 0.0f, v[ROW_CHUNK], w[ROW_CHUNK];
    for (size_t first = 0; first < C; first += step) {
        load_lane_columns(v, x, first, C, lane);
#pragma unroll
        for (int k = 0; k < ROW_CHUNK; k++) sum_sq += v[k] * v[k];
    }
    sum_sq = warp_sum(sum_sq);
    float s = 1.0f / sqrtf(sum_sq / (float)C + RMSNORM_EPS);
    for (size_t first = 0; first < C; first += step) {
        load_lane_columns(v, x, first, C, lane);
        load_lane_weights(w, weight, first, C, lane);
#pragma unroll
        for (int k = 0; k < ROW_CHUNK; k++) {
            size_t c = first + lane + (size_t)k * WARP_SIZE;
            if (c < C) out[row * C + c] = w[k] * (v[k] * s);  // w = 1: v * s exactly
        }
    }
    if (lane == 0) rstd[row] = s;
}

// forward was: y = w * x * rstd, so with dot = sum_c dy_c w_c x_c:
// dx = rstd * (w * dy - x * rstd^2 * dot / C), w = 1 when weight is NULL. One warp per row,
// columns as in the forward; a chunk's dinp is read before any of it is written.
__global__ void rmsnorm_backward_inp_kernel(float* dinp, const float* dout, const float* inp,
                                            const float* weight, const float* rstd,
                                            size_t N, size_t C) {
    size_t row = (size_t)blockIdx.x * (blockDim.x / WARP_SIZE) + threadIdx.x / WARP_SIZE;
    unsigned int lane = threadIdx.x % WARP_SIZE;
    if (row >= N) return;
    const float* x = inp + row * C;
    const float* dy = dout + row * C;
    float* dx = dinp + row * C;
    const size_t step = (size_t)WARP_SIZE * ROW_CHUNK;
    float v[ROW_CHUNK], d[ROW_CHUNK], w[ROW_CHUNK], g[ROW_CHUNK];
    float dot = 0.0f;
    for (size_t first = 0; first < C; first += step) {
        load_lane_columns(v, x, first, C, lane);
        load_lane_columns(d, dy, first, C, lane);
        load_lane_weights(w, weight, first, C, lane);
#pragma unroll
        for (int k = 0; k < ROW_CHUNK; k++) dot += d[k] * w[k] * v[k];
    }
    dot = warp_sum(dot);
    float s = rstd[row];
    for (size_t first = 0; first < C; first += step) {
        load_lane_columns(v, x, first, C, lane);
        load_lane_columns(d, dy, first, C, lane);
        load_lane_weights(w, weight, first, C, lane);
        load_lane_columns(g, dx, first, C, lane);
#pragma unroll
        for (int k = 0; k < ROW_CHUNK; k++) {
            size_t c = first + lane + (size_t)k * WARP_SIZE;
            if (c < C) dx[c] = g[k] + s * (w[k] * d[k] - v[k] * s * s * dot / (float)C);
        }
    }
}

// dweight_c += sum_n dy_nc x_nc rstd_n, in two deterministic steps (one thread per column
// walking all N rows would leave all but C threads of the GPU idle):
// 1. partial[b][c] = the sum over the ROWS_PER_PART rows of part b, one thread per (b, c),
//    loading ROW_CHUNK rows at once and adding them in order;
// 2. dweight_c += sum_b partial[b][c], in order of b (add_column_partials_cuda).
__global__ void rmsnorm_backward_weight_kernel(float* partial, const float* dout,
                                               const float* inp, const float* rstd, size_t N,
                                               size_t C) {
    size_t c = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C) return;
    size_t first = (size_t)blockIdx.y * ROWS_PER_PART;
    size_t last = first + ROWS_PER_PART < N ? first + ROWS_PER_PART : N;
    float sum = 0.0f;
    for (size_t n0 = first; n0 < last; n0 += ROW_CHUNK) {
        float d[ROW_CHUNK], x[ROW_CHUNK], r[ROW_CHUNK];
#pragma unroll
        for (int k = 0; k < ROW_CHUNK; k++) {
            size_t n = n0 + k;
            if (n < last) {
                d[k] = dout[n * C + c];
                x[k] = inp[n * C + c];
                r[k] = rstd[n];
            }
        }
#pragma unroll
        for (int k = 0; k < ROW_CHUNK; k++)
            if (n0 + k < last) sum += d[k] * x[k] * r[k];
    }
    partial[blockIdx.y * C + c] = sum;
}

void rmsnorm_forward_cuda(float* out, float* rstd, const float* inp, const float* weight,
                          size_t N, size_t C) {
    const size_t threads = 128;  // 4 rows per block
    launch_kernel(rmsnorm_forward_kernel, ceil_div(N * WARP_SIZE, threads), threads,
                  out, rstd, inp, weight, N, C);
}

void rmsnorm_backward_cuda(float* dinp, float* dweight, const float* dout, const float* inp,
                           const float* weight, const float* rstd, size_t N, size_t C) {
    const size_t threads = 128;
    launch_kernel(rmsnorm_backward_inp_kernel, ceil_div(N * WARP_SIZE, threads), threads,
                  dinp, dout, inp, weight, rstd, N, C);
    if (dweight == NULL) return;  // no gain (weight NULL): nothing to learn
    unsigned int parts = ceil_div(N, ROWS_PER_PART);
    float* partial = cuda_workspace((size_t)parts * C);
    launch_kernel(rmsnorm_backward_weight_kernel, dim3(ceil_div(C, threads), parts),
                  threads, partial, dout, inp, rstd, N, C);
    add_column_partials_cuda(dweight, partial, parts, C);
}
