// depth_attention.cu — the AttnRes operator on the GPU (mirror of src/depth_attention.c).
// Per row n, over the sources V_i (N,C): k_i = rmsnorm(V_i; g), s_i = w . k_i,
// alpha = softmax_i(s), out = sum_i alpha_i V_i. alpha and key_rstd are (N,n_sources).
#include <math.h>

#include "common.cuh"
#include "depth_sources.cuh"
#include "layers.cuh"

// Every kernel below gives one block of DEPTH_BLOCK threads to one row n: first its warps
// share out the sources (warp w takes sources w, w + 8, ...: the sums over c of each), then
// its threads share out the columns (thread t takes c = t, t + DEPTH_BLOCK, ...). A row of
// the bench model (17 sources of C = 256) so keeps 256 threads busy, where one warp per row
// walked the sources one after another.
#define DEPTH_BLOCK 256

// s_i = rstd_i * sum_c w_c g_c V_ic, alpha = softmax(s), out = sum_i alpha_i V_i
__global__ void depth_attention_forward_kernel(float* out, float* alpha, float* key_rstd,
                                               SourceList sources, const float* query,
                                               const float* norm_weight, size_t n_sources,
                                               size_t N, size_t C) {
    __shared__ float score[DEPTH_ATTENTION_MAX_SOURCES], weight[DEPTH_ATTENTION_MAX_SOURCES];
    size_t row = blockIdx.x;
    unsigned int warp = threadIdx.x / WARP_SIZE, lane = threadIdx.x % WARP_SIZE;
    unsigned int n_warps = blockDim.x / WARP_SIZE;
    (void)N;
    // 1. the scores, one warp per source
    for (size_t i = warp; i < n_sources; i += n_warps) {
        const float* v = sources.source[i] + row * C;
        float sum_sq = 0.0f, dot = 0.0f;
        for (size_t c = lane; c < C; c += WARP_SIZE) {
            sum_sq += v[c] * v[c];
            dot += query[c] * norm_weight[c] * v[c];
        }
        sum_sq = warp_sum(sum_sq);
        dot = warp_sum(dot);
        float rstd = 1.0f / sqrtf(sum_sq / (float)C + RMSNORM_EPS);
        if (lane == 0) {
            key_rstd[row * n_sources + i] = rstd;
            score[i] = rstd * dot;
        }
    }
    __syncthreads();
    // 2. the softmax: every thread reads the scores in the same order, thread i writes alpha_i
    float max_score = -INFINITY;
    for (size_t i = 0; i < n_sources; i++) max_score = fmaxf(max_score, score[i]);
    float sum = 0.0f;
    for (size_t i = 0; i < n_sources; i++) sum += expf(score[i] - max_score);
    for (size_t i = threadIdx.x; i < n_sources; i += blockDim.x) {
        weight[i] = expf(score[i] - max_score) / sum;
        alpha[row * n_sources + i] = weight[i];
    }
    __syncthreads();
    // 3. the weighted sum, one thread per column
    for (size_t c = threadIdx.x; c < C; c += blockDim.x) {
        float acc = 0.0f;
        for (size_t i = 0; i < n_sources; i++) acc += weight[i] * sources.source[i][row * C + c];
        out[row * C + c] = acc;
    }
}

// forward was: s_i = rstd_i (w . g V_i), alpha = softmax(s), out = sum_i alpha_i V_i. With
// dalpha_i = dout . V_i: ds_i = alpha_i (dalpha_i - sum_j alpha_j dalpha_j), stored in dscore
// (N,n_sources). Each source gets the value path alpha_i dout and the key path, rmsnorm's
// backward of dk_i = ds_i w: dV_i += ds_i rstd_i (w g - V_i rstd_i^2 (w . g V_i) / C).
// The weights' gradients: with k_i = g V_i rstd_i and dk_i = ds_i w, dw += sum ds_i k_i and
// dg += sum dk_i V_i rstd_i, both a column c times acc_c = sum_{n,i} ds_ni rstd_ni V_inc;
// this kernel writes row n's part of it, acc_rows[n][c] = sum_i ds_ni rstd_ni V_inc.
__global__ void depth_attention_backward_rows_kernel(GradList dsources, float* dscore,
                                                     float* acc_rows, const float* dout,
                                                     const float* alpha, const float* key_rstd,
                                                     SourceList sources, const float* query,
                                                     const float* norm_weight, size_t n_sources,
                                                     size_t N, size_t C) {
    __shared__ float dalpha[DEPTH_ATTENTION_MAX_SOURCES], wgv[DEPTH_ATTENTION_MAX_SOURCES];
    __shared__ float ds[DEPTH_ATTENTION_MAX_SOURCES];
    size_t row = blockIdx.x;
    unsigned int warp = threadIdx.x / WARP_SIZE, lane = threadIdx.x % WARP_SIZE;
    unsigned int n_warps = blockDim.x / WARP_SIZE;
    (void)N;
    const float* dy = dout + row * C;
    const float* alpha_row = alpha + row * n_sources;
    const float* rstd_row = key_rstd + row * n_sources;
    // 1. dout . V_i and w . g V_i, one warp per source
    for (size_t i = warp; i < n_sources; i += n_warps) {
        const float* v = sources.source[i] + row * C;
        float dot_dy = 0.0f, dot_wg = 0.0f;
        for (size_t c = lane; c < C; c += WARP_SIZE) {
            dot_dy += dy[c] * v[c];
            dot_wg += query[c] * norm_weight[c] * v[c];
        }
        dot_dy = warp_sum(dot_dy);
        dot_wg = warp_sum(dot_wg);
        if (lane == 0) {
            dalpha[i] = dot_dy;
            wgv[i] = dot_wg;
        }
    }
    __syncthreads();
    // 2. the softmax's backward: every thread sums alpha_j dalpha_j in the same order
    float alpha_dot_dalpha = 0.0f;
    for (size_t j = 0; j < n_sources; j++) alpha_dot_dalpha += alpha_row[j] * dalpha[j];
    for (size_t i = threadIdx.x; i < n_sources; i += blockDim.x) {
        ds[i] = alpha_row[i] * (dalpha[i] - alpha_dot_dalpha);
        dscore[row * n_sources + i] = ds[i];
    }
    __syncthreads();
    // 3. the sources' gradients and the row's part of acc, one thread per column
    for (size_t c = threadIdx.x; c < C; c += blockDim.x) {
        float wg = query[c] * norm_weight[c], dy_c = dy[c], acc = 0.0f;
        for (size_t i = 0; i < n_sources; i++) {
            float v = sources.source[i][row * C + c], rstd = rstd_row[i];
            float key_path = ds[i] * rstd * (wg - v * rstd * rstd * wgv[i] / (float)C);
            dsources.source[i][row * C + c] += alpha_row[i] * dy_c + key_path;
            acc += ds[i] * rstd * v;
        }
        acc_rows[row * C + c] = acc;
    }
}

// The column sum of acc_rows (N,C), then the two gradients: acc_c = sum_n acc_rows[n][c],
// dquery_c += g_c acc_c, dnorm_weight_c += w_c acc_c. One launch: a block of SUM_GROUPS x
// SUM_COLUMNS threads takes SUM_COLUMNS columns; thread (group r, column c) sums the rows
// r, r + SUM_GROUPS, r + 2 SUM_GROUPS, ... in order (a warp reads 32 neighbouring columns of
// a row: 128 contiguous bytes), then group 0 adds the SUM_GROUPS sums of its column in order
// of r. Fixed orders throughout, so the result repeats bit for bit.
#define SUM_COLUMNS 32
#define SUM_GROUPS 32
__global__ void depth_attention_backward_weights_kernel(float* dquery, float* dnorm_weight,
                                                        const float* acc_rows,
                                                        const float* query,
                                                        const float* norm_weight, size_t N,
                                                        size_t C) {
    __shared__ float group_sum[SUM_GROUPS][SUM_COLUMNS];
    unsigned int column = threadIdx.x % SUM_COLUMNS, group = threadIdx.x / SUM_COLUMNS;
    size_t c = (size_t)blockIdx.x * SUM_COLUMNS + column;
    float sum = 0.0f;
    if (c < C)
        for (size_t n = group; n < N; n += SUM_GROUPS) sum += acc_rows[n * C + c];
    group_sum[group][column] = sum;
    __syncthreads();
    if (group == 0 && c < C) {
        float acc = 0.0f;
        for (int r = 0; r < SUM_GROUPS; r++) acc += group_sum[r][column];
        dquery[c] += norm_weight[c] * acc;
        dnorm_weight[c] += query[c] * acc;
    }
}

void depth_attention_forward_cuda(float* out, float* alpha, float* key_rstd,
                                  const float* const* sources, const float* query,
                                  const float* norm_weight, size_t n_sources, size_t N, size_t C) {
    launch_kernel(depth_attention_forward_kernel, (unsigned int)N, DEPTH_BLOCK, out, alpha,
                  key_rstd, source_list(sources, n_sources), query, norm_weight, n_sources, N, C);
}

size_t depth_attention_workspace_floats_cuda(size_t n_sources, size_t N, size_t C) {
    return N * n_sources + N * C;
}

void depth_attention_backward_cuda(float* const* dsources, float* dquery, float* dnorm_weight,
                                   const float* dout, const float* alpha, const float* key_rstd,
                                   const float* const* sources, const float* query,
                                   const float* norm_weight, size_t n_sources, size_t N, size_t C) {
    // the workspace holds dscore (N,n_sources), then acc_rows (N,C)
    float* dscore = cuda_workspace(depth_attention_workspace_floats_cuda(n_sources, N, C));
    float* acc_rows = dscore + N * n_sources;
    launch_kernel(depth_attention_backward_rows_kernel, (unsigned int)N, DEPTH_BLOCK,
                  grad_list(dsources, n_sources), dscore, acc_rows, dout, alpha, key_rstd,
                  source_list(sources, n_sources), query, norm_weight, n_sources, N, C);
    launch_kernel(depth_attention_backward_weights_kernel, ceil_div(C, SUM_COLUMNS),
                  SUM_GROUPS * SUM_COLUMNS, dquery, dnorm_weight, acc_rows, query, norm_weight,
                  N, C);
}
