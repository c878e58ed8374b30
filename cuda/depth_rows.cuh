// depth_rows.cuh — the block of rows that the depth attention's fast kernels share: the
// default operator's (depth_attention.cu) and those of SPEC's one-head variants and mixings
// (depth_variants.cu). Its shape, and the steps those kernels take on a row (loads, sums over
// a row, the weighted sum, the RMSNorm of the output each way, a column group's source
// gradients), so that each kernel reads as its steps and the two files compute them alike.
// Both files are compiled with the shape; the shape builds (dev/infra/gpu.mk's DEPTH_SHAPES)
// compile both with other -D values.
#ifndef ATTNRES_DEPTH_ROWS_CUH
#define ATTNRES_DEPTH_ROWS_CUH

#include <math.h>

#include "common.cuh"
#include "depth_sources.cuh"
#include "layers.cuh"

// A fast kernel gives one block of DEPTH_BLOCK threads to DEPTH_ROWS rows: the ROW_THREADS
// threads (64: two warps) of row r take its columns c = t, t + ROW_THREADS, ... (four each at
// C = 256), two at a time (DEPTH_COLS). At the model's sizes these kernels are bound by
// memory latency, not bandwidth (a row of 17 sources is 17 KB, the whole call a few MB, and at
// B T = 1024 rows the grid holds a quarter of the threads an H100 or H200 can run at once), so
// what counts is how many loads a thread has in flight before it waits. A thread takes the
// sources SOURCE_CHUNK at a time (depth_sources.cuh) and its columns DEPTH_COLS at a time (a
// column group: c, c + ROW_THREADS, ..., c + (DEPTH_COLS - 1) ROW_THREADS): it issues the
// loads of a group's columns for a chunk's sources together (DEPTH_COLS x SOURCE_CHUNK of
// them: 8 at 1 column, 32 at 4), and only then uses them. Taken a column at a time, a thread
// waits out one memory latency per column and chunk, since where the kernel writes between
// columns (h, the sources' gradients) the compiler may not move the next column's reads
// above the write. A thread still adds its columns in order of c, so every result is the
// same, bit for bit, whatever DEPTH_COLS is (checked under the emulator).
// The block's shape is the one a GPU timed fastest (docs/cuda.md has the numbers): `make
// gpu-check` builds and times the step with other shapes too (-DDEPTH_ROWS=..
// -DROW_THREADS=.. -DDEPTH_COLS=.., DEPTH_SHAPES), each checked against the CPU.
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
// Every fast kernel is compiled to fit at least 512 threads on a streaming multiprocessor (at
// most 128 registers a thread; 64 with blocks of 1024): with DEPTH_COLS 4 the backward holds
// 64 values of a group (its sources' and their gradients'), and left alone the compiler may
// take more than 128 registers (ptxas -v: 132 at 8 x 32 x 4), which fits one block of 256
// threads on an SM: the bench's blocks would run in twice the waves. Capped, it takes 128 and
// spills nothing (-warn-spills is an error in the Makefile).
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
// sum_c q_c g_c V_ic (load_key_weights; token_query (N,C) the query's per-token part, or NULL).
// Each of the row's threads sums its columns, each warp sums its lanes (warp_sum), and
// lane 0 of the row's warp `warp` writes warp_first[warp][i] and
// warp_second[warp][i]; the caller, after a barrier, adds the ROW_WARPS warps' sums in order
// of warp (sum_row_warps).
__device__ __forceinline__ void row_source_sums(
    float (*warp_first)[DEPTH_ATTENTION_MAX_SOURCES],
    float (*warp_second)[DEPTH_ATTENTION_MAX_SOURCES], const float* x_row,
    const SourceList& sources, const float* query, const float* token_query,
    const float* norm_weight, size_t n_sources, size_t row, size_t C, unsigned int t) {
    unsigned int warp = t / WARP_SIZE, lane = t % WARP_SIZE;
    const float* query_row = token_query != NULL ? token_query + row * C : NULL;
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
// ds_i rstd_i w_c g_c - ds_i rstd_i^3 (w . g V_i) / C * V_ic (key; depth_attention.cu's
// backward rows kernel derives it)
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

// what the fused norm's backward reads at a column group: dxn, h and its gain `weight` (1
// without one)
__device__ __forceinline__ void load_norm_columns(float dy_k[DEPTH_COLS], float x_k[DEPTH_COLS],
                                                  float weight_k[DEPTH_COLS], const float* dy,
                                                  const float* x, const float* weight,
                                                  size_t group, size_t C) {
    load_columns(dy_k, dy, group, C);
    load_columns(x_k, x, group, C);
    load_columns(weight_k, weight, group, C);
}

// alpha = softmax(score) of one row (score and row_alpha in shared memory, n_sources each):
// every thread of the row reads the scores in the same order; thread t writes alpha_i for
// i = t, t + ROW_THREADS, ... into row_alpha and into alpha_out (the row's saved alpha)
__device__ __forceinline__ void row_softmax(float* row_alpha, float* alpha_out, const float* score,
                                            size_t n_sources, unsigned int t) {
    float max_score = -INFINITY;
    for (size_t i = 0; i < n_sources; i++) max_score = fmaxf(max_score, score[i]);
    float sum = 0.0f;
    for (size_t i = 0; i < n_sources; i++) sum += expf(score[i] - max_score);
    for (size_t i = t; i < n_sources; i += ROW_THREADS) {
        row_alpha[i] = expf(score[i] - max_score) / sum;
        alpha_out[i] = row_alpha[i];
    }
}

// out_row (the row's C floats) = sum_i alpha_i V_i at this thread's columns of row `row`, in
// order of i, a column group's loads of SOURCE_CHUNK sources at a time; the group's outputs
// are written once all its sources are summed. alpha: the row's n_sources weights. Returns
// this thread's part of sum_c h_c^2, for the norm.
__device__ __forceinline__ float row_weighted_sum(float* out_row, const float* alpha,
                                                  const SourceList& sources, size_t n_sources,
                                                  size_t row, size_t C, unsigned int t) {
    float sum_sq = 0.0f;
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
                    if (first + j < n_sources) acc[k] += alpha[first + j] * v[k][j];
            }
        }
#pragma unroll
        for (int k = 0; k < DEPTH_COLS; k++) {
            size_t c = group + k * ROW_THREADS;
            if (c >= C) break;
            out_row[c] = acc[k];
            sum_sq += acc[k] * acc[k];
        }
    }
    return sum_sq;
}

// The RMSNorm of the row just written (src/rmsnorm.c:rmsnorm_forward; rmsnorm.cu's, with a
// row's ROW_THREADS threads in place of one warp): h_rstd = 1/sqrt(mean(h^2) + eps) from
// every thread's part sum_sq of the row, then xn = weight * h * h_rstd at the columns
// this thread wrote (weight NULL: all ones). Every thread of the block calls it (row_sum's
// barrier); a row past N (live false) only takes part.
__device__ __forceinline__ void row_rmsnorm_forward(float* xn, float* h_rstd, const float* h,
                                                    const float* weight,
                                                    float (*row_warps)[ROW_WARPS], float sum_sq,
                                                    bool live, size_t row, size_t C,
                                                    unsigned int r, unsigned int t) {
    float s = 1.0f / sqrtf(row_sum(row_warps, sum_sq, r, t) / (float)C + RMSNORM_EPS);
    if (!live) return;
    for (size_t group = t; group < C; group += GROUP_STRIDE) {
        float o[DEPTH_COLS], weight_k[DEPTH_COLS];
        load_columns(o, h + row * C, group, C);
        load_columns(weight_k, weight, group, C);
#pragma unroll
        for (int k = 0; k < DEPTH_COLS; k++) {
            size_t c = group + k * ROW_THREADS;
            if (c >= C) break;
            xn[row * C + c] = weight_k[k] * (o[k] * s);
        }
    }
    if (t == 0) h_rstd[row] = s;
}

// Its backward (src/rmsnorm.c:rmsnorm_backward, and its names: x the norm's input h, dy the
// gradient of its output xn, dx that of its input), from dxn into dx, the row's C floats of
// h's gradient: dx_c = rstd weight_c dy_c - rstd^3 (sum_j dy_j weight_j x_j) / C x_c, with
// the saved h_rstd. A thread writes its columns c = t, t + ROW_THREADS, ..., the same it
// then reads in the backward's steps 1 and 3, so no barrier stands between them; a column
// group's reads come before its writes. Every thread of the block calls it (row_sum).
__device__ __forceinline__ void row_rmsnorm_backward(float* dx, const float* dxn, const float* h,
                                                     const float* h_rstd, const float* weight,
                                                     float (*row_warps)[ROW_WARPS], bool live,
                                                     size_t row, size_t C, unsigned int r,
                                                     unsigned int t) {
    const float* dy = dxn + row * C;
    const float* x = h + row * C;
    float dot = 0.0f;  // sum_j dy_j weight_j x_j
    if (live) {
        for (size_t group = t; group < C; group += GROUP_STRIDE) {
            float dy_k[DEPTH_COLS], x_k[DEPTH_COLS], weight_k[DEPTH_COLS];
            load_norm_columns(dy_k, x_k, weight_k, dy, x, weight, group, C);
#pragma unroll
            for (int k = 0; k < DEPTH_COLS; k++)
                if (group + k * ROW_THREADS < C) dot += dy_k[k] * weight_k[k] * x_k[k];
        }
    }
    dot = row_sum(row_warps, dot, r, t);
    if (!live) return;
    float s = h_rstd[row], correction = s * s * s * dot / (float)C;
    for (size_t group = t; group < C; group += GROUP_STRIDE) {
        float dy_k[DEPTH_COLS], x_k[DEPTH_COLS], weight_k[DEPTH_COLS];
        load_norm_columns(dy_k, x_k, weight_k, dy, x, weight, group, C);
#pragma unroll
        for (int k = 0; k < DEPTH_COLS; k++) {
            size_t c = group + k * ROW_THREADS;
            if (c >= C) break;
            dx[c] = s * weight_k[k] * dy_k[k] - correction * x_k[k];
        }
    }
}

// Per source i of a row, what its gradient at a column takes (source_gradient), in shared
// memory: the value path's alpha_i (depth_variants.cu: a mixing's coefficient where it takes
// alpha's place), the key path's ds_i rstd_i and the key norm's correction
// ds_i rstd_i^3 ((w * g) . V_i) / C
struct SourceScales {
    float alpha[DEPTH_ATTENTION_MAX_SOURCES];
    float key[DEPTH_ATTENTION_MAX_SOURCES];
    float correction[DEPTH_ATTENTION_MAX_SOURCES];
};

// A column group's sources' gradients (the backward's step 3) at row `row`: for every source
// i, SOURCE_CHUNK at a time, dV_i += source_gradient at the group's columns, where wg and dy
// hold the group's w_c g_c and dout_c, and acc[k] += ds_i rstd_i V_ic. chunk_grads: a chunk's
// gradients are all read before any is written (distinct_grads), else each just before its
// write. (depth_variants.cu's switched kernel has the loop written out: it says why.)
__device__ __forceinline__ void add_source_gradients(float acc[DEPTH_COLS],
                                                     const GradList& dsources,
                                                     const SourceList& sources,
                                                     const SourceScales& scales,
                                                     const float wg[DEPTH_COLS],
                                                     const float dy[DEPTH_COLS], bool chunk_grads,
                                                     size_t n_sources, size_t row, size_t group,
                                                     size_t C) {
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
                        dv[k][j] + source_gradient(scales.alpha[i], scales.key[i],
                                                   scales.correction[i], dy[k], wg[k], v[k][j]);
                    acc[k] += scales.key[i] * v[k][j];  // ds_i rstd_i V_i
                }
            }
        }
    }
}

// The block's part of a sum over rows at a thread's column group + k ROW_THREADS: the
// DEPTH_ROWS rows' values (0 for a row past N) in order of row
__device__ __forceinline__ float block_rows_sum(const float (*values)[DEPTH_COLS][ROW_THREADS],
                                                int k, unsigned int t) {
    float sum = 0.0f;
    for (int r = 0; r < DEPTH_ROWS; r++) sum += values[r][k][t];
    return sum;
}

// depth_attention.cu's sums of the parts of the parameters' gradients that a backward wrote
// (parts, C) each, in fixed orders (the fast kernels' blocks of rows; the many-head kernels'
// rows): dquery += g * sum acc_parts (g = norm_weight, 1 when NULL; dquery NULL: none);
// dnorm_weight (when not NULL) += the sum of gain_parts, or query * sum acc_parts when
// gain_parts is NULL; dweight += the sum of dweight_parts when that is not NULL
void depth_attention_parts_sum_cuda(float* dquery, float* dnorm_weight, float* dweight,
                                    const float* acc_parts, const float* gain_parts,
                                    const float* dweight_parts, const float* query,
                                    const float* norm_weight, size_t parts, size_t C);

#endif
