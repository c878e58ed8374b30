// cuda_test_emulator.cpp — the emulator in tests/cuda_emu.h catches what the agreement tests
// rely on it to catch: a missing __syncthreads (in one of the two thread orders), a divergent
// barrier or warp collective (the program aborts; checked in a forked child), a block that
// counts itself done in an atomic before its threads have written, reads of shared memory
// that the block never wrote, host code touching device memory and kernels handed host
// pointers; and its warp shuffles follow CUDA's definitions.
#include <doctest/doctest.h>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <functional>
#include <string>
#include <vector>

#include "common.cuh"

// Each thread writes its slot of shared memory, then reads a neighbour's: the neighbour on the
// right (direction +1) or on the left (-1), -1 past the ends. Correct only with the barrier.
__global__ void neighbour_kernel(float* out, int direction, int with_barrier) {
    __shared__ float slots[64];
    int t = (int)threadIdx.x, neighbour = t + direction;
    slots[t] = (float)t;
    if (with_barrier) __syncthreads();
    out[t] = neighbour >= 0 && neighbour < (int)blockDim.x ? slots[neighbour] : -1.0f;
}

// Runs neighbour_kernel on one block of 64 threads in the given order; true if out is right.
static bool neighbour_is_right(cuda_emu::Order order, int direction, int with_barrier) {
    const int n = 64;
    cuda_emu::Order saved = cuda_emu::order;
    cuda_emu::order = order;
    float* d_out;
    cudaCheck(cudaMalloc(&d_out, n * sizeof(float)));
    launch_kernel(neighbour_kernel, 1, n, d_out, direction, with_barrier);
    std::vector<float> out(n);
    cudaCheck(cudaMemcpy(out.data(), d_out, n * sizeof(float), cudaMemcpyDeviceToHost));
    cudaCheck(cudaFree(d_out));
    cuda_emu::order = saved;
    for (int t = 0; t < n; t++) {
        int neighbour = t + direction;
        float expected = neighbour >= 0 && neighbour < n ? (float)neighbour : -1.0f;
        if (out[t] != expected) return false;  // NaN (unwritten shared memory) included
    }
    return true;
}

TEST_CASE("a missing __syncthreads gives a wrong result in one of the two thread orders") {
    // reading the right neighbour: in forward order thread 0 runs before thread 1 has written
    CHECK_FALSE(neighbour_is_right(cuda_emu::Order::forward, +1, 0));
    CHECK(neighbour_is_right(cuda_emu::Order::reverse, +1, 0));
    // reading the left neighbour: wrong in reverse order only
    CHECK(neighbour_is_right(cuda_emu::Order::forward, -1, 0));
    CHECK_FALSE(neighbour_is_right(cuda_emu::Order::reverse, -1, 0));
    // with the barrier, right in both
    for (cuda_emu::Order order : {cuda_emu::Order::forward, cuda_emu::Order::reverse}) {
        CHECK(neighbour_is_right(order, +1, 1));
        CHECK(neighbour_is_right(order, -1, 1));
    }
}

// Each block writes its threads' values into its slot of parts (parts[b][t] = 100 b + t),
// then thread 0 counts the block done; the block that counts last adds up every block's
// slot (sums[t] = sum over b of parts[b][t]) and sets the count back: a split-K sum done by
// its last block. Correct only with the barrier between the writes and the count.
__global__ void count_last_kernel(float* parts, float* sums, unsigned int* count,
                                  int with_barrier) {
    __shared__ int last;
    unsigned int t = threadIdx.x, b = blockIdx.x;
    parts[b * blockDim.x + t] = (float)(100 * b + t);
    __threadfence();
    if (with_barrier) __syncthreads();
    if (t == 0) {
        last = atomicAdd(count, 1u) == gridDim.x - 1;
        if (last) *count = 0;
    }
    __syncthreads();
    if (last) {
        float sum = 0.0f;
        for (unsigned int k = 0; k < gridDim.x; k++) sum += parts[k * blockDim.x + t];
        sums[t] = sum;
    }
}

// Runs count_last_kernel on 3 blocks of 32 threads in the given order; true if sums is right.
static bool count_last_is_right(cuda_emu::Order order, int with_barrier) {
    const unsigned int blocks = 3, n = 32;
    cuda_emu::Order saved = cuda_emu::order;
    cuda_emu::order = order;
    float *d_parts, *d_sums;
    unsigned int* d_count;
    cudaCheck(cudaMalloc(&d_parts, blocks * n * sizeof(float)));  // 0xFF bytes: NaN
    cudaCheck(cudaMalloc(&d_sums, n * sizeof(float)));
    cudaCheck(cudaMalloc(&d_count, sizeof(unsigned int)));
    cudaCheck(cudaMemset(d_count, 0, sizeof(unsigned int)));
    launch_kernel(count_last_kernel, blocks, n, d_parts, d_sums, d_count, with_barrier);
    std::vector<float> sums(n);
    unsigned int count;
    cudaCheck(cudaMemcpy(sums.data(), d_sums, n * sizeof(float), cudaMemcpyDeviceToHost));
    cudaCheck(cudaMemcpy(&count, d_count, sizeof(unsigned int), cudaMemcpyDeviceToHost));
    cudaCheck(cudaFree(d_parts));
    cudaCheck(cudaFree(d_sums));
    cudaCheck(cudaFree(d_count));
    cuda_emu::order = saved;
    for (unsigned int t = 0; t < n; t++)
        if (sums[t] != (float)(100 * (0 + 1 + 2) + 3 * t)) return false;  // NaN included
    return count == 0;
}

TEST_CASE("a block that counts itself done in an atomic before its threads write is caught") {
    // The launch's first atomic suspends its block while every block not started yet runs to
    // its end: in forward order thread 0 counts block 0 done before threads 1.. have written
    // their part, and the block that counts last (block 2) adds what is there instead (NaN).
    // In reverse order thread 0 runs last in its block, after the others have written.
    CHECK_FALSE(count_last_is_right(cuda_emu::Order::forward, 0));
    CHECK(count_last_is_right(cuda_emu::Order::reverse, 0));
    // with the barrier, right in both
    CHECK(count_last_is_right(cuda_emu::Order::forward, 1));
    CHECK(count_last_is_right(cuda_emu::Order::reverse, 1));
}

// out[block] = the value shared memory holds before the block writes it, then the block's sum
// of threadIdx.x through a tree in shared memory
__global__ void fresh_shared_kernel(float* before, float* sums) {
    __shared__ float partial[32];
    unsigned int t = threadIdx.x;
    if (t == 0) before[blockIdx.x] = partial[5];
    __syncthreads();
    partial[t] = (float)t;
    __syncthreads();
    for (unsigned int half = 16; half > 0; half /= 2) {
        if (t < half) partial[t] += partial[t + half];
        __syncthreads();
    }
    if (t == 0) sums[blockIdx.x] = partial[0];
}

TEST_CASE("shared memory is one object per block and reads as NaN until the block writes it") {
    const int blocks = 3;
    float *d_before, *d_sums;
    cudaCheck(cudaMalloc(&d_before, blocks * sizeof(float)));
    cudaCheck(cudaMalloc(&d_sums, blocks * sizeof(float)));
    launch_kernel(fresh_shared_kernel, blocks, 32, d_before, d_sums);
    std::vector<float> before(blocks), sums(blocks);
    cudaCheck(cudaMemcpy(before.data(), d_before, blocks * sizeof(float), cudaMemcpyDeviceToHost));
    cudaCheck(cudaMemcpy(sums.data(), d_sums, blocks * sizeof(float), cudaMemcpyDeviceToHost));
    for (int b = 0; b < blocks; b++) {
        CHECK(std::isnan(before[b]));  // even after the previous block left its sums there
        CHECK(sums[b] == 31.0f * 32.0f / 2.0f);
    }
    cudaCheck(cudaFree(d_before));
    cudaCheck(cudaFree(d_sums));
}

// out[lane] for each shuffle of v = lane * 10 over a block of two warps (the second shifted)
__global__ void shuffle_kernel(float* out) {
    unsigned int t = threadIdx.x, lane = t % WARP_SIZE;
    float v = (float)(t * 10);
    float* o = out + (t / WARP_SIZE) * 5 * WARP_SIZE;
    o[0 * WARP_SIZE + lane] = __shfl_xor_sync(FULL_MASK, v, 5);
    o[1 * WARP_SIZE + lane] = __shfl_down_sync(FULL_MASK, v, 3);
    o[2 * WARP_SIZE + lane] = __shfl_up_sync(FULL_MASK, v, 3);
    o[3 * WARP_SIZE + lane] = __shfl_sync(FULL_MASK, v, 7);
    o[4 * WARP_SIZE + lane] = warp_sum(v);
}

TEST_CASE("warp shuffles exchange values within each warp as CUDA defines them") {
    const unsigned int n = 2 * WARP_SIZE;
    float* d_out;
    cudaCheck(cudaMalloc(&d_out, 5 * n * sizeof(float)));
    launch_kernel(shuffle_kernel, 1, n, d_out);
    std::vector<float> out(5 * n);
    cudaCheck(cudaMemcpy(out.data(), d_out, out.size() * sizeof(float), cudaMemcpyDeviceToHost));
    cudaCheck(cudaFree(d_out));
    for (unsigned int warp = 0; warp < 2; warp++) {
        const float* o = out.data() + warp * 5 * WARP_SIZE;
        float base = (float)(warp * WARP_SIZE * 10), sum = 0.0f;
        for (unsigned int lane = 0; lane < WARP_SIZE; lane++) sum += base + (float)(lane * 10);
        for (unsigned int lane = 0; lane < WARP_SIZE; lane++) {
            CAPTURE(warp);
            CAPTURE(lane);
            CHECK(o[lane] == base + (float)((lane ^ 5) * 10));
            unsigned int down = lane + 3 < WARP_SIZE ? lane + 3 : lane;
            CHECK(o[WARP_SIZE + lane] == base + (float)(down * 10));
            CHECK(o[2 * WARP_SIZE + lane] == base + (float)((lane >= 3 ? lane - 3 : lane) * 10));
            CHECK(o[3 * WARP_SIZE + lane] == base + 70.0f);
            CHECK(o[4 * WARP_SIZE + lane] == sum);
        }
    }
}

// Runs body() in a forked child; returns its wait status, and its stderr in *message.
static int run_in_child(const std::function<void()>& body, std::string* message) {
    int pipe_fds[2];
    REQUIRE(pipe(pipe_fds) == 0);
    fflush(NULL);
    pid_t child = fork();
    REQUIRE(child >= 0);
    if (child == 0) {
        signal(SIGABRT, SIG_DFL);  // doctest's crash handlers would report a failed test
        signal(SIGSEGV, SIG_DFL);
        dup2(pipe_fds[1], STDERR_FILENO);
        close(pipe_fds[0]);
        body();
        _exit(0);
    }
    close(pipe_fds[1]);
    char buffer[512];
    ssize_t got;
    while ((got = read(pipe_fds[0], buffer, sizeof buffer)) > 0)
        message->append(buffer, (size_t)got);
    close(pipe_fds[0]);
    int status = 0;
    waitpid(child, &status, 0);
    return status;
}
static bool aborts(const std::function<void()>& body, std::string* message) {
    int status = run_in_child(body, message);
    return WIFSIGNALED(status) && WTERMSIG(status) == SIGABRT;
}

// the bug the emulator must not let through: threads leave before a barrier the others reach
__global__ void early_return_kernel(float* out, size_t n) {
    __shared__ float tile[64];
    size_t i = threadIdx.x;
    if (i >= n) return;
    tile[i] = 1.0f;
    __syncthreads();
    out[i] = tile[n - 1 - i];
}

// lanes 0..15 of each warp enter a warp reduction, the rest do not
__global__ void divergent_shuffle_kernel(float* out) {
    float x = 1.0f;
    if (threadIdx.x % WARP_SIZE < 16) x = warp_sum(x);
    out[threadIdx.x] = x;
}

// two halves of the block wait at two different barriers
__global__ void two_barriers_kernel(float* out) {
    if (threadIdx.x < 32) __syncthreads();
    else __syncthreads();
    out[threadIdx.x] = 1.0f;
}

TEST_CASE("a divergent barrier or warp collective aborts the program, naming the threads") {
    float* d_out;
    cudaCheck(cudaMalloc(&d_out, 64 * sizeof(float)));
    std::string message;
    INFO("the child's stderr: " << message);
    SUBCASE("threads returning before __syncthreads") {
        CHECK(aborts([&] { launch_kernel(early_return_kernel, 1, 64, d_out, (size_t)40); },
                     &message));
        CHECK(message.find("divergent __syncthreads") != std::string::npos);
        CHECK(message.find("has finished") != std::string::npos);
    }
    SUBCASE("half a warp in a shuffle") {
        CHECK(aborts([&] { launch_kernel(divergent_shuffle_kernel, 1, 64, d_out); }, &message));
        CHECK(message.find("divergent warp collective") != std::string::npos);
    }
    SUBCASE("two different barriers") {
        CHECK(aborts([&] { launch_kernel(two_barriers_kernel, 1, 64, d_out); }, &message));
        CHECK(message.find("divergent __syncthreads") != std::string::npos);
    }
    SUBCASE("a launch of more than 1024 threads per block") {
        CHECK(aborts([&] { launch_kernel(two_barriers_kernel, 1, 2048, d_out); }, &message));
        CHECK(message.find("invalid block") != std::string::npos);
    }
    SUBCASE("the same early return is fine when every thread is in range") {
        CHECK_FALSE(aborts([&] { launch_kernel(early_return_kernel, 1, 64, d_out, (size_t)64); },
                           &message));
    }
    cudaCheck(cudaFree(d_out));
}

__global__ void add_one_kernel(float* x) { x[threadIdx.x] += 1.0f; }

TEST_CASE("host code cannot touch device memory, nor kernels take host pointers") {
    float* d_x;
    cudaCheck(cudaMalloc(&d_x, 32 * sizeof(float)));
    cudaCheck(cudaMemset(d_x, 0, 32 * sizeof(float)));
    std::string message;
    INFO("the child's stderr: " << message);
    SUBCASE("copies and launches may") {
        launch_kernel(add_one_kernel, 1, 32, d_x);
        float x[32];
        cudaCheck(cudaMemcpy(x, d_x, sizeof x, cudaMemcpyDeviceToHost));
        CHECK(x[31] == 1.0f);
    }
    SUBCASE("a host read of device memory crashes") {
        int status = run_in_child(
            [&] { fprintf(stderr, "read %g\n", (double)*(volatile float*)d_x); }, &message);
        CHECK_FALSE((WIFEXITED(status) && WEXITSTATUS(status) == 0));
        CHECK(message.find("read") == std::string::npos);
    }
    SUBCASE("a host pointer handed to a kernel aborts the launch") {
        static float host[32];
        CHECK(aborts([&] { launch_kernel(add_one_kernel, 1, 32, host); }, &message));
        CHECK(message.find("argument 0 of a kernel launch") != std::string::npos);
    }
    SUBCASE("cudaFree of a host pointer aborts") {
        static float host[32];
        CHECK(aborts([&] { cudaFree(host); }, &message));
        CHECK(message.find("not from cudaMalloc") != std::string::npos);
    }
    cudaCheck(cudaFree(d_x));
}

__global__ void add_kernel(float* x, float value) { x[threadIdx.x] += value; }

// Stream capture as a GPU does it: nothing runs until the graph is launched, every launch of
// it runs the nodes in order, and an instantiated graph's kernel node takes new arguments
TEST_CASE("stream capture records work that a graph launch then runs, with arguments it can change") {
    float* d_x;
    cudaCheck(cudaMalloc(&d_x, 32 * sizeof(float)));
    cudaCheck(cudaMemset(d_x, 0, 32 * sizeof(float)));
    cudaStream_t stream;
    cudaCheck(cudaStreamCreate(&stream));
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    cudaCheck(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
    launch_kernel(add_kernel, 1, 32, d_x, 1.0f);
    cudaStreamCaptureStatus status;
    const cudaGraphNode_t* last = NULL;
    size_t n_last = 0;
    cudaCheck(cudaStreamGetCaptureInfo(stream, &status, NULL, NULL, &last, NULL, &n_last));
    REQUIRE(n_last == 1);
    cudaGraphNode_t add_node = last[0];
    cudaCheck(cudaMemsetAsync(d_x + 16, 0, 16 * sizeof(float), stream));
    cudaCheck(cudaStreamEndCapture(stream, &graph));
    cudaCheck(cudaGraphInstantiate(&exec, graph, 0));
    float x[32];
    cudaCheck(cudaMemcpy(x, d_x, sizeof x, cudaMemcpyDeviceToHost));
    CHECK(x[0] == 0.0f);  // captured, not run
    cudaCheck(cudaGraphLaunch(exec, stream));
    cudaCheck(cudaGraphLaunch(exec, stream));
    cudaCheck(cudaMemcpy(x, d_x, sizeof x, cudaMemcpyDeviceToHost));
    CHECK(x[0] == 2.0f);
    CHECK(x[31] == 0.0f);  // the set ran after each add
    float value = 5.0f;
    void* args[] = {&d_x, &value};
    cudaKernelNodeParams params = {(void*)add_kernel, dim3(1), dim3(32), 0, args, NULL};
    cudaCheck(cudaGraphExecKernelNodeSetParams(exec, add_node, &params));
    cudaCheck(cudaGraphLaunch(exec, stream));
    cudaCheck(cudaMemcpy(x, d_x, sizeof x, cudaMemcpyDeviceToHost));
    CHECK(x[0] == 7.0f);
    CHECK(x[31] == 0.0f);
    cudaCheck(cudaGraphExecDestroy(exec));
    cudaCheck(cudaGraphDestroy(graph));
    cudaCheck(cudaStreamDestroy(stream));
    cudaCheck(cudaFree(d_x));
}

TEST_CASE("a capture refuses the legacy stream, allocation, freeing and waiting") {
    std::string message;
    INFO("the child's stderr: " << message);
    CHECK(cudaStreamBeginCapture(0, cudaStreamCaptureModeGlobal) == cudaErrorStreamCaptureUnsupported);
    cudaStream_t stream;
    cudaCheck(cudaStreamCreate(&stream));
    auto captured = [&](const std::function<void()>& body) {
        return aborts([&] {
            cudaCheck(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
            body();
        }, &message);
    };
    float* d_x;
    SUBCASE("cudaMalloc") { CHECK(captured([&] { cudaCheck(cudaMalloc(&d_x, 4)); })); }
    SUBCASE("cudaFree") { CHECK(captured([&] { cudaCheck(cudaFree(NULL)); })); }
    SUBCASE("cudaStreamSynchronize") { CHECK(captured([&] { cudaCheck(cudaStreamSynchronize(stream)); })); }
    SUBCASE("a synchronous copy") {
        float host = 0.0f;
        CHECK(captured([&] { cudaCheck(cudaMemcpy(&host, &host, 4, cudaMemcpyHostToHost)); }));
    }
    CHECK(message.find("during stream capture") != std::string::npos);
    cudaCheck(cudaStreamDestroy(stream));
}

// cuda_graph_prepare (common.cuh): the first call captures, later calls walk the same calls
// to bring changed arguments into the graph; a walk that queues other work exits, naming it
TEST_CASE("a captured CUDA graph takes each walk's new arguments and refuses other work") {
    float* d_x;
    cudaCheck(cudaMalloc(&d_x, 32 * sizeof(float)));
    cudaCheck(cudaMemset(d_x, 0, 32 * sizeof(float)));
    CudaGraph* graph = NULL;
    auto queue = [&](float value) {
        cuda_memset_async(d_x + 16, 0, 16 * sizeof(float));
        launch_kernel(add_kernel, 1, 32, d_x, value);
    };
    cuda_graph_prepare(&graph, [&] { queue(1.0f); });
    float x[32];
    cudaCheck(cudaMemcpy(x, d_x, sizeof x, cudaMemcpyDeviceToHost));
    CHECK(x[0] == 0.0f);  // captured, not run
    cuda_graph_launch(graph);
    cuda_graph_prepare(&graph, [&] { queue(3.0f); });  // walked: nothing runs
    cudaCheck(cudaMemcpy(x, d_x, sizeof x, cudaMemcpyDeviceToHost));
    CHECK(x[0] == 1.0f);
    CHECK(x[31] == 1.0f);
    cuda_graph_launch(graph);
    cudaCheck(cudaMemcpy(x, d_x, sizeof x, cudaMemcpyDeviceToHost));
    CHECK(x[0] == 4.0f);
    CHECK(x[31] == 3.0f);
    std::string message;
    INFO("the child's stderr: " << message);
    int status = 0;
    SUBCASE("another grid") {
        status = run_in_child([&] {
            cuda_graph_prepare(&graph, [&] {
                cuda_memset_async(d_x + 16, 0, 16 * sizeof(float));
                launch_kernel(add_kernel, 1, 16, d_x, 1.0f);
            });
        }, &message);
        CHECK(message.find("another kernel, grid or block") != std::string::npos);
    }
    SUBCASE("a set elsewhere") {
        status = run_in_child([&] {
            cuda_graph_prepare(&graph, [&] {
                cuda_memset_async(d_x, 0, 16 * sizeof(float));
                launch_kernel(add_kernel, 1, 32, d_x, 1.0f);
            });
        }, &message);
        CHECK(message.find("a set or copy with other parameters") != std::string::npos);
    }
    SUBCASE("one launch fewer") {
        status = run_in_child([&] {
            cuda_graph_prepare(&graph, [&] { cuda_memset_async(d_x + 16, 0, 16 * sizeof(float)); });
        }, &message);
        CHECK(message.find("fewer operations") != std::string::npos);
    }
    SUBCASE("one launch more") {
        status = run_in_child([&] {
            cuda_graph_prepare(&graph, [&] {
                cuda_memset_async(d_x + 16, 0, 16 * sizeof(float));
                launch_kernel(add_kernel, 1, 32, d_x, 1.0f);
                launch_kernel(add_kernel, 1, 32, d_x, 1.0f);
            });
        }, &message);
        CHECK(message.find("more operations") != std::string::npos);
    }
    CHECK((WIFEXITED(status) && WEXITSTATUS(status) == 1));
    cuda_graph_free(graph);
    cudaCheck(cudaFree(d_x));
}
