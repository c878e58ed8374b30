// bench_gemm.cu — our matmul (cuda/linear.cu) against cuBLAS SGEMM on the bench shapes:
// the three products of linear_forward_cuda / linear_backward_cuda, each checked against
// cuBLAS (the one agreement test that does not rest on our own code) and timed with CUDA
// events (median of --repeats after warm-up). float32 everywhere; cuBLAS without TF32.
// Exits 1 if any result differs from cuBLAS by more than 1e-4 relative to the tensor's
// largest value (sums of up to 1024 products of O(1) numbers). Built by `make gpu-check`.
//
// ./build/bench_gemm [--repeats N]
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <vector>

#include "common.cuh"
#include "layers.cuh"
#include "bench_gpu.h"

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
    std::printf("bench_gemm: float32 matmuls of the bench model, ours (cuda/linear.cu) vs "
                "cuBLAS SGEMM, median of %d runs\n", repeats);
    std::printf("%-14s %5s %4s %4s  %22s  %22s  %s\n", "product", "N", "IN", "OUT",
                "forward GFLOP/s ours/cublas", "backward GFLOP/s ours/cublas", "ratio f/b");
    int ok = 1;
    double flops_ours = 0.0, flops_cublas = 0.0, ms_ours = 0.0, ms_cublas = 0.0;
    for (size_t s = 0; s < sizeof(shapes) / sizeof(shapes[0]); s++) {
        size_t N = shapes[s][0], IN = shapes[s][1], OUT = shapes[s][2];
        std::vector<float> inp = random_floats(N * IN, 1), weight = random_floats(OUT * IN, 2);
        std::vector<float> dout = random_floats(N * OUT, 3), dinp0 = random_floats(N * IN, 4);
        std::vector<float> dweight0 = random_floats(OUT * IN, 5);
        float *d_inp = upload(inp), *d_weight = upload(weight), *d_dout = upload(dout);
        std::vector<float> results[2][3];
        Timing timing[2];
        for (int cublas = 0; cublas < 2; cublas++) {
            linear_use_cublas_cuda(cublas);
            float *d_out = upload(random_floats(N * OUT, 6)), *d_dinp = upload(dinp0);
            float* d_dweight = upload(dweight0);
            // one checked run from known starting values, then the timed runs
            linear_forward_cuda(d_out, d_inp, d_weight, N, IN, OUT);
            linear_backward_cuda(d_dinp, d_dweight, d_dout, d_inp, d_weight, N, IN, OUT);
            results[cublas][0] = download(d_out, N * OUT);
            results[cublas][1] = download(d_dinp, N * IN);
            results[cublas][2] = download(d_dweight, OUT * IN);
            timing[cublas] = time_forward_backward(
                [&] { linear_forward_cuda(d_out, d_inp, d_weight, N, IN, OUT); },
                [&] { linear_backward_cuda(d_dinp, d_dweight, d_dout, d_inp, d_weight, N, IN, OUT); },
                repeats);
            cudaCheck(cudaFree(d_out));
            cudaCheck(cudaFree(d_dinp));
            cudaCheck(cudaFree(d_dweight));
        }
        linear_use_cublas_cuda(0);
        const char* what[] = {"out", "dinp", "dweight"};
        for (int k = 0; k < 3; k++) {
            double rel = relative_difference(results[0][k], results[1][k]);
            if (!(rel <= 1e-4)) {
                std::printf("FAIL %s %s: ours differs from cuBLAS by %.2e (relative)\n",
                            names[s], what[k], rel);
                ok = 0;
            }
        }
        double flops = 2.0 * N * IN * OUT;
        double f0 = flops / timing[0].forward_ms * 1e-6, f1 = flops / timing[1].forward_ms * 1e-6;
        double b0 = 2 * flops / timing[0].backward_ms * 1e-6;
        double b1 = 2 * flops / timing[1].backward_ms * 1e-6;
        std::printf("%-14s %5zu %4zu %4zu  %10.0f / %-10.0f  %10.0f / %-10.0f  %.2f / %.2f\n",
                    names[s], N, IN, OUT, f0, f1, b0, b1, f0 / f1, b0 / b1);
        flops_ours += 3 * flops;
        flops_cublas += 3 * flops;
        ms_ours += timing[0].forward_ms + timing[0].backward_ms;
        ms_cublas += timing[1].forward_ms + timing[1].backward_ms;
        cudaCheck(cudaFree(d_inp));
        cudaCheck(cudaFree(d_weight));
        cudaCheck(cudaFree(d_dout));
    }
    std::printf("all products: ours %.0f GFLOP/s, cuBLAS %.0f GFLOP/s: ours at %.0f%% of cuBLAS\n",
                flops_ours / ms_ours * 1e-6, flops_cublas / ms_cublas * 1e-6,
                100.0 * ms_cublas / ms_ours);
    std::printf("%s\n", ok ? "agreement with cuBLAS: ok" : "agreement with cuBLAS: FAIL");
    return ok ? 0 : 1;
}
