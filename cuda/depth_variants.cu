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
// Simple kernels for toy-scale ablations: a block of VARIANT_BLOCK threads per row (forward)
// or per tile of VARIANT_TILE rows (backward, which walks its rows one after another). In a
// row, warps share out the (source, head) pairs for the sums over a head's channels, threads
// share out the heads for the softmax, then the columns for the sums over sources. A thread
// that owns column c of a row adds every source's gradient there, in order of the sources,
// SOURCE_CHUNK sources at a time (depth_sources.cuh): a chunk's values, gradients and
// coefficients read before any gradient is written, or, where a tensor is passed as two
// sources (its gradient sums both uses), each gradient read after the write before it.
#include <math.h>

#include "common.cuh"
#include "depth_sources.cuh"
#include "layers.cuh"

#define VARIANT_BLOCK 256
// Rows per block in the backwards: each block sums its rows' parameter gradients in order
// into its own partial, and the partials are added in block order (add_column_partials_cuda),
// so the result does not depend on the order the blocks run in.
#define VARIANT_TILE 16

// For one warp, over the channels of head k of row `row` (x and v point to the row's C
// floats): dot_x = x . v and dot_query = (q * g) . v, q = w + u_row the query (g = 1 without
// key norm); every lane gets both sums.
__device__ __forceinline__ void head_dots(float& dot_x, float& dot_query, const float* x,
                                          const float* v, const float* query,
                                          const float* query_rows, const float* norm_weight,
                                          size_t row, size_t C, size_t k, size_t Ck) {
    unsigned int lane = threadIdx.x % WARP_SIZE;
    dot_x = 0.0f;
    dot_query = 0.0f;
    for (size_t c = k * Ck + lane; c < (k + 1) * Ck; c += WARP_SIZE) {
        float q = query[c] + (query_rows != NULL ? query_rows[row * C + c] : 0.0f);
        dot_x += x[c] * v[c];
        dot_query += (norm_weight != NULL ? q * norm_weight[c] : q) * v[c];
    }
    dot_x = warp_sum(dot_x);
    dot_query = warp_sum(dot_query);
}

// s_i = r_i * (q * g) . V_i per (source, head), then alpha = softmax or sigmoid per head,
// then out = sum_i alpha_i V_i; one block per row. The scores wait in alpha until step 2.
__global__ void depth_attention_variant_forward_kernel(float* out, float* alpha, float* key_rstd,
                                                       SourceList sources, const float* query,
                                                       const float* query_rows,
                                                       const float* norm_weight,
                                                       size_t n_sources, size_t C, size_t heads,
                                                       int sigmoid) {
    size_t row = blockIdx.x, Ck = C / heads, S = n_sources;
    unsigned int warp = threadIdx.x / WARP_SIZE, lane = threadIdx.x % WARP_SIZE;
    unsigned int n_warps = blockDim.x / WARP_SIZE;
    float* a = alpha + row * S * heads;
    // 1. the scores, one warp per (source i, head k)
    for (size_t pair = warp; pair < S * heads; pair += n_warps) {
        size_t i = pair / heads, k = pair % heads;
        const float* v = sources.source[i] + row * C;
        float sum_sq, dot;
        head_dots(sum_sq, dot, v, v, query, query_rows, norm_weight, row, C, k, Ck);
        float r = norm_weight != NULL ? 1.0f / sqrtf(sum_sq / (float)Ck + RMSNORM_EPS) : 1.0f;
        if (lane == 0) {
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
    for (size_t c = threadIdx.x; c < C; c += blockDim.x) {
        size_t k = c / Ck;
        float acc = 0.0f;
        for (size_t i = 0; i < S; i++) acc += a[i * heads + k] * sources.source[i][row * C + c];
        out[row * C + c] = acc;
    }
}

// forward was: out_c = sum_i alpha_i V_ic, alpha = softmax(s) or sigmoid(s),
// s_i = (q * g) . V_i * r_i over the head's channels. Per row and head:
//   dalpha_i = dout . V_i
//   softmax: ds_i = alpha_i (dalpha_i - sum_j alpha_j dalpha_j);  sigmoid: ds_i = dalpha_i alpha_i (1 - alpha_i)
//   dV_i += alpha_i dout + ds_i r_i (q * g) - ds_i r_i^3 ((q * g) . V_i) / Ck * V_i
//     (key norm off: r = 1, g = 1, no last term)
//   with acc_c = sum_i ds_i r_i V_ic: dq_c = g_c acc_c (into dquery_rows, when the query has a
//   row part, and summed over rows into dquery), dg_c = q_c acc_c (summed over rows)
// One block per tile of VARIANT_TILE rows; dscore and key_dot (N, n_sources, heads) hold
// dalpha, then ds, and (q * g) . V_i; partial_query and partial_gain (tiles, C) the tile's
// sums over its rows of dq and dg.
__global__ void depth_attention_variant_backward_kernel(
    GradList dsources, float* dquery_rows, float* partial_query, float* partial_gain,
    float* dscore, float* key_dot, const float* dout, const float* alpha, const float* key_rstd,
    SourceList sources, const float* query, const float* query_rows, const float* norm_weight,
    size_t n_sources, size_t N, size_t C, size_t heads, int sigmoid, int distinct) {
    size_t tile = blockIdx.x, Ck = C / heads, S = n_sources;
    size_t first = tile * VARIANT_TILE, end = first + VARIANT_TILE < N ? first + VARIANT_TILE : N;
    unsigned int warp = threadIdx.x / WARP_SIZE, lane = threadIdx.x % WARP_SIZE;
    unsigned int n_warps = blockDim.x / WARP_SIZE;
    float* pq = partial_query + tile * C;
    float* pg = partial_gain + tile * C;
    for (size_t c = threadIdx.x; c < C; c += blockDim.x) pq[c] = pg[c] = 0.0f;
    for (size_t row = first; row < end; row++) {
        const float* d = dout + row * C;
        const float* a = alpha + row * S * heads;
        const float* rs = key_rstd + row * S * heads;
        float* ds = dscore + row * S * heads;
        float* kd = key_dot + row * S * heads;
        // 1. dalpha and (q * g) . V_i, one warp per (source i, head k)
        for (size_t pair = warp; pair < S * heads; pair += n_warps) {
            size_t i = pair / heads, k = pair % heads;
            float dot_dout, dot_query;
            head_dots(dot_dout, dot_query, d, sources.source[i] + row * C, query, query_rows,
                      norm_weight, row, C, k, Ck);
            if (lane == 0) {
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
            pq[c] += g * acc;
            pg[c] += q * acc;
        }
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

// out = sum_i weight_i V_i, one thread per element of out (N*C)
__global__ void depth_mixing_forward_kernel(float* out, const float* weights, SourceList sources,
                                            size_t n_sources, size_t N, size_t C) {
    size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= N * C) return;
    float acc = 0.0f;
    for (size_t i = 0; i < n_sources; i++) acc += weights[i] * sources.source[i][idx];
    out[idx] = acc;
}

// forward was: out = sum_i weight_i V_i. One block per tile of VARIANT_TILE rows:
// dV_i += weight_i dout (one thread per column), and partial[tile][i] = the tile's sum over
// its rows of dout . V_i (one warp per source, rows in order).
__global__ void depth_mixing_backward_rows_kernel(GradList dsources, float* partial,
                                                  const float* dout, const float* weights,
                                                  SourceList sources, size_t n_sources, size_t N,
                                                  size_t C, int distinct) {
    size_t tile = blockIdx.x;
    size_t first = tile * VARIANT_TILE, end = first + VARIANT_TILE < N ? first + VARIANT_TILE : N;
    unsigned int warp = threadIdx.x / WARP_SIZE, lane = threadIdx.x % WARP_SIZE;
    unsigned int n_warps = blockDim.x / WARP_SIZE;
    for (size_t i = warp; i < n_sources; i += n_warps) {
        float sum = 0.0f;
        for (size_t row = first; row < end; row++) {
            float dot = 0.0f;
            for (size_t c = lane; c < C; c += WARP_SIZE)
                dot += dout[row * C + c] * sources.source[i][row * C + c];
            sum += warp_sum(dot);
        }
        if (lane == 0) partial[tile * n_sources + i] = sum;
    }
    // SOURCE_CHUNK sources at a time, as in the attention's backward above
    for (size_t row = first; row < end; row++) {
        for (size_t c = threadIdx.x; c < C; c += blockDim.x) {
            size_t index = row * C + c;
            float dy = dout[index];
            for (size_t first_i = 0; first_i < n_sources; first_i += SOURCE_CHUNK) {
                float dv[SOURCE_CHUNK], weight[SOURCE_CHUNK];
                if (distinct) load_chunk(dv, dsources, first_i, n_sources, index);
#pragma unroll
                for (int j = 0; j < SOURCE_CHUNK; j++)
                    if (first_i + j < n_sources) weight[j] = weights[first_i + j];
#pragma unroll
                for (int j = 0; j < SOURCE_CHUNK; j++) {
                    size_t i = first_i + j;
                    if (i < n_sources) {
                        if (!distinct) dv[j] = dsources.source[i][index];
                        dsources.source[i][index] = dv[j] + weight[j] * dy;
                    }
                }
            }
        }
    }
}

// dweight_i = sum over tiles of partial[tile][i], in tile order; then
// static: dc_i += weight_i (dweight_i - sum_j weight_j dweight_j);  dense: dc_i += dweight_i.
// One block, one thread per source.
__global__ void depth_mixing_backward_coefficients_kernel(float* dcoefficients,
                                                          const float* partial,
                                                          const float* weights, size_t n_tiles,
                                                          size_t n_sources, int normalise) {
    __shared__ float dweight[DEPTH_ATTENTION_MAX_SOURCES];
    for (size_t i = threadIdx.x; i < n_sources; i += blockDim.x) {
        float sum = 0.0f;
        for (size_t tile = 0; tile < n_tiles; tile++) sum += partial[tile * n_sources + i];
        dweight[i] = sum;
    }
    __syncthreads();
    float weighted = 0.0f;  // sum_j weight_j dweight_j, every thread in the same order
    for (size_t j = 0; j < n_sources; j++) weighted += weights[j] * dweight[j];
    for (size_t i = threadIdx.x; i < n_sources; i += blockDim.x)
        dcoefficients[i] += normalise ? weights[i] * (dweight[i] - weighted) : dweight[i];
}

void depth_attention_variant_forward_cuda(float* out, float* alpha, float* key_rstd,
                                          const float* const* sources, const float* query,
                                          const float* query_rows, const float* norm_weight,
                                          size_t n_sources, size_t N, size_t C, size_t heads,
                                          int sigmoid) {
    launch_kernel(depth_attention_variant_forward_kernel, (unsigned int)N, VARIANT_BLOCK, out,
                  alpha, key_rstd, source_list(sources, n_sources), query, query_rows,
                  norm_weight, n_sources, C, heads, sigmoid);
}

size_t depth_variants_workspace_floats_cuda(size_t n_sources, size_t N, size_t C, size_t heads) {
    size_t n_tiles = ceil_div(N, VARIANT_TILE);
    return 2 * N * n_sources * heads + 2 * n_tiles * C;  // the mixing's n_tiles * n_sources is less
}

void depth_attention_variant_backward_cuda(float* const* dsources, float* dquery,
                                           float* dquery_rows, float* dnorm_weight,
                                           const float* dout, const float* alpha,
                                           const float* key_rstd, const float* const* sources,
                                           const float* query, const float* query_rows,
                                           const float* norm_weight, size_t n_sources, size_t N,
                                           size_t C, size_t heads, int sigmoid) {
    // the workspace holds dscore and key_dot (N,n_sources,heads), then the tiles' partial
    // sums of dq and dg (n_tiles,C) each
    size_t n_tiles = ceil_div(N, VARIANT_TILE), scores = N * n_sources * heads;
    float* dscore = cuda_workspace(depth_variants_workspace_floats_cuda(n_sources, N, C, heads));
    float* key_dot = dscore + scores;
    float* partial_query = key_dot + scores;
    float* partial_gain = partial_query + n_tiles * C;
    launch_kernel(depth_attention_variant_backward_kernel, (unsigned int)n_tiles, VARIANT_BLOCK,
                  grad_list(dsources, n_sources), dquery_rows, partial_query, partial_gain,
                  dscore, key_dot, dout, alpha, key_rstd, source_list(sources, n_sources), query,
                  query_rows, norm_weight, n_sources, N, C, heads, sigmoid,
                  distinct_grads(dsources, n_sources));
    add_column_partials_cuda(dquery, partial_query, n_tiles, C);
    if (dnorm_weight != NULL) add_column_partials_cuda(dnorm_weight, partial_gain, n_tiles, C);
}

void depth_mixing_forward_cuda(float* out, float* weights, const float* const* sources,
                               const float* coefficients, size_t n_sources, size_t N, size_t C,
                               int normalise) {
    SourceList list = source_list(sources, n_sources);
    launch_kernel(depth_mixing_weights_kernel, 1, DEPTH_ATTENTION_MAX_SOURCES, weights,
                  coefficients, n_sources, normalise);
    const size_t block_size = 256;
    launch_kernel(depth_mixing_forward_kernel, ceil_div(N * C, block_size), block_size, out,
                  weights, list, n_sources, N, C);
}

void depth_mixing_backward_cuda(float* const* dsources, float* dcoefficients, const float* dout,
                                const float* weights, const float* const* sources,
                                size_t n_sources, size_t N, size_t C, int normalise) {
    size_t n_tiles = ceil_div(N, VARIANT_TILE);
    float* partial = cuda_workspace(n_tiles * n_sources);  // per tile: dweight
    launch_kernel(depth_mixing_backward_rows_kernel, (unsigned int)n_tiles, VARIANT_BLOCK,
                  grad_list(dsources, n_sources), partial, dout, weights,
                  source_list(sources, n_sources), n_sources, N, C,
                  distinct_grads(dsources, n_sources));
    launch_kernel(depth_mixing_backward_coefficients_kernel, 1, DEPTH_ATTENTION_MAX_SOURCES,
                  dcoefficients, partial, weights, n_tiles, n_sources, normalise);
}

// ---- the one entry point: any depth attention, then its RMSNorm ---------------------------
// model.c's input_forward makes this one call for every AttnRes sub-layer (and the output),
// through the kernel table: attnres_input_forward of src/depth_variants.c, each layer of it
// here its _cuda twin.

// 1 for the default operator (depth_attention.cu): softmax, one head, the key norm, a static
// query, no mixing
static int default_operator(const float* norm_weight, const float* query_proj, size_t heads,
                            int sigmoid, int mixing) {
    return !mixing && heads == 1 && !sigmoid && norm_weight != NULL && query_proj == NULL;
}

static void zero(float* x, size_t n) {
    cuda_memset_async(x, 0, n * sizeof(float));
}

void attnres_input_forward_cuda(float* xn, float* rstd, float* h, float* alpha, float* key_rstd,
                                float* last_xn, float* last_rstd, float* query_rows,
                                const float* const* sources, const float* query,
                                const float* norm_weight, const float* query_proj,
                                const float* coefficients, const float* weight, size_t n_sources,
                                size_t N, size_t C, size_t heads, int sigmoid, int mixing) {
    // the default operator and its norm as one kernel: one pass over the rows, each row's h
    // still on chip when it is normed
    if (default_operator(norm_weight, query_proj, heads, sigmoid, mixing) && xn != NULL) {
        depth_attention_rmsnorm_forward_cuda(xn, rstd, h, alpha, key_rstd, sources, query,
                                             norm_weight, weight, n_sources, N, C);
        return;
    }
    // (without the norm the default operator is the variant with every switch off)
    if (mixing) {
        depth_mixing_forward_cuda(h, alpha, sources, coefficients, n_sources, N, C, mixing == 1);
    } else {
        if (query_proj != NULL) {  // --depth-query input: query_rows = U rmsnorm(V_last), no gain
            rmsnorm_forward_cuda(last_xn, last_rstd, sources[n_sources - 1], NULL, N, C);
            linear_forward_cuda(query_rows, last_xn, query_proj, N, C, C);
        }
        depth_attention_variant_forward_cuda(h, alpha, key_rstd, sources, query,
                                             query_proj != NULL ? query_rows : NULL,
                                             norm_weight, n_sources, N, C, heads, sigmoid);
    }
    if (xn != NULL) rmsnorm_forward_cuda(xn, rstd, h, weight, N, C);
}

void attnres_input_backward_cuda(float* const* dsources, float* dquery, float* dnorm_weight,
                                 float* dquery_proj, float* dcoefficients, float* dweight,
                                 float* dh, float* dquery_rows, float* dlast_xn,
                                 const float* dxn, const float* h, const float* rstd,
                                 const float* weight, const float* alpha, const float* key_rstd,
                                 const float* last_xn, const float* last_rstd,
                                 const float* query_rows, const float* const* sources,
                                 const float* query, const float* norm_weight,
                                 const float* query_proj, size_t n_sources, size_t N, size_t C,
                                 size_t heads, int sigmoid, int mixing) {
    if (default_operator(norm_weight, query_proj, heads, sigmoid, mixing)) {
        depth_attention_rmsnorm_backward_cuda(dsources, dquery, dnorm_weight, dweight, dh, dxn, h,
                                              rstd, weight, alpha, key_rstd, sources, query,
                                              norm_weight, n_sources, N, C);
        return;
    }
    zero(dh, N * C);
    rmsnorm_backward_cuda(dh, dweight, dxn, h, weight, rstd, N, C);
    if (mixing) {
        depth_mixing_backward_cuda(dsources, dcoefficients, dh, alpha, sources, n_sources, N, C,
                                   mixing == 1);
        return;
    }
    if (query_proj != NULL) zero(dquery_rows, N * C);
    depth_attention_variant_backward_cuda(dsources, dquery,
                                          query_proj != NULL ? dquery_rows : NULL, dnorm_weight,
                                          dh, alpha, key_rstd, sources, query,
                                          query_proj != NULL ? query_rows : NULL, norm_weight,
                                          n_sources, N, C, heads, sigmoid);
    if (query_proj != NULL) {
        zero(dlast_xn, N * C);
        linear_backward_cuda(dlast_xn, dquery_proj, dquery_rows, last_xn, query_proj, N, C, C);
        rmsnorm_backward_cuda(dsources[n_sources - 1], NULL, dlast_xn, sources[n_sources - 1],
                              NULL, last_rstd, N, C);
    }
}
