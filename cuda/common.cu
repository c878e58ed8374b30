// common.cu — the pieces of common.cuh that are not inline: the column sums (kernels), and
// the captured CUDA graphs.
#include "common.cuh"

// out_c += sum over part = 0 .. parts-1 of partial[part][c], in order of part; one thread per
// column.
// There are only C threads (8 warps at C = 256), so each loads PART_CHUNK parts at once before
// adding them (common.cuh).
__global__ void column_partials_sum_kernel(float* out, const float* partial, size_t parts,
                                           size_t C) {
    size_t c = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C) return;
    float sum = 0.0f;
    for (size_t first = 0; first < parts; first += PART_CHUNK) {
        float v[PART_CHUNK];
#pragma unroll
        for (int k = 0; k < PART_CHUNK; k++)
            if (first + k < parts) v[k] = partial[(first + k) * C + c];
#pragma unroll
        for (int k = 0; k < PART_CHUNK; k++)
            if (first + k < parts) sum += v[k];
    }
    out[c] += sum;
}

void add_column_partials_cuda(float* out, const float* partial, size_t parts, size_t C) {
    const size_t threads = 128;
    launch_kernel(column_partials_sum_kernel, ceil_div(C, threads), threads, out, partial,
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
    const size_t threads = 64;
    unsigned int parts = ceil_div(N, ROWS_PER_PART);
    launch_kernel(column_part_sums_kernel, dim3(ceil_div(C, threads), parts), threads,
                  partial, x, N, C);
    add_column_partials_cuda(out, partial, parts, C);
}

// ---- CUDA graphs (common.cuh) -------------------------------------------------------------

#include <vector>

// One operation of a captured graph, in the order queued
struct CudaGraphOp {
    const void* kernel;    // NULL: a set or a copy
    cudaGraphNode_t node;  // a kernel's node, whose arguments a walk brings up to date
    dim3 grid, block;
    size_t first, n;       // its bytes in CudaGraph::bytes: a kernel's arguments one after
                           // another, or a set's or copy's parameters
};
struct CudaGraph {
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    std::vector<CudaGraphOp> ops;
    std::vector<unsigned char> bytes;
    size_t next;  // while walked: the operation the next launch, set or copy is compared with
};

// graph_check: cudaCheck for the capture and replay calls, naming the way around them
static void graph_check(cudaError_t error, const char* what) {
    if (error != cudaSuccess) {
        fprintf(stderr, "error: CUDA graph %s failed: %s (./train_cuda --no-graph queues the step "
                "call by call)\n", what, cudaGetErrorString(error));
        exit(EXIT_FAILURE);
    }
}

[[noreturn]] static void walk_differs(const CudaGraph* g, const char* what) {
    fprintf(stderr, "error: a captured CUDA graph's walk queued %s where its capture queued "
            "operation %zu of %zu differently (the step must queue the same work every time)\n",
            what, g->next + 1, g->ops.size());
    exit(EXIT_FAILURE);
}

static CudaGraph* cuda_graph_capture_begin(void) {
    if (cuda_graph_capturing != NULL || cuda_graph_walking != NULL) {
        fprintf(stderr, "error: a CUDA graph is prepared inside another\n");
        exit(EXIT_FAILURE);
    }
    // The legacy stream (0) cannot be captured: a stream of its own, created without
    // cudaStreamNonBlocking, so that synchronous copies on the legacy stream still wait for it
    if (cuda_stream == 0) cudaCheck(cudaStreamCreate(&cuda_stream));
    (void)cuda_sm_count();  // asked before the capture, which refuses such queries on some drivers
    CudaGraph* g = new CudaGraph();
    graph_check(cudaStreamBeginCapture(cuda_stream, cudaStreamCaptureModeGlobal), "capture");
    cuda_graph_capturing = g;
    return g;
}

static void cuda_graph_capture_end(CudaGraph* g) {
    cuda_graph_capturing = NULL;
    graph_check(cudaStreamEndCapture(cuda_stream, &g->graph), "capture");
    graph_check(cudaGraphInstantiate(&g->exec, g->graph, 0), "instantiation");
}

static void cuda_graph_walk_begin(CudaGraph* g) {
    g->next = 0;
    cuda_graph_walking = g;
}

static void cuda_graph_walk_end(CudaGraph* g) {
    cuda_graph_walking = NULL;
    if (g->next != g->ops.size()) walk_differs(g, "fewer operations");
}

void cuda_graph_begin(CudaGraph** graph) {
    if (*graph == NULL) *graph = cuda_graph_capture_begin();
    else cuda_graph_walk_begin(*graph);
}

void cuda_graph_end(CudaGraph* graph) {
    if (cuda_graph_capturing == graph) cuda_graph_capture_end(graph);
    else cuda_graph_walk_end(graph);
}

// the next operation of the walk, which must be a kernel's launch (kernel) or a set or copy
// (kernel NULL) of n bytes of parameters, at grid, block
static CudaGraphOp* walk_next(CudaGraph* g, const void* kernel, dim3 grid, dim3 block, size_t n) {
    if (g->next == g->ops.size()) walk_differs(g, "more operations");
    CudaGraphOp* op = &g->ops[g->next];
    bool same = op->kernel == kernel && op->n == n && op->grid.x == grid.x &&
                op->grid.y == grid.y && op->grid.z == grid.z && op->block.x == block.x &&
                op->block.y == block.y && op->block.z == block.z;
    if (!same) walk_differs(g, kernel != NULL ? "another kernel, grid or block" : "another set or copy");
    g->next++;
    return op;
}

void cuda_graph_kernel(const void* kernel, dim3 grid, dim3 block, void* const* args,
                       const size_t* sizes, size_t n_args) {
    size_t n = 0;
    for (size_t i = 0; i < n_args; i++) n += sizes[i];
    if (cuda_graph_capturing != NULL) {  // after the launch: its node is the last captured
        CudaGraph* g = cuda_graph_capturing;
        cudaStreamCaptureStatus status;
        const cudaGraphNode_t* last = NULL;
        size_t n_last = 0;
        cudaCheck(cudaStreamGetCaptureInfo(cuda_stream, &status, NULL, NULL, &last, NULL, &n_last));
        if (status != cudaStreamCaptureStatusActive || n_last != 1) {
            fprintf(stderr, "error: a launch under capture left no single node to depend on\n");
            exit(EXIT_FAILURE);
        }
        g->ops.push_back(CudaGraphOp{kernel, last[0], grid, block, g->bytes.size(), n});
        for (size_t i = 0; i < n_args; i++) {
            const unsigned char* from = (const unsigned char*)args[i];
            g->bytes.insert(g->bytes.end(), from, from + sizes[i]);
        }
        return;
    }
    CudaGraph* g = cuda_graph_walking;
    CudaGraphOp* op = walk_next(g, kernel, grid, block, n);
    unsigned char* recorded = g->bytes.data() + op->first;
    bool changed = false;
    for (size_t i = 0, offset = 0; i < n_args; offset += sizes[i], i++) {
        if (memcmp(recorded + offset, args[i], sizes[i]) != 0) {
            memcpy(recorded + offset, args[i], sizes[i]);
            changed = true;
        }
    }
    if (changed) {
        cudaKernelNodeParams params = {(void*)kernel, grid, block, 0, (void**)args, NULL};
        graph_check(cudaGraphExecKernelNodeSetParams(g->exec, op->node, &params),
                    "argument update");
    }
}

// a set or copy: recorded while capturing, compared while walking (its parameters never
// change: the step's buffers are fixed); 1 if it is to be queued
static int graph_operation(const void* parameters, size_t n) {
    if (cuda_graph_walking != NULL) {
        CudaGraph* g = cuda_graph_walking;
        CudaGraphOp* op = walk_next(g, NULL, dim3(), dim3(), n);
        if (memcmp(g->bytes.data() + op->first, parameters, n) != 0)
            walk_differs(g, "a set or copy with other parameters");
        return 0;
    }
    if (cuda_graph_capturing != NULL) {
        CudaGraph* g = cuda_graph_capturing;
        g->ops.push_back(CudaGraphOp{NULL, NULL, dim3(), dim3(), g->bytes.size(), n});
        const unsigned char* from = (const unsigned char*)parameters;
        g->bytes.insert(g->bytes.end(), from, from + n);
    }
    return 1;
}

void cuda_memset_async(void* pointer, int value, size_t bytes) {
    uint64_t parameters[3] = {(uintptr_t)pointer, bytes, (uint64_t)value};
    if (graph_operation(&parameters, sizeof(parameters)))
        cudaCheck(cudaMemsetAsync(pointer, value, bytes, cuda_stream));
}

void cuda_memcpy_async(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind) {
    uint64_t parameters[4] = {(uintptr_t)dst, (uintptr_t)src, bytes, (uint64_t)kind};
    if (graph_operation(&parameters, sizeof(parameters)))
        cudaCheck(cudaMemcpyAsync(dst, src, bytes, kind, cuda_stream));
}

void cuda_graph_launch(CudaGraph* g) {
    graph_check(cudaGraphLaunch(g->exec, cuda_stream), "launch");
}

void cuda_graph_free(CudaGraph* g) {
    if (g == NULL) return;
    cudaCheck(cudaGraphExecDestroy(g->exec));
    cudaCheck(cudaGraphDestroy(g->graph));
    delete g;
}
