// linear.cu — y = x W^T on the GPU (mirror of src/linear.c): one register-blocked matmul does
// the forward and both halves of the backward. Read it as a walk through how a fast GEMM
// works; every step is plain CUDA, so the emulator runs it too.
//
// C (M,J) = A (M,K) . B (K,J), or C += when accumulating. The operands are read through
// strides, A(m,k) = a[m*a_row + k*a_col] and B(k,j) = b[k*b_row + j*b_col], so the three
// products need no transposed copies:
//   forward   out = inp . W^T      A = inp (k contiguous),    B(k,j) = W[j][k] (k contiguous)
//   backward  dinp += dout . W     A = dout (k contiguous),   B = W (j contiguous)
//             dW += dout^T . inp   A(m,k) = dout[k][m] (m contiguous), B = inp (j contiguous)
//
// 1. Blocking for the memory hierarchy. A block of 256 threads owns a BM x BN tile of C. It
//    walks K in steps of BK: all 256 threads copy a BM x BK slice of A and a BK x BN slice of
//    B into shared memory (each element read from global memory once per block), wait
//    (__syncthreads), then multiply out of shared memory.
// 2. Blocking for registers. Each thread owns a TM x TN sub-tile of C (8 x 8 in the big
//    configuration) kept in registers. For each k of the slice it loads TM values of A and TN
//    of B into registers and does TM*TN fused multiply-adds with them: 64 FMAs for 16 shared
//    loads, where one output per thread would need 2 loads per FMA.
// 3. Coalesced, vectorised loads. Whichever direction of an operand is contiguous in memory,
//    neighbouring threads read neighbouring addresses, 4 floats (16 bytes) at a time when the
//    tile is inside the matrix and the address is aligned; shared memory holds both slices
//    k-major (As[k][m], Bs[k][j]) so the inner loop reads rows of them.
// 4. Split-K when C is small. dW is only OUT x IN (e.g. 256 x 256 = 16 tiles of 64 x 64) but
//    K = B*T is long; even the forward of 1024 rows has 64 tiles for 132 multiprocessors: too
//    few blocks to fill the GPU. The K range is then split into S parts,
//    each written to its own slice of a scratch buffer, and a second kernel adds the slices
//    in order. No atomics anywhere: every output is summed in a fixed order, so results
//    repeat bit for bit.
#include "common.cuh"
#include "layers.cuh"
#ifdef __CUDACC__
#include <cublas_v2.h>
#endif

// The copy of one operand's slice into shared memory. X(i,k) = x[i*s_i + k*s_k] where i runs
// over the rows of C (for A) or its columns (for B) and k over the reduction; the slice is
// i0 .. i0+BI-1 by k0 .. k0+BK-1, stored k-major: tile[k][i]. Each thread copies groups of 4
// elements that are consecutive in memory (along k when s_k == 1, else along i), as one
// 16-byte load when `vectorised` (x aligned, the other stride a multiple of 4) and the group
// lies inside the matrix; elements outside (i >= n_i or k >= n_k) are 0.
template <int BI, int BK, int THREADS>
__device__ __forceinline__ void load_tile(float (*tile)[BI], const float* x, size_t s_i,
                                          size_t s_k, size_t i0, size_t k0, size_t n_i,
                                          size_t n_k, bool vectorised) {
    const bool along_k = s_k == 1;
    for (int g = threadIdx.x; g < BI * BK / 4; g += THREADS) {
        int ii = along_k ? g / (BK / 4) : g % (BI / 4) * 4;
        int kk = along_k ? g % (BK / 4) * 4 : g / (BI / 4);
        size_t i = i0 + ii, k = k0 + kk;
        float v[4];
        bool inside = along_k ? (i < n_i && k + 3 < n_k) : (k < n_k && i + 3 < n_i);
        if (vectorised && inside) {
            float4 q = load_float4(x + i * s_i + k * s_k);
            v[0] = q.x; v[1] = q.y; v[2] = q.z; v[3] = q.w;
        } else {
            for (int j = 0; j < 4; j++) {
                size_t ij = along_k ? i : i + j, kj = along_k ? k + j : k;
                v[j] = (ij < n_i && kj < n_k) ? x[ij * s_i + kj * s_k] : 0.0f;
            }
        }
        for (int j = 0; j < 4; j++) {
            if (along_k) tile[kk + j][ii] = v[j];
            else tile[kk][ii + j] = v[j];
        }
    }
}

// One BM x BN tile of C per block, TM x TN outputs per thread, k from k_begin to k_end.
// Writes C (accumulate: C +=) or, with `partial`, its own slice partial[blockIdx.z] (M,J).
template <int BM, int BN, int BK, int TM, int TN>
__global__ void __launch_bounds__((BM / TM) * (BN / TN))
matmul_kernel(float* c, float* partial, const float* a, const float* b, size_t M, size_t J,
              size_t K, size_t a_row, size_t a_col, size_t b_row, size_t b_col,
              size_t k_per_split, int accumulate, int vectorised_a, int vectorised_b,
              int vectorised_c) {
    constexpr int THREADS = (BM / TM) * (BN / TN);
    __shared__ float As[BK][BM];
    __shared__ float Bs[BK][BN];
    const int tx = threadIdx.x % (BN / TN), ty = threadIdx.x / (BN / TN);
    const size_t m0 = (size_t)blockIdx.x * BM, j0 = (size_t)blockIdx.y * BN;
    const size_t k_begin = (size_t)blockIdx.z * k_per_split;
    const size_t k_end = k_begin + k_per_split < K ? k_begin + k_per_split : K;

    float acc[TM][TN];  // registers: every loop over i, j below is unrolled
#pragma unroll
    for (int i = 0; i < TM; i++)
#pragma unroll
        for (int j = 0; j < TN; j++) acc[i][j] = 0.0f;
    for (size_t k0 = k_begin; k0 < k_end; k0 += BK) {
        // A(m, k) with i = m; B(k, j) with i = j. Elements past k_end read as 0.
        load_tile<BM, BK, THREADS>(As, a, a_row, a_col, m0, k0, M, k_end, vectorised_a);
        load_tile<BN, BK, THREADS>(Bs, b, b_col, b_row, j0, k0, J, k_end, vectorised_b);
        __syncthreads();  // both slices complete before anyone multiplies
#pragma unroll
        for (int k = 0; k < BK; k++) {
            float a_reg[TM], b_reg[TN];
#pragma unroll
            for (int i = 0; i < TM; i++) a_reg[i] = As[k][ty * TM + i];
#pragma unroll
            for (int j = 0; j < TN; j++) b_reg[j] = Bs[k][tx * TN + j];
#pragma unroll
            for (int i = 0; i < TM; i++)
#pragma unroll
                for (int j = 0; j < TN; j++) acc[i][j] = fmaf(a_reg[i], b_reg[j], acc[i][j]);
        }
        __syncthreads();  // everyone is done with the slices before the next copy
    }

    float* out = partial != NULL ? partial + (size_t)blockIdx.z * M * J : c;
    int add = partial == NULL && accumulate;
    const size_t col = j0 + tx * TN;
#pragma unroll
    for (int i = 0; i < TM; i++) {
        size_t m = m0 + ty * TM + i;
        if (m >= M) continue;
        float* row = out + m * J + col;
#pragma unroll
        for (int j = 0; j < TN; j += 4) {
            if (vectorised_c && col + j + 3 < J) {  // 4 outputs in one 16-byte store
                float4 old = add ? load_float4(row + j) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
                store_float4(row + j, make_float4(old.x + acc[i][j], old.y + acc[i][j + 1],
                                                  old.z + acc[i][j + 2], old.w + acc[i][j + 3]));
            } else {
#pragma unroll
                for (int q = 0; q < 4; q++)
                    if (col + j + q < J) row[j + q] = add ? row[j + q] + acc[i][j + q] : acc[i][j + q];
            }
        }
    }
}

// C (M,J) (+)= sum over s = 0 .. splits-1 of partial[s] (M,J), in that order. A thread takes
// 4 neighbouring elements, one 16-byte load per split where the count and c allow it (each
// partial slice then starts 16-byte aligned in the workspace), and reads the splits 4 at a
// time: the 4 loads are issued together (predicated, no branch between them), then added, so
// the thread waits out one memory latency per 4 splits instead of one per split. (4, not 8:
// the emulator's 4 multiprocessors give at most 8 splits, and a second chunk must run in
// the tests too.)
#define SPLIT_CHUNK 4
__global__ void split_k_sum_kernel(float* c, const float* partial, size_t count, int splits,
                                   int accumulate) {
    size_t i = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) * 4;
    if (i >= count) return;
    if (count % 4 == 0 && (uintptr_t)c % 16 == 0) {
        float4 sum = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        for (int first = 0; first < splits; first += SPLIT_CHUNK) {
            float4 loaded[SPLIT_CHUNK];
#pragma unroll
            for (int j = 0; j < SPLIT_CHUNK; j++)
                if (first + j < splits)
                    loaded[j] = load_float4(partial + (size_t)(first + j) * count + i);
#pragma unroll
            for (int j = 0; j < SPLIT_CHUNK; j++) {
                if (first + j < splits) {
                    sum.x += loaded[j].x; sum.y += loaded[j].y; sum.z += loaded[j].z;
                    sum.w += loaded[j].w;
                }
            }
        }
        if (accumulate) {
            float4 old = load_float4(c + i);
            sum = make_float4(old.x + sum.x, old.y + sum.y, old.z + sum.z, old.w + sum.w);
        }
        store_float4(c + i, sum);
        return;
    }
    for (size_t e = i; e < i + 4 && e < count; e++) {  // one float at a time
        float sum = 0.0f;
        for (int first = 0; first < splits; first += SPLIT_CHUNK) {
            float loaded[SPLIT_CHUNK];
#pragma unroll
            for (int j = 0; j < SPLIT_CHUNK; j++)
                if (first + j < splits) loaded[j] = partial[(size_t)(first + j) * count + e];
#pragma unroll
            for (int j = 0; j < SPLIT_CHUNK; j++)
                if (first + j < splits) sum += loaded[j];
        }
        c[e] = accumulate ? c[e] + sum : sum;
    }
}

// 16-byte loads of X(i,k) = x[i*s_i + k*s_k] are possible when x is 16-byte aligned, the
// contiguous direction has stride 1 and the other stride keeps every group aligned
static int vectorisable(const float* x, size_t s_i, size_t s_k) {
    size_t other = s_k == 1 ? s_i : s_k;
    return ((uintptr_t)x % 16 == 0) && (s_i == 1 || s_k == 1) && other % 4 == 0;
}

// How one product runs: the tile shape, 128 x 128 (8 x 8 per thread) when there are enough
// such tiles to fill the GPU, else 64 x 64 (4 x 4 per thread), four times as many blocks; and
// into how many parts K is split.
#define MATMUL_BK 8  // the slice of K both tile shapes copy into shared memory at a time
typedef struct {
    int big;                     // 1: 128 x 128 tiles, 0: 64 x 64
    size_t splits, k_per_split;  // K in `splits` parts of k_per_split (the last may be shorter)
} MatmulPlan;

static MatmulPlan matmul_plan(size_t M, size_t J, size_t K) {
    const size_t sms = (size_t)cuda_sm_count();
    MatmulPlan plan;
    plan.big = (size_t)ceil_div(M, 128) * ceil_div(J, 128) >= sms;
    const size_t tile = plan.big ? 128 : 64;
    const size_t tiles = (size_t)ceil_div(M, tile) * ceil_div(J, tile);
    // Split K when the tiles alone would leave the GPU short of blocks: double the splits
    // while the blocks stay under 4 per multiprocessor and each split keeps >= 64 of K (8
    // slices of MATMUL_BK): at the bench shapes the tiles alone fill too few multiprocessors,
    // and each doubling of the splits brought the products closer to cuBLAS SGEMM
    // (docs/cuda.md, dev/bench/bench_gemm.cu).
    size_t splits = 1;
    while (tiles * splits * 2 <= sms * 4 && K / (splits * 2) >= 64) splits *= 2;
    plan.k_per_split = ceil_div(K, splits * MATMUL_BK) * (size_t)MATMUL_BK;
    plan.splits = ceil_div(K, plan.k_per_split);
    return plan;
}

// The floats of the workspace a product run by `plan` borrows: the split-K partial sums, one
// M x J slice per split (none without a split)
static size_t plan_workspace_floats(const MatmulPlan* plan, size_t M, size_t J) {
    return plan->splits > 1 ? plan->splits * M * J : 0;
}

size_t matmul_workspace_floats_cuda(size_t M, size_t J, size_t K) {
    MatmulPlan plan = matmul_plan(M, J, K);
    return plan_workspace_floats(&plan, M, J);
}

// Split-K keeps tiles * splits <= 4 * multiprocessors (matmul_plan), and a tile covers at
// most 128 x 128 outputs, so one product's partial sums, splits * M * J <= splits * tiles *
// 128 * 128, never need more floats than this (on an H200, 35 MB)
size_t linear_workspace_floats_cuda(void) { return 4 * (size_t)cuda_sm_count() * 128 * 128; }

template <int BM, int BN, int TM, int TN>
static void launch_matmul(const MatmulPlan* plan, float* c, const float* a, const float* b,
                          size_t M, size_t J, size_t K, size_t a_row, size_t a_col,
                          size_t b_row, size_t b_col, int accumulate) {
    constexpr int THREADS = (BM / TM) * (BN / TN);
    const size_t splits = plan->splits;
    float* partial = splits > 1 ? cuda_workspace(plan_workspace_floats(plan, M, J)) : NULL;
    dim3 grid(ceil_div(M, BM), ceil_div(J, BN), (unsigned int)splits);
    launch_kernel(matmul_kernel<BM, BN, MATMUL_BK, TM, TN>, grid, THREADS, c, partial, a, b,
                  M, J, K, a_row, a_col, b_row, b_col, plan->k_per_split, accumulate,
                  vectorisable(a, a_row, a_col), vectorisable(b, b_col, b_row),
                  (int)((uintptr_t)c % 16 == 0 && J % 4 == 0));
    if (splits > 1) {
        const size_t threads = 256;
        launch_kernel(split_k_sum_kernel, ceil_div(ceil_div(M * J, 4), threads), threads,
                      c, partial, M * J, (int)splits, accumulate);
    }
}

// ---- the reference: the same products through cuBLAS (linear_use_cublas_cuda) ----------
// cuBLAS is column-major: our row-major C (M,J) is its C^T (J,M) = B^T A^T. A row-major
// operand read as column-major is already transposed (op N, leading dimension its row
// stride); one whose rows are its contiguous direction needs op T. float32 throughout:
// CUBLAS_DEFAULT_MATH never uses TF32.
static int use_cublas = 0;

void linear_use_cublas_cuda(int on) {
#ifndef __CUDACC__
    if (on) {
        fprintf(stderr, "error: this build has no cuBLAS (the emulator)\n");
        exit(EXIT_FAILURE);
    }
#endif
    use_cublas = on;
}

static int matmul_use_cublas(float* c, const float* a, const float* b, size_t M, size_t J,
                             size_t K, size_t a_row, size_t a_col, size_t b_row, size_t b_col,
                             int accumulate) {
#ifdef __CUDACC__
    if (!use_cublas) return 0;
    static cublasHandle_t handle = NULL;
    if (handle == NULL) {
        if (cublasCreate(&handle) != CUBLAS_STATUS_SUCCESS ||
            cublasSetMathMode(handle, CUBLAS_DEFAULT_MATH) != CUBLAS_STATUS_SUCCESS) {
            fprintf(stderr, "error: cuBLAS could not be initialised\n");
            exit(EXIT_FAILURE);
        }
    }
    cublasSetStream(handle, cuda_stream);
    cublasOperation_t op_a = a_col == 1 ? CUBLAS_OP_N : CUBLAS_OP_T;
    cublasOperation_t op_b = b_col == 1 ? CUBLAS_OP_N : CUBLAS_OP_T;
    int lda = (int)(a_col == 1 ? a_row : a_col), ldb = (int)(b_col == 1 ? b_row : b_col);
    const float one = 1.0f, beta = accumulate ? 1.0f : 0.0f;
    cublasStatus_t status = cublasSgemm(handle, op_b, op_a, (int)J, (int)M, (int)K, &one, b, ldb,
                                        a, lda, &beta, c, (int)J);
    if (status != CUBLAS_STATUS_SUCCESS) {
        fprintf(stderr, "error: cublasSgemm (%zu x %zu x %zu) failed with status %d\n", M, J, K,
                (int)status);
        exit(EXIT_FAILURE);
    }
    return 1;
#else
    (void)c; (void)a; (void)b; (void)M; (void)J; (void)K; (void)a_row; (void)a_col;
    (void)b_row; (void)b_col; (void)accumulate;
    return 0;
#endif
}

static void matmul(float* c, const float* a, const float* b, size_t M, size_t J, size_t K,
                   size_t a_row, size_t a_col, size_t b_row, size_t b_col, int accumulate) {
    if (matmul_use_cublas(c, a, b, M, J, K, a_row, a_col, b_row, b_col, accumulate)) return;
    MatmulPlan plan = matmul_plan(M, J, K);
    if (plan.big)
        launch_matmul<128, 128, 8, 8>(&plan, c, a, b, M, J, K, a_row, a_col, b_row, b_col,
                                      accumulate);
    else
        launch_matmul<64, 64, 4, 4>(&plan, c, a, b, M, J, K, a_row, a_col, b_row, b_col,
                                    accumulate);
}

// out (N,OUT) = inp (N,IN) . weight^T, weight (OUT,IN). Overwrites out.
void linear_forward_cuda(float* out, const float* inp, const float* weight,
                         size_t N, size_t IN, size_t OUT) {
    // A = inp (N,IN), B(k,j) = weight[j][k]
    matmul(out, inp, weight, N, OUT, IN, IN, 1, 1, IN, 0);
}

// out (N,M) += a (N,K) . b (K,M), both row-major as they are
void matmul_add_cuda(float* out, const float* a, const float* b, size_t N, size_t K, size_t M) {
    matmul(out, a, b, N, M, K, K, 1, M, 1, 1);
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
