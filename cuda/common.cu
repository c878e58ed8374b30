// common.cu — the pieces of common.cuh that are kernels: the column sums.
#include "common.cuh"

// out_c += sum over p = 0 .. parts-1 of partial[p][c], in order of p; one thread per column.
// There are only C threads (8 warps at C = 256), so each loads PART_CHUNK parts at once before
// adding them (common.cuh).
__global__ void column_partials_sum_kernel(float* out, const float* partial, size_t parts,
                                           size_t C) {
    size_t c = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C) return;
    float sum = 0.0f;
    for (size_t p0 = 0; p0 < parts; p0 += PART_CHUNK) {
        float v[PART_CHUNK];
#pragma unroll
        for (int k = 0; k < PART_CHUNK; k++)
            if (p0 + k < parts) v[k] = partial[(p0 + k) * C + c];
#pragma unroll
        for (int k = 0; k < PART_CHUNK; k++)
            if (p0 + k < parts) sum += v[k];
    }
    out[c] += sum;
}

void add_column_partials_cuda(float* out, const float* partial, size_t parts, size_t C) {
    const size_t block_size = 128;
    launch_kernel(column_partials_sum_kernel, ceil_div(C, block_size), block_size, out, partial,
                  parts, C);
}


// The first step of add_column_sums_cuda: partial[part][c] = the sum of x (N, C) over the
// ROWS_PER_PART rows of the part, in order; one thread per (column, part), PART_CHUNK rows
// loaded at once.
__global__ void column_part_sums_kernel(float* partial, const float* x, size_t N, size_t C) {
    size_t c = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C) return;
    size_t first = (size_t)blockIdx.y * ROWS_PER_PART;
    size_t last = first + ROWS_PER_PART < N ? first + ROWS_PER_PART : N;
    float sum = 0.0f;
    for (size_t n0 = first; n0 < last; n0 += PART_CHUNK) {
        float v[PART_CHUNK];
#pragma unroll
        for (int k = 0; k < PART_CHUNK; k++)
            if (n0 + k < last) v[k] = x[(n0 + k) * C + c];
#pragma unroll
        for (int k = 0; k < PART_CHUNK; k++)
            if (n0 + k < last) sum += v[k];
    }
    partial[blockIdx.y * C + c] = sum;
}

void add_column_sums_cuda(float* out, float* partial, const float* x, size_t N, size_t C) {
    const size_t block_size = 64;
    unsigned int parts = ceil_div(N, ROWS_PER_PART);
    launch_kernel(column_part_sums_kernel, dim3(ceil_div(C, block_size), parts), block_size,
                  partial, x, N, C);
    add_column_partials_cuda(out, partial, parts, C);
}
