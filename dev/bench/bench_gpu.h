// bench_gpu.h — what the GPU kernel benchmarks (dev/bench/bench_gemm.cu,
// dev/bench/bench_depth.cu, dev/bench/bench_attention.cu) share: their command line, random
// inputs on the device, the comparison of a result with the CPU's, and the timing.
#ifndef ATTNRES_BENCH_GPU_H
#define ATTNRES_BENCH_GPU_H

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "common.cuh"
#include "model.cuh"  // cuda_device_problem

// `program [--repeats N]`: N (default `repeats`); a bad argument or no usable GPU exits 1
// with one line
static int bench_repeats(int argc, char** argv, const char* program, int repeats) {
    for (int i = 1; i < argc; i++) {
        if (std::strcmp(argv[i], "--repeats") == 0 && i + 1 < argc) {
            repeats = std::atoi(argv[++i]);
        } else {
            std::fprintf(stderr, "error: unknown argument '%s' (usage: %s [--repeats N])\n",
                         argv[i], program);
            std::exit(1);
        }
    }
    if (repeats < 1) { std::fprintf(stderr, "error: --repeats must be positive\n"); std::exit(1); }
    const char* problem = cuda_device_problem();
    if (problem != NULL) { std::fprintf(stderr, "error: %s\n", problem); std::exit(1); }
    return repeats;
}

// n floats uniform in [-1, 1), the same for the same seed
static std::vector<float> random_floats(size_t n, unsigned seed) {
    std::vector<float> v(n);
    for (size_t i = 0; i < n; i++) {
        seed = seed * 1664525u + 1013904223u;
        v[i] = (float)(seed >> 8) / (float)(1u << 24) * 2.0f - 1.0f;
    }
    return v;
}

static float* upload(const std::vector<float>& host) {
    float* device = cuda_malloc_floats(host.size());
    cudaCheck(cudaMemcpy(device, host.data(), host.size() * sizeof(float), cudaMemcpyHostToDevice));
    return device;
}

static inline std::vector<float> download(const float* device, size_t n) {
    std::vector<float> host(n);
    cudaCheck(cudaMemcpy(host.data(), device, n * sizeof(float), cudaMemcpyDeviceToHost));
    return host;
}

// the largest |gpu - cpu| / (atol + rtol |cpu|) of two results: at most 1 passes (the
// kernels' agreement tests' tolerances, tests/cuda_test_layers.cpp)
static inline double tolerance_used(const std::vector<float>& gpu, const std::vector<float>& cpu,
                                    double atol = 1e-5, double rtol = 1e-5) {
    double worst = 0.0;
    for (size_t i = 0; i < gpu.size(); i++)
        worst = std::max(worst, std::fabs((double)gpu[i] - cpu[i]) / (atol + rtol * std::fabs(cpu[i])));
    return worst;
}

// The median milliseconds of forward() and of backward(), each between two CUDA events on
// cuda_stream, over `repeats` runs of the pair after 3 warm-up runs
struct Timing {
    double forward_ms, backward_ms;
};
template <typename Forward, typename Backward>
static Timing time_forward_backward(Forward forward, Backward backward, int repeats) {
    cudaEvent_t start, middle, stop;
    cudaCheck(cudaEventCreate(&start));
    cudaCheck(cudaEventCreate(&middle));
    cudaCheck(cudaEventCreate(&stop));
    std::vector<float> forward_ms, backward_ms;
    for (int r = -3; r < repeats; r++) {
        cudaCheck(cudaEventRecord(start, cuda_stream));
        forward();
        cudaCheck(cudaEventRecord(middle, cuda_stream));
        backward();
        cudaCheck(cudaEventRecord(stop, cuda_stream));
        cudaCheck(cudaEventSynchronize(stop));
        float f = 0.0f, b = 0.0f;
        cudaCheck(cudaEventElapsedTime(&f, start, middle));
        cudaCheck(cudaEventElapsedTime(&b, middle, stop));
        if (r >= 0) {
            forward_ms.push_back(f);
            backward_ms.push_back(b);
        }
    }
    std::sort(forward_ms.begin(), forward_ms.end());
    std::sort(backward_ms.begin(), backward_ms.end());
    cudaCheck(cudaEventDestroy(start));
    cudaCheck(cudaEventDestroy(middle));
    cudaCheck(cudaEventDestroy(stop));
    return Timing{forward_ms[forward_ms.size() / 2], backward_ms[backward_ms.size() / 2]};
}

#endif
