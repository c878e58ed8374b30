// adamw.cu — the AdamW step (mirror of src/adamw.c) and global-norm gradient clipping.
#include <math.h>

#include "common.cuh"
#include "layers.cuh"

// m = beta1 m + (1-beta1) g, v = beta2 v + (1-beta2) g^2,
// param -= lr (m/(1-beta1^t) / (sqrt(v/(1-beta2^t)) + eps) + weight_decay param); one thread per
// parameter.
// The bias corrections 1-beta^t are computed once on the host.
__global__ void adamw_kernel(float* params, const float* grads, float* m, float* v, size_t n,
                             float lr, float beta1, float beta2, float beta1_correction,
                             float beta2_correction, float eps, float weight_decay) {
    size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= n) return;
    float g = grads[idx];
    float m_new = beta1 * m[idx] + (1.0f - beta1) * g;
    float v_new = beta2 * v[idx] + (1.0f - beta2) * g * g;
    m[idx] = m_new;
    v[idx] = v_new;
    float m_hat = m_new / beta1_correction;
    float v_hat = v_new / beta2_correction;
    params[idx] -= lr * (m_hat / (sqrtf(v_hat) + eps) + weight_decay * params[idx]);
}

void adamw_update_cuda(float* params, const float* grads, float* m, float* v, size_t n,
                       float lr, float beta1, float beta2, float eps, float weight_decay, int t) {
    float beta1_correction = 1.0f - powf(beta1, (float)t);
    float beta2_correction = 1.0f - powf(beta2, (float)t);
    const size_t threads = 256;
    launch_kernel(adamw_kernel, ceil_div(n, threads), threads, params, grads, m, v, n,
                  lr, beta1, beta2, beta1_correction, beta2_correction, eps, weight_decay);
}

#define NORM_BLOCKS NORM_PARTIALS
#define NORM_THREADS 256

// partial[block] = sum of x^2 over the elements idx = block*NORM_THREADS + thread + k*stride:
// a fixed grid, each thread striding through x, then a tree reduction in shared memory, so the
// order of the additions depends only on n.
__global__ void squared_sum_kernel(float* partial, const float* x, size_t n) {
    __shared__ float sums[NORM_THREADS];
    unsigned int tid = threadIdx.x;
    float sum = 0.0f;
    size_t stride = (size_t)NORM_BLOCKS * NORM_THREADS;
    for (size_t idx = (size_t)blockIdx.x * NORM_THREADS + tid; idx < n; idx += stride)
        sum += x[idx] * x[idx];
    sums[tid] = sum;
    __syncthreads();
    for (unsigned int half = NORM_THREADS / 2; half > 0; half /= 2) {
        if (tid < half) sums[tid] += sums[tid + half];
        __syncthreads();
    }
    if (tid == 0) partial[blockIdx.x] = sums[0];
}

// x *= scale; one thread per element
__global__ void scale_kernel(float* x, size_t n, float scale) {
    size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx < n) x[idx] *= scale;
}

void squared_sum_partials_cuda(float* partial, const float* x, size_t n) {
    launch_kernel(squared_sum_kernel, NORM_BLOCKS, NORM_THREADS, partial, x, n);
}

double sum_of_partials(const float* host_partial) {
    double sum = 0.0;  // on the host, in order of the blocks
    for (int b = 0; b < NORM_PARTIALS; b++) sum += host_partial[b];
    return sum;
}

float norm_from_partials(const float* host_partial) {
    return (float)sqrt(sum_of_partials(host_partial));
}

float global_norm_cuda(const float* grads, size_t n) {
    float* partial = cuda_workspace(NORM_PARTIALS);
    squared_sum_partials_cuda(partial, grads, n);
    float host_partial[NORM_PARTIALS];
    cudaCheck(cudaMemcpyAsync(host_partial, partial, sizeof(host_partial), cudaMemcpyDeviceToHost,
                              cuda_stream));
    cudaCheck(cudaStreamSynchronize(cuda_stream));
    return norm_from_partials(host_partial);
}

void clip_gradients_cuda(float* grads, size_t n, float norm, float max_norm) {
    if (norm <= max_norm) return;
    const size_t threads = 256;
    launch_kernel(scale_kernel, ceil_div(n, threads), threads, grads, n, max_norm / norm);
}
