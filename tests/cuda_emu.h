// cuda_emu.h — run the kernels of cuda/ on a CPU, one fiber per CUDA thread.
//
// cuda/*.cu is plain CUDA: __global__ kernels, static __shared__ arrays, __syncthreads,
// full-mask warp shuffles and __syncwarp, atomicAdd (any type), __threadfence, and
// launches through launch_kernel() (cuda/common.cuh). Compiled with `g++ -x c++`
// against this header instead of nvcc, the same source runs on the host, so the agreement
// tests need no GPU. How each piece is emulated:
//   - a launch runs its blocks one after another; inside a block every CUDA thread is a fiber
//     (boost.context) that runs until it reaches __syncthreads, a warp collective or its end;
//     at the launch's first atomic, its block waits while every block not started yet runs
//     to its end (after_atomic), so a block that counts itself done too early is caught;
//   - __syncthreads releases the block only when every thread waits at the same barrier
//     (same file and line); a thread that finishes or waits elsewhere meanwhile is a divergent
//     barrier, and the program aborts with both places;
//   - warp collectives (__shfl_*_sync, __syncwarp; full mask only) complete when all 32 lanes
//     of the warp have arrived, with the lanes of a warp numbered as on the GPU (linear thread
//     index / 32); a lane that finishes or waits at a barrier meanwhile aborts the program;
//   - __shared__ makes a function static in the linker section cuda_emu_shared: blocks run one
//     at a time, so every thread of the block sees the same object. Before each block the
//     section is filled with 0xFF bytes (NaN as a float, -1 as an int), so a read of shared
//     memory that the block has not written shows in the result. Declare __shared__ only
//     inside __global__ kernels (a static in an inline function cannot share the section);
//   - cudaMalloc'd memory is filled with 0xFF too, and host code cannot touch it outside
//     copies, sets and launches (see "device memory" below); copies and sets are memcpy and
//     memset; streams are ignored (everything is synchronous), except that the legacy stream
//     (0) cannot be captured;
//   - stream capture records the launches, sets and copies queued meanwhile as the nodes of a
//     graph instead of running them (allocating, freeing, waiting or a synchronous copy
//     during a capture aborts, as they are errors on a GPU); launching an instantiated graph
//     runs its nodes in order; a kernel node's arguments can be replaced in the instantiated
//     graph (cudaGraphExecKernelNodeSetParams). Graphs hold one stream's work: a chain;
//   - with cuda_emu::tracing on, every launch, set and copy that runs is appended to
//     cuda_emu::trace (the kernel, grid, block and argument bytes; a set's or copy's
//     parameters), so tests can compare what two ways of queuing a step ran;
//   - cuda_emu::order is the order in which runnable threads, and blocks, are resumed:
//     Order::forward (thread 0 first) or Order::reverse, initialised from the environment
//     variable CUDA_EMU_ORDER=forward|reverse. A missing __syncthreads lets a thread read what
//     another has not written yet in at least one of the two orders.
// Link with -lboost_context.
#ifndef ATTNRES_CUDA_EMU_H
#define ATTNRES_CUDA_EMU_H

#include <boost/context/fiber.hpp>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include <functional>
#include <iterator>
#include <map>
#include <tuple>
#include <utility>
#include <type_traits>
#include <vector>

#ifdef __SANITIZE_ADDRESS__
#include <sanitizer/asan_interface.h>
#endif

// ---- the language ------------------------------------------------------------------------
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __shared__ static __attribute__((section("cuda_emu_shared")))

struct dim3 {
    unsigned int x, y, z;
    constexpr dim3(unsigned int x = 1, unsigned int y = 1, unsigned int z = 1)
        : x(x), y(y), z(z) {}
};
typedef dim3 uint3;

// The built-in variables; the scheduler sets them before it resumes a thread. A kernel only
// gives up the CPU inside a call into the emulator, so it always reads its own values.
inline uint3 threadIdx, blockIdx;
inline dim3 blockDim, gridDim;

// ---- device memory -----------------------------------------------------------------------
// Each cudaMalloc gets its own pages between two guard pages, and device memory is readable
// and writable only while a kernel runs or a copy or set touches it: host code that reads a
// device pointer crashes here as it would with a GPU. A launch checks that its pointer
// arguments are NULL or point into device memory, so a host pointer handed to a kernel is
// caught too (pointers inside struct arguments are not checked).
namespace cuda_emu {

[[noreturn]] inline void fail(const char* format, ...) {
    va_list args;
    va_start(args, format);
    fprintf(stderr, "cuda_emu: ");
    vfprintf(stderr, format, args);
    fprintf(stderr, "\n");
    va_end(args);
    abort();
}

struct Allocation {
    char* data;
    size_t bytes;   // asked for
    size_t mapped;  // whole pages from data on
};
inline std::map<uintptr_t, Allocation> allocations;  // by address of data
inline size_t malloc_calls = 0;  // cudaMalloc calls so far (a training step should make none)
// what a GPU would queue, counted so far: kernel launches, and asynchronous memsets and copies
inline size_t kernel_launches = 0, async_operations = 0;

// What ran, in order, while tracing is on: a launch, set or copy and its parameters (a
// kernel's arguments as bytes, converted to its parameter types)
struct Operation {
    enum Kind { kernel, set, copy } kind;
    const void* function;  // the kernel (NULL for a set or copy)
    unsigned int grid[3], block[3];
    std::vector<unsigned char> bytes;
    bool operator==(const Operation& o) const {
        return kind == o.kind && function == o.function && memcmp(grid, o.grid, sizeof grid) == 0 &&
               memcmp(block, o.block, sizeof block) == 0 && bytes == o.bytes;
    }
};
inline bool tracing = false;
inline std::vector<Operation> trace;
template <typename T>
void append_bytes(std::vector<unsigned char>& bytes, const T& value) {
    const unsigned char* p = (const unsigned char*)&value;
    bytes.insert(bytes.end(), p, p + sizeof(T));
}

struct Graph;
inline Graph* capturing = NULL;  // the graph that stream capture records into, if any
// what a GPU refuses while a stream is captured: anything that allocates, frees or waits
inline void check_not_capturing(const char* call) {
    if (capturing != NULL) fail("%s during stream capture (a GPU refuses it)", call);
}

inline void set_device_access(bool allowed) {
    for (const auto& entry : allocations)
        mprotect(entry.second.data, entry.second.mapped,
                 allowed ? PROT_READ | PROT_WRITE : PROT_NONE);
}
struct DeviceAccess {  // device memory is accessible while one of these lives
    DeviceAccess() { set_device_access(true); }
    ~DeviceAccess() { set_device_access(false); }
};

inline bool is_device_pointer(const void* pointer) {
    uintptr_t address = (uintptr_t)pointer;
    auto next = allocations.upper_bound(address);
    if (next == allocations.begin()) return false;
    const Allocation& a = std::prev(next)->second;
    return address <= (uintptr_t)a.data + a.bytes;  // one past the end included
}

}  // namespace cuda_emu

// ---- the runtime -------------------------------------------------------------------------
enum cudaError_t {
    cudaSuccess = 0, cudaErrorInvalidValue = 1, cudaErrorMemoryAllocation = 2,
    cudaErrorInsufficientDriver = 35, cudaErrorNoDevice = 100,
    cudaErrorStreamCaptureUnsupported = 900, cudaErrorIllegalState = 401
};
enum cudaMemcpyKind {
    cudaMemcpyHostToHost = 0, cudaMemcpyHostToDevice = 1, cudaMemcpyDeviceToHost = 2,
    cudaMemcpyDeviceToDevice = 3, cudaMemcpyDefault = 4
};
typedef struct cuda_emu_stream* cudaStream_t;

inline const char* cudaGetErrorString(cudaError_t error) {
    switch (error) {
    case cudaSuccess: return "no error";
    case cudaErrorInvalidValue: return "invalid argument";
    case cudaErrorMemoryAllocation: return "out of memory";
    case cudaErrorInsufficientDriver: return "CUDA driver version is insufficient for CUDA runtime version";
    case cudaErrorNoDevice: return "no CUDA-capable device is detected";
    case cudaErrorStreamCaptureUnsupported: return "operation not permitted when stream is capturing";
    case cudaErrorIllegalState: return "the operation cannot be performed in the present state";
    }
    return "unknown error";
}
template <typename T>
cudaError_t cudaMalloc(T** pointer, size_t bytes) {
    cuda_emu::check_not_capturing("cudaMalloc");
    size_t page = (size_t)getpagesize();
    size_t mapped = bytes > 0 ? (bytes + page - 1) / page * page : page;
    void* memory = mmap(NULL, mapped + 2 * page, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (memory == MAP_FAILED) return cudaErrorMemoryAllocation;
    char* data = (char*)memory + page;
    mprotect(data, mapped, PROT_READ | PROT_WRITE);
    memset(data, 0xFF, bytes);  // uninitialised device memory reads as NaN
    mprotect(data, mapped, PROT_NONE);
#ifdef __SANITIZE_ADDRESS__
    __asan_poison_memory_region(data + bytes, mapped - bytes);  // past the end
#endif
    cuda_emu::allocations[(uintptr_t)data] = cuda_emu::Allocation{data, bytes, mapped};
    cuda_emu::malloc_calls++;
    *pointer = (T*)data;
    return cudaSuccess;
}
inline cudaError_t cudaFree(void* pointer) {
    cuda_emu::check_not_capturing("cudaFree");
    if (pointer == NULL) return cudaSuccess;
    auto found = cuda_emu::allocations.find((uintptr_t)pointer);
    if (found == cuda_emu::allocations.end())
        cuda_emu::fail("cudaFree(%p): not from cudaMalloc", pointer);
    cuda_emu::Allocation a = found->second;
    cuda_emu::allocations.erase(found);
#ifdef __SANITIZE_ADDRESS__
    __asan_unpoison_memory_region(a.data, a.mapped);
#endif
    munmap(a.data - getpagesize(), a.mapped + 2 * (size_t)getpagesize());
    return cudaSuccess;
}
// Page-locked host memory: to the emulator, host memory like any other.
inline cudaError_t cudaMallocHost(void** pointer, size_t bytes) {
    *pointer = malloc(bytes > 0 ? bytes : 1);
    return *pointer != NULL ? cudaSuccess : cudaErrorMemoryAllocation;
}
inline cudaError_t cudaFreeHost(void* pointer) {
    free(pointer);
    return cudaSuccess;
}
inline cudaError_t cudaMemcpy(void* dst, const void* src, size_t bytes, cudaMemcpyKind) {
    cuda_emu::check_not_capturing("cudaMemcpy");
    cuda_emu::DeviceAccess access;
    if (bytes > 0) memcpy(dst, src, bytes);
    return cudaSuccess;
}
inline cudaError_t cudaMemset(void* pointer, int value, size_t bytes) {
    cuda_emu::check_not_capturing("cudaMemset");
    cuda_emu::DeviceAccess access;
    if (bytes > 0) memset(pointer, value, bytes);
    return cudaSuccess;
}

namespace cuda_emu {

// One node of a graph: a launch, set or copy, queued when the graph is launched
struct Node {
    size_t index = 0;  // its place in its graph (and in the graph's instantiations)
    virtual ~Node() {}
    virtual void run() = 0;
    virtual Node* clone() const = 0;
    // a kernel node: its kernel, grid, block and parameters (kernel_params[i] points to
    // parameter i), as cudaGraphExecKernelNodeSetParams sets them
    virtual void set(const void*, dim3, dim3, void**) { fail("not a kernel node"); }
};
struct Graph {
    std::vector<Node*> nodes;  // a chain: each depends on the one before
    ~Graph() {
        for (Node* node : nodes) delete node;
    }
    void add(Node* node) {
        node->index = nodes.size();
        nodes.push_back(node);
    }
};
struct GraphExec {
    std::vector<Node*> nodes;  // copies of the graph's, whose parameters can be changed
    ~GraphExec() {
        for (Node* node : nodes) delete node;
    }
};

// a set or copy that runs now: counted, and traced with its parameters
template <typename... Values>
void count_set_or_copy(Operation::Kind kind, const Values&... values) {
    async_operations++;
    if (!tracing) return;
    Operation op{kind, NULL, {0, 0, 0}, {0, 0, 0}, {}};
    (append_bytes(op.bytes, values), ...);
    trace.push_back(op);
}
// value into `bytes` bytes at pointer (device memory), as cudaMemsetAsync
inline void set_now(void* pointer, int value, size_t bytes) {
    count_set_or_copy(Operation::set, pointer, value, bytes);
    DeviceAccess access;
    if (bytes > 0) memset(pointer, value, bytes);
}
inline void copy_now(void* dst, const void* src, size_t bytes) {
    count_set_or_copy(Operation::copy, dst, src, bytes);
    DeviceAccess access;
    if (bytes > 0) memcpy(dst, src, bytes);
}
struct SetNode : Node {
    void* pointer;
    int value;
    size_t bytes;
    SetNode(void* pointer, int value, size_t bytes) : pointer(pointer), value(value), bytes(bytes) {}
    void run() override { set_now(pointer, value, bytes); }
    Node* clone() const override { return new SetNode(*this); }
};
struct CopyNode : Node {
    void* dst;
    const void* src;
    size_t bytes;
    CopyNode(void* dst, const void* src, size_t bytes) : dst(dst), src(src), bytes(bytes) {}
    void run() override { copy_now(dst, src, bytes); }
    Node* clone() const override { return new CopyNode(*this); }
};

}  // namespace cuda_emu

inline cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t bytes, cudaMemcpyKind,
                                   cudaStream_t = 0) {
    if (cuda_emu::capturing != NULL) cuda_emu::capturing->add(new cuda_emu::CopyNode(dst, src, bytes));
    else cuda_emu::copy_now(dst, src, bytes);
    return cudaSuccess;
}
inline cudaError_t cudaMemsetAsync(void* pointer, int value, size_t bytes, cudaStream_t = 0) {
    if (cuda_emu::capturing != NULL) cuda_emu::capturing->add(new cuda_emu::SetNode(pointer, value, bytes));
    else cuda_emu::set_now(pointer, value, bytes);
    return cudaSuccess;
}
inline cudaError_t cudaGetDeviceCount(int* count) {  // the emulator is one device
    *count = 1;
    return cudaSuccess;
}
inline cudaError_t cudaDriverGetVersion(int* version) {  // the emulator plays CUDA 13.0
    *version = 13000;
    return cudaSuccess;
}
inline cudaError_t cudaRuntimeGetVersion(int* version) {
    *version = 13000;
    return cudaSuccess;
}
inline cudaError_t cudaDeviceSynchronize(void) {
    cuda_emu::check_not_capturing("cudaDeviceSynchronize");
    return cudaSuccess;
}
inline cudaError_t cudaStreamSynchronize(cudaStream_t) {
    cuda_emu::check_not_capturing("cudaStreamSynchronize");
    return cudaSuccess;
}
// Streams other than the legacy one (0): all the same to the emulator, but only they can be
// captured
struct cuda_emu_stream {
    int unused;
};
inline cudaError_t cudaStreamCreate(cudaStream_t* stream) {
    *stream = new cuda_emu_stream{0};
    return cudaSuccess;
}
inline cudaError_t cudaStreamDestroy(cudaStream_t stream) {
    delete stream;
    return cudaSuccess;
}
inline cudaError_t cudaGetLastError(void) { return cudaSuccess; }
inline cudaError_t cudaPeekAtLastError(void) { return cudaSuccess; }

// The device's properties: the emulator reports 4 multiprocessors, so that code choosing
// its launch shapes by the size of the GPU takes every branch at test sizes.
enum cudaDeviceAttr { cudaDevAttrMultiProcessorCount = 16 };
inline cudaError_t cudaGetDevice(int* device) {
    *device = 0;
    return cudaSuccess;
}
inline cudaError_t cudaDeviceGetAttribute(int* value, cudaDeviceAttr attribute, int) {
    if (attribute != cudaDevAttrMultiProcessorCount) return cudaErrorInvalidValue;
    *value = 4;
    return cudaSuccess;
}
inline cudaError_t cudaMemGetInfo(size_t* free_bytes, size_t* total_bytes) {
    *free_bytes = *total_bytes = 0;
    return cudaSuccess;
}

// ---- vector types ------------------------------------------------------------------------
struct alignas(16) float4 {
    float x, y, z, w;
};
inline float4 make_float4(float x, float y, float z, float w) { return float4{x, y, z, w}; }

// ---- device functions --------------------------------------------------------------------
inline float rsqrtf(float x) { return 1.0f / sqrtf(x); }
inline float __expf(float x) { return expf(x); }
inline void sincospif(float x, float* sin_pi_x, float* cos_pi_x) {  // sin, cos of pi*x
    *sin_pi_x = (float)sin(M_PI * (double)x);
    *cos_pi_x = (float)cos(M_PI * (double)x);
}
namespace cuda_emu {
void after_atomic();
}
// Threads switch only inside the emulator's calls, so a read-modify-write is atomic (for any
// of CUDA's overloads: float, or an unsigned count of blocks). The first atomic of a launch
// then lets every block not yet started run to its end (cuda_emu::after_atomic).
template <typename T>
inline T atomicAdd(T* address, T value) {
    T old = *address;
    *address = old + value;
    cuda_emu::after_atomic();
    return old;
}
// One memory: a write is seen by every thread and block at once, so the fence orders
// nothing more.
inline void __threadfence() {}

namespace cuda_emu {

enum class Order { forward, reverse };
inline Order order_from_environment() {
    const char* value = getenv("CUDA_EMU_ORDER");
    if (value == NULL || strcmp(value, "forward") == 0) return Order::forward;
    if (strcmp(value, "reverse") == 0) return Order::reverse;
    fprintf(stderr, "cuda_emu: CUDA_EMU_ORDER must be forward or reverse, not '%s'\n", value);
    exit(EXIT_FAILURE);
}
inline Order order = order_from_environment();

enum class State { runnable, at_barrier, at_warp_op, finished };
enum class WarpOp { sync, shfl, shfl_xor, shfl_down, shfl_up };

struct Thread {
    uint3 index;
    boost::context::fiber fiber;      // this CUDA thread, while it is suspended
    boost::context::fiber scheduler;  // the scheduler, while this thread runs
    State state = State::runnable;
    const char* file = "";  // where it waits at a barrier
    int line = 0;
    WarpOp op = WarpOp::sync;  // the warp collective it waits in
    unsigned int mask = 0;
    int lane_arg = 0;
    uint64_t value = 0;  // its operand while it waits, then its result
};
inline Thread* current = NULL;

// Fiber stacks, reused from launch to launch; each has a guard page below it.
class StackPool {
public:
#ifdef __SANITIZE_ADDRESS__
    static constexpr size_t stack_bytes = 256 * 1024;
#else
    static constexpr size_t stack_bytes = 64 * 1024;
#endif
    boost::context::stack_context allocate() {
        char* base;
        if (free_stacks.empty()) {
            void* memory = mmap(NULL, stack_bytes, PROT_READ | PROT_WRITE,
                                MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
            if (memory == MAP_FAILED) fail("cannot map a fiber stack");
            base = (char*)memory;
            mprotect(base, (size_t)getpagesize(), PROT_NONE);
        } else {
            base = free_stacks.back();
            free_stacks.pop_back();
        }
        boost::context::stack_context stack;
        stack.size = stack_bytes;
        stack.sp = base + stack_bytes;
        return stack;
    }
    void deallocate(boost::context::stack_context& stack) {
        char* base = (char*)stack.sp - stack.size;
#ifdef __SANITIZE_ADDRESS__
        // frames that never returned normally leave poisoned shadow behind
        size_t page = (size_t)getpagesize();
        __asan_unpoison_memory_region(base + page, stack_bytes - page);
#endif
        free_stacks.push_back(base);
    }
private:
    std::vector<char*> free_stacks;
};
inline StackPool stack_pool;
struct PooledStack {  // the stack allocator handed to boost.context
    boost::context::stack_context allocate() { return stack_pool.allocate(); }
    void deallocate(boost::context::stack_context& stack) { stack_pool.deallocate(stack); }
};

// Suspends the running CUDA thread until the scheduler resumes it.
inline void wait(State state) {
    Thread* self = current;
    self->state = state;
    self->scheduler = std::move(self->scheduler).resume();
}

inline void syncthreads(const char* file, int line) {
    current->file = file;
    current->line = line;
    wait(State::at_barrier);
}

template <typename T>
T warp_op(WarpOp op, unsigned int mask, T value, int lane_arg, int width) {
    static_assert(sizeof(T) <= sizeof(uint64_t), "warp shuffles move up to 8 bytes");
    if (width != 32) fail("warp shuffles with width %d are not emulated (only 32)", width);
    Thread* self = current;
    self->op = op;
    self->mask = mask;
    self->lane_arg = lane_arg;
    self->value = 0;
    memcpy(&self->value, &value, sizeof(T));
    wait(State::at_warp_op);
    T result;
    memcpy(&result, &self->value, sizeof(T));
    return result;
}

inline void describe(char* text, size_t size, const Thread& t) {
    const char* what = t.state == State::finished    ? "has finished"
                       : t.state == State::at_warp_op ? "waits in a warp collective"
                       : t.state == State::runnable   ? "runs"
                                                      : "waits at __syncthreads";
    int n = snprintf(text, size, "thread (%u,%u,%u) of block (%u,%u,%u) %s", t.index.x,
                     t.index.y, t.index.z, blockIdx.x, blockIdx.y, blockIdx.z, what);
    if (t.state == State::at_barrier)
        snprintf(text + n, size - (size_t)n, " at %s:%d", t.file, t.line);
}

// Completes the warp collective of lanes [first, first+32) if one of them waits in it;
// returns whether it did.
inline bool complete_warp_op(std::vector<Thread>& threads, size_t first) {
    size_t end = first + 32 < threads.size() ? first + 32 : threads.size();
    size_t waiting = first;
    while (waiting < end && threads[waiting].state != State::at_warp_op) waiting++;
    if (waiting == end) return false;
    char a[256], b[256];  // the descriptions are formatted only for a failure (they are slow)
    if (end - first < 32) {
        describe(a, sizeof a, threads[waiting]);
        fail("%s, but its warp has only %zu threads (full-mask collectives need 32)", a,
             end - first);
    }
    for (size_t i = first; i < end; i++) {
        const Thread& t = threads[i];
        bool both_sync = (t.op == WarpOp::sync) == (threads[waiting].op == WarpOp::sync);
        if (t.state == State::at_warp_op && t.mask == 0xffffffffu && both_sync) continue;
        describe(a, sizeof a, threads[waiting]);
        describe(b, sizeof b, t);
        if (t.state != State::at_warp_op) fail("divergent warp collective: %s, but %s", a, b);
        if (t.mask != 0xffffffffu)
            fail("%s with mask %#x; only the full mask is emulated", b, t.mask);
        fail("divergent warp collective: %s (shuffle/__syncwarp mismatch)", b);
    }
    uint64_t result[32];
    for (size_t lane = 0; lane < 32; lane++) {
        const Thread& t = threads[first + lane];
        size_t source = lane, arg = (size_t)t.lane_arg;  // lanes out of range read their own
        if (t.op == WarpOp::shfl) source = arg & 31;
        if (t.op == WarpOp::shfl_xor) source = (lane ^ arg) & 31;
        if (t.op == WarpOp::shfl_down && lane + arg < 32) source = lane + arg;
        if (t.op == WarpOp::shfl_up && lane >= arg) source = lane - arg;
        result[lane] = threads[first + source].value;
    }
    for (size_t lane = 0; lane < 32; lane++) {
        threads[first + lane].value = result[lane];
        threads[first + lane].state = State::runnable;
    }
    return true;
}

// Releases the barrier if every thread waits at it; returns false when all have finished.
inline bool release_barrier(std::vector<Thread>& threads) {
    size_t waiting = 0;
    while (waiting < threads.size() && threads[waiting].state != State::at_barrier) waiting++;
    if (waiting == threads.size()) return false;
    const Thread& w = threads[waiting];
    char a[256], b[256];
    for (Thread& t : threads) {
        if (t.state != State::at_barrier || t.line != w.line || strcmp(t.file, w.file) != 0) {
            describe(a, sizeof a, w);
            describe(b, sizeof b, t);
            fail("divergent __syncthreads: %s, but %s", a, b);
        }
    }
    for (Thread& t : threads) t.state = State::runnable;
    return true;
}

// Runs one block (blockIdx, blockDim set) to completion.
inline void run_block(const std::function<void()>& body) {
    size_t n = (size_t)blockDim.x * blockDim.y * blockDim.z;
    std::vector<Thread> threads(n);
    for (size_t i = 0; i < n; i++) {
        Thread* t = &threads[i];
        t->index = uint3((unsigned int)(i % blockDim.x),
                         (unsigned int)(i / blockDim.x % blockDim.y),
                         (unsigned int)(i / ((size_t)blockDim.x * blockDim.y)));
        t->fiber = boost::context::fiber(
            std::allocator_arg, PooledStack(), [t, &body](boost::context::fiber&& scheduler) {
                t->scheduler = std::move(scheduler);
                body();
                t->state = State::finished;
                return std::move(t->scheduler);
            });
    }
    for (;;) {
        // run every runnable thread, in the chosen order, until it waits or finishes
        for (size_t k = 0; k < n; k++) {
            Thread& t = threads[order == Order::forward ? k : n - 1 - k];
            if (t.state != State::runnable) continue;
            current = &t;
            threadIdx = t.index;
            t.fiber = std::move(t.fiber).resume();
        }
        current = NULL;
        bool progress = false;
        for (size_t first = 0; first < n; first += 32) progress |= complete_warp_op(threads, first);
        if (!progress && !release_barrier(threads)) break;
    }
}

// The __shared__ section's bytes, AddressSanitizer's red zones skipped: f(byte) for each.
extern "C" char __start_cuda_emu_shared[] __attribute__((weak));
extern "C" char __stop_cuda_emu_shared[] __attribute__((weak));
template <typename F>
void for_each_shared_byte(F f) {
    uintptr_t begin = (uintptr_t)__start_cuda_emu_shared, end = (uintptr_t)__stop_cuda_emu_shared;
    for (uintptr_t address = begin; address < end; address++) {
#ifdef __SANITIZE_ADDRESS__
        if (__asan_address_is_poisoned((void*)address)) continue;
#endif
        f((volatile unsigned char*)address);
    }
}

// Fills the __shared__ section with 0xFF bytes.
inline void poison_shared_memory() {
    for_each_shared_byte([](volatile unsigned char* byte) { *byte = 0xFF; });
}

// The launch running now: its blocks in the order they start, the next to start, and
// whether one has been suspended at an atomic yet.
struct Launch {
    size_t next = 0, n_blocks = 0;
    bool suspended = false;
    std::function<void(size_t)> run;  // runs the k-th block to start to its end
};
inline Launch launch_now;

// A block that publishes with an atomic (say each block counts itself done once its part of
// a sum is written, and the block that counts last adds the parts) must have finished what
// it publishes: a GPU may run the other blocks to their ends before this one goes on. So at
// the first atomic of a launch the emulator does that: it suspends the block there, runs
// every block not started yet to its end, then resumes the block. Had the block's other
// threads not written their part before the count (a missing __syncthreads), the block
// that adds reads whatever that part held (0xFF bytes, NaN, when fresh) and the sum comes
// out wrong (tests/cuda_test_emulator.cpp).
inline void after_atomic() {
    if (current == NULL || launch_now.suspended) return;
    launch_now.suspended = true;
    std::vector<unsigned char> shared;  // the suspended block's shared memory
    for_each_shared_byte(
        [&shared](volatile unsigned char* byte) { shared.push_back((unsigned char)*byte); });
    Thread* self = current;
    uint3 block = blockIdx, thread = threadIdx;
    while (launch_now.next < launch_now.n_blocks) launch_now.run(launch_now.next++);
    size_t i = 0;
    for_each_shared_byte([&shared, &i](volatile unsigned char* byte) { *byte = shared[i++]; });
    current = self;
    blockIdx = block;
    threadIdx = thread;
}

template <typename T>
void check_argument(const T& param, int index) {
    if constexpr (std::is_pointer_v<T>) {
        if (param != NULL && !is_device_pointer(param))
            fail("argument %d of a kernel launch, %p, is not device memory", index,
                 (const void*)param);
    }
}

// Runs kernel<<<grid, block>>> with these parameters; traced
template <typename... Params>
void execute(void (*kernel)(Params...), dim3 grid, dim3 block, const std::tuple<Params...>& params) {
    kernel_launches++;
    std::apply([](const Params&... param) {
        int index = 0;
        (check_argument(param, index++), ...);
    }, params);
    if (tracing) {
        Operation op{Operation::kernel, (const void*)kernel, {grid.x, grid.y, grid.z},
                     {block.x, block.y, block.z}, {}};
        std::apply([&op](const Params&... param) { (append_bytes(op.bytes, param), ...); }, params);
        trace.push_back(op);
    }
    DeviceAccess access;
    gridDim = grid;
    blockDim = block;
    size_t n_blocks = (size_t)grid.x * grid.y * grid.z;
    launch_now.next = 0;
    launch_now.n_blocks = n_blocks;
    launch_now.suspended = false;
    launch_now.run = [&params, kernel, grid, n_blocks](size_t k) {
        size_t b = order == Order::forward ? k : n_blocks - 1 - k;
        blockIdx = uint3((unsigned int)(b % grid.x), (unsigned int)(b / grid.x % grid.y),
                         (unsigned int)(b / ((size_t)grid.x * grid.y)));
        poison_shared_memory();
        run_block([&params, kernel] { std::apply(kernel, params); });
    };
    while (launch_now.next < n_blocks) launch_now.run(launch_now.next++);
}

// A launch recorded by stream capture: the kernel and its own copy of the parameters, which
// cudaGraphExecKernelNodeSetParams replaces (kernelParams[i] points to parameter i)
template <typename... Params>
struct KernelNode : Node {
    void (*kernel)(Params...);
    dim3 grid, block;
    std::tuple<Params...> params;
    KernelNode(void (*kernel)(Params...), dim3 grid, dim3 block, const std::tuple<Params...>& params)
        : kernel(kernel), grid(grid), block(block), params(params) {}
    void run() override { execute(kernel, grid, block, params); }
    Node* clone() const override { return new KernelNode(*this); }
    void set(const void* function, dim3 new_grid, dim3 new_block, void** kernel_params) override {
        if (function != (const void*)kernel)
            fail("cudaGraphExecKernelNodeSetParams: another kernel than the node's");
        grid = new_grid;
        block = new_block;
        set_params(kernel_params, std::index_sequence_for<Params...>{});
    }
    template <size_t... I>
    void set_params(void** kernel_params, std::index_sequence<I...>) {
        ((memcpy(&std::get<I>(params), kernel_params[I], sizeof(std::get<I>(params)))), ...);
    }
};

// kernel<<<grid, block>>>(args...): the arguments are converted to the kernel's parameter
// types once, as a launch does, and every thread gets its own copy. While a stream is
// captured, the launch becomes a node of its graph instead.
template <typename... Params, typename... Args>
void launch(void (*kernel)(Params...), dim3 grid, dim3 block, Args... args) {
    size_t threads = (size_t)block.x * block.y * block.z;
    if (threads == 0 || threads > 1024 || block.z > 64)
        fail("invalid block (%u,%u,%u)", block.x, block.y, block.z);
    if (grid.x == 0 || grid.y == 0 || grid.z == 0 || grid.y > 65535 || grid.z > 65535)
        fail("invalid grid (%u,%u,%u)", grid.x, grid.y, grid.z);
    std::tuple<Params...> params(args...);
    if (capturing != NULL) {
        std::apply([](const Params&... param) {
            int index = 0;
            (check_argument(param, index++), ...);
        }, params);
        capturing->add(new KernelNode<Params...>(kernel, grid, block, params));
        return;
    }
    execute(kernel, grid, block, params);
}

}  // namespace cuda_emu

// ---- graphs -------------------------------------------------------------------------------
enum cudaStreamCaptureMode {
    cudaStreamCaptureModeGlobal = 0, cudaStreamCaptureModeThreadLocal = 1,
    cudaStreamCaptureModeRelaxed = 2
};
enum cudaStreamCaptureStatus {
    cudaStreamCaptureStatusNone = 0, cudaStreamCaptureStatusActive = 1,
    cudaStreamCaptureStatusInvalidated = 2
};
typedef cuda_emu::Graph* cudaGraph_t;
typedef cuda_emu::GraphExec* cudaGraphExec_t;
typedef cuda_emu::Node* cudaGraphNode_t;
struct cudaGraphEdgeData {
    unsigned char from_port, to_port, type, reserved[5];
};
struct cudaKernelNodeParams {
    void* func;
    dim3 gridDim, blockDim;
    unsigned int sharedMemBytes;
    void** kernelParams;
    void** extra;
};
inline cudaError_t cudaStreamBeginCapture(cudaStream_t stream, cudaStreamCaptureMode) {
    if (stream == 0 || cuda_emu::capturing != NULL) return cudaErrorStreamCaptureUnsupported;
    cuda_emu::capturing = new cuda_emu::Graph;
    return cudaSuccess;
}
inline cudaError_t cudaStreamEndCapture(cudaStream_t, cudaGraph_t* graph) {
    if (cuda_emu::capturing == NULL) return cudaErrorIllegalState;
    *graph = cuda_emu::capturing;
    cuda_emu::capturing = NULL;
    return cudaSuccess;
}
// the node the next captured one will depend on: the last one captured
inline cudaError_t cudaStreamGetCaptureInfo(cudaStream_t, cudaStreamCaptureStatus* status,
                                            unsigned long long* id = NULL,
                                            cudaGraph_t* graph = NULL,
                                            const cudaGraphNode_t** dependencies = NULL,
                                            const cudaGraphEdgeData** edges = NULL,
                                            size_t* n_dependencies = NULL) {
    cuda_emu::Graph* g = cuda_emu::capturing;
    *status = g != NULL ? cudaStreamCaptureStatusActive : cudaStreamCaptureStatusNone;
    if (id != NULL) *id = 1;
    if (graph != NULL) *graph = g;
    if (edges != NULL) *edges = NULL;
    bool any = g != NULL && !g->nodes.empty();
    if (dependencies != NULL) *dependencies = any ? &g->nodes.back() : NULL;
    if (n_dependencies != NULL) *n_dependencies = any ? 1 : 0;
    return cudaSuccess;
}
inline cudaError_t cudaGraphInstantiate(cudaGraphExec_t* exec, cudaGraph_t graph,
                                        unsigned long long = 0) {
    cuda_emu::check_not_capturing("cudaGraphInstantiate");
    *exec = new cuda_emu::GraphExec;
    for (const cuda_emu::Node* node : graph->nodes) (*exec)->nodes.push_back(node->clone());
    return cudaSuccess;
}
inline cudaError_t cudaGraphExecKernelNodeSetParams(cudaGraphExec_t exec, cudaGraphNode_t node,
                                                    const cudaKernelNodeParams* p) {
    if (node->index >= exec->nodes.size()) return cudaErrorInvalidValue;
    exec->nodes[node->index]->set(p->func, p->gridDim, p->blockDim, p->kernelParams);
    return cudaSuccess;
}
inline cudaError_t cudaGraphLaunch(cudaGraphExec_t exec, cudaStream_t) {
    cuda_emu::check_not_capturing("cudaGraphLaunch");
    for (cuda_emu::Node* node : exec->nodes) node->run();
    return cudaSuccess;
}
inline cudaError_t cudaGraphExecDestroy(cudaGraphExec_t exec) {
    delete exec;
    return cudaSuccess;
}
inline cudaError_t cudaGraphDestroy(cudaGraph_t graph) {
    delete graph;
    return cudaSuccess;
}

#define __syncthreads() cuda_emu::syncthreads(__FILE__, __LINE__)
inline void __syncwarp(unsigned int mask = 0xffffffffu) {
    cuda_emu::warp_op(cuda_emu::WarpOp::sync, mask, 0, 0, 32);
}
template <typename T>
T __shfl_sync(unsigned int mask, T value, int source_lane, int width = 32) {
    return cuda_emu::warp_op(cuda_emu::WarpOp::shfl, mask, value, source_lane, width);
}
template <typename T>
T __shfl_xor_sync(unsigned int mask, T value, int lane_mask, int width = 32) {
    return cuda_emu::warp_op(cuda_emu::WarpOp::shfl_xor, mask, value, lane_mask, width);
}
template <typename T>
T __shfl_down_sync(unsigned int mask, T value, unsigned int delta, int width = 32) {
    return cuda_emu::warp_op(cuda_emu::WarpOp::shfl_down, mask, value, (int)delta, width);
}
template <typename T>
T __shfl_up_sync(unsigned int mask, T value, unsigned int delta, int width = 32) {
    return cuda_emu::warp_op(cuda_emu::WarpOp::shfl_up, mask, value, (int)delta, width);
}

#endif
