// depth_attention_naive.cuh — the depth attention's first GPU version (version 1 of
// bench_depth.cu): one thread per row, walking the row's sources and columns in plain loops,
// as src/depth_attention.c's naive version does. The weights' gradients are sums over every
// row, so a second kernel gives one thread to each column, which adds the rows in order (no
// atomics: the result repeats bit for bit). What the trainer runs instead is
// cuda/depth_attention.cu, and the reason is visible here: the 32 threads of a warp read 32
// rows C floats apart (a 128-byte line each instead of one line for the warp), each thread
// waits for one load at a time, and at B T = 1024 rows the grid is 1024 threads where a GPU
// runs tens of thousands at once. Tested against the CPU under the emulator, in both thread
// orders (tests/cuda_test_layers.cpp), and timed beside cuda/depth_attention.cu by
// bench_depth.cu.
#ifndef ATTNRES_DEPTH_ATTENTION_NAIVE_CUH
#define ATTNRES_DEPTH_ATTENTION_NAIVE_CUH

#include <math.h>

#include "common.cuh"
#include "depth_sources.cuh"
#include "layers.cuh"

#define NAIVE_BLOCK 128  // threads (rows, or columns) of a block

// Row n: s_i = (w * g) . V_i * r_i, r_i = (mean(V_i^2) + eps)^(-1/2), alpha = softmax(s),
// out = sum_i alpha_i V_i. alpha and key_rstd (N,n_sources) are saved for the backward.
static __global__ void depth_attention_forward_naive_kernel(float* out, float* alpha,
                                                            float* key_rstd, SourceList sources,
                                                            const float* query,
                                                            const float* norm_weight,
                                                            size_t n_sources, size_t N, size_t C) {
    size_t n = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (n >= N) return;
    float* a = alpha + n * n_sources;  // the scores s_i, then alpha_i
    float* r = key_rstd + n * n_sources;
    float max_score = -INFINITY, sum = 0.0f;
    for (size_t i = 0; i < n_sources; i++) {
        const float* v = sources.source[i] + n * C;
        float sum_sq = 0.0f, wgv = 0.0f;  // sum_c V_c^2 and (w * g) . V
        for (size_t c = 0; c < C; c++) {
            sum_sq += v[c] * v[c];
            wgv += query[c] * norm_weight[c] * v[c];
        }
        r[i] = 1.0f / sqrtf(sum_sq / (float)C + RMSNORM_EPS);
        a[i] = wgv * r[i];
        max_score = fmaxf(max_score, a[i]);
    }
    for (size_t i = 0; i < n_sources; i++) {
        a[i] = expf(a[i] - max_score);
        sum += a[i];
    }
    for (size_t i = 0; i < n_sources; i++) a[i] /= sum;
    for (size_t c = 0; c < C; c++) {
        float o = 0.0f;
        for (size_t i = 0; i < n_sources; i++) o += a[i] * sources.source[i][n * C + c];
        out[n * C + c] = o;
    }
}

// forward was: out = sum_i alpha_i V_i, alpha = softmax(s), s_i = (w * g) . V_i * r_i. Row n,
// with dalpha_i = dout . V_i and ds_i = alpha_i (dalpha_i - sum_j alpha_j dalpha_j):
//   dV_i += alpha_i dout + ds_i r_i (w * g) - ds_i r_i^3 ((w * g) . V_i) / C * V_i
// (the value path, then the key path through the key norm; src/depth_attention.c derives
// it), and key_scale[n][i] = ds_i r_i for the weights' kernel below.
static __global__ void depth_attention_backward_naive_rows_kernel(
    GradList dsources, float* key_scale, const float* dout, const float* alpha,
    const float* key_rstd, SourceList sources, const float* query, const float* norm_weight,
    size_t n_sources, size_t N, size_t C) {
    size_t n = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (n >= N) return;
    const float* a = alpha + n * n_sources;
    const float* d = dout + n * C;
    float weighted = 0.0f;  // sum_j alpha_j dalpha_j
    for (size_t j = 0; j < n_sources; j++) {
        float dalpha = 0.0f;
        for (size_t c = 0; c < C; c++) dalpha += d[c] * sources.source[j][n * C + c];
        weighted += a[j] * dalpha;
    }
    for (size_t i = 0; i < n_sources; i++) {
        const float* v = sources.source[i] + n * C;
        float* dv = dsources.source[i] + n * C;
        float dalpha = 0.0f, wgv = 0.0f;  // dout . V_i and (w * g) . V_i, again
        for (size_t c = 0; c < C; c++) {
            dalpha += d[c] * v[c];
            wgv += query[c] * norm_weight[c] * v[c];
        }
        float ds = a[i] * (dalpha - weighted), r = key_rstd[n * n_sources + i];
        float correction = ds * r * r * r * wgv / (float)C;
        for (size_t c = 0; c < C; c++)
            dv[c] += a[i] * d[c] + ds * r * (query[c] * norm_weight[c]) - correction * v[c];
        key_scale[n * n_sources + i] = ds * r;
    }
}

// Column c: acc_c = sum over the rows n and sources i, in order, of ds_i r_i V_ic; then
// dquery_c += g_c acc_c (dw = sum ds_i k_i) and dnorm_weight_c += w_c acc_c.
static __global__ void depth_attention_backward_naive_weights_kernel(
    float* dquery, float* dnorm_weight, const float* key_scale, SourceList sources,
    const float* query, const float* norm_weight, size_t n_sources, size_t N, size_t C) {
    size_t c = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C) return;
    float acc = 0.0f;
    for (size_t n = 0; n < N; n++)
        for (size_t i = 0; i < n_sources; i++)
            acc += key_scale[n * n_sources + i] * sources.source[i][n * C + c];
    dquery[c] += norm_weight[c] * acc;
    dnorm_weight[c] += query[c] * acc;
}

// The two layer functions, with depth_attention_forward_cuda's and
// depth_attention_backward_cuda's arguments. The backward borrows N x n_sources floats of the
// workspace (common.cuh) for key_scale.
inline void depth_attention_forward_naive_cuda(float* out, float* alpha, float* key_rstd,
                                               const float* const* sources, const float* query,
                                               const float* norm_weight, size_t n_sources,
                                               size_t N, size_t C) {
    launch_kernel(depth_attention_forward_naive_kernel, ceil_div(N, NAIVE_BLOCK), NAIVE_BLOCK,
                  out, alpha, key_rstd, source_list(sources, n_sources), query, norm_weight,
                  n_sources, N, C);
}

inline void depth_attention_backward_naive_cuda(float* const* dsources, float* dquery,
                                                float* dnorm_weight, const float* dout,
                                                const float* alpha, const float* key_rstd,
                                                const float* const* sources, const float* query,
                                                const float* norm_weight, size_t n_sources,
                                                size_t N, size_t C) {
    float* key_scale = cuda_workspace(N * n_sources);
    launch_kernel(depth_attention_backward_naive_rows_kernel, ceil_div(N, NAIVE_BLOCK),
                  NAIVE_BLOCK, grad_list(dsources, n_sources), key_scale, dout, alpha, key_rstd,
                  source_list(sources, n_sources), query, norm_weight, n_sources, N, C);
    launch_kernel(depth_attention_backward_naive_weights_kernel, ceil_div(C, NAIVE_BLOCK),
                  NAIVE_BLOCK, dquery, dnorm_weight, (const float*)key_scale,
                  source_list(sources, n_sources), query, norm_weight, n_sources, N, C);
}

#endif
