// depth_variants.cu — SPEC's variants of the depth attention on the GPU (mirror of
// src/depth_variants.c): the attention with every switch, the two mixings, and
// attnres_input_forward_cuda and its backward, the model's one call for any AttnRes operator.
//
// The attention, per row (position) n and head k (channels c of group k, Ck = C / heads):
//   q      = w + u_n                (u_n = token_query[n] with --depth-query input, else 0)
//   r_i    = (mean_{c in k}(V_i^2) + eps)^(-1/2)   (key norm on)   or 1 (--key-norm off)
//   s_i    = sum_{c in k} q_c g_c V_ic r_i          (g = 1 when the key norm is off)
//   alpha  = softmax_i(s)   or   alpha_i = sigmoid(s_i) (--depth-score sigmoid: no normaliser)
//   h_c  = sum_i alpha_i V_ic
// alpha and key_rstd are (N, n_sources, heads): entry (n, i, k) at (n * n_sources + i) * heads + k.
//
// The mixings, one weight per source for every row (no query, no keys):
//   static: alpha = softmax(c_0 .. c_{n-1})   dense (DenseFormer): beta_i = c_i
//   h = sum_i weight_i V_i
//
// With one head, and in the mixings, the layers run this file's first two kernels,
// depth_attention_switched_forward_kernel and depth_attention_switched_backward_rows_kernel:
// depth_attention.cu's two fast kernels with the switches added (DepthSwitches, DepthSaved's
// token_query, a NULL key-norm gain), built from the same row steps (depth_rows.cuh), so they
// take the same block shape and loads, fuse the RMSNorm each way, and compute what those do
// when every switch is off. The mixings' coefficients get their gradient from
// depth_mixing_coefficients_kernel. The kernels after them take more heads: a block of
// VARIANT_BLOCK threads per row, each way, the RMSNorm fused too (the backward writes its
// row's parts of the parameters' gradients, which depth_attention.cu's sum of parts adds up
// in a fixed order, one launch for all three). In a row, groups of lanes (head_lanes: 16 at 16
// channels a head, a whole warp from 32 up) share out the (source, head) pairs for the sums
// over a head's channels, threads share out the heads for the softmax, then the columns for
// the sums over sources. A thread that owns column c of a row adds every source's gradient
// there, in order of the sources, SOURCE_CHUNK sources at a time (depth_sources.cuh): a
// chunk's values, gradients and coefficients read before any gradient is written, or, where
// a tensor is passed as two sources (its gradient sums both uses), each gradient read after
// the write before it.
#include <math.h>

#include "common.cuh"
#include "depth_rows.cuh"
#include "depth_sources.cuh"
#include "layers.cuh"

// What the variants' backward kernels write besides the sources' gradients (NULL: not
// written). The sums over rows come in parts, one a block of DEPTH_ROWS rows (one head) or a
// row (more heads), which depth_attention_parts_sum_cuda and depth_mixing_coefficients_cuda
// add in a fixed order. (It travels to the kernels by value, so it has no padding:
// depth_sources.cuh says why.)
struct VariantOutputs {
    float* acc_parts;      // (parts, C) sum_i ds_i r_i V_i: dq = g acc, dg = q acc
    float* gain_parts;     // (parts, C) dg's q acc, where q differs from row to row
    float* dweight_parts;  // (parts, C) the fused norm's gain: dxn h rstd
    float* mixing_parts;   // (parts, n_sources) the mixings: dweight_i = sum_n dalpha_ni
    float* dtoken_query;   // (N, C) the query's per-token part: dq_n = g acc_n, +=
    float* dscore;         // (N, n_sources, heads) more heads: dalpha, then ds
    float* key_dot;        // (N, n_sources, heads) more heads: (q * g) . V_i
};
static_assert(sizeof(VariantOutputs) == 7 * sizeof(float*), "VariantOutputs has no padding");

// ---- one head, and the mixings: depth_attention.cu's kernels with the switches ----

// Mirrors src/depth_variants.c:depth_attention_variant_forward with one head, and
// src/depth_variants.c:depth_mixing_forward, each with the norm after it; it is
// depth_attention.cu's depth_attention_forward_kernel (the steps there) with the switches:
// without the key norm (params.norm NULL) rstd_i = 1 and g = 1; with saved.token_query the
// query is w + u_n; with switches.sigmoid alpha_i = sigmoid(s_i); in the mixings
// (switches.mixing) alpha = saved.alpha, the n_sources weights, for every row, no scores, and
// saved.alpha and saved.key_rstd are not written.
// Threads: block b, rows R b .. R b + R-1 (R = DEPTH_ROWS, 4); a row's thread t, columns t,
// t + ROW_THREADS (64), ... (steps 2-3: thread t takes source t)
__global__ void __launch_bounds__(DEPTH_BLOCK, DEPTH_MIN_BLOCKS)
depth_attention_switched_forward_kernel(float* xn, float* h_rstd, float* h, DepthSaved saved,
                                        SourceList sources, DepthParams params,
                                        const float* weight, size_t n_sources, size_t N, size_t C,
                                        DepthSwitches switches) {
    __shared__ float warp_sq[DEPTH_ROWS][ROW_WARPS][DEPTH_ATTENTION_MAX_SOURCES];
    __shared__ float warp_dot[DEPTH_ROWS][ROW_WARPS][DEPTH_ATTENTION_MAX_SOURCES];
    __shared__ float score[DEPTH_ROWS][DEPTH_ATTENTION_MAX_SOURCES];
    __shared__ float row_alpha[DEPTH_ROWS][DEPTH_ATTENTION_MAX_SOURCES];
    __shared__ float h_sq[DEPTH_ROWS][ROW_WARPS];
    unsigned int r = threadIdx.x / ROW_THREADS, t = threadIdx.x % ROW_THREADS;
    size_t row = (size_t)blockIdx.x * DEPTH_ROWS + r;
    bool live = row < N;  // the last block's rows past N only take part in the barriers
    bool scored = !switches.mixing;  // the same for the whole grid
    const float* token_query = saved.token_query;
    // 1. per source, sum V^2 and (w * g) . V
    if (live && scored)
        row_source_sums(warp_sq[r], warp_dot[r], NULL, sources, params.query, token_query,
                        params.norm, n_sources, row, C, t);
    __syncthreads();
    // 2. the scores, thread i of the row for source i
    if (live && scored) {
        for (size_t i = t; i < n_sources; i += ROW_THREADS) {
            float rstd = params.norm == NULL
                             ? 1.0f
                             : 1.0f / sqrtf(sum_row_warps(warp_sq[r], i) / (float)C + RMSNORM_EPS);
            saved.key_rstd[row * n_sources + i] = rstd;
            score[r][i] = sum_row_warps(warp_dot[r], i) * rstd;
        }
    }
    __syncthreads();
    // 3. the weights: the softmax (every thread of the row reads the scores in the same order),
    //    the sigmoid, or the mixing's; thread i writes alpha_i
    if (live && !scored) {
        for (size_t i = t; i < n_sources; i += ROW_THREADS) row_alpha[r][i] = saved.alpha[i];
    } else if (live && switches.sigmoid) {
        for (size_t i = t; i < n_sources; i += ROW_THREADS) {
            row_alpha[r][i] = 1.0f / (1.0f + expf(-score[r][i]));
            saved.alpha[row * n_sources + i] = row_alpha[r][i];
        }
    } else if (live) {
        row_softmax(row_alpha[r], saved.alpha + row * n_sources, score[r], n_sources, t);
    }
    __syncthreads();
    // 4. the weighted sum, in order of i
    float sum_sq = live ? row_weighted_sum(h + row * C, row_alpha[r], sources, n_sources, row,
                                           C, t)
                        : 0.0f;  // this thread's part of sum_c h_c^2
    if (xn == NULL) return;  // the same for the whole grid
    // 5. the RMSNorm of the row: each thread reads back the columns it wrote in step 4
    row_rmsnorm_forward(xn, h_rstd, h, weight, h_sq, sum_sq, live, row, C, r, t);
}

// Mirrors src/depth_variants.c:depth_attention_variant_backward with one head, and
// src/depth_variants.c:depth_mixing_backward, each with the norm's backward before it; it is
// depth_attention.cu's depth_attention_backward_rows_kernel (its steps and formulas there)
// with the switches, as in the forward: without the key norm rstd_i = 1, g = 1 and no
// correction term; sigmoid: ds_i = dalpha_i alpha_i (1 - alpha_i); with a per-token part of the
// query (q = w + u_n), dq_n = g acc_n per row into outputs.dtoken_query (+=) and dg =
// sum_n q_n acc_n, the block's part in outputs.gain_parts; the mixings: no key path (ds = 0,
// acc = 0), and the block's part of dweight_i = sum_n dalpha_ni in outputs.mixing_parts. The
// block's parts of acc and of the norm's gain go to outputs.acc_parts and
// outputs.dweight_parts (NULL: no gain).
// Threads: block b, rows R b .. R b + R-1 (R = DEPTH_ROWS, 4); a row's thread t, columns t,
// t + ROW_THREADS (64), ... (step 2: thread t takes source t)
__global__ void __launch_bounds__(DEPTH_BLOCK, DEPTH_MIN_BLOCKS)
depth_attention_switched_backward_rows_kernel(GradList dsources, VariantOutputs outputs,
                                              float* dh, const float* dxn, const float* h,
                                              const float* h_rstd, const float* weight,
                                              DepthSaved saved, SourceList sources,
                                              DepthParams params, size_t n_sources, size_t N,
                                              size_t C, int distinct, DepthSwitches switches) {
    const float* query = params.query;            // NULL in the mixings
    const float* norm_weight = params.norm;       // NULL: no key norm
    const float* token_query = saved.token_query;   // NULL: no per-token part
    const float* weights = switches.mixing ? saved.alpha : NULL;  // the mixings' weights
    const bool key_norm = norm_weight != NULL;
    // a chunk of gradients read before any is written (distinct), except at 4 columns a
    // thread: there each is read just before its write (as where a tensor is passed twice),
    // holding 32 registers fewer, which a block of 512 threads (8 x 64 x 4) needs to fit in
    // its 128 (depth_attention.cu's kernel, without the switches' code, fits reading chunks)
    const bool chunk_grads = distinct && DEPTH_COLS < 4;
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
        row_source_sums(warp_dy[r], warp_wg[r], dy, sources, query, token_query, norm_weight,
                        n_sources, row, C, t);
    __syncthreads();
    // 2. the scores' backward: dalpha first, then every thread of the row sums
    //    alpha_j dalpha_j in the same order (softmax), and thread i gives source i its
    //    coefficients
    if (live) {
        for (size_t i = t; i < n_sources; i += ROW_THREADS) {
            dalpha[r][i] = sum_row_warps(warp_dy[r], i);
            scales[r].alpha[i] = weights != NULL ? weights[i] : saved.alpha[row * n_sources + i];
        }
    }
    __syncthreads();
    if (live) {
        float alpha_dot_dalpha = 0.0f;
        for (size_t j = 0; j < n_sources; j++)
            alpha_dot_dalpha += scales[r].alpha[j] * dalpha[r][j];
        for (size_t i = t; i < n_sources; i += ROW_THREADS) {
            float a = scales[r].alpha[i];
            float ds = weights != NULL    ? 0.0f
                       : switches.sigmoid ? dalpha[r][i] * a * (1.0f - a)
                                          : a * (dalpha[r][i] - alpha_dot_dalpha);
            float rstd = key_norm ? saved.key_rstd[row * n_sources + i] : 1.0f;
            scales[r].key[i] = ds * rstd;
            scales[r].correction[i] =
                key_norm ? ds * rstd * rstd * rstd * sum_row_warps(warp_wg[r], i) / (float)C
                         : 0.0f;
        }
    }
    // the mixings: the block's part of dweight, its rows in order
    if (outputs.mixing_parts != NULL && r == 0) {
        for (size_t i = t; i < n_sources; i += ROW_THREADS) {
            float sum = 0.0f;
            for (int q = 0; q < DEPTH_ROWS && blockIdx.x * DEPTH_ROWS + q < N; q++)
                sum += dalpha[q][i];
            outputs.mixing_parts[blockIdx.x * n_sources + i] = sum;
        }
    }
    __syncthreads();
    // 3. the sources' gradients, a column group and a chunk of sources at a time: read the
    //    values and gradients of them all, then write the gradients; then the block's part of
    //    acc (and of dg with the query's per-token part), its rows in order
    for (size_t first_c = 0; first_c < C; first_c += GROUP_STRIDE) {
        size_t group = first_c + t;  // this thread's columns: group + k ROW_THREADS
        float acc[DEPTH_COLS];
#pragma unroll
        for (int k = 0; k < DEPTH_COLS; k++) acc[k] = 0.0f;
        if (live) {
            float wg[DEPTH_COLS], dy_c[DEPTH_COLS];
            load_key_weights(wg, query, token_query != NULL ? token_query + row * C : NULL,
                             norm_weight, group, C);
            load_columns(dy_c, dy, group, C);
            // add_source_gradients' loop, written out: through the helper ptxas gives this
            // kernel 18 more registers, and at 4 columns a thread it spills
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
                                dv[k][j] + source_gradient(scales[r].alpha[i], scales[r].key[i],
                                                           scales[r].correction[i], dy_c[k], wg[k],
                                                           v[k][j]);
                            acc[k] += scales[r].key[i] * v[k][j];  // ds_i rstd_i V_i
                        }
                    }
                }
            }
        }
#pragma unroll
        for (int k = 0; k < DEPTH_COLS; k++) {
            size_t c = group + k * ROW_THREADS;
            row_acc[r][k][t] = acc[k];  // 0 past N or C (and in the mixings)
            if (outputs.dweight_parts != NULL)
                row_dweight[r][k][t] = live && c < C
                                        ? dxn[row * C + c] * h[row * C + c] * h_rstd[row]
                                        : 0.0f;
        }
        __syncthreads();
        // the block's parts, its rows in order: acc, the norm gain's terms and, with the
        // query's per-token part, dg's q_n acc_n (q from each row's u_n)
        if (r == 0) {
#pragma unroll
            for (int k = 0; k < DEPTH_COLS; k++) {
                size_t c = group + k * ROW_THREADS;
                if (c >= C) break;
                outputs.acc_parts[blockIdx.x * C + c] = block_rows_sum(row_acc, k, t);
                if (outputs.gain_parts != NULL) {
                    float gain_sum = 0.0f;
                    for (int block_row = 0;
                         block_row < DEPTH_ROWS && blockIdx.x * DEPTH_ROWS + block_row < N;
                         block_row++) {
                        size_t at = (blockIdx.x * DEPTH_ROWS + block_row) * C + c;
                        gain_sum += (query[c] + token_query[at]) * row_acc[block_row][k][t];
                    }
                    outputs.gain_parts[blockIdx.x * C + c] = gain_sum;
                }
                if (outputs.dweight_parts != NULL)
                    outputs.dweight_parts[blockIdx.x * C + c] = block_rows_sum(row_dweight, k, t);
            }
        }
        // with the query's per-token part: dq_n = g acc_n into the row's dtoken_query
        if (token_query != NULL && live) {
#pragma unroll
            for (int k = 0; k < DEPTH_COLS; k++) {
                size_t c = group + k * ROW_THREADS;
                if (c >= C) break;
                outputs.dtoken_query[row * C + c] +=
                    (norm_weight != NULL ? norm_weight[c] : 1.0f) * row_acc[r][k][t];
            }
        }
        __syncthreads();  // row_acc and row_dweight are written again by the next columns
    }
}

// weights = softmax(coefficients) (normalise) or the coefficients; one thread per source,
// each reading the coefficients in the same order. (Launched by depth_mixing_rmsnorm_forward,
// the mixings' forward, before the switched kernel: no launcher of its own.)
__global__ void depth_mixing_weights_kernel(float* weights, const float* coefficients,
                                            size_t n_sources, int normalise) {
    for (size_t i = threadIdx.x; i < n_sources; i += blockDim.x) {
        if (!normalise) {
            weights[i] = coefficients[i];
            continue;
        }
        float max_coefficient = -INFINITY, sum = 0.0f;
        for (size_t j = 0; j < n_sources; j++) max_coefficient = fmaxf(max_coefficient, coefficients[j]);
        for (size_t j = 0; j < n_sources; j++) sum += expf(coefficients[j] - max_coefficient);
        weights[i] = expf(coefficients[i] - max_coefficient) / sum;
    }
}

// The mixings' coefficients (forward: weights = softmax(coefficients) when normalise, else
// the coefficients): dweight_i = the sum of weight_parts[part][i] over the parts, then static:
// dc_i += weight_i (dweight_i - sum_j weight_j dweight_j); dense: dc_i += dweight_i. One
// block of MIX_GROUPS x DEPTH_ATTENTION_MAX_SOURCES threads: thread (group r, source i) sums
// the parts r, r + MIX_GROUPS, ... in order (PART_CHUNK loaded at once), then group 0 adds
// the MIX_GROUPS sums in order of r.
#define MIX_GROUPS 16
__global__ void depth_mixing_coefficients_kernel(float* dcoefficients, const float* weight_parts,
                                                 const float* weights, size_t parts,
                                                 size_t n_sources, int normalise) {
    __shared__ float group_sum[MIX_GROUPS][DEPTH_ATTENTION_MAX_SOURCES];
    __shared__ float dweight[DEPTH_ATTENTION_MAX_SOURCES];
    unsigned int i = threadIdx.x % DEPTH_ATTENTION_MAX_SOURCES;
    unsigned int group = threadIdx.x / DEPTH_ATTENTION_MAX_SOURCES;
    float sum = 0.0f;
    if (i < n_sources) {
        for (size_t first = group; first < parts; first += PART_CHUNK * MIX_GROUPS) {
            float loaded[PART_CHUNK];
#pragma unroll
            for (int k = 0; k < PART_CHUNK; k++) {
                size_t part = first + k * MIX_GROUPS;
                loaded[k] = part < parts ? weight_parts[part * n_sources + i] : 0.0f;
            }
#pragma unroll
            for (int k = 0; k < PART_CHUNK; k++)
                if (first + k * MIX_GROUPS < parts) sum += loaded[k];
        }
    }
    group_sum[group][i] = sum;
    __syncthreads();
    if (group == 0 && i < n_sources) {
        float total = 0.0f;
        for (int r = 0; r < MIX_GROUPS; r++) total += group_sum[r][i];
        dweight[i] = total;
    }
    __syncthreads();
    if (group != 0 || i >= n_sources) return;
    float weighted = 0.0f;  // sum_j weight_j dweight_j, every thread in the same order
    for (size_t j = 0; j < n_sources; j++) weighted += weights[j] * dweight[j];
    dcoefficients[i] += normalise ? weights[i] * (dweight[i] - weighted) : dweight[i];
}

static void depth_mixing_coefficients_cuda(float* dcoefficients, const float* weight_parts,
                                           const float* weights, size_t parts, size_t n_sources,
                                           int normalise) {
    launch_kernel(depth_mixing_coefficients_kernel, 1, MIX_GROUPS * DEPTH_ATTENTION_MAX_SOURCES,
                  dcoefficients, weight_parts, weights, parts, n_sources, normalise);
}

// what the one-head backward borrows of the workspace (common.cuh): acc_parts, gain_parts and
// dweight_parts (N / DEPTH_ROWS, C) each, then mixing_parts (N / DEPTH_ROWS, n_sources)
static size_t one_head_workspace_floats(size_t n_sources, size_t N, size_t C) {
    return (size_t)ceil_div(N, DEPTH_ROWS) * (3 * C + n_sources);
}

// The one-head kernels' launches, with the layers' arguments (xn NULL: no norm).
static void depth_attention_switched_forward_cuda(float* xn, float* rstd, float* h,
                                                  DepthSaved saved, const float* const* sources,
                                                  DepthParams params, const float* weight,
                                                  size_t n_sources, size_t N, size_t C,
                                                  DepthSwitches switches) {
    launch_kernel(depth_attention_switched_forward_kernel, ceil_div(N, DEPTH_ROWS), DEPTH_BLOCK,
                  xn, rstd, h, saved, source_list(sources, n_sources), params, weight,
                  n_sources, N, C, switches);
}

// Every backward with one head, and the mixings': the rows kernel (given dxn, the norm's
// backward first, into scratch.dh; without, scratch.dh is read as h's gradient), then the
// column sums (or, in the mixings, the coefficients' gradient into grads.mix and, given
// dweight, the column sums for it alone). grads and scratch.dtoken_query as the layers have
// them (NULL: none). The workspace holds acc_parts (N / DEPTH_ROWS, C), then gain_parts and
// dweight_parts as many, then mixing_parts (N / DEPTH_ROWS, n_sources).
static void depth_attention_switched_backward_cuda(float* const* dsources, DepthParams grads,
                                                   float* dweight, DepthScratch scratch,
                                                   const float* dxn, const float* h,
                                                   const float* rstd, const float* weight,
                                                   DepthSaved saved, const float* const* sources,
                                                   DepthParams params, size_t n_sources, size_t N,
                                                   size_t C, DepthSwitches switches) {
    size_t parts = ceil_div(N, DEPTH_ROWS);
    float* acc_parts = cuda_workspace(one_head_workspace_floats(n_sources, N, C));
    float* gain_parts =
        saved.token_query != NULL && grads.norm != NULL ? acc_parts + parts * C : NULL;
    float* dweight_parts = dxn != NULL && dweight != NULL ? acc_parts + 2 * parts * C : NULL;
    float* mixing_parts = switches.mixing ? acc_parts + 3 * parts * C : NULL;
    VariantOutputs outputs = {acc_parts, gain_parts, dweight_parts, mixing_parts,
                              scratch.dtoken_query, NULL, NULL};
    launch_kernel(depth_attention_switched_backward_rows_kernel, (unsigned int)parts, DEPTH_BLOCK,
                  grad_list(dsources, n_sources), outputs, scratch.dh, dxn, h, rstd, weight,
                  saved, source_list(sources, n_sources), params, n_sources, N, C,
                  distinct_grads(dsources, n_sources), switches);
    if (switches.mixing)
        depth_mixing_coefficients_cuda(grads.mix, mixing_parts, saved.alpha, parts, n_sources,
                                       switches.mixing == 1);
    if (switches.mixing && dweight_parts == NULL) return;  // nothing left to sum
    depth_attention_parts_sum_cuda(grads.query, grads.norm, dweight, acc_parts, gain_parts,
                                   dweight_parts, params.query, params.norm, parts, C);
}

// ---- more heads: a block per row ----
#define VARIANT_BLOCK 256

// The lanes that share one (source, head) pair's sums over the head's Ck channels: the
// largest power of two up to Ck and the warp's 32, so a warp takes 32 / head_lanes pairs at
// once (two at Ck = 16: 16 heads at C = 256) and no lane is left without a channel.
__device__ __forceinline__ unsigned int head_lanes(size_t Ck) {
    unsigned int lanes = 1;
    while (lanes * 2 <= Ck && lanes * 2 <= WARP_SIZE) lanes *= 2;
    return lanes;
}

// For one group of `lanes` lanes (head_lanes; groups aligned within the warp), over the
// channels of head k of row `row` (x and v point to the row's C floats): dot_x = x . v and
// dot_query = (q * g) . v, q = w + u_row the query (g = 1 without key norm); a lane takes the
// channels k Ck + l, k Ck + l + lanes, ... (l its place in the group), then the group adds its
// lanes' sums by shuffles that stay inside it; every lane of the group gets both sums. Every
// lane of the warp must call it together (the shuffles take the whole warp).
__device__ __forceinline__ void head_dots(float& dot_x, float& dot_query, const float* x,
                                          const float* v, const float* query,
                                          const float* token_query, const float* norm_weight,
                                          size_t row, size_t C, size_t k, size_t Ck,
                                          unsigned int lanes) {
    unsigned int place = threadIdx.x % lanes;
    dot_x = 0.0f;
    dot_query = 0.0f;
    for (size_t c = k * Ck + place; c < (k + 1) * Ck; c += lanes) {
        float q = query[c] + (token_query != NULL ? token_query[row * C + c] : 0.0f);
        dot_x += x[c] * v[c];
        dot_query += (norm_weight != NULL ? q * norm_weight[c] : q) * v[c];
    }
    for (unsigned int offset = lanes / 2; offset > 0; offset /= 2) {
        dot_x += __shfl_xor_sync(FULL_MASK, dot_x, offset);
        dot_query += __shfl_xor_sync(FULL_MASK, dot_query, offset);
    }
}

// The sum over the block of one value per thread: each warp sums its lanes, lane 0 writes its
// warp's sum to warp_sums, and after a barrier every thread adds them in order of warp. Every
// thread of the block must call it.
__device__ __forceinline__ float block_sum(float x, float warp_sums[VARIANT_BLOCK / WARP_SIZE]) {
    x = warp_sum(x);
    if (threadIdx.x % WARP_SIZE == 0) warp_sums[threadIdx.x / WARP_SIZE] = x;
    __syncthreads();
    float sum = 0.0f;
    for (unsigned int warp = 0; warp < blockDim.x / WARP_SIZE; warp++) sum += warp_sums[warp];
    return sum;
}
// s_i = r_i * (q * g) . V_i per (source, head), then alpha = softmax or sigmoid per head,
// then h = sum_i alpha_i V_i; one block per row. The scores wait in alpha until step 2.
// With xn not NULL, then the row's RMSNorm (as depth_attention.cu's fused forward):
// xn = weight * h * h_rstd, h_rstd = 1/sqrt(mean(h^2) + eps), weight NULL for ones.
// Launched by depth_attention_variant_rmsnorm_forward.
__global__ void depth_attention_variant_forward_kernel(float* xn, float* h_rstd, float* h,
                                                       DepthSaved saved, SourceList sources,
                                                       DepthParams params, const float* weight,
                                                       size_t n_sources, size_t C,
                                                       DepthSwitches switches) {
    // the names of the formulas above
    float *alpha = saved.alpha, *key_rstd = saved.key_rstd;
    const float *query = params.query, *token_query = saved.token_query;
    const float* norm_weight = params.norm;
    size_t heads = switches.heads;
    int sigmoid = switches.sigmoid;
    __shared__ float warp_sums[VARIANT_BLOCK / WARP_SIZE];
    size_t row = blockIdx.x, Ck = C / heads, S = n_sources;
    unsigned int warp = threadIdx.x / WARP_SIZE, lane = threadIdx.x % WARP_SIZE;
    unsigned int n_warps = blockDim.x / WARP_SIZE;
    float* a = alpha + row * S * heads;
    // 1. the scores, a group of head_lanes lanes per (source i, head k)
    unsigned int lanes = head_lanes(Ck), per_warp = WARP_SIZE / lanes;
    for (size_t first = warp * per_warp; first < S * heads; first += n_warps * per_warp) {
        // the warp's groups take the pairs first, first + 1, ...; a group past the last pair
        // sums pair 0 again (the shuffles need every lane) and writes nothing
        size_t pair = first + lane / lanes < S * heads ? first + lane / lanes : 0;
        size_t i = pair / heads, k = pair % heads;
        const float* v = sources.source[i] + row * C;
        float sum_sq, dot;
        head_dots(sum_sq, dot, v, v, query, token_query, norm_weight, row, C, k, Ck, lanes);
        float r = norm_weight != NULL ? 1.0f / sqrtf(sum_sq / (float)Ck + RMSNORM_EPS) : 1.0f;
        if (lane % lanes == 0 && first + lane / lanes < S * heads) {
            key_rstd[row * S * heads + pair] = r;
            a[pair] = dot * r;
        }
    }
    __syncthreads();
    // 2. the weights, one thread per head: sigmoid, or softmax over the sources in order
    for (size_t k = threadIdx.x; k < heads; k += blockDim.x) {
        if (sigmoid) {
            for (size_t i = 0; i < S; i++) a[i * heads + k] = 1.0f / (1.0f + expf(-a[i * heads + k]));
            continue;
        }
        float max_score = -INFINITY, sum = 0.0f;
        for (size_t i = 0; i < S; i++) max_score = fmaxf(max_score, a[i * heads + k]);
        for (size_t i = 0; i < S; i++) {
            a[i * heads + k] = expf(a[i * heads + k] - max_score);
            sum += a[i * heads + k];
        }
        for (size_t i = 0; i < S; i++) a[i * heads + k] /= sum;
    }
    __syncthreads();
    // 3. the weighted sum, one thread per column
    float sum_sq = 0.0f;  // this thread's part of sum_c h_c^2
    for (size_t c = threadIdx.x; c < C; c += blockDim.x) {
        size_t k = c / Ck;
        float acc = 0.0f;
        for (size_t i = 0; i < S; i++) acc += a[i * heads + k] * sources.source[i][row * C + c];
        h[row * C + c] = acc;
        sum_sq += acc * acc;
    }
    if (xn == NULL) return;  // the same for the whole grid
    // 4. the RMSNorm of the row: each thread reads back the columns it wrote in step 3
    float s = 1.0f / sqrtf(block_sum(sum_sq, warp_sums) / (float)C + RMSNORM_EPS);
    for (size_t c = threadIdx.x; c < C; c += blockDim.x)
        xn[row * C + c] = (weight != NULL ? weight[c] : 1.0f) * (h[row * C + c] * s);
    if (threadIdx.x == 0) h_rstd[row] = s;
}
// forward was: h_c = sum_i alpha_i V_ic, alpha = softmax(s) or sigmoid(s),
// s_i = (q * g) . V_i * r_i over the head's channels. Per row and head:
//   dalpha_i = dh . V_i
//   softmax: ds_i = alpha_i (dalpha_i - sum_j alpha_j dalpha_j);  sigmoid: ds_i = dalpha_i alpha_i (1 - alpha_i)
//   dV_i += alpha_i dh + ds_i r_i (q * g) - ds_i r_i^3 ((q * g) . V_i) / Ck * V_i
//     (key norm off: r = 1, g = 1, no last term)
//   with acc_c = sum_i ds_i r_i V_ic: dq_c = g_c acc_c (into dtoken_query, when the query has a
//   per-token part, and summed over rows into dquery), dg_c = q_c acc_c (summed over rows)
// One block per row; outputs (VariantOutputs, a part a row): dscore and key_dot hold dalpha,
// then ds, and (q * g) . V_i; acc_parts and gain_parts the row's acc and dg = q acc, which
// the caller sums over the rows (dq = g acc). With dxn not NULL the kernel first takes dxn
// back through the row's RMSNorm (saved h_rstd, gain weight) into dh (the caller's
// scratch; step 0, as depth_attention.cu's fused backward), and writes the row's terms of the
// gain's gradient, dxn_c h_c h_rstd, to dweight_parts when not NULL. Launched by
// depth_attention_variant_rmsnorm_backward.
__global__ void depth_attention_variant_backward_kernel(GradList dsources, VariantOutputs outputs,
                                                        float* dh, const float* dxn,
                                                        const float* h, const float* h_rstd,
                                                        const float* weight, DepthSaved saved,
                                                        SourceList sources, DepthParams params,
                                                        size_t n_sources, size_t C, int distinct,
                                                        DepthSwitches switches) {
    // the names of the formulas above
    float *dtoken_query = outputs.dtoken_query, *row_acc = outputs.acc_parts;
    float *row_gain = outputs.gain_parts, *row_dweight = outputs.dweight_parts;
    float *dscore = outputs.dscore, *key_dot = outputs.key_dot;
    const float *alpha = saved.alpha, *key_rstd = saved.key_rstd;
    const float *query = params.query, *token_query = saved.token_query;
    const float* norm_weight = params.norm;
    size_t heads = switches.heads;
    int sigmoid = switches.sigmoid;
    __shared__ float warp_sums[VARIANT_BLOCK / WARP_SIZE];
    size_t row = blockIdx.x, Ck = C / heads, S = n_sources;
    unsigned int warp = threadIdx.x / WARP_SIZE, lane = threadIdx.x % WARP_SIZE;
    unsigned int n_warps = blockDim.x / WARP_SIZE;
    // 0. (with the norm) dout_c = rstd weight_c dxn_c - rstd^3 (sum_j dxn_j weight_j out_j) / C
    //    h_c, then a barrier: step 1 reads every column of the row
    if (dxn != NULL) {
        size_t first = row * C;
        float dot = 0.0f;
        for (size_t c = threadIdx.x; c < C; c += blockDim.x)
            dot += dxn[first + c] * (weight != NULL ? weight[c] : 1.0f) * h[first + c];
        dot = block_sum(dot, warp_sums);
        float s = h_rstd[row], correction = s * s * s * dot / (float)C;
        for (size_t c = threadIdx.x; c < C; c += blockDim.x) {
            float w = weight != NULL ? weight[c] : 1.0f;
            dh[first + c] = s * w * dxn[first + c] - correction * h[first + c];
            if (row_dweight != NULL) row_dweight[first + c] = dxn[first + c] * h[first + c] * s;
        }
        __syncthreads();
    }
    const float* d = dh + row * C;
    const float* a = alpha + row * S * heads;
    const float* rs = key_rstd + row * S * heads;
    float* ds = dscore + row * S * heads;
    float* kd = key_dot + row * S * heads;
    // 1. dalpha and (q * g) . V_i, a group of head_lanes lanes per (source i, head k)
    unsigned int lanes = head_lanes(Ck), per_warp = WARP_SIZE / lanes;
    for (size_t first = warp * per_warp; first < S * heads; first += n_warps * per_warp) {
        // as in the forward: a group past the last pair sums pair 0 and writes nothing
        size_t pair = first + lane / lanes < S * heads ? first + lane / lanes : 0;
        size_t i = pair / heads, k = pair % heads;
        float dot_dout, dot_query;
        head_dots(dot_dout, dot_query, d, sources.source[i] + row * C, query, token_query,
                  norm_weight, row, C, k, Ck, lanes);
        if (lane % lanes == 0 && first + lane / lanes < S * heads) {
            ds[pair] = dot_dout;
            kd[pair] = dot_query;
        }
    }
    __syncthreads();
    // 2. ds from dalpha, one thread per head
    for (size_t k = threadIdx.x; k < heads; k += blockDim.x) {
        float weighted = 0.0f;  // sum_j alpha_j dalpha_j (softmax)
        for (size_t i = 0; i < S; i++) weighted += a[i * heads + k] * ds[i * heads + k];
        for (size_t i = 0; i < S; i++) {
            float ai = a[i * heads + k], dalpha = ds[i * heads + k];
            ds[i * heads + k] = sigmoid ? dalpha * ai * (1.0f - ai) : ai * (dalpha - weighted);
        }
    }
    __syncthreads();
    // 3. the sources' gradients and the row's dq, dg, one thread per column
    for (size_t c = threadIdx.x; c < C; c += blockDim.x) {
        size_t k = c / Ck, index = row * C + c;
        float q = query[c] + (token_query != NULL ? token_query[index] : 0.0f);
        float g = norm_weight != NULL ? norm_weight[c] : 1.0f;
        float dy = d[c], acc = 0.0f;
        for (size_t first_i = 0; first_i < S; first_i += SOURCE_CHUNK) {
            // per source of the chunk: V_ic, its gradient, alpha_i, ds_i r_i and the key
            // norm's correction ds_i r_i^3 ((q * g) . V_i) / Ck
            float v[SOURCE_CHUNK], dv[SOURCE_CHUNK], value_scale[SOURCE_CHUNK];
            float key_scale[SOURCE_CHUNK], correction[SOURCE_CHUNK];
            load_chunk(v, sources, first_i, S, index);
            if (distinct) load_chunk(dv, dsources, first_i, S, index);
#pragma unroll
            for (int j = 0; j < SOURCE_CHUNK; j++) {
                size_t at = (first_i + j) * heads + k;
                if (first_i + j < S) {
                    float r = rs[at];
                    value_scale[j] = a[at];
                    key_scale[j] = ds[at] * r;
                    correction[j] =
                        norm_weight != NULL ? key_scale[j] * r * r * kd[at] / (float)Ck : 0.0f;
                }
            }
#pragma unroll
            for (int j = 0; j < SOURCE_CHUNK; j++) {
                size_t i = first_i + j;
                if (i < S) {
                    if (!distinct) dv[j] = dsources.source[i][index];
                    dsources.source[i][index] = dv[j] + (value_scale[j] * dy +
                                                         key_scale[j] * (q * g) -
                                                         correction[j] * v[j]);
                    acc += key_scale[j] * v[j];
                }
            }
        }
        if (dtoken_query != NULL) dtoken_query[row * C + c] += g * acc;
        row_acc[row * C + c] = acc;
        row_gain[row * C + c] = q * acc;
    }
}
size_t depth_variants_workspace_floats_cuda(size_t n_sources, size_t N, size_t C, size_t heads) {
    // more heads: dscore and key_dot (N, n_sources, heads), then the rows' acc, dg and dweight
    // terms (N, C) each
    size_t one_head = one_head_workspace_floats(n_sources, N, C);
    size_t more_heads = 2 * N * n_sources * heads + 3 * N * C;
    return one_head > more_heads ? one_head : more_heads;
}

// ---- the layers ----

// The attention with its switches, any number of heads, then its norm (xn NULL: none): one
// head runs the switched kernel, more heads the many-head kernel
static void depth_attention_variant_rmsnorm_forward(float* xn, float* rstd, float* h,
                                                    DepthSaved saved, const float* const* sources,
                                                    DepthParams params, const float* weight,
                                                    size_t n_sources, size_t N, size_t C,
                                                    DepthSwitches switches) {
    if (switches.heads == 1) {
        depth_attention_switched_forward_cuda(xn, rstd, h, saved, sources, params, weight,
                                              n_sources, N, C, switches);
        return;
    }
    launch_kernel(depth_attention_variant_forward_kernel, (unsigned int)N, VARIANT_BLOCK, xn, rstd,
                  h, saved, source_list(sources, n_sources), params, weight, n_sources, C,
                  switches);
}

// Its backward (dxn NULL: scratch.dh read as h's gradient, no norm); with more heads the
// many-head kernel, then the sums over the rows, one launch for the three. The workspace holds
// dscore and key_dot (N,n_sources,heads), then the rows' acc, dg and the norm gain's terms
// (N,C) each.
static void depth_attention_variant_rmsnorm_backward(float* const* dsources, DepthParams grads,
                                                     float* dweight, DepthScratch scratch,
                                                     const float* dxn, const float* h,
                                                     const float* rstd, const float* weight,
                                                     DepthSaved saved,
                                                     const float* const* sources,
                                                     DepthParams params, size_t n_sources,
                                                     size_t N, size_t C, DepthSwitches switches) {
    if (switches.heads == 1) {
        depth_attention_switched_backward_cuda(dsources, grads, dweight, scratch, dxn, h, rstd,
                                               weight, saved, sources, params, n_sources, N, C,
                                               switches);
        return;
    }
    size_t scores = N * n_sources * switches.heads;
    float* dscore =
        cuda_workspace(depth_variants_workspace_floats_cuda(n_sources, N, C, switches.heads));
    float* key_dot = dscore + scores;
    float* row_acc = key_dot + scores;
    float* row_gain = row_acc + N * C;
    float* row_dweight = dxn != NULL && dweight != NULL ? row_gain + N * C : NULL;
    VariantOutputs outputs = {row_acc, row_gain, row_dweight, NULL, scratch.dtoken_query, dscore,
                              key_dot};
    launch_kernel(depth_attention_variant_backward_kernel, (unsigned int)N, VARIANT_BLOCK,
                  grad_list(dsources, n_sources), outputs, scratch.dh, dxn, h, rstd, weight,
                  saved, source_list(sources, n_sources), params, n_sources, C,
                  distinct_grads(dsources, n_sources), switches);
    depth_attention_parts_sum_cuda(grads.query, grads.norm, dweight, row_acc, row_gain,
                                   row_dweight, params.query, params.norm, N, C);
}

// the layer functions: the two above without the norm (the structs' pointers are not const;
// what a layer takes as const is only read)
void depth_attention_variant_forward_cuda(float* h, float* alpha, float* key_rstd,
                                          const float* const* sources, const float* query,
                                          const float* token_query, const float* norm_weight,
                                          size_t n_sources, size_t N, size_t C, size_t heads,
                                          int sigmoid) {
    DepthSaved saved = {alpha, key_rstd, NULL, NULL, const_cast<float*>(token_query)};
    DepthParams params = {const_cast<float*>(query), const_cast<float*>(norm_weight), NULL, NULL};
    depth_attention_variant_rmsnorm_forward(NULL, NULL, h, saved, sources, params, NULL,
                                            n_sources, N, C, DepthSwitches{heads, sigmoid, 0});
}

void depth_attention_variant_backward_cuda(float* const* dsources, float* dquery,
                                           float* dtoken_query, float* dnorm_weight,
                                           const float* dh, const float* alpha,
                                           const float* key_rstd, const float* const* sources,
                                           const float* query, const float* token_query,
                                           const float* norm_weight, size_t n_sources, size_t N,
                                           size_t C, size_t heads, int sigmoid) {
    DepthSaved saved = {const_cast<float*>(alpha), const_cast<float*>(key_rstd), NULL, NULL,
                        const_cast<float*>(token_query)};
    DepthParams params = {const_cast<float*>(query), const_cast<float*>(norm_weight), NULL, NULL};
    DepthParams grads = {dquery, dnorm_weight, NULL, NULL};
    DepthScratch scratch = {const_cast<float*>(dh), dtoken_query, NULL};
    depth_attention_variant_rmsnorm_backward(dsources, grads, NULL, scratch, NULL, NULL, NULL,
                                             NULL, saved, sources, params, n_sources, N, C,
                                             DepthSwitches{heads, sigmoid, 0});
}

// The mixings, the weights into saved.alpha (one thread per source), then the switched
// kernel with them in place of the scores (xn NULL: without the norm)
static void depth_mixing_rmsnorm_forward(float* xn, float* rstd, float* h, DepthSaved saved,
                                         const float* const* sources, DepthParams params,
                                         const float* weight, size_t n_sources, size_t N,
                                         size_t C, DepthSwitches switches) {
    launch_kernel(depth_mixing_weights_kernel, 1, DEPTH_ATTENTION_MAX_SOURCES, saved.alpha,
                  params.mix, n_sources, switches.mixing == 1);
    depth_attention_switched_forward_cuda(xn, rstd, h, saved, sources, params, weight,
                                          n_sources, N, C, switches);
}

void depth_mixing_forward_cuda(float* h, float* weights, const float* const* sources,
                               const float* coefficients, size_t n_sources, size_t N, size_t C,
                               int normalise) {
    DepthSaved saved = {weights, NULL, NULL, NULL, NULL};
    DepthParams params = {NULL, NULL, NULL, const_cast<float*>(coefficients)};
    depth_mixing_rmsnorm_forward(NULL, NULL, h, saved, sources, params, NULL, n_sources, N, C,
                                 DepthSwitches{1, 0, normalise ? 1 : 2});
}

// the mixings' backward is the switched one, with the weights in saved.alpha
void depth_mixing_backward_cuda(float* const* dsources, float* dcoefficients, const float* dh,
                                const float* weights, const float* const* sources,
                                size_t n_sources, size_t N, size_t C, int normalise) {
    DepthSaved saved = {const_cast<float*>(weights), NULL, NULL, NULL, NULL};
    DepthParams params = {NULL, NULL, NULL, NULL};
    DepthParams grads = {NULL, NULL, NULL, dcoefficients};
    DepthScratch scratch = {const_cast<float*>(dh), NULL, NULL};
    depth_attention_switched_backward_cuda(dsources, grads, NULL, scratch, NULL, NULL, NULL, NULL,
                                           saved, sources, params, n_sources, N, C,
                                           DepthSwitches{1, 0, normalise ? 1 : 2});
}

// ---- the one entry point: any depth attention, then its RMSNorm ---------------------------
// model.c's input_forward makes this one call for every AttnRes sub-layer (and the output),
// through the kernel table: attnres_input_forward of src/depth_variants.c, each layer of it
// here its _cuda twin. The operator and its norm run fused (one kernel forward, the rows
// kernel and the parts' sum backward): the default operator's depth_attention.cu's, the
// others this file's.

// 1 for the default operator (depth_attention.cu): softmax, one head, the key norm, a static
// query, no mixing
static int default_operator(DepthParams params, DepthSwitches switches) {
    return !switches.mixing && switches.heads == 1 && !switches.sigmoid && params.norm != NULL &&
           params.qproj == NULL;
}

static void zero(float* x, size_t n) {
    cuda_memset_async(x, 0, n * sizeof(float));
}

void attnres_input_forward_cuda(float* xn, float* rstd, float* h, DepthSaved saved,
                                const float* const* sources, DepthParams params,
                                const float* weight, size_t n_sources, size_t N, size_t C,
                                DepthSwitches switches) {
    if (default_operator(params, switches) && xn != NULL) {
        depth_attention_rmsnorm_forward_cuda(xn, rstd, h, saved, sources, params, weight,
                                             n_sources, N, C);
        return;
    }
    // (without the norm the default operator is the switched kernel with every switch off,
    // the same arithmetic)
    if (switches.mixing) {
        depth_mixing_rmsnorm_forward(xn, rstd, h, saved, sources, params, weight, n_sources, N, C,
                                     switches);
        return;
    }
    if (params.qproj != NULL) {  // --depth-query input: token_query = U rmsnorm(V_last), no gain
        rmsnorm_forward_cuda(saved.last_xn, saved.last_rstd, sources[n_sources - 1], NULL, N, C);
        linear_forward_cuda(saved.token_query, saved.last_xn, params.qproj, N, C, C);
    } else {
        saved.token_query = NULL;  // no per-token part of the query
    }
    depth_attention_variant_rmsnorm_forward(xn, rstd, h, saved, sources, params, weight,
                                            n_sources, N, C, switches);
}

void attnres_input_backward_cuda(float* const* dsources, DepthParams grads, float* dweight,
                                 DepthScratch scratch, const float* dxn, const float* h,
                                 const float* rstd, DepthSaved saved, const float* const* sources,
                                 DepthParams params, const float* weight, size_t n_sources,
                                 size_t N, size_t C, DepthSwitches switches) {
    if (default_operator(params, switches)) {
        depth_attention_rmsnorm_backward_cuda(dsources, grads, dweight, scratch.dh, dxn, h, rstd,
                                              weight, saved, sources, params, n_sources, N, C);
        return;
    }
    if (switches.mixing) {
        depth_attention_switched_backward_cuda(dsources, grads, dweight, scratch, dxn, h, rstd,
                                               weight, saved, sources, params, n_sources, N, C,
                                               switches);
        return;
    }
    int input_query = params.qproj != NULL;
    if (input_query) {
        zero(scratch.dtoken_query, N * C);
    } else {
        saved.token_query = NULL;  // no per-token part of the query, nor its gradient
        scratch.dtoken_query = NULL;
    }
    depth_attention_variant_rmsnorm_backward(dsources, grads, dweight, scratch, dxn, h, rstd,
                                             weight, saved, sources, params, n_sources, N, C,
                                             switches);
    if (input_query) {
        zero(scratch.dlast_xn, N * C);
        linear_backward_cuda(scratch.dlast_xn, grads.qproj, scratch.dtoken_query, saved.last_xn,
                             params.qproj, N, C, C);
        rmsnorm_backward_cuda(dsources[n_sources - 1], NULL, scratch.dlast_xn,
                              sources[n_sources - 1], NULL, saved.last_rstd, N, C);
    }
}
