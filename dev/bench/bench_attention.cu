// bench_attention.cu — the causal attention's GPU kernels, version by version (llm.c's
// dev/cuda habit: each version a complete idea, checked against the CPU and timed in one
// program, so a reader sees how the kernel became fast and a GPU says by how much).
//   naive:     cuda/attention.cu's naive kernels, one thread per query row (then per key
//              row in the backward), the online softmax a key at a time; keeps lse (B,H,T).
//   version 1: the first kernels, kept here whole: one warp per query row, its lanes
//              splitting the keys, every key, value and score read straight from global
//              memory; the forward saves the probabilities att (B,H,T,T), the backward writes
//              the score gradients to a (B,H,T,T) scratch, then two kernels of one thread per
//              output element read them back.
//   version 2: cuda/attention.cu's flash kernels, what the trainer runs: 32x32 tiles in
//              shared memory, the keys streamed a tile at a time through an online softmax,
//              lse (B,H,T) saved, the probabilities and score gradients recomputed where they
//              are needed (nothing of size T^2).
// Each is checked against src/attention.c (out; dq, dk, dv accumulated onto random values)
// on the bench model's shape (B=8 T=128 H=8 G=4 hs=32) and an odd one, within 1e-5 + 1e-5
// |cpu| (tests/cuda_test_layers.cpp's tolerance), then the 8 calls of one training step are
// timed each way with CUDA events (median of --repeats).
// Exits 1 on a mismatch. Built by `make gpu-check`, which runs it.
//
// ./build/bench_attention [--repeats N]
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <vector>

#include "common.cuh"
#include "layers.cuh"
#include "layers.h"
#include "bench_gpu.h"

// ---- version 1 ---------------------------------------------------------------------------
// One row of causal attention turned from scores into probabilities, in place, by one warp:
// row[t2] for t2 <= t holds the scaled scores, lane j wrote t2 = j, j + 32, ... and passes the
// largest of them (lane_max); after, row holds softmax over t2 <= t and 0 for t < t2 < T.
// Each lane reads back only the entries it wrote.
__device__ __forceinline__ void warp_causal_softmax(float* row, float lane_max, size_t t,
                                                    size_t T) {
    unsigned int lane = threadIdx.x % WARP_SIZE;
    float row_max = warp_max(lane_max);
    float sum = 0.0f;
    for (size_t t2 = lane; t2 <= t; t2 += WARP_SIZE) {
        float e = expf(row[t2] - row_max);
        row[t2] = e;
        sum += e;
    }
    sum = warp_sum(sum);
    for (size_t t2 = lane; t2 < T; t2 += WARP_SIZE) row[t2] = t2 <= t ? row[t2] / sum : 0.0f;
}

// att[b,h,t,:] = softmax over t2 <= t of q_t . k_t2 / sqrt(hs) (zero above the diagonal);
// out_t = sum_t2 att[b,h,t,t2] v_t2. One warp per query row (b,h,t): lanes split the keys,
// then the output dims.
__global__ void attention_forward_kernel1(float* out, float* att, const float* q, const float* k,
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
    warp_causal_softmax(att_row, max_score, t, T);
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
__global__ void attention_backward_score_kernel1(float* dscore, const float* dout, const float* att,
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
__global__ void attention_backward_query_kernel1(float* dq, const float* dscore, const float* k,
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
__global__ void attention_backward_key_value_kernel1(float* dk, float* dv, const float* dscore,
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

static void attention_forward1(float* out, float* att, const float* q, const float* k,
                               const float* v, size_t B, size_t T, size_t H, size_t G, size_t hs) {
    const size_t threads = 128;  // 4 query rows per block
    launch_kernel(attention_forward_kernel1, ceil_div(B * H * T * WARP_SIZE, threads),
                  threads, out, att, q, k, v, B, T, H, G, hs);
}

// (out unused: the probabilities att are saved)
static void attention_backward1(float* dq, float* dk, float* dv, const float* dout,
                                const float* out, const float* att, const float* q,
                                const float* k, const float* v, size_t B, size_t T, size_t H,
                                size_t G, size_t hs) {
    (void)out;
    float* dscore = cuda_workspace(B * H * T * T);
    const size_t threads = 128;
    launch_kernel(attention_backward_score_kernel1, ceil_div(B * H * T * WARP_SIZE, threads),
                  threads, dscore, dout, att, v, B, T, H, G, hs);
    launch_kernel(attention_backward_query_kernel1, ceil_div(B * T * H * hs, threads),
                  threads, dq, dscore, k, B, T, H, G, hs);
    launch_kernel(attention_backward_key_value_kernel1, ceil_div(B * T * G * hs, threads),
                  threads, dk, dv, dscore, dout, att, q, B, T, H, G, hs);
}

// ---- checking and timing -----------------------------------------------------------------

typedef void (*Forward)(float*, float*, const float*, const float*, const float*, size_t,
                        size_t, size_t, size_t, size_t);
typedef void (*Backward)(float*, float*, float*, const float*, const float*, const float*,
                         const float*, const float*, const float*, size_t, size_t, size_t, size_t,
                         size_t);
struct Version {
    const char* name;
    Forward forward;
    Backward backward;
    bool saves_att;  // the forward saves att (B,H,T,T), else lse (B,H,T)
};

// One version at one shape: checked against the CPU (returns 0 on a mismatch), then timed
static int check_and_time(const Version& version, size_t B, size_t T, size_t H, size_t G,
                          size_t hs, int repeats) {
    size_t nq = B * T * H * hs, nkv = B * T * G * hs;
    size_t nsaved = B * H * T * (version.saves_att ? T : 1);
    std::vector<float> q = random_floats(nq, 1), k = random_floats(nkv, 2);
    std::vector<float> v = random_floats(nkv, 3), dout = random_floats(nq, 4);
    std::vector<float> dq = random_floats(nq, 5), dk = random_floats(nkv, 6);
    std::vector<float> dv = random_floats(nkv, 7), out(nq), lse(B * H * T);
    float *d_q = upload(q), *d_k = upload(k), *d_v = upload(v), *d_dout = upload(dout);
    float *d_dq = upload(dq), *d_dk = upload(dk), *d_dv = upload(dv);
    float *d_out = cuda_malloc_floats(nq), *d_saved = cuda_malloc_floats(nsaved);
    version.forward(d_out, d_saved, d_q, d_k, d_v, B, T, H, G, hs);
    version.backward(d_dq, d_dk, d_dv, d_dout, d_out, d_saved, d_q, d_k, d_v, B, T, H, G, hs);
    attention_forward(out.data(), lse.data(), q.data(), k.data(), v.data(), B, T, H, G, hs);
    attention_backward(dq.data(), dk.data(), dv.data(), dout.data(), out.data(), lse.data(),
                       q.data(), k.data(), v.data(), B, T, H, G, hs);
    double used = std::max({tolerance_used(download(d_out, nq), out),
                            tolerance_used(download(d_dq, nq), dq),
                            tolerance_used(download(d_dk, nkv), dk),
                            tolerance_used(download(d_dv, nkv), dv)});
    const size_t L = 8;  // the bench model's layers: one call each way per layer and step
    Timing timing = time_forward_backward(
        [&] {
            for (size_t l = 0; l < L; l++)
                version.forward(d_out, d_saved, d_q, d_k, d_v, B, T, H, G, hs);
        },
        [&] {
            for (size_t l = 0; l < L; l++)
                version.backward(d_dq, d_dk, d_dv, d_dout, d_out, d_saved, d_q, d_k, d_v, B, T,
                                 H, G, hs);
        },
        repeats);
    std::printf("%-10s B=%zu T=%zu H=%zu G=%zu hs=%-3zu %12.1f %12.1f   %s (%.0f %% of the "
                "tolerance)\n", version.name, B, T, H, G, hs, 1000.0 * timing.forward_ms,
                1000.0 * timing.backward_ms, used <= 1.0 ? "ok" : "MISMATCH", 100.0 * used);
    for (float* p : {d_q, d_k, d_v, d_dout, d_dq, d_dk, d_dv, d_out, d_saved}) cudaCheck(cudaFree(p));
    return used <= 1.0;
}

int main(int argc, char** argv) {
    int repeats = bench_repeats(argc, argv, "bench_attention", 100);
    const Version versions[] = {
        {"naive", attention_forward_naive_cuda, attention_backward_naive_cuda, false},
        {"version 1", attention_forward1, attention_backward1, true},
        {"version 2", attention_forward_cuda, attention_backward_cuda, false}};
    const size_t shapes[][5] = {{8, 128, 8, 4, 32}, {3, 131, 6, 2, 16}};  // B, T, H, G, hs
    std::printf("bench_attention: the causal attention, 8 calls each way (one training step of "
                "the bench model), median of %d runs, checked against the CPU\n", repeats);
    std::printf("%-10s %-28s %12s %12s   %s\n", "kernels", "shape", "forward us", "backward us",
                "against src/attention.c");
    int ok = 1;
    for (const auto& shape : shapes)
        for (const Version& version : versions)
            ok &= check_and_time(version, shape[0], shape[1], shape[2], shape[3], shape[4],
                                 repeats);
    return ok ? 0 : 1;
}
