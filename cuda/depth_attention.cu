// depth_attention.cu — the AttnRes operator on the GPU (mirror of src/depth_attention.c).
// Per row n, over the sources V_i (N,C): k_i = rmsnorm(V_i; g), s_i = w . k_i,
// alpha = softmax_i(s), out = sum_i alpha_i V_i. alpha and key_rstd are (N,n_sources).
#include <math.h>

#include "common.cuh"
#include "depth_sources.cuh"
#include "layers.cuh"

// Every kernel below gives one block of DEPTH_BLOCK threads to DEPTH_ROWS rows: the
// ROW_THREADS threads (two warps) of row r take its columns c = t, t + ROW_THREADS, ...
// (four each at C = 256). At the model's sizes these kernels are bound by memory latency,
// not bandwidth (a row of 17 sources is 17 KB, the whole call a few MB), so a thread takes
// the sources SOURCE_CHUNK at a time (depth_sources.cuh): their loads issued together, and
// in the backward a chunk's gradients read before any is written.
#define DEPTH_ROWS 4
#define ROW_THREADS 64
#define ROW_WARPS (ROW_THREADS / WARP_SIZE)
#define DEPTH_BLOCK (DEPTH_ROWS * ROW_THREADS)

// Two sums over one row's columns for every source i: first[i] = sum_c x_c V_ic, where x is
// the row `x_row` (N,C) or, when x_row is NULL, V_i itself (sum_c V_ic^2); and second[i] =
// sum_c w_c g_c V_ic. Each of the row's threads sums its columns, each warp sums its lanes
// (warp_sum), and lane 0 of the row's warp w writes warp_first[w][i], warp_second[w][i]; the
// caller, after a barrier, adds the ROW_WARPS warps' sums in order of w (sum_row_warps).
__device__ __forceinline__ void row_source_sums(
    float (*warp_first)[DEPTH_ATTENTION_MAX_SOURCES],
    float (*warp_second)[DEPTH_ATTENTION_MAX_SOURCES], const float* x_row,
    const SourceList& sources, const float* query, const float* norm_weight, size_t n_sources,
    size_t row, size_t C, unsigned int t) {
    unsigned int warp = t / WARP_SIZE, lane = t % WARP_SIZE;
    for (size_t first = 0; first < n_sources; first += SOURCE_CHUNK) {
        float sum_first[SOURCE_CHUNK], sum_second[SOURCE_CHUNK], v[SOURCE_CHUNK];
#pragma unroll
        for (int j = 0; j < SOURCE_CHUNK; j++) sum_first[j] = sum_second[j] = 0.0f;
        for (size_t c = t; c < C; c += ROW_THREADS) {
            float wg = query[c] * norm_weight[c];
            load_chunk(v, sources, first, n_sources, row * C + c);
#pragma unroll
            for (int j = 0; j < SOURCE_CHUNK; j++) {
                if (first + j < n_sources) {
                    sum_first[j] += (x_row != NULL ? x_row[c] : v[j]) * v[j];
                    sum_second[j] += wg * v[j];
                }
            }
        }
#pragma unroll
        for (int j = 0; j < SOURCE_CHUNK; j++) {
            if (first + j < n_sources) {  // the same for the whole warp: every lane shuffles
                float a = warp_sum(sum_first[j]), b = warp_sum(sum_second[j]);
                if (lane == 0) {
                    warp_first[warp][first + j] = a;
                    warp_second[warp][first + j] = b;
                }
            }
        }
    }
}

// the row's sum for source i: its warps' sums in order of warp
__device__ __forceinline__ float sum_row_warps(
    const float (*warp_sums)[DEPTH_ATTENTION_MAX_SOURCES], size_t i) {
    float sum = 0.0f;
    for (int w = 0; w < ROW_WARPS; w++) sum += warp_sums[w][i];
    return sum;
}

// the gradient source i receives at one column c from both paths: alpha_i dout_c (value),
// ds_i rstd_i w_c g_c - ds_i rstd_i^3 (w . g V_i) / C * V_ic (key); see the backward below
__device__ __forceinline__ float source_gradient(float value_scale, float key_scale,
                                                 float correction, float dy, float wg, float v) {
    return value_scale * dy + key_scale * wg - correction * v;
}

// s_i = rstd_i * sum_c w_c g_c V_ic, alpha = softmax(s), out = sum_i alpha_i V_i
__global__ void depth_attention_forward_kernel(float* out, float* alpha, float* key_rstd,
                                               SourceList sources, const float* query,
                                               const float* norm_weight, size_t n_sources,
                                               size_t N, size_t C) {
    __shared__ float warp_sq[DEPTH_ROWS][ROW_WARPS][DEPTH_ATTENTION_MAX_SOURCES];
    __shared__ float warp_dot[DEPTH_ROWS][ROW_WARPS][DEPTH_ATTENTION_MAX_SOURCES];
    __shared__ float score[DEPTH_ROWS][DEPTH_ATTENTION_MAX_SOURCES];
    __shared__ float weight[DEPTH_ROWS][DEPTH_ATTENTION_MAX_SOURCES];
    unsigned int r = threadIdx.x / ROW_THREADS, t = threadIdx.x % ROW_THREADS;
    size_t row = (size_t)blockIdx.x * DEPTH_ROWS + r;
    bool live = row < N;  // the last block's rows past N only take part in the barriers
    // 1. per source, sum V^2 and (w * g) . V
    if (live)
        row_source_sums(warp_sq[r], warp_dot[r], NULL, sources, query, norm_weight, n_sources,
                        row, C, t);
    __syncthreads();
    // 2. the scores, thread i of the row for source i
    if (live) {
        for (size_t i = t; i < n_sources; i += ROW_THREADS) {
            float rstd = 1.0f / sqrtf(sum_row_warps(warp_sq[r], i) / (float)C + RMSNORM_EPS);
            key_rstd[row * n_sources + i] = rstd;
            score[r][i] = sum_row_warps(warp_dot[r], i) * rstd;
        }
    }
    __syncthreads();
    // 3. the softmax: every thread of the row reads the scores in the same order, thread i
    //    writes alpha_i
    if (live) {
        float max_score = -INFINITY;
        for (size_t i = 0; i < n_sources; i++) max_score = fmaxf(max_score, score[r][i]);
        float sum = 0.0f;
        for (size_t i = 0; i < n_sources; i++) sum += expf(score[r][i] - max_score);
        for (size_t i = t; i < n_sources; i += ROW_THREADS) {
            weight[r][i] = expf(score[r][i] - max_score) / sum;
            alpha[row * n_sources + i] = weight[r][i];
        }
    }
    __syncthreads();
    // 4. the weighted sum, in order of i, SOURCE_CHUNK sources' loads at a time
    if (live) {
        for (size_t c = t; c < C; c += ROW_THREADS) {
            float acc = 0.0f, v[SOURCE_CHUNK];
            for (size_t first = 0; first < n_sources; first += SOURCE_CHUNK) {
                load_chunk(v, sources, first, n_sources, row * C + c);
#pragma unroll
                for (int j = 0; j < SOURCE_CHUNK; j++)
                    if (first + j < n_sources) acc += weight[r][first + j] * v[j];
            }
            out[row * C + c] = acc;
        }
    }
}

// forward was: s_i = rstd_i (w . g V_i), alpha = softmax(s), out = sum_i alpha_i V_i. With
// dalpha_i = dout . V_i: ds_i = alpha_i (dalpha_i - sum_j alpha_j dalpha_j). Each source
// gets the value path alpha_i dout and the key path, rmsnorm's backward of dk_i = ds_i w:
// dV_i += ds_i rstd_i (w g) - ds_i rstd_i^3 (w . g V_i) / C * V_i.
// The weights' gradients: with k_i = g V_i rstd_i and dk_i = ds_i w, dw += sum ds_i k_i and
// dg += sum dk_i V_i rstd_i, both a column c times acc_c = sum_{n,i} ds_ni rstd_ni V_inc;
// this kernel writes its DEPTH_ROWS rows' part of it, acc_parts[block][c] (rows in order).
// distinct: every source has its own gradient tensor (depth_sources.cuh, distinct_grads).
__global__ void depth_attention_backward_rows_kernel(GradList dsources, float* acc_parts,
                                                     const float* dout, const float* alpha,
                                                     const float* key_rstd, SourceList sources,
                                                     const float* query,
                                                     const float* norm_weight, size_t n_sources,
                                                     size_t N, size_t C, int distinct) {
    __shared__ float warp_dy[DEPTH_ROWS][ROW_WARPS][DEPTH_ATTENTION_MAX_SOURCES];
    __shared__ float warp_wg[DEPTH_ROWS][ROW_WARPS][DEPTH_ATTENTION_MAX_SOURCES];
    __shared__ float dalpha[DEPTH_ROWS][DEPTH_ATTENTION_MAX_SOURCES];
    // per source: alpha_i; ds_i rstd_i; ds_i rstd_i^3 (w . g V_i) / C
    __shared__ float value_scale[DEPTH_ROWS][DEPTH_ATTENTION_MAX_SOURCES];
    __shared__ float key_scale[DEPTH_ROWS][DEPTH_ATTENTION_MAX_SOURCES];
    __shared__ float correction[DEPTH_ROWS][DEPTH_ATTENTION_MAX_SOURCES];
    __shared__ float row_acc[DEPTH_ROWS][ROW_THREADS];
    unsigned int r = threadIdx.x / ROW_THREADS, t = threadIdx.x % ROW_THREADS;
    size_t row = (size_t)blockIdx.x * DEPTH_ROWS + r;
    bool live = row < N;  // the last block's rows past N only take part in the barriers
    const float* dy = dout + row * C;
    // 1. per source, dout . V_i and (w * g) . V_i
    if (live)
        row_source_sums(warp_dy[r], warp_wg[r], dy, sources, query, norm_weight, n_sources,
                        row, C, t);
    __syncthreads();
    // 2. the softmax's backward: dalpha first, then every thread of the row sums
    //    alpha_j dalpha_j in the same order, and thread i gives source i its coefficients
    if (live) {
        for (size_t i = t; i < n_sources; i += ROW_THREADS) {
            dalpha[r][i] = sum_row_warps(warp_dy[r], i);
            value_scale[r][i] = alpha[row * n_sources + i];
        }
    }
    __syncthreads();
    if (live) {
        float alpha_dot_dalpha = 0.0f;
        for (size_t j = 0; j < n_sources; j++) alpha_dot_dalpha += value_scale[r][j] * dalpha[r][j];
        for (size_t i = t; i < n_sources; i += ROW_THREADS) {
            float ds = value_scale[r][i] * (dalpha[r][i] - alpha_dot_dalpha);
            float rstd = key_rstd[row * n_sources + i];
            key_scale[r][i] = ds * rstd;
            correction[r][i] = ds * rstd * rstd * rstd * sum_row_warps(warp_wg[r], i) / (float)C;
        }
    }
    __syncthreads();
    // 3. the sources' gradients, a chunk of sources at a time: read the chunk's values and
    //    gradients, then write the gradients; then the block's part of acc, its rows in order
    for (size_t first_c = 0; first_c < C; first_c += ROW_THREADS) {
        size_t c = first_c + t;
        float acc = 0.0f;
        if (live && c < C) {
            float wg = query[c] * norm_weight[c], dy_c = dy[c];
            size_t index = row * C + c;
            for (size_t first = 0; first < n_sources; first += SOURCE_CHUNK) {
                float v[SOURCE_CHUNK], dv[SOURCE_CHUNK];
                load_chunk(v, sources, first, n_sources, index);
                if (distinct) load_chunk(dv, dsources, first, n_sources, index);
#pragma unroll
                for (int j = 0; j < SOURCE_CHUNK; j++) {
                    size_t i = first + j;
                    if (i < n_sources) {
                        if (!distinct) dv[j] = dsources.source[i][index];
                        dsources.source[i][index] =
                            dv[j] + source_gradient(value_scale[r][i], key_scale[r][i],
                                                    correction[r][i], dy_c, wg, v[j]);
                        acc += key_scale[r][i] * v[j];  // ds_i rstd_i V_i
                    }
                }
            }
        }
        row_acc[r][t] = acc;  // 0 past N or C
        __syncthreads();
        if (r == 0 && c < C) {
            float sum = 0.0f;
            for (int k = 0; k < DEPTH_ROWS; k++) sum += row_acc[k][t];
            acc_parts[blockIdx.x * C + c] = sum;
        }
        __syncthreads();  // row_acc is written again by the next columns
    }
}

// The column sum of acc_parts (parts,C), then the two gradients: acc_c = sum_p
// acc_parts[p][c], dquery_c += g_c acc_c, dnorm_weight_c += w_c acc_c. One launch: a block
// of SUM_GROUPS x SUM_COLUMNS threads takes SUM_COLUMNS columns; thread (group r, column c)
// sums the parts r, r + SUM_GROUPS, r + 2 SUM_GROUPS, ... in order (a warp reads 32
// neighbouring columns of a part: 128 contiguous bytes), then group 0 adds the SUM_GROUPS
// sums of its column in order of r. Fixed orders throughout, so the result repeats bit for bit.
#define SUM_COLUMNS 32
#define SUM_GROUPS 32
__global__ void depth_attention_backward_weights_kernel(float* dquery, float* dnorm_weight,
                                                        const float* acc_parts,
                                                        const float* query,
                                                        const float* norm_weight, size_t parts,
                                                        size_t C) {
    __shared__ float group_sum[SUM_GROUPS][SUM_COLUMNS];
    unsigned int column = threadIdx.x % SUM_COLUMNS, group = threadIdx.x / SUM_COLUMNS;
    size_t c = (size_t)blockIdx.x * SUM_COLUMNS + column;
    float sum = 0.0f;
    if (c < C)
        for (size_t p = group; p < parts; p += SUM_GROUPS) sum += acc_parts[p * C + c];
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
    launch_kernel(depth_attention_forward_kernel, ceil_div(N, DEPTH_ROWS), DEPTH_BLOCK, out,
                  alpha, key_rstd, source_list(sources, n_sources), query, norm_weight,
                  n_sources, N, C);
}

size_t depth_attention_workspace_floats_cuda(size_t n_sources, size_t N, size_t C) {
    (void)n_sources;
    return (size_t)ceil_div(N, DEPTH_ROWS) * C;
}

void depth_attention_backward_cuda(float* const* dsources, float* dquery, float* dnorm_weight,
                                   const float* dout, const float* alpha, const float* key_rstd,
                                   const float* const* sources, const float* query,
                                   const float* norm_weight, size_t n_sources, size_t N, size_t C) {
    // the workspace holds acc_parts (N / DEPTH_ROWS, C)
    size_t parts = ceil_div(N, DEPTH_ROWS);
    float* acc_parts = cuda_workspace(depth_attention_workspace_floats_cuda(n_sources, N, C));
    launch_kernel(depth_attention_backward_rows_kernel, (unsigned int)parts, DEPTH_BLOCK,
                  grad_list(dsources, n_sources), acc_parts, dout, alpha, key_rstd,
                  source_list(sources, n_sources), query, norm_weight, n_sources, N, C,
                  distinct_grads(dsources, n_sources));
    launch_kernel(depth_attention_backward_weights_kernel, ceil_div(C, SUM_COLUMNS),
                  SUM_GROUPS * SUM_COLUMNS, dquery, dnorm_weight, acc_parts, query, norm_weight,
                  parts, C);
}
