// depth_variants.cu — SPEC's variants of the depth attention on the GPU (mirror of
// src/depth_variants.c): the attention with every switch, the two mixings, and
// attnres_input_forward_cuda and its backward, the model's one call for any AttnRes operator.
//
// The attention, per row (position) n and head k (channels c of group k, Ck = C / heads):
//   q      = w + u_n                (u_n = query_rows[n] with --depth-query input, else 0)
//   r_i    = (mean_{c in k}(V_i^2) + eps)^(-1/2)   (key norm on)   or 1 (--key-norm off)
//   s_i    = sum_{c in k} q_c g_c V_ic r_i          (g = 1 when the key norm is off)
//   alpha  = softmax_i(s)   or   alpha_i = sigmoid(s_i) (--depth-score sigmoid: no normaliser)
//   out_c  = sum_i alpha_i V_ic
// alpha and key_rstd are (N, n_sources, heads): entry (n, i, k) at (n * n_sources + i) * heads + k.
//
// The mixings, one weight per source for every row (no query, no keys):
//   static: alpha = softmax(c_0 .. c_{n-1})   dense (DenseFormer): beta_i = c_i
//   out = sum_i weight_i V_i
//
// With one head, and in the mixings, the layers run depth_attention.cu's kernels with the
// switches on (KernelSwitches, depth_sources.cuh): the same block shape and loads as the
// default operator, and its RMSNorm fused each way; the mixings' coefficients get their
// gradient from this file's depth_mixing_coefficients_kernel. The kernels below take more
// heads: a block of VARIANT_BLOCK threads per row, each way, the RMSNorm fused too (the
// backward writes its row's parts of the parameters' gradients, which depth_attention.cu's sum
// of parts adds up in a fixed order, one launch for all three). In a row, groups of lanes
// (head_lanes: 16 at 16 channels a head, a whole warp from 32 up) share out the (source, head)
// pairs for the sums over a head's channels, threads share out the heads for the softmax, then
// the columns for the sums over sources. A thread that owns column c of a row adds every
// source's gradient there, in order of the sources, SOURCE_CHUNK sources at a time
// (depth_sources.cuh): a chunk's values, gradients and coefficients read before any gradient
// is written, or, where a tensor is passed as two sources (its gradient sums both uses), each
// gradient read after the write before it.
#include <math.h>

#include "common.cuh"
#include "depth_sources.cuh"
#include "layers.cuh"

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
                                          const float* query_rows, const float* norm_weight,
                                          size_t row, size_t C, size_t k, size_t Ck,
                                          unsigned int lanes) {
    unsigned int place = threadIdx.x % lanes;
    dot_x = 0.0f;
    dot_query = 0.0f;
    for (size_t c = k * Ck + place; c < (k + 1) * Ck; c += lanes) {
        float q = query[c] + (query_rows != NULL ? query_rows[row * C + c] : 0.0f);
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
// then out = sum_i alpha_i V_i; one block per row. The scores wait in alpha until step 2.
// With xn not NULL, then the row's RMSNorm (as depth_attention.cu's fused forward):
// xn = weight * out * out_rstd, out_rstd = 1/sqrt(mean(out^2) + eps), weight NULL for ones.
__global__ void depth_attention_variant_forward_kernel(float* out, float* alpha, float* key_rstd,
                                                       SourceList sources, const float* query,
                                                       const float* query_rows,
                                                       const float* norm_weight,
                                                       size_t n_sources, size_t C, size_t heads,
                                                       int sigmoid, float* xn, float* out_rstd,
                                                       const float* weight) {
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
        head_dots(sum_sq, dot, v, v, query, query_rows, norm_weight, row, C, k, Ck, lanes);
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
    float sum_sq = 0.0f;  // this thread's part of sum_c out_c^2
    for (size_t c = threadIdx.x; c < C; c += blockDim.x) {
        size_t k = c / Ck;
        float acc = 0.0f;
        for (size_t i = 0; i < S; i++) acc += a[i * heads + k] * sources.source[i][row * C + c];
        out[row * C + c] = acc;
        sum_sq += acc * acc;
    }
    if (xn == NULL) return;  // the same for the whole grid
    // 4. the RMSNorm of the row: each thread reads back the columns it wrote in step 3
    float s = 1.0f / sqrtf(block_sum(sum_sq, warp_sums) / (float)C + RMSNORM_EPS);
    for (size_t c = threadIdx.x; c < C; c += blockDim.x)
        xn[row * C + c] = (weight != NULL ? weight[c] : 1.0f) * (out[row * C + c] * s);
    if (threadIdx.x == 0) out_rstd[row] = s;
}

// forward was: out_c = sum_i alpha_i V_ic, alpha = softmax(s) or sigmoid(s),
// s_i = (q * g) . V_i * r_i over the head's channels. Per row and head:
//   dalpha_i = dout . V_i
//   softmax: ds_i = alpha_i (dalpha_i - sum_j alpha_j dalpha_j);  sigmoid: ds_i = dalpha_i alpha_i (1 - alpha_i)
//   dV_i += alpha_i dout + ds_i r_i (q * g) - ds_i r_i^3 ((q * g) . V_i) / Ck * V_i
//     (key norm off: r = 1, g = 1, no last term)
//   with acc_c = sum_i ds_i r_i V_ic: dq_c = g_c acc_c (into dquery_rows, when the query has a
//   row part, and summed over rows into dquery), dg_c = q_c acc_c (summed over rows)
// One block per row; dscore and key_dot (N, n_sources, heads) hold dalpha, then ds, and
// (q * g) . V_i; row_acc and row_gain (N, C) the row's acc and dg = q acc, which the caller
// sums over the rows (dq = g acc). With dxn not NULL the kernel first takes dxn back through the row's RMSNorm (saved
// out_rstd, gain weight) into dout (the caller's scratch; step 0, as depth_attention.cu's
// fused backward), and writes the row's terms of the gain's gradient, dxn_c out_c out_rstd,
// to row_dweight (N, C) when not NULL.
__global__ void depth_attention_variant_backward_kernel(
    GradList dsources, float* dquery_rows, float* row_acc, float* row_gain, float* dscore,
    float* key_dot, float* dout, const float* alpha, const float* key_rstd,
    SourceList sources, const float* query, const float* query_rows, const float* norm_weight,
    size_t n_sources, size_t C, size_t heads, int sigmoid, int distinct, const float* dxn,
    const float* out, const float* out_rstd, const float* weight, float* row_dweight) {
    __shared__ float warp_sums[VARIANT_BLOCK / WARP_SIZE];
    size_t row = blockIdx.x, Ck = C / heads, S = n_sources;
    unsigned int warp = threadIdx.x / WARP_SIZE, lane = threadIdx.x % WARP_SIZE;
    unsigned int n_warps = blockDim.x / WARP_SIZE;
    // 0. (with the norm) dout_c = rstd weight_c dxn_c - rstd^3 (sum_j dxn_j weight_j out_j) / C
    //    out_c, then a barrier: step 1 reads every column of the row
    if (dxn != NULL) {
        size_t first = row * C;
        float dot = 0.0f;
        for (size_t c = threadIdx.x; c < C; c += blockDim.x)
            dot += dxn[first + c] * (weight != NULL ? weight[c] : 1.0f) * out[first + c];
        dot = block_sum(dot, warp_sums);
        float s = out_rstd[row], correction = s * s * s * dot / (float)C;
        for (size_t c = threadIdx.x; c < C; c += blockDim.x) {
            float w = weight != NULL ? weight[c] : 1.0f;
            dout[first + c] = s * w * dxn[first + c] - correction * out[first + c];
            if (row_dweight != NULL) row_dweight[first + c] = dxn[first + c] * out[first + c] * s;
        }
        __syncthreads();
    }
    const float* d = dout + row * C;
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
        head_dots(dot_dout, dot_query, d, sources.source[i] + row * C, query, query_rows,
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
        float q = query[c] + (query_rows != NULL ? query_rows[index] : 0.0f);
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
        if (dquery_rows != NULL) dquery_rows[row * C + c] += g * acc;
        row_acc[row * C + c] = acc;
        row_gain[row * C + c] = q * acc;
    }
}

// weights = softmax(coefficients) (normalise) or the coefficients; one thread per source,
// each reading the coefficients in the same order
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
// the coefficients): dweight_i = the sum of weight_parts[p][i] over the parts, then static:
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
            float part[PART_CHUNK];
#pragma unroll
            for (int k = 0; k < PART_CHUNK; k++) {
                size_t p = first + k * MIX_GROUPS;
                part[k] = p < parts ? weight_parts[p * n_sources + i] : 0.0f;
            }
#pragma unroll
            for (int k = 0; k < PART_CHUNK; k++)
                if (first + k * MIX_GROUPS < parts) sum += part[k];
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

void depth_mixing_coefficients_cuda(float* dcoefficients, const float* weight_parts,
                                    const float* weights, size_t parts, size_t n_sources,
                                    int normalise) {
    launch_kernel(depth_mixing_coefficients_kernel, 1, MIX_GROUPS * DEPTH_ATTENTION_MAX_SOURCES,
                  dcoefficients, weight_parts, weights, parts, n_sources, normalise);
}

size_t depth_variants_workspace_floats_cuda(size_t n_sources, size_t N, size_t C, size_t heads) {
    return 2 * N * n_sources * heads + 3 * N * C;
}

// The attention with its switches, any number of heads (xn NULL: without the norm): one head
// runs depth_attention.cu's kernel, the switches on, more heads the kernel above
static void attention_forward(float* xn, float* rstd, float* out, float* alpha, float* key_rstd,
                              const float* const* sources, const float* query,
                              const float* query_rows, const float* norm_weight,
                              const float* weight, size_t n_sources, size_t N, size_t C,
                              size_t heads, int sigmoid) {
    if (heads == 1) {
        KernelSwitches sw = {};
        sw.sigmoid = sigmoid;
        sw.query_rows = query_rows;
        depth_attention_switched_forward_cuda(xn, rstd, out, alpha, key_rstd, sources, query,
                                              norm_weight, weight, sw, n_sources, N, C);
        return;
    }
    launch_kernel(depth_attention_variant_forward_kernel, (unsigned int)N, VARIANT_BLOCK, out,
                  alpha, key_rstd, source_list(sources, n_sources), query, query_rows,
                  norm_weight, n_sources, C, heads, sigmoid, xn, rstd, weight);
}

// Its backward (dxn NULL: dout read as given, no norm); with more heads the kernel above, then
// the sums over the rows, one launch for the three. The workspace holds dscore and key_dot
// (N,n_sources,heads), then the rows' acc, dg and the norm gain's terms (N,C) each.
static void attention_backward(float* const* dsources, float* dquery, float* dquery_rows,
                               float* dnorm_weight, float* dweight, float* dout, const float* dxn,
                               const float* out, const float* rstd, const float* weight,
                               const float* alpha, const float* key_rstd,
                               const float* const* sources, const float* query,
                               const float* query_rows, const float* norm_weight,
                               size_t n_sources, size_t N, size_t C, size_t heads, int sigmoid) {
    if (heads == 1) {
        KernelSwitches sw = {};
        sw.sigmoid = sigmoid;
        sw.query_rows = query_rows;
        sw.dquery_rows = dquery_rows;
        depth_attention_switched_backward_cuda(dsources, dquery, dnorm_weight, dweight, dout, dxn,
                                               out, rstd, weight, alpha, key_rstd, sources,
                                               query, norm_weight, sw, n_sources, N, C);
        return;
    }
    size_t scores = N * n_sources * heads;
    float* dscore = cuda_workspace(depth_variants_workspace_floats_cuda(n_sources, N, C, heads));
    float* key_dot = dscore + scores;
    float* row_acc = key_dot + scores;
    float* row_gain = row_acc + N * C;
    float* row_dweight = dxn != NULL && dweight != NULL ? row_gain + N * C : NULL;
    launch_kernel(depth_attention_variant_backward_kernel, (unsigned int)N, VARIANT_BLOCK,
                  grad_list(dsources, n_sources), dquery_rows, row_acc, row_gain, dscore,
                  key_dot, dout, alpha, key_rstd, source_list(sources, n_sources), query,
                  query_rows, norm_weight, n_sources, C, heads, sigmoid,
                  distinct_grads(dsources, n_sources), dxn, out, rstd, weight, row_dweight);
    depth_attention_parts_sum_cuda(dquery, dnorm_weight, dweight, row_acc, row_gain, row_dweight,
                                   query, norm_weight, N, C);
}

void depth_attention_variant_forward_cuda(float* out, float* alpha, float* key_rstd,
                                          const float* const* sources, const float* query,
                                          const float* query_rows, const float* norm_weight,
                                          size_t n_sources, size_t N, size_t C, size_t heads,
                                          int sigmoid) {
    attention_forward(NULL, NULL, out, alpha, key_rstd, sources, query, query_rows, norm_weight,
                      NULL, n_sources, N, C, heads, sigmoid);
}

void depth_attention_variant_backward_cuda(float* const* dsources, float* dquery,
                                           float* dquery_rows, float* dnorm_weight,
                                           const float* dout, const float* alpha,
                                           const float* key_rstd, const float* const* sources,
                                           const float* query, const float* query_rows,
                                           const float* norm_weight, size_t n_sources, size_t N,
                                           size_t C, size_t heads, int sigmoid) {
    attention_backward(dsources, dquery, dquery_rows, dnorm_weight, NULL, (float*)dout, NULL,
                       NULL, NULL, NULL, alpha, key_rstd, sources, query, query_rows,
                       norm_weight, n_sources, N, C, heads, sigmoid);
}

// The mixings, the weights into `weights` (one thread per source), then depth_attention.cu's
// kernel with them in place of the scores (xn NULL: without the norm)
static void mixing_forward(float* xn, float* rstd, float* out, float* weights,
                           const float* const* sources, const float* coefficients,
                           const float* weight, size_t n_sources, size_t N, size_t C,
                           int normalise) {
    launch_kernel(depth_mixing_weights_kernel, 1, DEPTH_ATTENTION_MAX_SOURCES, weights,
                  coefficients, n_sources, normalise);
    KernelSwitches sw = {};
    sw.weights = weights;
    depth_attention_switched_forward_cuda(xn, rstd, out, weights, NULL, sources, NULL, NULL,
                                          weight, sw, n_sources, N, C);
}

// the mixings' backward (dxn NULL: dout read as given, no norm)
static void mixing_backward(float* const* dsources, float* dcoefficients, float* dweight,
                            float* dout, const float* dxn, const float* out, const float* rstd,
                            const float* weight, const float* weights,
                            const float* const* sources, size_t n_sources, size_t N, size_t C,
                            int normalise) {
    KernelSwitches sw = {};
    sw.weights = weights;
    sw.dcoefficients = dcoefficients;
    sw.normalise = normalise;
    depth_attention_switched_backward_cuda(dsources, NULL, NULL, dweight, dout, dxn, out, rstd,
                                           weight, weights, NULL, sources, NULL, NULL, sw,
                                           n_sources, N, C);
}

void depth_mixing_forward_cuda(float* out, float* weights, const float* const* sources,
                               const float* coefficients, size_t n_sources, size_t N, size_t C,
                               int normalise) {
    mixing_forward(NULL, NULL, out, weights, sources, coefficients, NULL, n_sources, N, C,
                   normalise);
}

void depth_mixing_backward_cuda(float* const* dsources, float* dcoefficients, const float* dout,
                                const float* weights, const float* const* sources,
                                size_t n_sources, size_t N, size_t C, int normalise) {
    mixing_backward(dsources, dcoefficients, NULL, (float*)dout, NULL, NULL, NULL, NULL, weights,
                    sources, n_sources, N, C, normalise);
}

// ---- the one entry point: any depth attention, then its RMSNorm ---------------------------
// model.c's input_forward makes this one call for every AttnRes sub-layer (and the output),
// through the kernel table: attnres_input_forward of src/depth_variants.c, each layer of it
// here its _cuda twin. The operator and its norm run as one kernel each way: with one head
// (the default operator among them) and in the mixings depth_attention.cu's, the switches
// on; with more heads this file's.

static void zero(float* x, size_t n) {
    cuda_memset_async(x, 0, n * sizeof(float));
}

void attnres_input_forward_cuda(float* xn, float* rstd, float* h, DepthSaved saved,
                                const float* const* sources, DepthParams params,
                                const float* weight, size_t n_sources, size_t N, size_t C,
                                DepthSwitches switches) {
    if (switches.mixing) {
        mixing_forward(xn, rstd, h, saved.alpha, sources, params.mix, weight, n_sources, N, C,
                       switches.mixing == 1);
        return;
    }
    const float* query_rows = NULL;
    if (params.qproj != NULL) {  // --depth-query input: query_rows = U rmsnorm(V_last), no gain
        rmsnorm_forward_cuda(saved.last_xn, saved.last_rstd, sources[n_sources - 1], NULL, N, C);
        linear_forward_cuda(saved.query_rows, saved.last_xn, params.qproj, N, C, C);
        query_rows = saved.query_rows;
    }
    attention_forward(xn, rstd, h, saved.alpha, saved.key_rstd, sources, params.query, query_rows,
                      params.norm, weight, n_sources, N, C, switches.heads, switches.sigmoid);
}

void attnres_input_backward_cuda(float* const* dsources, DepthParams grads, float* dweight,
                                 DepthScratch scratch, const float* dxn, const float* h,
                                 const float* rstd, DepthSaved saved, const float* const* sources,
                                 DepthParams params, const float* weight, size_t n_sources,
                                 size_t N, size_t C, DepthSwitches switches) {
    if (switches.mixing) {
        mixing_backward(dsources, grads.mix, dweight, scratch.dh, dxn, h, rstd, weight,
                        saved.alpha, sources, n_sources, N, C, switches.mixing == 1);
        return;
    }
    int input_query = params.qproj != NULL;
    if (input_query) zero(scratch.dquery_rows, N * C);
    attention_backward(dsources, grads.query, input_query ? scratch.dquery_rows : NULL, grads.norm,
                       dweight, scratch.dh, dxn, h, rstd, weight, saved.alpha, saved.key_rstd,
                       sources, params.query, input_query ? saved.query_rows : NULL, params.norm,
                       n_sources, N, C, switches.heads, switches.sigmoid);
    if (input_query) {
        zero(scratch.dlast_xn, N * C);
        linear_backward_cuda(scratch.dlast_xn, grads.qproj, scratch.dquery_rows, saved.last_xn,
                             params.qproj, N, C, C);
        rmsnorm_backward_cuda(dsources[n_sources - 1], NULL, scratch.dlast_xn,
                              sources[n_sources - 1], NULL, saved.last_rstd, N, C);
    }
}
