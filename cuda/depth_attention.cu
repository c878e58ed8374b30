// depth_attention.cu — the AttnRes operator on the GPU, the mirror of src/depth_attention.c
// and in its order: the naive version (one thread per row, the C loops as they are), then the
// kernels the model runs (a block of threads for a few rows), then the operator fused with the
// RMSNorm of its output. Per row n, over the sources V_i (N,C), with the pseudo-query w
// (`query`) and the key norm's gain g (`norm_weight`), both (C):
//   k_i = g * V_i * r_i,  r_i = (mean(V_i^2) + eps)^(-1/2)
//   s_i = w . k_i,  alpha = softmax_i(s),  out = sum_i alpha_i V_i
// alpha and key_rstd (the r_i) are (N,n_sources); the backward's formulas are the C file's.
// The kernels the model runs also take SPEC's one-head variants' switches (KernelSwitches,
// depth_sources.cuh: no key norm, sigmoid scores, a query with a row part, the mixings' fixed
// weights), each the same for the whole grid; every switch off is the default operator.
// depth_variants.cu sets them through the two launchers at the end of this file.
#include <math.h>

#include "common.cuh"
#include "depth_sources.cuh"
#include "layers.cuh"

// ---- the naive version ----
// src/depth_attention.c's naive functions on the GPU: one thread per row, walking the row's
// sources and columns in the C loops' order. The weights' gradients are sums over every row,
// so a second kernel gives one thread to each column, which adds the rows in order (no
// atomics: the result repeats bit for bit). The model runs the next section's kernels
// instead, and the reason is visible here: the 32 threads of a warp read 32 rows C floats
// apart (a 128-byte line each instead of one line for the warp), each thread waits for one
// load at a time, and at B T = 1024 rows the grid is 1024 threads where a GPU runs tens of
// thousands at once. dev/bench/bench_depth.cu times both versions.
#define NAIVE_BLOCK 128  // threads (rows, or columns) of a block

// Mirrors src/depth_attention.c:depth_attention_forward_naive, row by row; it sums a score in
// plain order where the C code uses its 16-lane dot (util.h), so the two agree to float
// rounding, not bit for bit (the test's tolerance).
// Threads: thread n of the grid takes row n, every source and column of it.
// Row n: s_i = (w * g) . V_i * r_i, r_i = (mean(V_i^2) + eps)^(-1/2), alpha = softmax(s),
// out = sum_i alpha_i V_i. alpha and key_rstd (N,n_sources) are saved for the backward.
__global__ void depth_attention_forward_naive_kernel(float* out, float* alpha, float* key_rstd,
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
        out[n * C + c] = o;
    }
}

// the layer function, with depth_attention_forward_cuda's arguments
void depth_attention_forward_naive_cuda(float* out, float* alpha, float* key_rstd,
                                        const float* const* sources, const float* query,
                                        const float* norm_weight, size_t n_sources,
                                        size_t N, size_t C) {
    launch_kernel(depth_attention_forward_naive_kernel, ceil_div(N, NAIVE_BLOCK), NAIVE_BLOCK,
                  out, alpha, key_rstd, source_list(sources, n_sources), query, norm_weight,
                  n_sources, N, C);
}

// Mirrors src/depth_attention.c:depth_attention_backward_naive, except dquery and dnorm_weight
// (the next kernel).
// Threads: thread n of the grid takes row n, every source and column of it.
// Forward was: out = sum_i alpha_i V_i, alpha = softmax(s), s_i = (w * g) . V_i * r_i. With
// dalpha_i = dout . V_i and ds_i = alpha_i (dalpha_i - sum_j alpha_j dalpha_j):
//   dV_i += alpha_i dout + ds_i r_i (w * g) - ds_i r_i^3 ((w * g) . V_i) / C * V_i
// (the value path, then the key path through the key norm), and key_scale[n][i] = ds_i r_i
// for the weights' kernel below.
__global__ void depth_attention_backward_naive_rows_kernel(
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

// The sums of the dquery and dnorm_weight lines of src/depth_attention.c's naive backward,
// factored as its tiled depth_attention_backward does (one sum, then times g_c or w_c).
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

// ---- the version the model runs ----
// Every kernel of this version gives one block of DEPTH_BLOCK threads to DEPTH_ROWS rows: the
// ROW_THREADS threads (64: two warps) of row r take its columns c = t, t + ROW_THREADS, ...
// (four each at C = 256), two at a time (DEPTH_COLS). At the model's sizes these kernels are
// bound by memory latency, not bandwidth (a row of 17 sources is 17 KB, the whole call a few
// MB, and at B T = 1024 rows the grid holds a quarter of the threads an H100 or H200 can run
// at once), so what counts is how many loads a thread has in flight before it waits. A thread
// takes the sources SOURCE_CHUNK at a time (depth_sources.cuh) and its columns DEPTH_COLS at
// a time (a column group: c, c + ROW_THREADS, ..., c + (DEPTH_COLS - 1) ROW_THREADS): it
// issues the loads of a group's columns for a chunk's sources together (DEPTH_COLS x
// SOURCE_CHUNK of them: 8 at 1 column, 32 at 4), and only then uses them. Taken a column at
// a time, a thread waits out one memory latency per column and chunk, since where the kernel
// writes between columns (out, the sources' gradients) the compiler may not move the next
// column's reads above the write. A thread still adds its columns in order of c, so every result is
// the same, bit for bit, whatever DEPTH_COLS is (checked under the emulator).
// The block's shape is the one a GPU timed fastest (docs/cuda.md has the numbers): `make
// gpu-check` builds and times the step with other shapes too (-DDEPTH_ROWS=..
// -DROW_THREADS=.. -DDEPTH_COLS=.., the Makefile's DEPTH_SHAPES), each checked against the CPU.
#ifndef DEPTH_ROWS
#define DEPTH_ROWS 4
#endif
#ifndef ROW_THREADS
#define ROW_THREADS 64
#endif
#ifndef DEPTH_COLS
#define DEPTH_COLS 2
#endif
#define ROW_WARPS (ROW_THREADS / WARP_SIZE)
#define DEPTH_BLOCK (DEPTH_ROWS * ROW_THREADS)
#define GROUP_STRIDE (DEPTH_COLS * ROW_THREADS)  // from one column group of a thread to its next
static_assert(ROW_THREADS % WARP_SIZE == 0 && DEPTH_BLOCK <= 1024,
              "a row takes whole warps, and a block at most 1024 threads");
static_assert(DEPTH_COLS >= 1 && DEPTH_COLS <= 4, "a thread holds 1 to 4 columns at a time");
// The forward and the backward rows kernels are compiled to fit at least 512 threads on a
// streaming multiprocessor (at most 128 registers a thread; 64 with blocks of 1024): with
// DEPTH_COLS 4 the backward holds 64 values of a group (its sources' and their gradients'),
// and left alone the compiler may take more than 128 registers (ptxas -v: 132 at 8 x 32 x 4),
// which fits one block of 256 threads on an SM: the bench's blocks would run in twice the
// waves. Capped, it takes 128 and spills nothing (-warn-spills is an error in the Makefile).
#define DEPTH_MIN_BLOCKS (DEPTH_BLOCK <= 512 ? 512 / DEPTH_BLOCK : 1)

// v[k] = values[c] at a column group's columns c = group + k ROW_THREADS below C, or 1 when
// values is NULL (the fused norm without a gain: 1 leaves every product exact), 0 past C;
// calls one after another issue all their loads before any is used
__device__ __forceinline__ void load_columns(float v[DEPTH_COLS], const float* values,
                                             size_t group, size_t C) {
#pragma unroll
    for (int k = 0; k < DEPTH_COLS; k++) {
        size_t c = group + k * ROW_THREADS;
        v[k] = c >= C ? 0.0f : values != NULL ? values[c] : 1.0f;
    }
}

// q[k] = the query q_c = w_c (+ u_c, the row's part query_row, when not NULL) at a column
// group's columns; 0 past C, and everywhere without a query (the mixings: query NULL)
__device__ __forceinline__ void load_query(float q[DEPTH_COLS], const float* query,
                                           const float* query_row, size_t group, size_t C) {
#pragma unroll
    for (int k = 0; k < DEPTH_COLS; k++) {
        size_t c = group + k * ROW_THREADS;
        q[k] = c >= C || query == NULL ? 0.0f
               : query_row != NULL     ? query[c] + query_row[c]
                                       : query[c];
    }
}

// wg[k] = q_c g_c, the vector a key is dotted with (load_query's q; g = norm_weight, 1 when
// NULL: no key norm), at a column group's columns (0 past C)
__device__ __forceinline__ void load_key_weights(float wg[DEPTH_COLS], const float* query,
                                                 const float* query_row,
                                                 const float* norm_weight, size_t group,
                                                 size_t C) {
    float g[DEPTH_COLS];
    load_query(wg, query, query_row, group, C);
    load_columns(g, norm_weight, group, C);
#pragma unroll
    for (int k = 0; k < DEPTH_COLS; k++) wg[k] *= g[k];
}

// v[k] = load_chunk of the sources (or their gradients) first .. at row `row`, column
// group + k ROW_THREADS, for the group's columns below C: DEPTH_COLS x SOURCE_CHUNK loads
template <typename List>
__device__ __forceinline__ void load_group_chunk(float v[DEPTH_COLS][SOURCE_CHUNK],
                                                 const List& list, size_t first,
                                                 size_t n_sources, size_t row, size_t group,
                                                 size_t C) {
#pragma unroll
    for (int k = 0; k < DEPTH_COLS; k++) {
        size_t c = group + k * ROW_THREADS;
        if (c < C) load_chunk(v[k], list, first, n_sources, row * C + c);
    }
}

// Two sums over one row's columns for every source i: first[i] = sum_c x_c V_ic, where x is
// the row `x_row` (N,C) or, when x_row is NULL, V_i itself (sum_c V_ic^2); and second[i] =
// sum_c q_c g_c V_ic (load_key_weights; query_rows (N,C) the query's row parts, or NULL).
// Each of the row's threads sums its columns, each warp sums its lanes (warp_sum), and
// lane 0 of the row's warp `warp` writes warp_first[warp][i] and
// warp_second[warp][i]; the caller, after a barrier, adds the ROW_WARPS warps' sums in order
// of warp (sum_row_warps).
__device__ __forceinline__ void row_source_sums(
    float (*warp_first)[DEPTH_ATTENTION_MAX_SOURCES],
    float (*warp_second)[DEPTH_ATTENTION_MAX_SOURCES], const float* x_row,
    const SourceList& sources, const float* query, const float* query_rows,
    const float* norm_weight, size_t n_sources, size_t row, size_t C, unsigned int t) {
    unsigned int warp = t / WARP_SIZE, lane = t % WARP_SIZE;
    const float* query_row = query_rows != NULL ? query_rows + row * C : NULL;
    for (size_t first = 0; first < n_sources; first += SOURCE_CHUNK) {
        float sum_first[SOURCE_CHUNK], sum_second[SOURCE_CHUNK];
#pragma unroll
        for (int j = 0; j < SOURCE_CHUNK; j++) sum_first[j] = sum_second[j] = 0.0f;
        for (size_t group = t; group < C; group += GROUP_STRIDE) {
            // the group's loads first: v[k][j] = V_{first + j} at column group + k ROW_THREADS
            // (x is only read with x_row)
            float v[DEPTH_COLS][SOURCE_CHUNK], x[DEPTH_COLS], wg[DEPTH_COLS];
            load_key_weights(wg, query, query_row, norm_weight, group, C);
            load_columns(x, x_row, group, C);
            load_group_chunk(v, sources, first, n_sources, row, group, C);
#pragma unroll
            for (int k = 0; k < DEPTH_COLS; k++) {
                if (group + k * ROW_THREADS >= C) break;
#pragma unroll
                for (int j = 0; j < SOURCE_CHUNK; j++) {
                    if (first + j < n_sources) {
                        sum_first[j] += (x_row != NULL ? x[k] : v[k][j]) * v[k][j];
                        sum_second[j] += wg[k] * v[k][j];
                    }
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
    for (int warp = 0; warp < ROW_WARPS; warp++) sum += warp_sums[warp][i];
    return sum;
}

// the gradient source i receives at one column c from both paths: alpha_i dout_c (value),
// ds_i rstd_i w_c g_c - ds_i rstd_i^3 (w . g V_i) / C * V_ic (key); see the backward below
__device__ __forceinline__ float source_gradient(float value_scale, float key_scale,
                                                 float correction, float dy, float wg, float v) {
    return value_scale * dy + key_scale * wg - correction * v;
}

// The sum over a row of one value per thread: each warp sums its lanes, lane 0 writes its
// warp's sum to row_warps[warp], and after a barrier (every thread of the block takes part)
// each thread adds the ROW_WARPS sums in order of warp.
__device__ __forceinline__ float row_sum(float (*row_warps)[ROW_WARPS], float x, unsigned int r,
                                         unsigned int t) {
    x = warp_sum(x);
    if (t % WARP_SIZE == 0) row_warps[r][t / WARP_SIZE] = x;
    __syncthreads();
    float sum = 0.0f;
    for (int warp = 0; warp < ROW_WARPS; warp++) sum += row_warps[r][warp];
    return sum;
}

// what the fused norm's backward reads at a column group: dxn, out and its gain `weight` (1
// without one)
__device__ __forceinline__ void load_norm_columns(float dx_k[DEPTH_COLS], float x_k[DEPTH_COLS],
                                                  float weight_k[DEPTH_COLS], const float* dx,
                                                  const float* x, const float* weight,
                                                  size_t group, size_t C) {
    load_columns(dx_k, dx, group, C);
    load_columns(x_k, x, group, C);
    load_columns(weight_k, weight, group, C);
}

// Mirrors src/depth_attention.c:depth_attention_forward: steps 1-2 below are its step 1 (the
// scores), 3 its step 2 (the softmax), 4 its step 3 (out); step 5, with xn, is
// src/rmsnorm.c:rmsnorm_forward on the row just computed.
// Threads: block b, rows R b .. R b + R-1 (R = DEPTH_ROWS, 4); a row's thread t, columns t,
// t + ROW_THREADS (64), ... (steps 2-3: thread t takes source t)
// s_i = rstd_i * sum_c w_c g_c V_ic, alpha = softmax(s), out = sum_i alpha_i V_i. With xn not
// NULL, then also the RMSNorm of the row just computed (depth_attention_rmsnorm_forward):
// xn = weight * out * out_rstd, out_rstd = 1/sqrt(mean(out^2) + eps), the gain weight NULL
// for all ones (rmsnorm.cu's forward, with a row's ROW_THREADS threads in place of one warp).
// The switches (sw): without the key norm (norm_weight NULL) rstd_i = 1 and g = 1; with
// sw.query_rows the query is w + u_n; with sw.sigmoid alpha_i = sigmoid(s_i); with sw.weights
// (the mixings) alpha = sw.weights for every row, no scores, and alpha and key_rstd are not
// written (alpha is the weights' own buffer).
__global__ void __launch_bounds__(DEPTH_BLOCK, DEPTH_MIN_BLOCKS)
depth_attention_forward_kernel(float* out, float* alpha, float* key_rstd,
                                               SourceList sources, const float* query,
                                               const float* norm_weight, size_t n_sources,
                                               size_t N, size_t C, float* xn, float* out_rstd,
                                               const float* weight, KernelSwitches sw) {
    __shared__ float warp_sq[DEPTH_ROWS][ROW_WARPS][DEPTH_ATTENTION_MAX_SOURCES];
    __shared__ float warp_dot[DEPTH_ROWS][ROW_WARPS][DEPTH_ATTENTION_MAX_SOURCES];
    __shared__ float score[DEPTH_ROWS][DEPTH_ATTENTION_MAX_SOURCES];
    __shared__ float row_alpha[DEPTH_ROWS][DEPTH_ATTENTION_MAX_SOURCES];
    __shared__ float out_sq[DEPTH_ROWS][ROW_WARPS];
    unsigned int r = threadIdx.x / ROW_THREADS, t = threadIdx.x % ROW_THREADS;
    size_t row = (size_t)blockIdx.x * DEPTH_ROWS + r;
    bool live = row < N;  // the last block's rows past N only take part in the barriers
    bool scored = sw.weights == NULL;  // the same for the whole grid
    // 1. per source, sum V^2 and (w * g) . V
    if (live && scored)
        row_source_sums(warp_sq[r], warp_dot[r], NULL, sources, query, sw.query_rows,
                        norm_weight, n_sources, row, C, t);
    __syncthreads();
    // 2. the scores, thread i of the row for source i
    if (live && scored) {
        for (size_t i = t; i < n_sources; i += ROW_THREADS) {
            float rstd = norm_weight == NULL
                             ? 1.0f
                             : 1.0f / sqrtf(sum_row_warps(warp_sq[r], i) / (float)C + RMSNORM_EPS);
            key_rstd[row * n_sources + i] = rstd;
            score[r][i] = sum_row_warps(warp_dot[r], i) * rstd;
        }
    }
    __syncthreads();
    // 3. the weights: the softmax (every thread of the row reads the scores in the same order),
    //    the sigmoid, or the mixing's; thread i writes alpha_i
    if (live && !scored) {
        for (size_t i = t; i < n_sources; i += ROW_THREADS) row_alpha[r][i] = sw.weights[i];
    } else if (live && sw.sigmoid) {
        for (size_t i = t; i < n_sources; i += ROW_THREADS) {
            row_alpha[r][i] = 1.0f / (1.0f + expf(-score[r][i]));
            alpha[row * n_sources + i] = row_alpha[r][i];
        }
    } else if (live) {
        float max_score = -INFINITY;
        for (size_t i = 0; i < n_sources; i++) max_score = fmaxf(max_score, score[r][i]);
        float sum = 0.0f;
        for (size_t i = 0; i < n_sources; i++) sum += expf(score[r][i] - max_score);
        for (size_t i = t; i < n_sources; i += ROW_THREADS) {
            row_alpha[r][i] = expf(score[r][i] - max_score) / sum;
            alpha[row * n_sources + i] = row_alpha[r][i];
        }
    }
    __syncthreads();
    // 4. the weighted sum, in order of i, a column group's loads of SOURCE_CHUNK sources at a
    //    time; the group's outputs are written once all its sources are summed
    float sum_sq = 0.0f;  // this thread's part of sum_c out_c^2
    if (live) {
        for (size_t group = t; group < C; group += GROUP_STRIDE) {
            float acc[DEPTH_COLS], v[DEPTH_COLS][SOURCE_CHUNK];
#pragma unroll
            for (int k = 0; k < DEPTH_COLS; k++) acc[k] = 0.0f;
            for (size_t first = 0; first < n_sources; first += SOURCE_CHUNK) {
                load_group_chunk(v, sources, first, n_sources, row, group, C);
#pragma unroll
                for (int k = 0; k < DEPTH_COLS; k++) {
                    if (group + k * ROW_THREADS >= C) break;
#pragma unroll
                    for (int j = 0; j < SOURCE_CHUNK; j++)
                        if (first + j < n_sources) acc[k] += row_alpha[r][first + j] * v[k][j];
                }
            }
#pragma unroll
            for (int k = 0; k < DEPTH_COLS; k++) {
                size_t c = group + k * ROW_THREADS;
                if (c >= C) break;
                out[row * C + c] = acc[k];
                sum_sq += acc[k] * acc[k];
            }
        }
    }
    if (xn == NULL) return;  // the same for the whole grid
    // 5. the RMSNorm of the row: each thread reads back the columns it wrote in step 4
    float s = 1.0f / sqrtf(row_sum(out_sq, sum_sq, r, t) / (float)C + RMSNORM_EPS);
    if (live) {
        for (size_t group = t; group < C; group += GROUP_STRIDE) {
            float o[DEPTH_COLS], weight_k[DEPTH_COLS];
            load_columns(o, out + row * C, group, C);
            load_columns(weight_k, weight, group, C);
#pragma unroll
            for (int k = 0; k < DEPTH_COLS; k++) {
                size_t c = group + k * ROW_THREADS;
                if (c >= C) break;
                xn[row * C + c] = weight_k[k] * (o[k] * s);
            }
        }
        if (t == 0) out_rstd[row] = s;
    }
}

// Mirrors src/depth_attention.c:depth_attention_backward, steps 1-3 and a tile's part of acc
// (a block's DEPTH_ROWS rows here); step 0, with dxn, is src/rmsnorm.c:rmsnorm_backward.
// Threads: block b, rows R b .. R b + R-1 (R = DEPTH_ROWS, 4); a row's thread t, columns t,
// t + ROW_THREADS (64), ... (step 2: thread t takes source t)
// forward was: s_i = rstd_i (w . g V_i), alpha = softmax(s), out = sum_i alpha_i V_i. With
// dalpha_i = dout . V_i: ds_i = alpha_i (dalpha_i - sum_j alpha_j dalpha_j). Each source
// gets the value path alpha_i dout and the key path, rmsnorm's backward of dk_i = ds_i w:
// dV_i += ds_i rstd_i (w g) - ds_i rstd_i^3 (w . g V_i) / C * V_i.
// The weights' gradients: with k_i = g V_i rstd_i and dk_i = ds_i w, dw += sum ds_i k_i and
// dg += sum dk_i V_i rstd_i, both a column c times acc_c = sum_{n,i} ds_ni rstd_ni V_inc;
// this kernel writes its DEPTH_ROWS rows' part of it, acc_parts[block][c] (rows in order).
// distinct: every source has its own gradient tensor (depth_sources.cuh, distinct_grads).
// dout is the gradient of out, read. With dxn not NULL (depth_attention_rmsnorm_backward) the
// kernel first computes it itself into dout (the caller's dout_scratch), as the RMSNorm of out
// (saved out_rstd, gain weight) takes dxn back (step 0, rmsnorm.c's backward); and with
// dweight_parts not NULL also the block's part of the gain's gradient,
// dweight_parts[block][c] = sum over its rows of dxn_c out_c out_rstd.
// The switches (sw), as in the forward: without the key norm rstd_i = 1, g = 1 and no
// correction term; sigmoid: ds_i = dalpha_i alpha_i (1 - alpha_i); with a row part of the
// query (q = w + u_n), dq_n = g acc_n per row into sw.dquery_rows (+=) and dg = sum_n q_n acc_n,
// the block's part in gain_parts; the mixings: no key path (ds = 0, acc = 0), and the
// block's part of dweight_i = sum_n dalpha_ni in weight_parts[block][i].
// Two instances: SWITCHED false for the default operator (every switch off, the key norm on),
// which the compiler builds without the switches' code, so that its registers fit what
// DEPTH_MIN_BLOCKS allows (at 4 columns a thread it needs all 128 of them), and SWITCHED
// true for the variants.
template <bool SWITCHED>
__global__ void __launch_bounds__(DEPTH_BLOCK, DEPTH_MIN_BLOCKS)
depth_attention_backward_rows_kernel(GradList dsources, float* acc_parts,
                                                     float* dout, const float* alpha,
                                                     const float* key_rstd, SourceList sources,
                                                     const float* query,
                                                     const float* norm_weight, size_t n_sources,
                                                     size_t N, size_t C, int distinct,
                                                     float* dweight_parts, const float* dxn,
                                                     const float* out, const float* out_rstd,
                                                     const float* weight, KernelSwitches switches,
                                                     float* switched_gain_parts,
                                                     float* switched_weight_parts) {
    // (the default operator's instance: every switch off, the key norm on, no such parts)
    const KernelSwitches sw = SWITCHED ? switches : KernelSwitches{};
    const bool key_norm = !SWITCHED || norm_weight != NULL;
    float* gain_parts = SWITCHED ? switched_gain_parts : NULL;
    float* weight_parts = SWITCHED ? switched_weight_parts : NULL;
    // a chunk of gradients read before any is written (distinct), except in the variants at 4
    // columns a thread: they read each just before its write (as where a tensor is passed
    // twice), holding 32 registers fewer, which a block of 512 threads (8 x 64 x 4) needs to
    // fit in its 128
    const bool chunk_grads = distinct && (!SWITCHED || DEPTH_COLS < 4);
    __shared__ float warp_dy[DEPTH_ROWS][ROW_WARPS][DEPTH_ATTENTION_MAX_SOURCES];
    __shared__ float warp_wg[DEPTH_ROWS][ROW_WARPS][DEPTH_ATTENTION_MAX_SOURCES];
    __shared__ float dalpha[DEPTH_ROWS][DEPTH_ATTENTION_MAX_SOURCES];
    // per source: alpha_i; ds_i rstd_i; ds_i rstd_i^3 (w . g V_i) / C
    __shared__ float value_scale[DEPTH_ROWS][DEPTH_ATTENTION_MAX_SOURCES];
    __shared__ float key_scale[DEPTH_ROWS][DEPTH_ATTENTION_MAX_SOURCES];
    __shared__ float correction[DEPTH_ROWS][DEPTH_ATTENTION_MAX_SOURCES];
    __shared__ float row_acc[DEPTH_ROWS][DEPTH_COLS][ROW_THREADS];
    __shared__ float row_dweight[DEPTH_ROWS][DEPTH_COLS][ROW_THREADS];
    __shared__ float row_dot[DEPTH_ROWS][ROW_WARPS];
    unsigned int r = threadIdx.x / ROW_THREADS, t = threadIdx.x % ROW_THREADS;
    size_t row = (size_t)blockIdx.x * DEPTH_ROWS + r;
    bool live = row < N;  // the last block's rows past N only take part in the barriers
    float* dy = dout + row * C;
    // 0. (fused with the norm) dout_c = rstd weight_c dxn_c - rstd^3 (sum_j dxn_j weight_j
    //    out_j) / C out_c; each thread writes its columns c = t, t + ROW_THREADS, ..., the same it
    //    reads in steps 1 and 3, so no barrier stands between them; a column group's reads
    //    come before its writes
    if (dxn != NULL) {
        const float* dx = dxn + row * C;
        const float* x = out + row * C;
        float dot = 0.0f;
        if (live) {
            for (size_t group = t; group < C; group += GROUP_STRIDE) {
                float dx_k[DEPTH_COLS], x_k[DEPTH_COLS], weight_k[DEPTH_COLS];
                load_norm_columns(dx_k, x_k, weight_k, dx, x, weight, group, C);
#pragma unroll
                for (int k = 0; k < DEPTH_COLS; k++)
                    if (group + k * ROW_THREADS < C) dot += dx_k[k] * weight_k[k] * x_k[k];
            }
        }
        dot = row_sum(row_dot, dot, r, t);
        if (live) {
            float s = out_rstd[row], correction = s * s * s * dot / (float)C;
            for (size_t group = t; group < C; group += GROUP_STRIDE) {
                float dx_k[DEPTH_COLS], x_k[DEPTH_COLS], weight_k[DEPTH_COLS];
                load_norm_columns(dx_k, x_k, weight_k, dx, x, weight, group, C);
#pragma unroll
                for (int k = 0; k < DEPTH_COLS; k++) {
                    size_t c = group + k * ROW_THREADS;
                    if (c >= C) break;
                    dy[c] = s * weight_k[k] * dx_k[k] - correction * x_k[k];
                }
            }
        }
    }
    // 1. per source, dout . V_i and (w * g) . V_i
    if (live)
        row_source_sums(warp_dy[r], warp_wg[r], dy, sources, query, sw.query_rows, norm_weight,
                        n_sources, row, C, t);
    __syncthreads();
    // 2. the scores' backward: dalpha first, then every thread of the row sums
    //    alpha_j dalpha_j in the same order (softmax), and thread i gives source i its
    //    coefficients
    if (live) {
        for (size_t i = t; i < n_sources; i += ROW_THREADS) {
            dalpha[r][i] = sum_row_warps(warp_dy[r], i);
            value_scale[r][i] = sw.weights != NULL ? sw.weights[i] : alpha[row * n_sources + i];
        }
    }
    __syncthreads();
    if (live) {
        float alpha_dot_dalpha = 0.0f;
        for (size_t j = 0; j < n_sources; j++) alpha_dot_dalpha += value_scale[r][j] * dalpha[r][j];
        for (size_t i = t; i < n_sources; i += ROW_THREADS) {
            float a = value_scale[r][i];
            float ds = sw.weights != NULL ? 0.0f
                       : sw.sigmoid       ? dalpha[r][i] * a * (1.0f - a)
                                          : a * (dalpha[r][i] - alpha_dot_dalpha);
            float rstd = key_norm ? key_rstd[row * n_sources + i] : 1.0f;
            key_scale[r][i] = ds * rstd;
            correction[r][i] = key_norm ? ds * rstd * rstd * rstd *
                                                         sum_row_warps(warp_wg[r], i) / (float)C
                                                   : 0.0f;
        }
    }
    // the mixings: the block's part of dweight, its rows in order
    if (weight_parts != NULL && r == 0) {
        for (size_t i = t; i < n_sources; i += ROW_THREADS) {
            float sum = 0.0f;
            for (int q = 0; q < DEPTH_ROWS && blockIdx.x * DEPTH_ROWS + q < N; q++)
                sum += dalpha[q][i];
            weight_parts[blockIdx.x * n_sources + i] = sum;
        }
    }
    __syncthreads();
    // 3. the sources' gradients, a column group and a chunk of sources at a time: read the
    //    values and gradients of them all, then write the gradients; then the block's part of
    //    acc (and of dg with the query's row part), its rows in order
    for (size_t first_c = 0; first_c < C; first_c += GROUP_STRIDE) {
        size_t group = first_c + t;  // this thread's columns: group + k ROW_THREADS
        float acc[DEPTH_COLS];
#pragma unroll
        for (int k = 0; k < DEPTH_COLS; k++) acc[k] = 0.0f;
        if (live) {
            float wg[DEPTH_COLS], dy_c[DEPTH_COLS];
            load_key_weights(wg, query, sw.query_rows != NULL ? sw.query_rows + row * C : NULL,
                             norm_weight, group, C);
            load_columns(dy_c, dy, group, C);
            for (size_t first = 0; first < n_sources; first += SOURCE_CHUNK) {
                float v[DEPTH_COLS][SOURCE_CHUNK], dv[DEPTH_COLS][SOURCE_CHUNK];
                load_group_chunk(v, sources, first, n_sources, row, group, C);
                if (chunk_grads) load_group_chunk(dv, dsources, first, n_sources, row, group, C);
#pragma unroll
                for (int k = 0; k < DEPTH_COLS; k++) {
                    size_t c = group + k * ROW_THREADS, index = row * C + c;
                    if (c >= C) break;
#pragma unroll
                    for (int j = 0; j < SOURCE_CHUNK; j++) {
                        size_t i = first + j;
                        if (i < n_sources) {
                            if (!chunk_grads) dv[k][j] = dsources.source[i][index];
                            dsources.source[i][index] =
                                dv[k][j] + source_gradient(value_scale[r][i], key_scale[r][i],
                                                           correction[r][i], dy_c[k], wg[k],
                                                           v[k][j]);
                            acc[k] += key_scale[r][i] * v[k][j];  // ds_i rstd_i V_i
                        }
                    }
                }
            }
        }
#pragma unroll
        for (int k = 0; k < DEPTH_COLS; k++) {
            size_t c = group + k * ROW_THREADS;
            row_acc[r][k][t] = acc[k];  // 0 past N or C (and in the mixings)
            if (dweight_parts != NULL)
                row_dweight[r][k][t] = live && c < C
                                        ? dxn[row * C + c] * out[row * C + c] * out_rstd[row]
                                        : 0.0f;
        }
        __syncthreads();
        // the block's parts, its rows in order: acc, the norm gain's terms and, with the
        // query's row part, dg's q_n acc_n (q from each row's u_n)
        if (r == 0) {
#pragma unroll
            for (int k = 0; k < DEPTH_COLS; k++) {
                size_t c = group + k * ROW_THREADS;
                if (c >= C) break;
                float sum = 0.0f;
                for (int p = 0; p < DEPTH_ROWS; p++) sum += row_acc[p][k][t];
                acc_parts[blockIdx.x * C + c] = sum;
                if (gain_parts != NULL) {
                    float gain_sum = 0.0f;
                    for (int p = 0; p < DEPTH_ROWS && blockIdx.x * DEPTH_ROWS + p < N; p++) {
                        size_t at = (blockIdx.x * DEPTH_ROWS + p) * C + c;
                        gain_sum += (query[c] + sw.query_rows[at]) * row_acc[p][k][t];
                    }
                    gain_parts[blockIdx.x * C + c] = gain_sum;
                }
                if (dweight_parts != NULL) {
                    float dweight_sum = 0.0f;
                    for (int p = 0; p < DEPTH_ROWS; p++) dweight_sum += row_dweight[p][k][t];
                    dweight_parts[blockIdx.x * C + c] = dweight_sum;
                }
            }
        }
        // with the query's row part: dq_n = g acc_n into the row's dquery_rows
        if (sw.query_rows != NULL && live) {
#pragma unroll
            for (int k = 0; k < DEPTH_COLS; k++) {
                size_t c = group + k * ROW_THREADS;
                if (c >= C) break;
                sw.dquery_rows[row * C + c] +=
                    (norm_weight != NULL ? norm_weight[c] : 1.0f) * row_acc[r][k][t];
            }
        }
        __syncthreads();  // row_acc and row_dweight are written again by the next columns
    }
}

// Mirrors the end of src/depth_attention.c:depth_attention_backward: the partial sums added
// in a fixed order (here one part per block of rows, summed as below), then dquery and
// dnorm_weight.
// Threads: thread (r, c) of block b takes column 32 b + c, its parts r, r + 32, r + 64, ...
// The column sums of the parts the rows kernel wrote (parts,C), then the parameters'
// gradients: acc_c = sum_p acc_parts[p][c]; dquery_c += g_c acc_c (g = 1 without the key
// norm; no dquery in the mixings); dnorm_weight_c += w_c acc_c, or, with the query's row part,
// the sum of gain_parts (sum_n q_nc acc_nc); dweight_c += the sum of dweight_parts (the fused
// norm's gain), when not NULL. One launch: a block of SUM_GROUPS x SUM_COLUMNS threads takes
// SUM_COLUMNS columns; thread (group r, column c) sums the parts r, r + SUM_GROUPS,
// r + 2 SUM_GROUPS, ... in order (a warp reads 32 neighbouring columns of a part: 128
// contiguous bytes), then group 0 adds the SUM_GROUPS sums in order of r. Fixed orders
// throughout, so the result repeats bit for bit.
#define SUM_COLUMNS 32
#define SUM_GROUPS 32
__global__ void depth_attention_backward_weights_kernel(float* dquery, float* dnorm_weight,
                                                        float* dweight, const float* acc_parts,
                                                        const float* gain_parts,
                                                        const float* dweight_parts,
                                                        const float* query,
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
                    size_t p = first + k * SUM_GROUPS;
                    a[s][k] = p < parts && part_sums[s] != NULL ? part_sums[s][p * C + c] : 0.0f;
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
    launch_kernel(depth_attention_backward_weights_kernel, ceil_div(C, SUM_COLUMNS),
                  SUM_GROUPS * SUM_COLUMNS, dquery, dnorm_weight, dweight, acc_parts, gain_parts,
                  dweight_parts, query, norm_weight, parts, C);
}

size_t depth_attention_workspace_floats_cuda(size_t n_sources, size_t N, size_t C) {
    // acc_parts, gain_parts, dweight_parts, weight_parts
    return (size_t)ceil_div(N, DEPTH_ROWS) * (3 * C + n_sources);
}

// the layer functions: the launchers at the end of this file with every switch off
void depth_attention_forward_cuda(float* out, float* alpha, float* key_rstd,
                                  const float* const* sources, const float* query,
                                  const float* norm_weight, size_t n_sources, size_t N, size_t C) {
    depth_attention_switched_forward_cuda(NULL, NULL, out, alpha, key_rstd, sources, query,
                                          norm_weight, NULL, KernelSwitches{}, n_sources, N, C);
}

void depth_attention_backward_cuda(float* const* dsources, float* dquery, float* dnorm_weight,
                                   const float* dout, const float* alpha, const float* key_rstd,
                                   const float* const* sources, const float* query,
                                   const float* norm_weight, size_t n_sources, size_t N, size_t C) {
    // without dxn the rows kernel only reads dout
    depth_attention_switched_backward_cuda(dsources, dquery, dnorm_weight, NULL, (float*)dout,
                                           NULL, NULL, NULL, NULL, alpha, key_rstd, sources,
                                           query, norm_weight, KernelSwitches{}, n_sources, N, C);
}

// ---- the depth attention and the RMSNorm of its output ----
// Mirrors src/depth_attention.c:depth_attention_rmsnorm_forward and _backward, which on the
// CPU call the two layers in turn; here the forward kernel does both in one launch (its step
// 5), and the backward rows kernel does the norm's backward first (its step 0), before the
// column sums' launch.
void depth_attention_rmsnorm_forward_cuda(float* xn, float* rstd, float* out, DepthSaved saved,
                                          const float* const* sources, DepthParams params,
                                          const float* weight, size_t n_sources, size_t N,
                                          size_t C) {
    depth_attention_switched_forward_cuda(xn, rstd, out, saved.alpha, saved.key_rstd, sources,
                                          params.query, params.norm, weight, KernelSwitches{},
                                          n_sources, N, C);
}

void depth_attention_rmsnorm_backward_cuda(float* const* dsources, DepthParams grads,
                                           float* dweight, float* dout_scratch, const float* dxn,
                                           const float* out, const float* rstd,
                                           const float* weight, DepthSaved saved,
                                           const float* const* sources, DepthParams params,
                                           size_t n_sources, size_t N, size_t C) {
    depth_attention_switched_backward_cuda(dsources, grads.query, grads.norm, dweight,
                                           dout_scratch, dxn, out, rstd, weight, saved.alpha,
                                           saved.key_rstd, sources, params.query, params.norm,
                                           KernelSwitches{}, n_sources, N, C);
}

// ---- the launchers, with SPEC's switches ----
// The layer functions above call these with every switch off; depth_variants.cu's one-head
// variants and mixings call them with theirs (depth_sources.cuh declares both). They launch
// this file's kernels with this file's block shape, which the shape builds (the Makefile's
// DEPTH_SHAPES) change by compiling this file alone with other -D values.
void depth_attention_switched_forward_cuda(float* xn, float* rstd, float* out, float* alpha,
                                           float* key_rstd, const float* const* sources,
                                           const float* query, const float* norm_weight,
                                           const float* weight, KernelSwitches sw,
                                           size_t n_sources, size_t N, size_t C) {
    launch_kernel(depth_attention_forward_kernel, ceil_div(N, DEPTH_ROWS), DEPTH_BLOCK, out,
                  alpha, key_rstd, source_list(sources, n_sources), query, norm_weight,
                  n_sources, N, C, xn, rstd, weight, sw);
}

// Every backward: the rows kernel (given dxn, the norm's backward first, into dout: then the
// caller's scratch), then the column sums (or, in the mixings, the coefficients' gradient and,
// given dweight, the column sums for it alone). The workspace holds acc_parts
// (N / DEPTH_ROWS, C), then gain_parts and dweight_parts as many, then weight_parts
// (N / DEPTH_ROWS, n_sources).
void depth_attention_switched_backward_cuda(float* const* dsources, float* dquery,
                                            float* dnorm_weight, float* dweight, float* dout,
                                            const float* dxn, const float* out,
                                            const float* rstd, const float* weight,
                                            const float* alpha, const float* key_rstd,
                                            const float* const* sources, const float* query,
                                            const float* norm_weight, KernelSwitches sw,
                                            size_t n_sources, size_t N, size_t C) {
    size_t parts = ceil_div(N, DEPTH_ROWS);
    float* acc_parts = cuda_workspace(depth_attention_workspace_floats_cuda(n_sources, N, C));
    float* gain_parts =
        sw.query_rows != NULL && dnorm_weight != NULL ? acc_parts + parts * C : NULL;
    float* dweight_parts = dxn != NULL && dweight != NULL ? acc_parts + 2 * parts * C : NULL;
    float* weight_parts = sw.weights != NULL ? acc_parts + 3 * parts * C : NULL;
    bool switched =
        sw.sigmoid || sw.query_rows != NULL || sw.weights != NULL || norm_weight == NULL;
    launch_kernel(switched ? depth_attention_backward_rows_kernel<true>
                           : depth_attention_backward_rows_kernel<false>,
                  (unsigned int)parts, DEPTH_BLOCK,
                  grad_list(dsources, n_sources), acc_parts, dout, alpha, key_rstd,
                  source_list(sources, n_sources), query, norm_weight, n_sources, N, C,
                  distinct_grads(dsources, n_sources), dweight_parts, dxn, out, rstd, weight, sw,
                  gain_parts, weight_parts);
    if (sw.weights != NULL)
        depth_mixing_coefficients_cuda(sw.dcoefficients, weight_parts, sw.weights, parts,
                                       n_sources, sw.normalise);
    if (sw.weights != NULL && dweight_parts == NULL) return;  // nothing left to sum
    depth_attention_parts_sum_cuda(dquery, dnorm_weight, dweight, acc_parts, gain_parts,
                                   dweight_parts, query, norm_weight, parts, C);
}
