// crossentropy.cu — softmax + cross-entropy on the GPU (mirror of src/crossentropy.c).
#include <math.h>

#include "common.cuh"
#include "layers.cuh"

// probs (N,V) = softmax(logits) per row; losses[n] = -log probs[n][target]
// = log(sum_i exp(x_i - max)) - (x_target - max), or 0 where the target is -1 (ignored).
// One warp per row.
__global__ void crossentropy_forward_kernel(float* losses, float* probs, const float* logits,
                                            const int* targets, size_t N, size_t V) {
    size_t row = (size_t)blockIdx.x * (blockDim.x / WARP_SIZE) + threadIdx.x / WARP_SIZE;
    unsigned int lane = threadIdx.x % WARP_SIZE;
    if (row >= N) return;  // the whole warp leaves together
    const float* x = logits + row * V;
    float max_logit = -INFINITY;
    for (size_t i = lane; i < V; i += WARP_SIZE) max_logit = fmaxf(max_logit, x[i]);
    max_logit = warp_max(max_logit);
    float sum = 0.0f;
    for (size_t i = lane; i < V; i += WARP_SIZE) sum += expf(x[i] - max_logit);
    sum = warp_sum(sum);
    for (size_t i = lane; i < V; i += WARP_SIZE) probs[row * V + i] = expf(x[i] - max_logit) / sum;
    if (lane == 0) {
        int target = targets != NULL ? targets[row] : -1;
        losses[row] = target < 0 ? 0.0f : logf(sum) - (x[target] - max_logit);
    }
}

// forward was: loss = -log softmax(logits)[target], so
// dlogits += scale * (probs - onehot(target)) on rows whose target is not -1;
// one thread per element
__global__ void crossentropy_backward_kernel(float* dlogits, const float* probs, const int* targets,
                                             float scale, size_t N, size_t V) {
    size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= N * V) return;
    size_t row = idx / V, i = idx % V;
    int target = targets[row];
    if (target < 0) return;
    float indicator = (size_t)target == i ? 1.0f : 0.0f;
    dlogits[idx] += scale * (probs[idx] - indicator);
}

void crossentropy_forward_cuda(float* losses, float* probs, const float* logits,
                               const int* targets, size_t N, size_t V) {
    const size_t threads = 128;  // 4 rows per block
    launch_kernel(crossentropy_forward_kernel, ceil_div(N * WARP_SIZE, threads), threads,
                  losses, probs, logits, targets, N, V);
}

void crossentropy_backward_cuda(float* dlogits, const float* probs, const int* targets,
                                float scale, size_t N, size_t V) {
    const size_t threads = 256;
    launch_kernel(crossentropy_backward_kernel, ceil_div(N * V, threads), threads,
                  dlogits, probs, targets, scale, N, V);
}
