// cuda_test_util.h — what the CUDA agreement tests (cuda_test_layers.cpp, cuda_test_depth.cpp)
// share: device buffers, run_cuda (every computation twice, in both of the emulator's thread
// orders, or twice on a real GPU, and the two equal bit for bit), and the comparison with the
// CPU within a tolerance. Those files' headers say what each tolerance covers.
#ifndef ATTNRES_CUDA_TEST_UTIL_H
#define ATTNRES_CUDA_TEST_UTIL_H

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "common.cuh"
#include "gradcheck.h"
#include "layers.cuh"
#include "layers.h"

using gradcheck::compare_exact;
using gradcheck::compare_within;
using gradcheck::Rng;
using gradcheck::Tolerance;

typedef std::vector<float> Floats;
struct Output {
    std::string name;
    Floats values;
};
typedef std::vector<Output> Outputs;

// Device copies of host data, freed together when the Device goes out of scope.
struct Device {
    std::vector<void*> allocations;
    template <typename T>
    T* upload(const std::vector<T>& host) {
        T* device;
        cudaCheck(cudaMalloc(&device, host.size() * sizeof(T)));
        cudaCheck(cudaMemcpy(device, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice));
        allocations.push_back(device);
        return device;
    }
    float* zeros(size_t n) { return upload(Floats(n, 0.0f)); }
    ~Device() {
        for (void* p : allocations) cudaCheck(cudaFree(p));
    }
};
template <typename T>
inline std::vector<T> download(const T* device, size_t n) {
    std::vector<T> host(n);
    cudaCheck(cudaMemcpy(host.data(), device, n * sizeof(T), cudaMemcpyDeviceToHost));
    return host;
}

#ifdef __CUDACC__
const bool ON_GPU = true;  // built by nvcc (build/test_cuda_gpu): the model's shapes too
// Runs a CUDA computation (upload, kernels, download) twice, checks that the results are
// identical (no race, no order-dependent sum), and returns them.
inline Outputs run_cuda(const std::function<Outputs()>& computation) {
    Outputs first = computation();
    Outputs second = computation();
    REQUIRE(first.size() == second.size());
    for (size_t i = 0; i < first.size(); i++) {
        REQUIRE(first[i].values.size() == second[i].values.size());
        compare_exact(first[i].name + ", second run vs first", second[i].values.data(),
                      first[i].values.data(), first[i].values.size());
    }
    return first;
}
#else
const bool ON_GPU = false;  // the emulator: sizes it runs in seconds
// Runs a CUDA computation (upload, kernels, download) in both thread orders, checks that the
// results are identical, and returns those of the forward order.
inline Outputs run_cuda(const std::function<Outputs()>& computation) {
    cuda_emu::Order saved = cuda_emu::order;
    cuda_emu::order = cuda_emu::Order::forward;
    Outputs forward = computation();
    cuda_emu::order = cuda_emu::Order::reverse;
    Outputs reverse = computation();
    cuda_emu::order = saved;
    REQUIRE(forward.size() == reverse.size());
    for (size_t i = 0; i < forward.size(); i++) {
        REQUIRE(forward[i].values.size() == reverse[i].values.size());
        compare_exact(forward[i].name + ", reverse vs forward thread order",
                      reverse[i].values.data(), forward[i].values.data(), forward[i].values.size());
    }
    return forward;
}
#endif

inline void check(const Output& cuda, const Floats& cpu, Tolerance tol) {
    REQUIRE(cuda.values.size() == cpu.size());
    compare_within(cuda.name, cuda.values.data(), cpu.data(), cpu.size(), tol);
}

#endif
