// depth_attention.cu — the AttnRes operator on the GPU, the default one (softmax, one head,
// the key norm, a static query), the mirror of src/depth_attention.c and in its order: the
// naive version (one thread per row, the C loops as they are), then the kernels the model runs
// (a block of threads for a few rows: their shape and the steps they take on a row are
// depth_rows.cuh's), then the operator fused with the RMSNorm of its output. Per row n, over
// the sources V_i (N,C), with the pseudo-query w (`query`) and the key norm's gain g
// (`norm_weight`), both (C):
//   k_i = g * V_i * r_i,  r_i = (mean(V_i^2) + eps)^(-1/2)
//   s_i = w . k_i,  alpha = softmax_i(s),  h = sum_i alpha_i V_i
// alpha and key_rstd (the r_i) are (N,n_sources); the backward's formulas are the C file's.
// SPEC's variants are depth_variants.cu's: there one head and the mixings run
// depth_attention_switched_forward_kernel and depth_attention_switched_backward_rows_kernel,
// this file's two fast kernels with the switches added (the same shape and row steps, so every
// switch off is this file's arithmetic), and more heads run kernels of their own; both add
// their parameters' gradients with this file's depth_attention_parts_sum_cuda.
//
// KERNEL MAP, in file order: each kernel or launcher, the function of src/depth_attention.c it
// mirrors, and which thread takes what (R = DEPTH_ROWS rows a block, T = ROW_THREADS a row).
//   depth_attention_forward_naive_kernel           depth_attention_forward_naive     thread n: row n
//   depth_attention_forward_naive_cuda             depth_attention_forward_naive     launches it
//   depth_attention_backward_naive_rows_kernel     depth_attention_backward_naive    thread n: row n
//   depth_attention_backward_naive_weights_kernel  depth_attention_backward_naive    thread c: column c
//   depth_attention_backward_naive_cuda            depth_attention_backward_naive    launches both
//   depth_attention_forward_kernel                 depth_attention_forward + norm    R rows, T a row
//   depth_attention_backward_rows_kernel           depth_attention_backward + norm   R rows, T a row
//   depth_attention_parts_sum_kernel               depth_attention_backward's end    32 x 32: column, parts
//   depth_attention_parts_sum_cuda                 depth_attention_backward's end    launches it
//   depth_attention_workspace_floats_cuda          -                                 -
//   depth_attention_forward_cuda                   depth_attention_forward           the forward kernel
//   depth_attention_backward_cuda                  depth_attention_backward          rows kernel, sum
//   depth_attention_rmsnorm_forward_cuda           depth_attention_rmsnorm_forward   the forward kernel
//   depth_attention_rmsnorm_backward_cuda          depth_attention_rmsnorm_backward  rows kernel, sum
// The fast kernels' numbered steps against the tiled C functions' (each kernel's comment has
// them): depth_attention_forward_kernel's steps 1-2 are C step 1 (the keys' rstd and the
// scores), 3 is step 2 (the softmax), 4 is step 3 (the weighted sum), 5 rmsnorm_forward;
// depth_attention_backward_rows_kernel's step 0 is rmsnorm_backward and steps 1-3 are C steps
// 1-3, each block leaving its rows' part of acc; depth_attention_parts_sum_kernel is the end
// of depth_attention_backward (dquery and dnorm_weight from acc).
#include <math.h>

#include "common.cuh"
#include "depth_rows.cuh"
#include "depth_sources.cuh"
#include "layers.cuh"

// ---- the naive version ----
// src/depth_attention.c's naive functions on the GPU: one thread per row, with the C loops'
// arithmetic (each kernel's comment says where its loop order differs). The weights'
// gradients are sums over every row,
// so a second kernel gives one thread to each column, which adds the rows in order (no
// atomics: the result repeats bit for bit). The model runs the next section's kernels
// instead, and the reason is visible here: the 32 threads of a warp read 32 rows C floats
// apart (a 128-byte line each instead of one line for the warp), each thread waits for one
// load at a time, and at B T = 1024 rows the grid is 1024 threads where a GPU runs tens of
// thousands at once. dev/bench/bench_depth.cu times both versions.
#define NAIVE_BLOCK 128  // threads (rows, or columns) of a block

// Mirrors src/depth_attention.c:depth_attention_forward_naive, row by row; it sums a score in
// plain order where the C code uses its 16-lane dot (util.h), and h column by column (each
// output written once) where the C loop adds source by source, so the two agree to float
// rounding, not bit for bit (the test's tolerance).
// Threads: thread n of the grid takes row n, every source and column of it.
// Row n: s_i = (w * g) . V_i * r_i, r_i = (mean(V_i^2) + eps)^(-1/2), alpha = softmax(s),
// h = sum_i alpha_i V_i. alpha and key_rstd (N,n_sources) are saved for the backward.
__global__ void depth_attention_forward_naive_kernel(float* h, float* alpha, float* key_rstd,
                                                     SourceList sources, const float* query,
                                                     const float* norm_weight, size_t n_sources,
                                                     size_t N, size_t C) {
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
        h[n * C + c] = o;
    }
}

// the layer function, with depth_attention_forward_cuda's arguments
void depth_attention_forward_naive_cuda(float* h, float* alpha, float* key_rstd,
                                        const float* const* sources, const float* query,
                                        const float* norm_weight, size_t n_sources,
                                        size_t N, size_t C) {
    launch_kernel(depth_attention_forward_naive_kernel, ceil_div(N, NAIVE_BLOCK), NAIVE_BLOCK,
                  h, alpha, key_rstd, source_list(sources, n_sources), query, norm_weight,
                  n_sources, N, C);
}

// Mirrors src/depth_attention.c:depth_attention_backward_naive, except dquery and dnorm_weight
// (the next kernel); where the C code keeps every dalpha_i of the row, a thread has no such
// array: it sums sum_j alpha_j dalpha_j in a first pass and computes dalpha_i again.
// Threads: thread n of the grid takes row n, every source and column of it.
// Forward was: h = sum_i alpha_i V_i, alpha = softmax(s), s_i = (w * g) . V_i * r_i. With
// dalpha_i = dh . V_i and ds_i = alpha_i (dalpha_i - sum_j alpha_j dalpha_j):
//   dV_i += alpha_i dh + ds_i r_i (w * g) - ds_i r_i^3 ((w * g) . V_i) / C * V_i
// (the value path, then the key path through the key norm), and key_scale[n][i] = ds_i r_i
// for the weights' kernel below.
__global__ void depth_attention_backward_naive_rows_kernel(
    GradList dsources, float* key_scale, const float* dh, const float* alpha,
    const float* key_rstd, SourceList sources, const float* query, const float* norm_weight,
    size_t n_sources, size_t N, size_t C) {
    size_t n = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (n >= N) return;
    const float* a = alpha + n * n_sources;
    const float* d = dh + n * C;
    float weighted = 0.0f;  // sum_j alpha_j dalpha_j
    for (size_t j = 0; j < n_sources; j++) {
        float dalpha = 0.0f;
        for (size_t c = 0; c < C; c++) dalpha += d[c] * sources.source[j][n * C + c];
        weighted += a[j] * dalpha;
    }
    for (size_t i = 0; i < n_sources; i++) {
        const float* v = sources.source[i] + n * C;
        float* dv = dsources.source[i] + n * C;
        float dalpha = 0.0f, wgv = 0.0f;  // dh . V_i and (w * g) . V_i, again
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

// Mirrors src/depth_attention.c:depth_attention_backward_naive, its dquery and dnorm_weight
// lines, their sums factored as the tiled depth_attention_backward does (one sum, then times
// g_c or w_c).
// Threads: thread c of the grid takes column c, every row and source of it.
// acc_c = sum over the rows n and sources i, in order, of ds_i r_i V_ic; then
// dquery_c += g_c acc_c (dw = sum ds_i k_i) and dnorm_weight_c += w_c acc_c.
__global__ void depth_attention_backward_naive_weights_kernel(
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

// the layer function, with depth_attention_backward_cuda's arguments; borrows N x n_sources
// floats of the workspace (common.cuh) for key_scale
void depth_attention_backward_naive_cuda(float* const* dsources, float* dquery,
                                         float* dnorm_weight, const float* dh,
                                         const float* alpha, const float* key_rstd,
                                         const float* const* sources, const float* query,
                                         const float* norm_weight, size_t n_sources,
                                         size_t N, size_t C) {
    float* key_scale = cuda_workspace(N * n_sources);
    launch_kernel(depth_attention_backward_naive_rows_kernel, ceil_div(N, NAIVE_BLOCK),
                  NAIVE_BLOCK, grad_list(dsources, n_sources), key_scale, dh, alpha, key_rstd,
                  source_list(sources, n_sources), query, norm_weight, n_sources, N, C);
    launch_kernel(depth_attention_backward_naive_weights_kernel, ceil_div(C, NAIVE_BLOCK),
                  NAIVE_BLOCK, dquery, dnorm_weight, (const float*)key_scale,
                  source_list(sources, n_sources), query, norm_weight, n_sources, N, C);
}

// ---- the version the model runs ----
// Its forward and backward kernels give one block of DEPTH_BLOCK threads to DEPTH_ROWS rows, a
// row's ROW_THREADS threads sharing out its columns, a few at a time; depth_rows.cuh says why
// that shape, and holds the steps the kernels take on a row. The parts' sum that ends the
// backward gives each thread a column instead.

// Mirrors src/depth_attention.c:depth_attention_forward: steps 1-2 below are its step 1 (the
// scores), 3 its step 2 (the softmax), 4 its step 3 (h); step 5, with xn, is
// src/rmsnorm.c:rmsnorm_forward on the row just computed (depth_attention_rmsnorm_forward).
// Threads: block b, rows R b .. R b + R-1 (R = DEPTH_ROWS, 4); a row's thread t, columns t,
// t + ROW_THREADS (64), ... (steps 2-3: thread t takes source t)
// s_i = rstd_i * sum_c w_c g_c V_ic, alpha = softmax(s), h = sum_i alpha_i V_i, with w and g
// params.query and params.norm, alpha and rstd_i saved in saved.alpha and saved.key_rstd.
// With xn not NULL, then also the RMSNorm of the row just computed: xn = weight * h *
// h_rstd, h_rstd = 1/sqrt(mean(h^2) + eps), the gain weight NULL for all ones.
__global__ void __launch_bounds__(DEPTH_BLOCK, DEPTH_MIN_BLOCKS)
depth_attention_forward_kernel(float* xn, float* h_rstd, float* h, DepthSaved saved,
                               SourceList sources, DepthParams params, const float* weight,
                               size_t n_sources, size_t N, size_t C) {
    __shared__ float warp_sq[DEPTH_ROWS][ROW_WARPS][DEPTH_ATTENTION_MAX_SOURCES];
    __shared__ float warp_dot[DEPTH_ROWS][ROW_WARPS][DEPTH_ATTENTION_MAX_SOURCES];
    __shared__ float score[DEPTH_ROWS][DEPTH_ATTENTION_MAX_SOURCES];
    __shared__ float row_alpha[DEPTH_ROWS][DEPTH_ATTENTION_MAX_SOURCES];
    __shared__ float h_sq[DEPTH_ROWS][ROW_WARPS];
    unsigned int r = threadIdx.x / ROW_THREADS, t = threadIdx.x % ROW_THREADS;
    size_t row = (size_t)blockIdx.x * DEPTH_ROWS + r;
    bool live = row < N;  // the last block's rows past N only take part in the barriers
    // 1. per source, sum V^2 and (w * g) . V
    if (live)
        row_source_sums(warp_sq[r], warp_dot[r], NULL, sources, params.query, NULL, params.norm,
                        n_sources, row, C, t);
    __syncthreads();
    // 2. the scores, thread i of the row for source i
    if (live) {
        for (size_t i = t; i < n_sources; i += ROW_THREADS) {
            float rstd = 1.0f / sqrtf(sum_row_warps(warp_sq[r], i) / (float)C + RMSNORM_EPS);
            saved.key_rstd[row * n_sources + i] = rstd;
            score[r][i] = sum_row_warps(warp_dot[r], i) * rstd;
        }
    }
    __syncthreads();
    // 3. the softmax, thread i writing alpha_i
    if (live) row_softmax(row_alpha[r], saved.alpha + row * n_sources, score[r], n_sources, t);
    __syncthreads();
    // 4. the weighted sum, in order of i
    float sum_sq = live ? row_weighted_sum(h + row * C, row_alpha[r], sources, n_sources, row,
                                           C, t)
                        : 0.0f;  // this thread's part of sum_c h_c^2
    if (xn == NULL) return;  // the same for the whole grid
    // 5. the RMSNorm of the row: each thread reads back the columns it wrote in step 4
    row_rmsnorm_forward(xn, h_rstd, h, weight, h_sq, sum_sq, live, row, C, r, t);
}

// Mirrors src/depth_attention.c:depth_attention_backward, steps 1-3 and a tile's part of acc
// (a block's DEPTH_ROWS rows here); step 0, with dxn, is src/rmsnorm.c:rmsnorm_backward
// (depth_attention_rmsnorm_backward).
// Threads: block b, rows R b .. R b + R-1 (R = DEPTH_ROWS, 4); a row's thread t, columns t,
// t + ROW_THREADS (64), ... (step 2: thread t takes source t)
// forward was: s_i = rstd_i (w . g V_i), alpha = softmax(s), h = sum_i alpha_i V_i. With
// dalpha_i = dh . V_i: ds_i = alpha_i (dalpha_i - sum_j alpha_j dalpha_j). Each source
// gets the value path alpha_i dh and the key path, rmsnorm's backward of dk_i = ds_i w:
// dV_i += ds_i rstd_i (w g) - ds_i rstd_i^3 (w . g V_i) / C * V_i.
// The weights' gradients: with k_i = g V_i rstd_i and dk_i = ds_i w, dw += sum ds_i k_i and
// dg += sum dk_i V_i rstd_i, both a column c times acc_c = sum_{n,i} ds_ni rstd_ni V_inc;
// this kernel writes its DEPTH_ROWS rows' part of it, acc_parts[block][c] (rows in order).
// distinct: every source has its own gradient tensor (depth_sources.cuh, distinct_grads).
// dh is the gradient of h, read. With dxn not NULL (depth_attention_rmsnorm_backward) the
// kernel first computes it itself into dh (the caller's dh_scratch), as the RMSNorm of h
// (saved h_rstd, gain weight) takes dxn back (step 0); and with dweight_parts not NULL also
// the block's part of the gain's gradient, dweight_parts[block][c] = sum over its rows of
// dxn_c h_c h_rstd.
__global__ void __launch_bounds__(DEPTH_BLOCK, DEPTH_MIN_BLOCKS)
depth_attention_backward_rows_kernel(GradList dsources, float* acc_parts, float* dweight_parts,
                                     float* dh, const float* dxn, const float* h,
                                     const float* h_rstd, const float* weight,
                                     DepthSaved saved, SourceList sources, DepthParams params,
                                     size_t n_sources, size_t N, size_t C, int distinct) {
    __shared__ float warp_dy[DEPTH_ROWS][ROW_WARPS][DEPTH_ATTENTION_MAX_SOURCES];
    __shared__ float warp_wg[DEPTH_ROWS][ROW_WARPS][DEPTH_ATTENTION_MAX_SOURCES];
    __shared__ float dalpha[DEPTH_ROWS][DEPTH_ATTENTION_MAX_SOURCES];
    __shared__ SourceScales scales[DEPTH_ROWS];
    __shared__ float row_acc[DEPTH_ROWS][DEPTH_COLS][ROW_THREADS];
    __shared__ float row_dweight[DEPTH_ROWS][DEPTH_COLS][ROW_THREADS];
    __shared__ float row_dot[DEPTH_ROWS][ROW_WARPS];
    unsigned int r = threadIdx.x / ROW_THREADS, t = threadIdx.x % ROW_THREADS;
    size_t row = (size_t)blockIdx.x * DEPTH_ROWS + r;
    bool live = row < N;  // the last block's rows past N only take part in the barriers
    float* dy = dh + row * C;
    // 0. (fused with the norm) dh = the norm's backward of dxn, each thread at the columns
    //    it reads in steps 1 and 3
    if (dxn != NULL)
        row_rmsnorm_backward(dy, dxn, h, h_rstd, weight, row_dot, live, row, C, r, t);
    // 1. per source, dh . V_i and (w * g) . V_i
    if (live)
        row_source_sums(warp_dy[r], warp_wg[r], dy, sources, params.query, NULL, params.norm,
                        n_sources, row, C, t);
    __syncthreads();
    // 2. the softmax's backward: dalpha first, then every thread of the row sums
    //    alpha_j dalpha_j in the same order, and thread i gives source i its scales
    if (live) {
        for (size_t i = t; i < n_sources; i += ROW_THREADS) {
            dalpha[r][i] = sum_row_warps(warp_dy[r], i);
            scales[r].alpha[i] = saved.alpha[row * n_sources + i];
        }
    }
    __syncthreads();
    if (live) {
        float alpha_dot_dalpha = 0.0f;
        for (size_t j = 0; j < n_sources; j++)
            alpha_dot_dalpha += scales[r].alpha[j] * dalpha[r][j];
        for (size_t i = t; i < n_sources; i += ROW_THREADS) {
            float a = scales[r].alpha[i], ds = a * (dalpha[r][i] - alpha_dot_dalpha);
            float rstd = saved.key_rstd[row * n_sources + i];
            scales[r].key[i] = ds * rstd;
            scales[r].correction[i] =
                ds * rstd * rstd * rstd * sum_row_warps(warp_wg[r], i) / (float)C;
        }
    }
    __syncthreads();
    // 3. the sources' gradients, a column group and a chunk of sources at a time: read the
    //    values and gradients of them all, then write the gradients; then the block's part of
    //    acc (and of the gain's gradient), its rows in order
    for (size_t first_c = 0; first_c < C; first_c += GROUP_STRIDE) {
        size_t group = first_c + t;  // this thread's columns: group + k ROW_THREADS
        float acc[DEPTH_COLS];
#pragma unroll
        for (int k = 0; k < DEPTH_COLS; k++) acc[k] = 0.0f;
        if (live) {
            float wg[DEPTH_COLS], dy_c[DEPTH_COLS];
            load_key_weights(wg, params.query, NULL, params.norm, group, C);
            load_columns(dy_c, dy, group, C);
            add_source_gradients(acc, dsources, sources, scales[r], wg, dy_c, distinct, n_sources,
                                 row, group, C);
        }
#pragma unroll
        for (int k = 0; k < DEPTH_COLS; k++) {
            size_t c = group + k * ROW_THREADS;
            row_acc[r][k][t] = acc[k];  // 0 past N or C
            if (dweight_parts != NULL)
                row_dweight[r][k][t] = live && c < C
                                        ? dxn[row * C + c] * h[row * C + c] * h_rstd[row]
                                        : 0.0f;
        }
        __syncthreads();
        if (r == 0) {
#pragma unroll
            for (int k = 0; k < DEPTH_COLS; k++) {
                size_t c = group + k * ROW_THREADS;
                if (c >= C) break;
                acc_parts[blockIdx.x * C + c] = block_rows_sum(row_acc, k, t);
                if (dweight_parts != NULL)
                    dweight_parts[blockIdx.x * C + c] = block_rows_sum(row_dweight, k, t);
            }
        }
        __syncthreads();  // row_acc and row_dweight are written again by the next columns
    }
}

// Mirrors the end of src/depth_attention.c:depth_attention_backward: the partial sums added
// in a fixed order (here one part per block of rows, summed as below), then dquery and
// dnorm_weight.
// Threads: thread (r, c) of block b takes column 32 b + c, its parts r, r + 32, r + 64, ...
// The column sums of the parts a rows kernel wrote (parts,C), then the parameters'
// gradients: acc_c = the sum of acc_parts[part][c] over the parts; dquery_c += g_c acc_c (g = norm_weight, 1 when
// NULL; dquery NULL: none); dnorm_weight_c (when not NULL) += w_c acc_c, or the sum of
// gain_parts when that is not NULL (depth_variants.cu's, where the query differs from row to
// row); dweight_c += the sum of dweight_parts (the fused norm's gain), when not NULL. One
// launch: a block of SUM_GROUPS x SUM_COLUMNS threads takes SUM_COLUMNS columns; thread
// (group r, column c) sums the parts r, r + SUM_GROUPS, r + 2 SUM_GROUPS, ... in order (a warp
// reads 32 neighbouring columns of a part: 128 contiguous bytes), then group 0 adds the
// SUM_GROUPS sums in order of r. Fixed orders throughout, so the result repeats bit for bit.
#define SUM_COLUMNS 32
#define SUM_GROUPS 32
__global__ void depth_attention_parts_sum_kernel(float* dquery, float* dnorm_weight, float* dweight,
                                                 const float* acc_parts, const float* gain_parts,
                                                 const float* dweight_parts, const float* query,
                                                 const float* norm_weight, size_t parts,
                                                 size_t C) {
    // per column: the sums of acc_parts, gain_parts and dweight_parts (0 for a NULL one)
    __shared__ float group_sum[3][SUM_GROUPS][SUM_COLUMNS];
    const float* part_sums[3] = {acc_parts, gain_parts, dweight_parts};
    unsigned int column = threadIdx.x % SUM_COLUMNS, group = threadIdx.x / SUM_COLUMNS;
    size_t c = (size_t)blockIdx.x * SUM_COLUMNS + column;
    float sum[3] = {0.0f, 0.0f, 0.0f};
    if (c < C) {
        // PART_CHUNK of the thread's parts loaded at once (common.cuh), then added in order
        for (size_t first = group; first < parts; first += PART_CHUNK * SUM_GROUPS) {
            float a[3][PART_CHUNK];
#pragma unroll
            for (int s = 0; s < 3; s++) {
#pragma unroll
                for (int k = 0; k < PART_CHUNK; k++) {
                    size_t part = first + k * SUM_GROUPS;
                    a[s][k] = part < parts && part_sums[s] != NULL ? part_sums[s][part * C + c] : 0.0f;
                }
            }
#pragma unroll
            for (int k = 0; k < PART_CHUNK; k++) {
                if (first + k * SUM_GROUPS >= parts) break;
#pragma unroll
                for (int s = 0; s < 3; s++) sum[s] += a[s][k];
            }
        }
    }
#pragma unroll
    for (int s = 0; s < 3; s++) group_sum[s][group][column] = sum[s];
    __syncthreads();
    if (group == 0 && c < C) {
        float total[3] = {0.0f, 0.0f, 0.0f};
        for (int r = 0; r < SUM_GROUPS; r++) {
#pragma unroll
            for (int s = 0; s < 3; s++) total[s] += group_sum[s][r][column];
        }
        if (dquery != NULL) dquery[c] += (norm_weight != NULL ? norm_weight[c] : 1.0f) * total[0];
        if (dnorm_weight != NULL)
            dnorm_weight[c] += gain_parts != NULL ? total[1] : query[c] * total[0];
        if (dweight_parts != NULL) dweight[c] += total[2];
    }
}

void depth_attention_parts_sum_cuda(float* dquery, float* dnorm_weight, float* dweight,
                                    const float* acc_parts, const float* gain_parts,
                                    const float* dweight_parts, const float* query,
                                    const float* norm_weight, size_t parts, size_t C) {
    launch_kernel(depth_attention_parts_sum_kernel, ceil_div(C, SUM_COLUMNS),
                  SUM_GROUPS * SUM_COLUMNS, dquery, dnorm_weight, dweight, acc_parts, gain_parts,
                  dweight_parts, query, norm_weight, parts, C);
}

size_t depth_attention_workspace_floats_cuda(size_t n_sources, size_t N, size_t C) {
    // the naive backward's key_scale (N, n_sources); the fast one's acc_parts and
    // dweight_parts (N / DEPTH_ROWS, C) each
    size_t naive = N * n_sources, fast = (size_t)ceil_div(N, DEPTH_ROWS) * 2 * C;
    return naive > fast ? naive : fast;
}

// the layer functions: the kernels above without the norm (the structs' pointers are not
// const; the kernels only read what the layer takes as const)
void depth_attention_forward_cuda(float* h, float* alpha, float* key_rstd,
                                  const float* const* sources, const float* query,
                                  const float* norm_weight, size_t n_sources, size_t N, size_t C) {
    DepthSaved saved = {alpha, key_rstd, NULL, NULL, NULL};
    DepthParams params = {const_cast<float*>(query), const_cast<float*>(norm_weight), NULL, NULL};
    launch_kernel(depth_attention_forward_kernel, ceil_div(N, DEPTH_ROWS), DEPTH_BLOCK, nullptr,
                  nullptr, h, saved, source_list(sources, n_sources), params, nullptr,
                  n_sources, N, C);
}

// The rows kernel, then the column sums. The workspace holds acc_parts (N / DEPTH_ROWS, C),
// then, with the norm's gain, dweight_parts as many.
void depth_attention_backward_cuda(float* const* dsources, float* dquery, float* dnorm_weight,
                                   const float* dh, const float* alpha, const float* key_rstd,
                                   const float* const* sources, const float* query,
                                   const float* norm_weight, size_t n_sources, size_t N, size_t C) {
    DepthSaved saved = {const_cast<float*>(alpha), const_cast<float*>(key_rstd), NULL, NULL, NULL};
    DepthParams params = {const_cast<float*>(query), const_cast<float*>(norm_weight), NULL, NULL};
    size_t parts = ceil_div(N, DEPTH_ROWS);
    float* acc_parts = cuda_workspace(depth_attention_workspace_floats_cuda(n_sources, N, C));
    // without dxn the rows kernel only reads dh
    launch_kernel(depth_attention_backward_rows_kernel, (unsigned int)parts, DEPTH_BLOCK,
                  grad_list(dsources, n_sources), acc_parts, nullptr, const_cast<float*>(dh),
                  nullptr, nullptr, nullptr, nullptr, saved, source_list(sources, n_sources),
                  params, n_sources, N, C, distinct_grads(dsources, n_sources));
    depth_attention_parts_sum_cuda(dquery, dnorm_weight, NULL, acc_parts, NULL, NULL, query,
                                   norm_weight, parts, C);
}

// ---- the depth attention and the RMSNorm of its output ----
// Mirrors src/depth_attention.c:depth_attention_rmsnorm_forward and _backward, which on the
// CPU call the two layers in turn; here the forward kernel does both in one launch (its step
// 5), and the backward rows kernel does the norm's backward first (its step 0), before the
// column sums' launch.
void depth_attention_rmsnorm_forward_cuda(float* xn, float* rstd, float* h, DepthSaved saved,
                                          const float* const* sources, DepthParams params,
                                          const float* weight, size_t n_sources, size_t N,
                                          size_t C) {
    launch_kernel(depth_attention_forward_kernel, ceil_div(N, DEPTH_ROWS), DEPTH_BLOCK, xn, rstd,
                  h, saved, source_list(sources, n_sources), params, weight, n_sources, N, C);
}

void depth_attention_rmsnorm_backward_cuda(float* const* dsources, DepthParams grads,
                                           float* dweight, float* dh_scratch, const float* dxn,
                                           const float* h, const float* rstd,
                                           const float* weight, DepthSaved saved,
                                           const float* const* sources, DepthParams params,
                                           size_t n_sources, size_t N, size_t C) {
    size_t parts = ceil_div(N, DEPTH_ROWS);
    float* acc_parts = cuda_workspace(depth_attention_workspace_floats_cuda(n_sources, N, C));
    float* dweight_parts = dweight != NULL ? acc_parts + parts * C : NULL;
    launch_kernel(depth_attention_backward_rows_kernel, (unsigned int)parts, DEPTH_BLOCK,
                  grad_list(dsources, n_sources), acc_parts, dweight_parts, dh_scratch, dxn,
                  h, rstd, weight, saved, source_list(sources, n_sources), params, n_sources, N,
                  C, distinct_grads(dsources, n_sources));
    depth_attention_parts_sum_cuda(grads.query, grads.norm, dweight, acc_parts, NULL,
                                   dweight_parts, params.query, params.norm, parts, C);
}
