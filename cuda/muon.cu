// muon.cu — one Muon step on one matrix on the GPU (mirror of src/muon.c): the momentum and
// its Nesterov direction, the Frobenius norm, five Newton–Schulz steps through linear.cu's
// matmul (matmul_add_cuda for the products whose right operand is not transposed), the
// update. Nothing is read back to the host: the norm goes from the partial sums to the
// division on the device.
#include <math.h>

#include "common.cuh"
#include "layers.cuh"

#define NS_A 3.4445f
#define NS_B (-4.7750f)
#define NS_C 2.0315f

// Scratch for the step, kept between calls and grown as needed (cuda_grow_floats); not the
// shared workspace, which the matmuls borrow.
static float* scratch_data = NULL;
static size_t scratch_capacity = 0;

// M = mu M + G; N = G + mu M (the new M), written to X (X^T when transposed); one thread
// per element of the matrix (rows,cols)
__global__ void muon_momentum_kernel(float* X, float* momentum, const float* grads, size_t rows,
                                     size_t cols, float mu, int transposed) {
    size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= rows * cols) return;
    size_t i = idx / cols, j = idx % cols;
    float g = grads[idx];
    float m = mu * momentum[idx] + g;
    momentum[idx] = m;
    X[transposed ? j * rows + i : idx] = g + mu * m;
}

// *denominator = sqrt(sum of the NORM_PARTIALS partial sums, in order) + 1e-7 (in float: the
// kernels use no double; the CPU sums in double)
__global__ void muon_denominator_kernel(float* denominator, const float* partial) {
    float sum = 0.0f;
    for (int b = 0; b < NORM_PARTIALS; b++) sum += partial[b];
    *denominator = sqrtf(sum) + 1e-7f;
}

// x /= *denominator; one thread per element
__global__ void muon_normalise_kernel(float* x, size_t n, const float* denominator) {
    size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx < n) x[idx] /= *denominator;
}

// out = scale * x; one thread per element
__global__ void muon_scale_kernel(float* out, const float* x, size_t n, float scale) {
    size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx < n) out[idx] = scale * x[idx];
}

// cY = c Y; Z = b Y; one thread per element
__global__ void muon_quintic_terms_kernel(float* cY, float* Z, const float* Y, size_t n) {
    size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= n) return;
    cY[idx] = NS_C * Y[idx];
    Z[idx] = NS_B * Y[idx];
}

// W -= lr (weight_decay W + scale X), X read transposed when it was; one thread per element
__global__ void muon_apply_kernel(float* params, const float* X, size_t rows, size_t cols,
                                  float lr, float weight_decay, float scale, int transposed) {
    size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= rows * cols) return;
    size_t i = idx / cols, j = idx % cols;
    float x = X[transposed ? j * rows + i : idx];
    params[idx] -= lr * (weight_decay * params[idx] + scale * x);
}

#define MUON_THREADS 256

// X (rows,cols), rows <= cols, in place: five times Y = X X^T; Z = b Y + Y (c Y); X = a X + Z X
void newton_schulz_cuda(float* X, float* work, size_t rows, size_t cols) {
    size_t n = rows * cols, r2 = rows * rows;
    float *Y = work, *cY = Y + r2, *Z = cY + r2, *next = Z + r2;
    for (int step = 0; step < NEWTON_SCHULZ_STEPS; step++) {
        linear_forward_cuda(Y, X, X, rows, cols, rows);  // Y (rows,rows) = X X^T
        launch_kernel(muon_quintic_terms_kernel, ceil_div(r2, MUON_THREADS), MUON_THREADS, cY, Z,
                      Y, r2);
        matmul_add_cuda(Z, Y, cY, rows, rows, rows);     // Z = b Y + Y (c Y)
        launch_kernel(muon_scale_kernel, ceil_div(n, MUON_THREADS), MUON_THREADS, next, X, n,
                      NS_A);
        matmul_add_cuda(next, Z, X, rows, rows, cols);   // next = a X + Z X
        cuda_memcpy_async(X, next, n * sizeof(float), cudaMemcpyDeviceToDevice);
    }
}

// The scratch of one matrix (rows,cols): X, the iteration's work (3 short^2 + n), the norm's
// partial sums and its denominator
static float* muon_scratch(size_t rows, size_t cols) {
    size_t n = rows * cols, short_side = rows < cols ? rows : cols;
    return cuda_grow_floats(&scratch_data, &scratch_capacity,
                            2 * n + 3 * short_side * short_side + NORM_PARTIALS + 1);
}

void muon_reserve_cuda(size_t rows, size_t cols) { muon_scratch(rows, cols); }

// one matrix (rows,cols): muon.c's muon_matrix
static void muon_matrix_cuda(float* params, const float* grads, float* momentum, size_t rows,
                             size_t cols, float lr, float mu, float weight_decay) {
    size_t n = rows * cols, short_side = rows < cols ? rows : cols;
    size_t long_side = rows < cols ? cols : rows;
    int transposed = rows > cols;
    float* X = muon_scratch(rows, cols);
    float* work = X + n;
    float* partial = work + n + 3 * short_side * short_side;
    float* denominator = partial + NORM_PARTIALS;
    unsigned int blocks = ceil_div(n, MUON_THREADS);
    launch_kernel(muon_momentum_kernel, blocks, MUON_THREADS, X, momentum, grads, rows, cols,
                  mu, transposed);
    squared_sum_partials_cuda(partial, X, n);
    launch_kernel(muon_denominator_kernel, 1, 1, denominator, partial);
    launch_kernel(muon_normalise_kernel, blocks, MUON_THREADS, X, n, denominator);
    newton_schulz_cuda(X, work, short_side, long_side);
    launch_kernel(muon_apply_kernel, blocks, MUON_THREADS, params, X, rows, cols, lr,
                  weight_decay, 0.2f * sqrtf((float)long_side), transposed);
}

// count matrices one after another, in order on the stream (each one's products fill the GPU)
void muon_update_cuda(float* params, const float* grads, float* momentum, size_t count,
                      size_t rows, size_t cols, float lr, float mu, float weight_decay) {
    size_t n = rows * cols;
    for (size_t k = 0; k < count; k++) {
        muon_matrix_cuda(params + k * n, grads + k * n, momentum + k * n, rows, cols, lr, mu,
                         weight_decay);
    }
}
