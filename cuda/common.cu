// common.cu — the pieces of common.cuh that are kernels: the two steps of the column sums.
#include "common.cuh"

// out_c += sum over p = 0 .. parts-1 of partial[p][c], in order of p; one thread per column
__global__ void column_partials_sum_kernel(float* out, const float* partial, size_t parts,
                                           size_t C) {
    size_t c = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C) return;
    float sum = 0.0f;
    for (size_t p = 0; p < parts; p++) sum += partial[p * C + c];
    out[c] += sum;
}

void add_column_partials_cuda(float* out, const float* partial, size_t parts, size_t C) {
    const size_t block_size = 128;
    launch_kernel(column_partials_sum_kernel, ceil_div(C, block_size), block_size, out, partial,
                  parts, C);
}

// partial[p][c] = the sum of column c over rows p*ROWS_PER_PART .. (p+1)*ROWS_PER_PART - 1 of
// matrix (N,C), in order of rows; one thread per (p, c)
__global__ void column_partials_kernel(float* partial, const float* matrix, size_t N, size_t C) {
    size_t c = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C) return;
    size_t first = (size_t)blockIdx.y * ROWS_PER_PART;
    size_t last = first + ROWS_PER_PART < N ? first + ROWS_PER_PART : N;
    float sum = 0.0f;
    for (size_t n = first; n < last; n++) sum += matrix[n * C + c];
    partial[blockIdx.y * C + c] = sum;
}

void column_partials_cuda(float* partial, const float* matrix, size_t N, size_t C) {
    const size_t block_size = 128;
    launch_kernel(column_partials_kernel, dim3(ceil_div(C, block_size), ceil_div(N, ROWS_PER_PART)),
                  block_size, partial, matrix, N, C);
}
