// attention.cu — causal grouped-query attention on the GPU (mirror of src/attention.c).
// q (B,T,H*hs), k and v (B,T,G*hs), out (B,T,H*hs), att (B,H,T,T); query head h reads
// key/value head h / (H/G).
#include <math.h>

#include "common.cuh"
#include "layers.cuh"

// att[b,h,t,:] = softmax over t2 <= t of q_t . k_t2 / sqrt(hs) (zero above the diagonal);
// out_t = sum_t2 att[b,h,t,t2] v_t2. One warp per query row (b,h,t): lanes split the keys,
// then the output dims.
__global__ void attention_forward_kernel(float* out, float* att, const float* q, const float* k,
                                         const float* v, size_t B, size_t T, size_t H, size_t G,
                                         size_t hs) {
    size_t row = (size_t)blockIdx.x * (blockDim.x / WARP_SIZE) + threadIdx.x / WARP_SIZE;
    unsigned int lane = threadIdx.x % WARP_SIZE;
    if (row >= B * H * T) return;  // the whole warp leaves together
    size_t t = row % T, h = row / T % H, b = row / (T * H);
    size_t g = h / (H / G);
    const float* q_t = q + (b * T + t) * H * hs + h * hs;
    float* att_row = att + row * T;
    float scale = 1.0f / sqrtf((float)hs);

    float max_score = -INFINITY;
    for (size_t t2 = lane; t2 <= t; t2 += WARP_SIZE) {
        const float* k_t2 = k + (b * T + t2) * G * hs + g * hs;
        float score = 0.0f;
        for (size_t i = 0; i < hs; i++) score += q_t[i] * k_t2[i];
        score *= scale;
        att_row[t2] = score;
        max_score = fmaxf(max_score, score);
    }
    max_score = warp_max(max_score);
    float sum = 0.0f;
    for (size_t t2 = lane; t2 <= t; t2 += WARP_SIZE) {
        float e = expf(att_row[t2] - max_score);
        att_row[t2] = e;
        sum += e;
    }
    sum = warp_sum(sum);
    for (size_t t2 = lane; t2 < T; t2 += WARP_SIZE)
        att_row[t2] = t2 <= t ? att_row[t2] / sum : 0.0f;
    __syncwarp();  // every lane reads the whole row below

    for (size_t i = lane; i < hs; i += WARP_SIZE) {
        float acc = 0.0f;
        for (size_t t2 = 0; t2 <= t; t2++)
            acc += att_row[t2] * v[(b * T + t2) * G * hs + g * hs + i];
        out[(b * T + t) * H * hs + h * hs + i] = acc;
    }
}

// forward was: s = q_t . k_t2 * scale, p = softmax(s), out_t = sum_t2 p v_t2. With
// dp[t2] = dout_t . v_t2 this stores dscore[b,h,t,t2] = scale * p (dp - sum_t3 p[t3] dp[t3])
// for t2 <= t, i.e. the gradient of the score already times its scale. One warp per (b,h,t).
__global__ void attention_backward_score_kernel(float* dscore, const float* dout, const float* att,
                                                const float* v, size_t B, size_t T, size_t H,
                                                size_t G, size_t hs) {
    size_t row = (size_t)blockIdx.x * (blockDim.x / WARP_SIZE) + threadIdx.x / WARP_SIZE;
    unsigned int lane = threadIdx.x % WARP_SIZE;
    if (row >= B * H * T) return;
    size_t t = row % T, h = row / T % H, b = row / (T * H);
    size_t g = h / (H / G);
    const float* dout_t = dout + (b * T + t) * H * hs + h * hs;
    const float* att_row = att + row * T;
    float* dscore_row = dscore + row * T;
    float scale = 1.0f / sqrtf((float)hs);

    float p_dot_dp = 0.0f;  // sum_t2 p[t2] dp[t2]
    for (size_t t2 = lane; t2 <= t; t2 += WARP_SIZE) {
        const float* v_t2 = v + (b * T + t2) * G * hs + g * hs;
        float dp = 0.0f;
        for (size_t i = 0; i < hs; i++) dp += dout_t[i] * v_t2[i];
        dscore_row[t2] = dp;
        p_dot_dp += att_row[t2] * dp;
    }
    p_dot_dp = warp_sum(p_dot_dp);
    // each lane rewrites only the entries it wrote above
    for (size_t t2 = lane; t2 <= t; t2 += WARP_SIZE)
        dscore_row[t2] = scale * att_row[t2] * (dscore_row[t2] - p_dot_dp);
}

// dq_t += sum_{t2 <= t} dscore[t][t2] k_t2; one thread per element (b,t,h,i) of dq
__global__ void attention_backward_query_kernel(float* dq, const float* dscore, const float* k,
                                                size_t B, size_t T, size_t H, size_t G,
                                                size_t hs) {
    size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= B * T * H * hs) return;
    size_t i = idx % hs, h = idx / hs % H, t = idx / (hs * H) % T, b = idx / (hs * H * T);
    size_t g = h / (H / G);
    const float* dscore_row = dscore + ((b * H + h) * T + t) * T;
    float sum = 0.0f;
    for (size_t t2 = 0; t2 <= t; t2++)
        sum += dscore_row[t2] * k[(b * T + t2) * G * hs + g * hs + i];
    dq[idx] += sum;
}

// Over the query heads h of group g and the rows t >= t2 that see key t2:
// dk_t2 += sum dscore[h][t][t2] q_t,h and dv_t2 += sum att[h][t][t2] dout_t,h.
// One thread per element (b,t2,g,i) of dk and dv.
__global__ void attention_backward_key_value_kernel(float* dk, float* dv, const float* dscore,
                                                    const float* dout, const float* att,
                                                    const float* q, size_t B, size_t T, size_t H,
                                                    size_t G, size_t hs) {
    size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= B * T * G * hs) return;
    size_t i = idx % hs, g = idx / hs % G, t2 = idx / (hs * G) % T, b = idx / (hs * G * T);
    size_t heads_per_group = H / G;
    float dk_sum = 0.0f, dv_sum = 0.0f;
    for (size_t h = g * heads_per_group; h < (g + 1) * heads_per_group; h++) {
        for (size_t t = t2; t < T; t++) {
            size_t score = ((b * H + h) * T + t) * T + t2;
            size_t qo = (b * T + t) * H * hs + h * hs + i;  // q and dout
            dk_sum += dscore[score] * q[qo];
            dv_sum += att[score] * dout[qo];
        }
    }
    dk[idx] += dk_sum;
    dv[idx] += dv_sum;
}

void attention_forward_cuda(float* out, float* att, const float* q, const float* k,
                            const float* v, size_t B, size_t T, size_t H, size_t G, size_t hs) {
    const size_t block_size = 128;  // 4 query rows per block
    launch_kernel(attention_forward_kernel, ceil_div(B * H * T * WARP_SIZE, block_size), block_size,
                  out, att, q, k, v, B, T, H, G, hs);
}

void attention_backward_cuda(float* dq, float* dk, float* dv, const float* dout, const float* att,
                             const float* q, const float* k, const float* v,
                             size_t B, size_t T, size_t H, size_t G, size_t hs) {
    float* dscore = cuda_workspace(B * H * T * T);
    const size_t block_size = 128;
    launch_kernel(attention_backward_score_kernel, ceil_div(B * H * T * WARP_SIZE, block_size),
                  block_size, dscore, dout, att, v, B, T, H, G, hs);
    launch_kernel(attention_backward_query_kernel, ceil_div(B * T * H * hs, block_size), block_size,
                  dq, dscore, k, B, T, H, G, hs);
    launch_kernel(attention_backward_key_value_kernel, ceil_div(B * T * G * hs, block_size),
                  block_size, dk, dv, dscore, dout, att, q, B, T, H, G, hs);
}
