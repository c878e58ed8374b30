// common.cuh — what every cuda/*.cu file shares: the CUDA runtime, error checks, the one
// kernel launcher, device memory (checked allocation, the shared workspace), warp reductions.
//
// Compiled by nvcc this is ordinary CUDA. Compiled as C++ by g++ (no __CUDACC__) the runtime
// and the language come from tests/cuda_emu.h, which runs every CUDA thread as a fiber, so
// the same kernels are tested on machines without a GPU.
#ifndef ATTNRES_COMMON_CUH
#define ATTNRES_COMMON_CUH

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <tuple>
#include <utility>

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
        fprintf(stderr, "error: CUDA call failed at %s:%d: %s\n", file, line,
                cudaGetErrorString(error));
        exit(EXIT_FAILURE);
    }
}
#define cudaCheck(call) cuda_check((call), __FILE__, __LINE__)

// Every layer launches on this stream (0: the default stream); set it once at start-up.
inline cudaStream_t cuda_stream = 0;

// ATTNRES_CUDA_SYNC=1 in the environment: wait for every kernel right after its launch and
// check it, so that a fault is reported by the kernel that caused it (slow; for debugging).
inline bool cuda_sync_every_launch() {
    static int on = -1;
    if (on < 0) {
        const char* flag = getenv("ATTNRES_CUDA_SYNC");
        on = flag != NULL && flag[0] != '\0' && flag[0] != '0';
    }
    return on;
}

// ---- CUDA graphs ---------------------------------------------------------------------------
// A CudaGraph (common.cu) is a sequence of queued work captured once and launched many times:
// the training step (cuda/model.cu). cuda_graph_prepare(&graph, queue) calls queue(), which
// queues work through launch_kernel, cuda_memset_async and cuda_memcpy_async. The first time,
// cuda_stream is captured: nothing runs, each launch, set and copy becomes a node of the
// graph, and the graph is instantiated. After that, queue() is only walked: nothing is queued,
// each launch is compared with the captured one in turn, and where its arguments differ (a
// learning rate, AdamW's step, the number of targets) the instantiated graph's node gets the
// new ones (cudaGraphExecKernelNodeSetParams). So every launch of the graph runs the kernels,
// grids, blocks and arguments that queue() would have queued itself. A walk that meets another
// kernel, grid, block, set or copy than the capture's exits naming it. cuda_graph_launch
// queues the whole graph on cuda_stream. Work that several calls queue in turn (the training
// step's forward, zero grad and backward) is bracketed by cuda_graph_begin and cuda_graph_end
// instead, the two halves of cuda_graph_prepare.
struct CudaGraph;
// the graph being captured (its launches recorded) or walked (compared, nothing queued)
inline CudaGraph* cuda_graph_capturing = NULL;
inline CudaGraph* cuda_graph_walking = NULL;
// launch_kernel's part: the kernel's arguments, args[i] pointing to argument i (sizes[i]
// bytes), recorded after its launch (capturing) or compared with the capture (walking)
void cuda_graph_kernel(const void* kernel, dim3 grid, dim3 block, void* const* args,
                       const size_t* sizes, size_t n_args);
// The capture of a new graph into *graph (NULL), or the walk of *graph, begins; then ends
void cuda_graph_begin(CudaGraph** graph);
void cuda_graph_end(CudaGraph* graph);
template <typename Queue>
void cuda_graph_prepare(CudaGraph** graph, Queue queue) {
    cuda_graph_begin(graph);
    queue();
    cuda_graph_end(*graph);
}
void cuda_graph_launch(CudaGraph* graph);
void cuda_graph_free(CudaGraph* graph);  // NULL: nothing
// As cudaMemsetAsync and cudaMemcpyAsync on cuda_stream, recorded or compared like a launch
void cuda_memset_async(void* pointer, int value, size_t bytes);
void cuda_memcpy_async(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind);

// launch_kernel's arguments converted to the kernel's parameter types, as a launch converts
// them, handed to the graph
template <typename... Params, size_t... I>
void cuda_graph_kernel_params(const void* kernel, dim3 grid, dim3 block,
                              std::tuple<Params...>& params, std::index_sequence<I...>) {
    void* args[] = {(void*)&std::get<I>(params)...};
    size_t sizes[] = {sizeof(Params)...};
    cuda_graph_kernel(kernel, grid, block, args, sizes, sizeof...(Params));
}

// launch_kernel(kernel, grid, block, args...) is kernel<<<grid, block, 0, cuda_stream>>>(args...)
// followed by a check of the launch that names the kernel. No dynamic shared memory: kernels
// declare theirs static. While a graph is walked it queues nothing (see CUDA graphs above).
template <typename... Params, typename... Args>
void launch_kernel(void (*kernel)(Params...), dim3 grid, dim3 block, Args... args) {
    if (cuda_graph_walking != NULL) {
        std::tuple<Params...> params(args...);
        cuda_graph_kernel_params((const void*)kernel, grid, block, params,
                                 std::index_sequence_for<Params...>{});
        return;
    }
#ifdef __CUDACC__
    kernel<<<grid, block, 0, cuda_stream>>>(args...);
    cudaError_t error = cudaGetLastError();
    if (error == cudaSuccess && cuda_sync_every_launch() && cuda_graph_capturing == NULL)
        error = cudaStreamSynchronize(cuda_stream);
    if (error != cudaSuccess) {
        const char* name = "?";
        if (cudaFuncGetName(&name, (const void*)kernel) != cudaSuccess) name = "?";
        fprintf(stderr, "error: CUDA kernel %s, grid (%u,%u,%u) of blocks (%u,%u,%u): %s\n",
                name, grid.x, grid.y, grid.z, block.x, block.y, block.z,
                cudaGetErrorString(error));
        exit(EXIT_FAILURE);
    }
#else
    cuda_emu::launch(kernel, grid, block, args...);
#endif
    if (cuda_graph_capturing != NULL) {
        std::tuple<Params...> params(args...);
        cuda_graph_kernel_params((const void*)kernel, grid, block, params,
                                 std::index_sequence_for<Params...>{});
    }
}

// cudaMalloc that names what ran out: one line with the size asked for, then exit
inline void* cuda_malloc_checked(size_t bytes) {
    void* ptr = NULL;
    if (bytes == 0) bytes = 1;
    cudaError_t error = cudaMalloc(&ptr, bytes);
    if (error == cudaErrorMemoryAllocation) {
        size_t free_bytes = 0, total_bytes = 0;
        (void)cudaGetLastError();
        (void)cudaMemGetInfo(&free_bytes, &total_bytes);
        fprintf(stderr, "error: out of GPU memory: allocating %zu bytes (%.1f MiB) with %.1f of "
                "%.1f MiB free\n", bytes, bytes / 1048576.0, free_bytes / 1048576.0,
                total_bytes / 1048576.0);
        exit(EXIT_FAILURE);
    }
    if (error != cudaSuccess) {
        fprintf(stderr, "error: cudaMalloc of %zu bytes failed: %s\n", bytes,
                cudaGetErrorString(error));
        exit(EXIT_FAILURE);
    }
    return ptr;
}
inline float* cuda_malloc_floats(size_t count) {
    return (float*)cuda_malloc_checked(count * sizeof(float));
}

// The number of streaming multiprocessors of the device: how many blocks it runs at once,
// which the matmul uses to choose its tile shape.
inline int cuda_sm_count() {
    static int count = 0;
    if (count == 0) {
        int device = 0;
        cudaCheck(cudaGetDevice(&device));
        cudaCheck(cudaDeviceGetAttribute(&count, cudaDevAttrMultiProcessorCount, device));
    }
    return count;
}

// One device buffer that the layers borrow for scratch (score gradients, split-K partial sums,
// per-block partial sums). Everything runs in order on cuda_stream, so one call's scratch is
// dead when the next call starts. It grows when a call needs more (cudaFree synchronises, so
// no kernel still reads the old one) and never shrinks; model_build_cuda reserves the most a
// training step needs, so that steps allocate nothing.
// cuda_grow_floats: *data grown to count floats the same way, for any such buffer.
inline float* cuda_grow_floats(float** data, size_t* capacity, size_t count) {
    if (count > *capacity) {
        if (*data != NULL) cudaCheck(cudaFree(*data));
        *data = cuda_malloc_floats(count);
        *capacity = count;
    }
    return *data;
}
inline float* cuda_workspace(size_t count) {
    static float* data = NULL;
    static size_t capacity = 0;
    return cuda_grow_floats(&data, &capacity, count);
}

// the number of blocks of `threads` threads each that cover `n`
inline unsigned int ceil_div(size_t n, size_t threads) {
    return (unsigned int)((n + threads - 1) / threads);
}

// 4 floats at ptr (16-byte aligned) in one 16-byte load or store. The emulator copies them
// and, as a GPU would fault, aborts on an address that is not 16-byte aligned.
#ifdef __CUDACC__
__device__ __forceinline__ float4 load_float4(const float* ptr) {
    return *reinterpret_cast<const float4*>(ptr);
}
__device__ __forceinline__ void store_float4(float* ptr, float4 v) {
    *reinterpret_cast<float4*>(ptr) = v;
}
#else
inline float4 load_float4(const float* ptr) {
    if ((uintptr_t)ptr % 16 != 0) cuda_emu::fail("misaligned 16-byte load at %p", (const void*)ptr);
    float4 v;
    memcpy(&v, ptr, sizeof(v));
    return v;
}
inline void store_float4(float* ptr, float4 v) {
    if ((uintptr_t)ptr % 16 != 0) cuda_emu::fail("misaligned 16-byte store at %p", (void*)ptr);
    memcpy(ptr, &v, sizeof(v));
}
#endif

// Column sums over many rows (weight gradients: the sum over the B*T rows of each column) run
// in two steps, so that more than C threads work: each (part of ROWS_PER_PART rows, column)
// sums its rows in order into partial[part][column] (a kernel of the layer's own); then
// add_column_partials_cuda (common.cu) adds the parts in order: out_c += the sum over the
// parts of partial[part][c].
// Fixed orders both times, so the result repeats bit for bit.
// A thread that sums many parts loads PART_CHUNK of them at once before adding them: one part
// after another would wait out a memory latency each.
#define ROWS_PER_PART 32
#define PART_CHUNK 8
void add_column_partials_cuda(float* out, const float* partial, size_t parts, size_t C);
// Both steps, for a matrix x (N, C) of per-row terms: out_c += sum_n x[n][c], through
// partial (ceil(N / ROWS_PER_PART), C), the caller's scratch.
void add_column_sums_cuda(float* out, float* partial, const float* x, size_t N, size_t C);

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

#endif
