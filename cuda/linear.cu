// linear.cu — y = x W^T on the GPU (mirror of src/linear.c), with one shared-memory tiled
// matmul doing the forward and both halves of the backward.
#include "common.cuh"
#include "layers.cuh"

#define TILE 16

// out (M,P) = A (M,K) . B (K,P), or out += when accumulate. A and B are read through strides,
// A(m,k) = a[m * a_row + k * a_col] and B(k,p) = b[k * b_row + p * b_col], so a transposed
// operand needs no copy. Each block computes a TILE x TILE tile of out, one thread per element,
// stepping along K one TILE x TILE tile of A and of B at a time through shared memory.
// blockIdx.x walks the rows (M = N*T can pass 65535 tiles), blockIdx.y the columns.
__global__ void matmul_tiled_kernel(float* out, const float* a, const float* b,
                                    size_t M, size_t P, size_t K,
                                    size_t a_row, size_t a_col, size_t b_row, size_t b_col,
                                    int accumulate) {
    __shared__ float a_tile[TILE][TILE];
    __shared__ float b_tile[TILE][TILE];
    unsigned int tx = threadIdx.x, ty = threadIdx.y;
    size_t m = (size_t)blockIdx.x * TILE + ty;
    size_t p = (size_t)blockIdx.y * TILE + tx;
    float sum = 0.0f;
    for (size_t k0 = 0; k0 < K; k0 += TILE) {
        // every thread loads one element of each tile (zero outside the matrices)...
        a_tile[ty][tx] = (m < M && k0 + tx < K) ? a[m * a_row + (k0 + tx) * a_col] : 0.0f;
        b_tile[ty][tx] = (k0 + ty < K && p < P) ? b[(k0 + ty) * b_row + p * b_col] : 0.0f;
        __syncthreads();
        // ...and, once both tiles are complete, adds their product to its element
        for (int k = 0; k < TILE; k++) sum += a_tile[ty][k] * b_tile[k][tx];
        __syncthreads();  // before the next step overwrites the tiles
    }
    if (m < M && p < P) {
        if (accumulate) out[m * P + p] += sum;
        else out[m * P + p] = sum;
    }
}

static void matmul(float* out, const float* a, const float* b, size_t M, size_t P, size_t K,
                   size_t a_row, size_t a_col, size_t b_row, size_t b_col, int accumulate) {
    dim3 grid(ceil_div(M, TILE), ceil_div(P, TILE));
    launch_kernel(matmul_tiled_kernel, grid, dim3(TILE, TILE), out, a, b, M, P, K,
                  a_row, a_col, b_row, b_col, accumulate);
}

// out (N,OUT) = inp (N,IN) . weight^T, weight (OUT,IN). Overwrites out.
void linear_forward_cuda(float* out, const float* inp, const float* weight,
                         size_t N, size_t IN, size_t OUT) {
    // A = inp (N,IN), B(k,p) = weight[p][k]
    matmul(out, inp, weight, N, OUT, IN, IN, 1, 1, IN, 0);
}

// forward was: out = inp . weight^T
// dinp (N,IN) += dout (N,OUT) . weight (OUT,IN); dweight (OUT,IN) += dout^T . inp (N,IN)
void linear_backward_cuda(float* dinp, float* dweight, const float* dout, const float* inp,
                          const float* weight, size_t N, size_t IN, size_t OUT) {
    // A = dout (N,OUT), B = weight (OUT,IN)
    matmul(dinp, dout, weight, N, IN, OUT, OUT, 1, IN, 1, 1);
    // A(o,n) = dout[n][o], B = inp (N,IN)
    matmul(dweight, dout, inp, OUT, IN, N, 1, OUT, IN, 1, 1);
}
