// bench_depth.cu — the depth attention's kernels (cuda/depth_attention.cu) as a training step
// of the bench model calls them: in `full` and `block S=4` (d = 256, L = 8, B*T = 1024 rows),
// the 2L + 1 = 17 forward calls of one step, each over the sources model.c hands it (1 to 17
// in full, 1 to 5 in block), then the 17 backward calls; timed with CUDA events, median of
// --repeats after warm-up. What the AttnRes modes add to a step over `none` is mostly these
// calls, so this is the number to move when the overhead is too large. Each depth attention's
// output goes straight into an RMSNorm, so the same calls are also timed with it: as two
// calls each way (depth attention, then rmsnorm; zeroing, rmsnorm's backward, then the depth
// attention's) and as the step runs them, one fused call each way
// (depth_attention_rmsnorm_*_cuda). Also built against an earlier commit's cuda/ (make carry
// AB=...), which may not have the fused calls: then their line is left out. Built by
// `make gpu-check`, which runs it.
//
// ./build/bench_depth [--repeats N]
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <vector>

#include "common.cuh"
#include "layers.cuh"
#include "bench_util.h"
#include "bench_gpu.h"

// one line of the table: the calls' time per step, per call, and the GB/s of their least
// DRAM traffic, that of the depth attention alone
static void print_depth_line(int mode, const char* calls, const std::vector<size_t>& counts,
                             Timing timing, size_t N, size_t C) {
    double f = 1000.0 * timing.forward_ms, b = 1000.0 * timing.backward_ms;
    double tensor_bytes = (double)N * C * sizeof(float);
    double forward_bytes = 0.0, backward_bytes = 0.0;
    for (size_t n : counts) {
        forward_bytes += (double)(n + 1) * tensor_bytes;
        backward_bytes += (double)(3 * n + 1) * tensor_bytes;
    }
    char range[64];
    std::snprintf(range, sizeof(range), "%zu calls of %zu..%zu", counts.size(),
                  *std::min_element(counts.begin(), counts.end()),
                  *std::max_element(counts.begin(), counts.end()));
    std::printf("%-10s %-26s %-22s %11.1f %11.1f %13.1f %7.0f / %6.0f\n",
                mode == 1 ? "full" : "block S=4", calls, range, f, b, (f + b) / counts.size(),
                forward_bytes / (f * 1e3), backward_bytes / (b * 1e3));
}

int main(int argc, char** argv) {
    int repeats = bench_repeats(argc, argv, "bench_depth", 100);
    const size_t N = BENCH_B * BENCH_T, C = 256, most = 17;
    // the sources (and their gradients) of the largest call; a call over n takes the first n
    std::vector<const float*> sources;
    std::vector<float*> dsources;
    for (size_t i = 0; i < most; i++) {
        sources.push_back(upload(random_floats(N * C, 10 + (unsigned)i)));
        dsources.push_back(upload(random_floats(N * C, 40 + (unsigned)i)));
    }
    float *out = cuda_malloc_floats(N * C), *dout = upload(random_floats(N * C, 1));
    float *xn = cuda_malloc_floats(N * C), *rstd = cuda_malloc_floats(N);
    float *dxn = upload(random_floats(N * C, 6)), *dh = cuda_malloc_floats(N * C);
    float *gain = upload(random_floats(C, 7)), *dgain = upload(random_floats(C, 8));
    float *alpha = cuda_malloc_floats(N * most), *key_rstd = cuda_malloc_floats(N * most);
    float *query = upload(random_floats(C, 2)), *norm_weight = upload(random_floats(C, 3));
    float *dquery = upload(random_floats(C, 4)), *dnorm_weight = upload(random_floats(C, 5));
    cuda_workspace(std::max(depth_attention_workspace_floats_cuda(most, N, C),
                            ceil_div(N, ROWS_PER_PART) * C));  // rmsnorm's partial sums
    std::printf("bench_depth: the depth attention's calls of one training step, bench model "
                "(N=%zu rows, C=%zu), median of %d runs\n", N, C, repeats);
    // the least DRAM traffic of a call over n sources of N x C floats: the forward reads the
    // sources and writes out, n + 1 tensors; the backward reads the sources and dout and reads
    // and writes the sources' gradients, 3n + 1. Against the GPU's bandwidth (an H200: about
    // 4.8 TB/s) the GB/s say how far from that bound the kernels run: latency, not bandwidth,
    // limits them at these sizes
    std::printf("%-10s %-26s %-22s %11s %11s %13s %16s\n", "mode", "calls", "sources per call",
                "forward us", "backward us", "us per call", "GB/s fwd / bwd");
    for (int mode = 1; mode < N_MODES; mode++) {  // full, block
        ModelConfig c = bench_config(mode);
        std::vector<size_t> counts;
        for (int l = 0; l <= 2 * c.n_layers; l++) counts.push_back(count_sources(&c, l));
        auto depth_forward = [&](size_t n) {
            depth_attention_forward_cuda(out, alpha, key_rstd, sources.data(), query,
                                         norm_weight, n, N, C);
        };
        auto depth_backward = [&](size_t n, const float* d) {
            depth_attention_backward_cuda(dsources.data(), dquery, dnorm_weight, d, alpha,
                                          key_rstd, sources.data(), query, norm_weight, n, N,
                                          C);
        };
        // the depth attention alone; the norm's traffic is not counted in the GB/s
        Timing alone = time_forward_backward(
            [&] { for (size_t n : counts) depth_forward(n); },
            [&] { for (size_t n : counts) depth_backward(n, dout); }, repeats);
        print_depth_line(mode, "depth attention", counts, alone, N, C);
        Timing separate = time_forward_backward(
            [&] {
                for (size_t n : counts) {
                    depth_forward(n);
                    rmsnorm_forward_cuda(xn, rstd, out, gain, N, C);
                }
            },
            [&] {
                for (size_t n : counts) {
                    cudaCheck(cudaMemsetAsync(dh, 0, N * C * sizeof(float), cuda_stream));
                    rmsnorm_backward_cuda(dh, dgain, dxn, out, gain, rstd, N, C);
                    depth_backward(n, dh);
                }
            },
            repeats);
        print_depth_line(mode, "+ rmsnorm, two calls", counts, separate, N, C);
#ifdef HAS_DEPTH_ATTENTION_RMSNORM
        Timing fused = time_forward_backward(
            [&] {
                for (size_t n : counts)
                    depth_attention_rmsnorm_forward_cuda(xn, rstd, out, alpha, key_rstd,
                                                         sources.data(), query, norm_weight,
                                                         gain, n, N, C);
            },
            [&] {
                for (size_t n : counts)
                    depth_attention_rmsnorm_backward_cuda(dsources.data(), dquery, dnorm_weight,
                                                          dgain, dh, dxn, out, rstd, gain, alpha,
                                                          key_rstd, sources.data(), query,
                                                          norm_weight, n, N, C);
            },
            repeats);
        print_depth_line(mode, "+ rmsnorm, one fused call", counts, fused, N, C);
#endif
    }
    return 0;
}
