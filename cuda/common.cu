// common.cu — the pieces of common.cuh that are kernels: the second step of the column sums.
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

