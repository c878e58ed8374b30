// depth_attention.cu — the AttnRes operator on the GPU (mirror of src/depth_attention.c).
// Per row n, over the sources V_i (N,C): k_i = rmsnorm(V_i; g), s_i = w . k_i,
// alpha = softmax_i(s), out = sum_i alpha_i V_i. alpha and key_rstd are (N,n_sources).
#include <math.h>

#include "common.cuh"
#include "layers.cuh"

// The pointers to the sources travel to the kernels by value, inside the launch parameters.
struct SourceList {
    const float* source[DEPTH_ATTENTION_MAX_SOURCES];
};
struct GradList {
    float* source[DEPTH_ATTENTION_MAX_SOURCES];
};

// One warp per row. s_i = rstd_i * sum_c w_c g_c V_ic is kept in alpha until the softmax.
__global__ void depth_attention_forward_kernel(float* out, float* alpha, float* key_rstd,
                                               SourceList sources, const float* query,
                                               const float* norm_weight, size_t n_sources,
                                               size_t N, size_t C) {
    size_t row = (size_t)blockIdx.x * (blockDim.x / WARP_SIZE) + threadIdx.x / WARP_SIZE;
    unsigned int lane = threadIdx.x % WARP_SIZE;
    if (row >= N) return;  // the whole warp leaves together
    float* alpha_row = alpha + row * n_sources;
    for (size_t i = 0; i < n_sources; i++) {
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
            alpha_row[i] = rstd * dot;
        }
    }
    __syncwarp();  // lane 0's scores are read by every lane
    float max_score = -INFINITY;
    for (size_t i = 0; i < n_sources; i++) max_score = fmaxf(max_score, alpha_row[i]);
    float sum = 0.0f;
    for (size_t i = 0; i < n_sources; i++) sum += expf(alpha_row[i] - max_score);
    __syncwarp();  // every lane has read the scores before they are overwritten
    for (size_t i = lane; i < n_sources; i += WARP_SIZE)
        alpha_row[i] = expf(alpha_row[i] - max_score) / sum;
    __syncwarp();
    for (size_t c = lane; c < C; c += WARP_SIZE) {
        float acc = 0.0f;
        for (size_t i = 0; i < n_sources; i++) acc += alpha_row[i] * sources.source[i][row * C + c];
        out[row * C + c] = acc;
    }
}

// forward was: s_i = rstd_i (w . g V_i), alpha = softmax(s), out = sum_i alpha_i V_i. With
// dalpha_i = dout . V_i: ds_i = alpha_i (dalpha_i - sum_j alpha_j dalpha_j), stored in dscore
// (N,n_sources). Each source gets the value path alpha_i dout and the key path, rmsnorm's
// backward of dk_i = ds_i w: dV_i += ds_i rstd_i (w g - V_i rstd_i^2 (w . g V_i) / C).
// One warp per row.
__global__ void depth_attention_backward_sources_kernel(GradList dsources, float* dscore,
                                                        const float* dout, const float* alpha,
                                                        const float* key_rstd, SourceList sources,
                                                        const float* query,
                                                        const float* norm_weight,
                                                        size_t n_sources, size_t N, size_t C) {
    size_t row = (size_t)blockIdx.x * (blockDim.x / WARP_SIZE) + threadIdx.x / WARP_SIZE;
    unsigned int lane = threadIdx.x % WARP_SIZE;
    if (row >= N) return;
    const float* dy = dout + row * C;
    const float* alpha_row = alpha + row * n_sources;
    float alpha_dot_dalpha = 0.0f;  // sum_j alpha_j dalpha_j
    for (size_t i = 0; i < n_sources; i++) {
        const float* v = sources.source[i] + row * C;
        float dalpha = 0.0f;
        for (size_t c = lane; c < C; c += WARP_SIZE) dalpha += dy[c] * v[c];
        alpha_dot_dalpha += alpha_row[i] * warp_sum(dalpha);
    }
    for (size_t i = 0; i < n_sources; i++) {
        const float* v = sources.source[i] + row * C;
        float* dv = dsources.source[i] + row * C;
        float dalpha = 0.0f, wgv = 0.0f;  // dout . V_i and w . g V_i
        for (size_t c = lane; c < C; c += WARP_SIZE) {
            dalpha += dy[c] * v[c];
            wgv += query[c] * norm_weight[c] * v[c];
        }
        dalpha = warp_sum(dalpha);
        wgv = warp_sum(wgv);
        float ds = alpha_row[i] * (dalpha - alpha_dot_dalpha);
        float rstd = key_rstd[row * n_sources + i];
        if (lane == 0) dscore[row * n_sources + i] = ds;
        for (size_t c = lane; c < C; c += WARP_SIZE) {
            float key_path =
                ds * rstd * (query[c] * norm_weight[c] - v[c] * rstd * rstd * wgv / (float)C);
            dv[c] += alpha_row[i] * dy[c] + key_path;
        }
    }
}

// With k_i = g V_i rstd_i and dk_i = ds_i w: dw += sum ds_i k_i, dg += sum dk_i V_i rstd_i,
// so both are a column c times acc_c = sum_{n,i} ds_ni rstd_ni V_inc. Step 1 of the column
// sum (common.cuh): partial[part][c] = that sum over the ROWS_PER_PART rows of one part,
// one thread per (part, column).
__global__ void depth_attention_backward_weights_kernel(float* partial, const float* dscore,
                                                        const float* key_rstd, SourceList sources,
                                                        size_t n_sources, size_t N, size_t C) {
    size_t c = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C) return;
    size_t first = (size_t)blockIdx.y * ROWS_PER_PART;
    size_t last = first + ROWS_PER_PART < N ? first + ROWS_PER_PART : N;
    float acc = 0.0f;
    for (size_t n = first; n < last; n++)
        for (size_t i = 0; i < n_sources; i++)
            acc += dscore[n * n_sources + i] * key_rstd[n * n_sources + i] *
                   sources.source[i][n * C + c];
    partial[blockIdx.y * C + c] = acc;
}

// Step 2, then the two gradients: acc_c = sum over parts; dquery_c += g_c acc_c,
// dnorm_weight_c += w_c acc_c. One thread per column.
__global__ void depth_attention_backward_sum_kernel(float* dquery, float* dnorm_weight,
                                                    const float* partial, size_t parts,
                                                    const float* query, const float* norm_weight,
                                                    size_t C) {
    size_t c = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C) return;
    float acc = 0.0f;
    for (size_t p = 0; p < parts; p++) acc += partial[p * C + c];
    dquery[c] += norm_weight[c] * acc;
    dnorm_weight[c] += query[c] * acc;
}

static SourceList source_list(const float* const* sources, size_t n_sources) {
    if (n_sources < 1 || n_sources > DEPTH_ATTENTION_MAX_SOURCES) {
        fprintf(stderr, "depth attention: %zu sources, not 1 to %d\n", n_sources,
                DEPTH_ATTENTION_MAX_SOURCES);
        exit(EXIT_FAILURE);
    }
    SourceList list = {};
    for (size_t i = 0; i < n_sources; i++) list.source[i] = sources[i];
    return list;
}

void depth_attention_forward_cuda(float* out, float* alpha, float* key_rstd,
                                  const float* const* sources, const float* query,
                                  const float* norm_weight, size_t n_sources, size_t N, size_t C) {
    const size_t block_size = 128;  // 4 rows per block
    launch_kernel(depth_attention_forward_kernel, ceil_div(N * WARP_SIZE, block_size), block_size,
                  out, alpha, key_rstd, source_list(sources, n_sources), query, norm_weight,
                  n_sources, N, C);
}

void depth_attention_backward_cuda(float* const* dsources, float* dquery, float* dnorm_weight,
                                   const float* dout, const float* alpha, const float* key_rstd,
                                   const float* const* sources, const float* query,
                                   const float* norm_weight, size_t n_sources, size_t N, size_t C) {
    unsigned int parts = ceil_div(N, ROWS_PER_PART);
    float* dscore = cuda_workspace(N * n_sources + (size_t)parts * C);  // then the partials
    float* partial = dscore + N * n_sources;
    SourceList source_pointers = source_list(sources, n_sources);
    GradList grad_pointers = {};
    for (size_t i = 0; i < n_sources; i++) grad_pointers.source[i] = dsources[i];
    const size_t block_size = 128;
    launch_kernel(depth_attention_backward_sources_kernel, ceil_div(N * WARP_SIZE, block_size),
                  block_size, grad_pointers, dscore, dout, alpha, key_rstd, source_pointers, query,
                  norm_weight, n_sources, N, C);
    launch_kernel(depth_attention_backward_weights_kernel, dim3(ceil_div(C, block_size), parts),
                  block_size, partial, dscore, key_rstd, source_pointers, n_sources, N, C);
    launch_kernel(depth_attention_backward_sum_kernel, ceil_div(C, block_size), block_size,
                  dquery, dnorm_weight, partial, (size_t)parts, query, norm_weight, C);
}
