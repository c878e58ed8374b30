// common.cuh — what every cuda/*.cu file shares: the CUDA runtime, error checks, the one
// kernel launcher, warp reductions and a layer's private scratch memory.
//
// Compiled by nvcc this is ordinary CUDA. Compiled as C++ by g++ (no __CUDACC__) the runtime
// and the language come from tests/cuda_emu.h, which runs every CUDA thread as a fiber, so
// the same kernels are tested on machines without a GPU.
#ifndef ATTNRES_COMMON_CUH
#define ATTNRES_COMMON_CUH

#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>

#ifdef __CUDACC__
#include <cuda_runtime.h>
#else
#include "cuda_emu.h"
#endif

#define WARP_SIZE 32
#define FULL_MASK 0xffffffffu

// cudaCheck(call) reports the file and line of a failing CUDA call and exits.
inline void cuda_check(cudaError_t error, const char* file, int line) {
    if (error != cudaSuccess) {
        fprintf(stderr, "[CUDA ERROR] at file %s:%d:\n%s\n", file, line, cudaGetErrorString(error));
        exit(EXIT_FAILURE);
    }
}
#define cudaCheck(call) cuda_check((call), __FILE__, __LINE__)

// Every layer launches on this stream (0: the default stream); set it once at start-up.
inline cudaStream_t cuda_stream = 0;

// launch_kernel(kernel, grid, block, args...) is kernel<<<grid, block, 0, cuda_stream>>>(args...)
// followed by a check of the launch. No dynamic shared memory: kernels declare theirs static.
template <typename... Params, typename... Args>
void launch_kernel(void (*kernel)(Params...), dim3 grid, dim3 block, Args... args) {
#ifdef __CUDACC__
    kernel<<<grid, block, 0, cuda_stream>>>(args...);
    cudaError_t error = cudaGetLastError();
    if (error != cudaSuccess) {
        fprintf(stderr, "[CUDA ERROR] launching grid (%u,%u,%u) of blocks (%u,%u,%u): %s\n",
                grid.x, grid.y, grid.z, block.x, block.y, block.z, cudaGetErrorString(error));
        exit(EXIT_FAILURE);
    }
#else
    cuda_emu::launch(kernel, grid, block, args...);
#endif
}

// the number of blocks of `block_size` that cover `n`
inline unsigned int ceil_div(size_t n, size_t block_size) {
    return (unsigned int)((n + block_size - 1) / block_size);
}

// Butterfly reductions over the 32 lanes of a warp; every lane gets the same result.
__device__ __forceinline__ float warp_sum(float x) {
    for (int offset = WARP_SIZE / 2; offset > 0; offset /= 2)
        x += __shfl_xor_sync(FULL_MASK, x, offset);
    return x;
}
__device__ __forceinline__ float warp_max(float x) {
    for (int offset = WARP_SIZE / 2; offset > 0; offset /= 2)
        x = fmaxf(x, __shfl_xor_sync(FULL_MASK, x, offset));
    return x;
}

// Device memory private to one layer (e.g. attention's backward keeps dscores in it): grows
// when a call needs more (cudaFree and cudaMalloc synchronise the device), never shrinks,
// and lives until the program exits.
struct Scratch {
    float* data;
    size_t count;
};
inline float* scratch_floats(Scratch* scratch, size_t count) {
    if (count > scratch->count) {
        if (scratch->data != NULL) cudaCheck(cudaFree(scratch->data));
        cudaCheck(cudaMalloc(&scratch->data, count * sizeof(float)));
        scratch->count = count;
    }
    return scratch->data;
}

#endif
