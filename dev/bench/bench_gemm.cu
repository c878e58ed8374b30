// bench_gemm.cu — the matmul of y = x W^T on the GPU, version by version (llm.c's dev/cuda
// habit: each version a complete idea, checked and timed in one program, so a reader sees how
// the kernel became fast and a GPU says by how much), and cuBLAS SGEMM beside them:
//   version 1: one thread per element of C, its row of A and column of B read straight from
//              global memory: 2 loads per fused multiply-add, each from global memory.
//   version 2: the first cuda/linear.cu, kept whole: 16 x 16 tiles of A and B staged in
//              shared memory, one element of C per thread: each element of A and B is read
//              from global memory once per block instead of once per thread, but the inner
//              loop still does 2 shared-memory loads per multiply-add.
//   version 3: cuda/linear.cu, what the trainer runs: register-blocked (a thread keeps an
//              8 x 8 or 4 x 4 tile of C in registers: 64 FMAs for 16 shared loads), 16-byte
//              loads, split-K when there are too few tiles to fill the GPU.
//   cuBLAS:    SGEMM, float32 without TF32 (cuda/linear.cu's --cublas path).
// Each runs the three products of one linear layer at the bench model's shapes (forward,
// dinp, dweight, with linear.cu's strided operands: no transposed copies), checked against
// the CPU (src/linear.c) within 1e-4 of the tensor's largest value (sums of up to 1024
// products of O(1) numbers), then timed with CUDA events (median of --repeats after warm-up).
// Exits 1 on a mismatch. Built by `make gpu-check`, which runs it.
//
// ./build/bench_gemm [--repeats N]
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <vector>

#include "common.cuh"
#include "layers.cuh"
#include "layers.h"
#include "bench_gpu.h"

// Every version computes C (M,P) = A (M,K) . B (K,P), or C += when accumulating, reading
// the operands through strides as cuda/linear.cu does: A(m,k) = a[m*a_row + k*a_col],
// B(k,p) = b[k*b_row + p*b_col].
typedef void (*Matmul)(float* c, const float* a, const float* b, size_t M, size_t P, size_t K,
                       size_t a_row, size_t a_col, size_t b_row, size_t b_col, int accumulate);

// ---- version 1 ---------------------------------------------------------------------------
// Thread (x, y) of a 16 x 16 block computes C(m, p), p along x: the 16 threads of a row of
// the block read the same A(m,k) (one broadcast) and 16 neighbouring B(k,p) (one contiguous
// read where B's rows are contiguous, 16 scattered ones where they are not).
__global__ void matmul_naive_kernel(float* c, const float* a, const float* b, size_t M,
                                    size_t P, size_t K, size_t a_row, size_t a_col,
                                    size_t b_row, size_t b_col, int accumulate) {
    size_t m = (size_t)blockIdx.x * blockDim.y + threadIdx.y;
    size_t p = (size_t)blockIdx.y * blockDim.x + threadIdx.x;
    if (m >= M || p >= P) return;
    float sum = 0.0f;
    for (size_t k = 0; k < K; k++) sum += a[m * a_row + k * a_col] * b[k * b_row + p * b_col];
    if (accumulate) c[m * P + p] += sum;
    else c[m * P + p] = sum;
}

static void matmul_naive(float* c, const float* a, const float* b, size_t M, size_t P, size_t K,
                         size_t a_row, size_t a_col, size_t b_row, size_t b_col, int accumulate) {
    launch_kernel(matmul_naive_kernel, dim3(ceil_div(M, 16), ceil_div(P, 16)), dim3(16, 16), c,
                  a, b, M, P, K, a_row, a_col, b_row, b_col, accumulate);
}

// ---- version 2 (cuda/linear.cu as first written) -----------------------------------------
#define TILE 16

// Each block computes a TILE x TILE tile of C, one thread per element, stepping along K one
// TILE x TILE tile of A and of B at a time through shared memory. blockIdx.x walks the rows
// (M = N*T can pass 65535 tiles), blockIdx.y the columns.
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

static void matmul_tiled(float* out, const float* a, const float* b, size_t M, size_t P,
                         size_t K, size_t a_row, size_t a_col, size_t b_row, size_t b_col,
                         int accumulate) {
    dim3 grid(ceil_div(M, TILE), ceil_div(P, TILE));
    launch_kernel(matmul_tiled_kernel, grid, dim3(TILE, TILE), out, a, b, M, P, K,
                  a_row, a_col, b_row, b_col, accumulate);
}

// ---- the layer's three products, through a version's matmul -----------------------------
// (the operands as linear_forward_cuda and linear_backward_cuda pass them)
template <Matmul matmul>
static void forward_with(float* out, const float* inp, const float* weight, size_t N, size_t IN,
                         size_t OUT) {
    matmul(out, inp, weight, N, OUT, IN, IN, 1, 1, IN, 0);  // A = inp, B(k,p) = weight[p][k]
}
template <Matmul matmul>
static void backward_with(float* dinp, float* dweight, const float* dout, const float* inp,
                          const float* weight, size_t N, size_t IN, size_t OUT) {
    matmul(dinp, dout, weight, N, IN, OUT, OUT, 1, IN, 1, 1);    // A = dout, B = weight
    matmul(dweight, dout, inp, OUT, IN, N, 1, OUT, IN, 1, 1);    // A(o,n) = dout[n][o], B = inp
}

struct Version {
    const char* name;
    void (*forward)(float*, const float*, const float*, size_t, size_t, size_t);
    void (*backward)(float*, float*, const float*, const float*, const float*, size_t, size_t,
                     size_t);
    int cublas;  // linear.cu's functions through cuBLAS
};

static const Version VERSIONS[] = {
    {"v1 naive", forward_with<matmul_naive>, backward_with<matmul_naive>, 0},
    {"v2 16x16 tiles", forward_with<matmul_tiled>, backward_with<matmul_tiled>, 0},
    {"v3 linear.cu", linear_forward_cuda, linear_backward_cuda, 0},
#ifdef __CUDACC__  // the emulator has no cuBLAS
    {"cuBLAS", linear_forward_cuda, linear_backward_cuda, 1},
#endif
};
static const int N_VERSIONS = sizeof(VERSIONS) / sizeof(VERSIONS[0]);

// max |a - b| / max |b|
static double relative_difference(const std::vector<float>& a, const std::vector<float>& b) {
    double diff = 0.0, scale = 0.0;
    for (size_t i = 0; i < a.size(); i++) {
        diff = std::max(diff, (double)std::fabs(a[i] - b[i]));
        scale = std::max(scale, (double)std::fabs(b[i]));
    }
    return scale > 0.0 ? diff / scale : diff;
}

int main(int argc, char** argv) {
    int repeats = bench_repeats(argc, argv, "bench_gemm", 200);
    // (N, IN, OUT) of the bench model (B*T = 1024 rows): q/k/v/o (d -> d; k, v: d -> d/2),
    // MLP up (d -> F), MLP down (F -> d), lm_head (d -> V)
    const size_t shapes[][3] = {{1024, 256, 256}, {1024, 256, 128}, {1024, 256, 704},
                                {1024, 704, 256}};
    const char* names[] = {"q, o, lm_head", "k, v", "MLP up", "MLP down"};
    std::printf("bench_gemm: float32 matmuls of the bench model, version by version, GFLOP/s "
                "forward / backward (dinp and dweight), median of %d runs\n", repeats);
    std::printf("%-14s %5s %4s %4s", "product", "N", "IN", "OUT");
    for (const Version& v : VERSIONS) std::printf("  %17s", v.name);
    std::printf("\n");
    int ok = 1;
    double flops_all = 0.0, ms[N_VERSIONS] = {0.0};
    for (size_t s = 0; s < sizeof(shapes) / sizeof(shapes[0]); s++) {
        size_t N = shapes[s][0], IN = shapes[s][1], OUT = shapes[s][2];
        std::vector<float> inp = random_floats(N * IN, 1), weight = random_floats(OUT * IN, 2);
        std::vector<float> dout = random_floats(N * OUT, 3), dinp0 = random_floats(N * IN, 4);
        std::vector<float> dweight0 = random_floats(OUT * IN, 5);
        // the CPU's products from the same starting values: the reference
        std::vector<float> cpu[3] = {std::vector<float>(N * OUT), dinp0, dweight0};
        linear_forward(cpu[0].data(), inp.data(), weight.data(), N, IN, OUT);
        linear_backward(cpu[1].data(), cpu[2].data(), dout.data(), inp.data(), weight.data(), N,
                        IN, OUT);
        float *d_inp = upload(inp), *d_weight = upload(weight), *d_dout = upload(dout);
        double flops = 2.0 * N * IN * OUT;
        std::printf("%-14s %5zu %4zu %4zu", names[s], N, IN, OUT);
        for (int k = 0; k < N_VERSIONS; k++) {
            const Version& v = VERSIONS[k];
            linear_use_cublas_cuda(v.cublas);
            float *d_out = upload(random_floats(N * OUT, 6)), *d_dinp = upload(dinp0);
            float* d_dweight = upload(dweight0);
            // one checked run from known starting values, then the timed runs
            v.forward(d_out, d_inp, d_weight, N, IN, OUT);
            v.backward(d_dinp, d_dweight, d_dout, d_inp, d_weight, N, IN, OUT);
            std::vector<float> got[3] = {download(d_out, N * OUT), download(d_dinp, N * IN),
                                         download(d_dweight, OUT * IN)};
            const char* what[] = {"out", "dinp", "dweight"};
            for (int j = 0; j < 3; j++) {
                double rel = relative_difference(got[j], cpu[j]);
                if (!(rel <= 1e-4)) {
                    std::printf("\nFAIL %s %s, %s: differs from the CPU by %.2e (relative)\n",
                                names[s], what[j], v.name, rel);
                    ok = 0;
                }
            }
            Timing t = time_forward_backward(
                [&] { v.forward(d_out, d_inp, d_weight, N, IN, OUT); },
                [&] { v.backward(d_dinp, d_dweight, d_dout, d_inp, d_weight, N, IN, OUT); },
                repeats);
            std::printf("  %7.0f / %-7.0f", flops / t.forward_ms * 1e-6,
                        2 * flops / t.backward_ms * 1e-6);
            ms[k] += t.forward_ms + t.backward_ms;
            cudaCheck(cudaFree(d_out));
            cudaCheck(cudaFree(d_dinp));
            cudaCheck(cudaFree(d_dweight));
        }
        linear_use_cublas_cuda(0);
        std::printf("\n");
        flops_all += 3 * flops;
        cudaCheck(cudaFree(d_inp));
        cudaCheck(cudaFree(d_weight));
        cudaCheck(cudaFree(d_dout));
    }
    std::printf("all products:");
    for (int k = 0; k < N_VERSIONS; k++)
        std::printf("%s %s %.0f GFLOP/s", k ? "," : "", VERSIONS[k].name,
                    flops_all / ms[k] * 1e-6);
    std::printf("\n");
#ifdef __CUDACC__
    std::printf("ours (v3) at %.0f%% of cuBLAS\n", 100.0 * ms[N_VERSIONS - 1] / ms[2]);
#endif
    std::printf("agreement with the CPU: %s\n", ok ? "ok" : "FAIL");
    return ok ? 0 : 1;
}
