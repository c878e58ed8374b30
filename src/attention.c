// attention.c — causal grouped-query self-attention (after RoPE has turned q and k).
// q (B,T,H*hs), k and v (B,T,G*hs); query head h reads key/value head h / (H/G).
// For each (b, h, t): s_t' = q_t . k_t' / sqrt(hs) for t' <= t, a = softmax(s),
// out_t = sum_t' a_t' v_t'. att (B,H,T,T) keeps a (zero above the diagonal).
#include <math.h>
#include <stdlib.h>
#include "layers.h"
#include "util.h"

// One query against n_keys keys and values (row t' of each at k + t' * kv_stride):
// a = softmax(q . k_t' * scale) kept in att_row, out = sum_t' a_t' v_t'. attention_forward
// runs it for every (b, h, t); the cached decoder (inference.c) runs it on its KV cache.
void attention_query(float* out, float* att_row, const float* q, const float* k, const float* v,
                     size_t n_keys, size_t kv_stride, size_t hs) {
    float scale = 1.0f / sqrtf((float)hs);
    float max_score = -INFINITY;
    for (size_t t2 = 0; t2 < n_keys; t2++) {
        att_row[t2] = dot(q, k + t2 * kv_stride, hs) * scale;
        if (att_row[t2] > max_score) { max_score = att_row[t2]; }
    }
    for (size_t t2 = 0; t2 < n_keys; t2++) {  // vectorised; the sum after it keeps its order
        att_row[t2] = expf_vectorizable(att_row[t2] - max_score);
    }
    float sum = 0.0f;
    for (size_t t2 = 0; t2 < n_keys; t2++) { sum += att_row[t2]; }
    for (size_t t2 = 0; t2 < n_keys; t2++) { att_row[t2] /= sum; }
    for (size_t i = 0; i < hs; i++) { out[i] = 0.0f; }
    for (size_t t2 = 0; t2 < n_keys; t2++) {
        const float* v_t2 = v + t2 * kv_stride;
        for (size_t i = 0; i < hs; i++) { out[i] += att_row[t2] * v_t2[i]; }
    }
}

void attention_forward(float* out, float* att, const float* q, const float* k, const float* v,
                       size_t B, size_t T, size_t H, size_t G, size_t hs) {
    size_t q_dim = H * hs, kv_dim = G * hs, kv_mul = H / G;
    #pragma omp parallel for collapse(3)
    for (size_t b = 0; b < B; b++) {
        for (size_t h = 0; h < H; h++) {
            for (size_t t = 0; t < T; t++) {
                size_t kv_offset = b * T * kv_dim + (h / kv_mul) * hs;
                float* a = att + ((b * H + h) * T + t) * T;
                attention_query(out + (b * T + t) * q_dim + h * hs, a, q + (b * T + t) * q_dim + h * hs,
                                k + kv_offset, v + kv_offset, t + 1, kv_dim, hs);
                for (size_t t2 = t + 1; t2 < T; t2++) { a[t2] = 0.0f; }  // causal: no future
            }
        }
    }
}

// forward was: s = q.k * scale, a = softmax(s), out = sum a v. Backward, per (b, h, t):
//   dv_t' += a_t' dout_t ;  da_t' = dout_t . v_t'
//   ds_t' = a_t' (da_t' - sum_j a_j da_j)          (softmax Jacobian)
//   dq_t += scale * sum_t' ds_t' k_t' ;  dk_t' += scale * ds_t' q_t
// The query heads that share a key/value head run in the same thread, so dk and dv need
// no atomics and sum in a fixed order.
void attention_backward(float* dq, float* dk, float* dv, const float* dout, const float* att,
                        const float* q, const float* k, const float* v,
                        size_t B, size_t T, size_t H, size_t G, size_t hs) {
    size_t q_dim = H * hs, kv_dim = G * hs, kv_mul = H / G;
    float scale = 1.0f / sqrtf((float)hs);
    #pragma omp parallel
    {
        float* dscore = mallocCheck(T * sizeof(float));
        #pragma omp for collapse(2)
        for (size_t b = 0; b < B; b++) {
            for (size_t g = 0; g < G; g++) {
                const float* k_b = k + b * T * kv_dim + g * hs;
                const float* v_b = v + b * T * kv_dim + g * hs;
                float* dk_b = dk + b * T * kv_dim + g * hs;
                float* dv_b = dv + b * T * kv_dim + g * hs;
                for (size_t h = g * kv_mul; h < (g + 1) * kv_mul; h++) {
                    for (size_t t = 0; t < T; t++) {
                        const float* a = att + ((b * H + h) * T + t) * T;
                        const float* q_t = q + (b * T + t) * q_dim + h * hs;
                        const float* do_t = dout + (b * T + t) * q_dim + h * hs;
                        float* dq_t = dq + (b * T + t) * q_dim + h * hs;
                        float weighted = 0.0f;  // sum_j a_j da_j
                        for (size_t t2 = 0; t2 <= t; t2++) {
                            float* dv_t2 = dv_b + t2 * kv_dim;
                            float da = dot(do_t, v_b + t2 * kv_dim, hs);
                            for (size_t i = 0; i < hs; i++) { dv_t2[i] += a[t2] * do_t[i]; }
                            dscore[t2] = da;
                            weighted += a[t2] * da;
                        }
                        for (size_t t2 = 0; t2 <= t; t2++) {
                            float ds = a[t2] * (dscore[t2] - weighted) * scale;
                            const float* k_t2 = k_b + t2 * kv_dim;
                            float* dk_t2 = dk_b + t2 * kv_dim;
                            for (size_t i = 0; i < hs; i++) {
                                dq_t[i] += ds * k_t2[i];
                                dk_t2[i] += ds * q_t[i];
                            }
                        }
                    }
                }
            }
        }
        free(dscore);
    }
}
