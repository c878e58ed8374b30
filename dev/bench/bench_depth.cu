// bench_depth.cu — the depth attention on the GPU, version by version (llm.c's dev/cuda habit:
// each version a complete idea, checked against the CPU and timed in one program, so a reader
// sees how the kernel became fast and a GPU says by how much):
//   version 1: cuda/depth_attention.cu's naive version (depth_attention_*_naive_cuda): one
//              thread per row, its sources and columns in plain loops (src/depth_attention.c's
//              naive version on the GPU); the weights' gradients by one thread per column,
//              adding every row in order.
//   version 2: the file's next section, what the trainer runs: a row's 64 threads split
//              its columns, each issuing its loads of several sources and columns at once
//              (memory latency, not bandwidth, bounds these kernels); the weights' gradients
//              summed in parts of 4 rows, then over the parts.
// Each is timed as a training step of the bench model calls it: in `full` and `block S=4`
// (d = 256, L = 8, B*T = 1024 rows), the 2L + 1 = 17 forward calls of one step, each over the
// sources model.c hands it (1 to 17 in full, 1 to 5 in block), then the 17 backward calls;
// CUDA events, median of --repeats after warm-up (version 1, far slower, a tenth of them).
// What the AttnRes modes add to a step over `none` is mostly these calls, so this is the
// number to move when the overhead is too large. Each depth attention's output goes straight
// into an RMSNorm, so version 2 is also timed with it: as two calls each way (depth
// attention, then rmsnorm; zeroing, rmsnorm's backward, then the depth attention's) and as the
// step runs them, one fused call each way (depth_attention_rmsnorm_*_cuda), beside the 17
// norms alone that `none` runs instead.
// Before timing, one call of each is checked against the CPU (src/depth_attention.c), since
// the program is also built with other block shapes (the Makefile's DEPTH_SHAPES): it exits 1
// on a mismatch. Also built against an earlier commit's cuda/ (make carry AB=...), which may
// not have the fused calls: then their lines are left out. Built by `make gpu-check`, which
// runs it.
//
// ./build/bench_depth [--repeats N]
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <vector>

#include "common.cuh"
#include "layers.cuh"
#include "bench_util.h"
#include "bench_gpu.h"

#ifdef HAS_DEPTH_ATTENTION_RMSNORM
#define HAS_FUSED 1
#else
#define HAS_FUSED 0
#endif

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

// The inputs of one call on the host: n sources V_i and the gradients they hold (N,C) (a call
// over fewer takes the first ones), the query, the key norm's gain norm_weight and the RMSNorm's
// gain weight (C) and the gradients the backwards add to, dxn (N,C): the norm's output
// gradient, or the attention's dout unfused.
// With `reversed`, every (N,C) tensor's rows in reverse order.
struct HostInputs {
    std::vector<std::vector<float>> sources, dsources;
    std::vector<float> query, norm_weight, weight, dquery, dnorm_weight, dweight, dxn;
    HostInputs(size_t n, size_t N, size_t C)
        : query(random_floats(C, 2)), norm_weight(random_floats(C, 3)),
          weight(random_floats(C, 7)), dquery(random_floats(C, 4)),
          dnorm_weight(random_floats(C, 5)), dweight(random_floats(C, 8)),
          dxn(random_floats(N * C, 6)) {
        for (size_t i = 0; i < n; i++) {
            sources.push_back(random_floats(N * C, 10 + (unsigned)i));
            dsources.push_back(random_floats(N * C, 40 + (unsigned)i));
        }
    }
    HostInputs reversed(size_t N, size_t C) const {
        HostInputs r = *this;
        auto reverse = [&](std::vector<float>& x) {
            for (size_t a = 0, b = N - 1; a < b; a++, b--)
                std::swap_ranges(&x[a * C], &x[a * C] + C, &x[b * C]);
        };
        for (auto& x : r.sources) reverse(x);
        for (auto& x : r.dsources) reverse(x);
        reverse(r.dxn);
        return r;
    }
};

// What one call (forward, then backward) gives: per row (out, alpha, key_rstd, the sources'
// gradients; fused also xn, rstd, dout) and sums over every row (dquery, dnorm_weight; fused
// also dweight), all on the host, each with its name
struct Results {
    std::vector<std::pair<const char*, std::vector<float>>> per_row, sums;
};

// The calls checked and timed: version 1 (the depth attention alone), version 2 alone, and
// version 2 fused with its RMSNorm
enum Call { NAIVE, ALONE, FUSED };

// The Results of one call from its tensors (host copies); xn, rstd, dout and dweight only fused
static Results named_results(std::vector<float> out, std::vector<float> alpha,
                             std::vector<float> key_rstd, std::vector<std::vector<float>> dsources,
                             std::vector<float> dquery, std::vector<float> dnorm_weight, bool fused,
                             std::vector<float> xn, std::vector<float> rstd,
                             std::vector<float> dout, std::vector<float> dweight) {
    Results r;
    r.per_row = {{"out", out}, {"alpha", alpha}, {"key_rstd", key_rstd}};
    for (const std::vector<float>& d : dsources) r.per_row.push_back({"dsource", d});
    r.sums = {{"dquery", dquery}, {"dnorm_weight", dnorm_weight}};
    if (fused) {
        r.per_row.insert(r.per_row.end(), {{"xn", xn}, {"rstd", rstd}, {"dout", dout}});
        r.sums.push_back({"dweight", dweight});
    }
    return r;
}

// The call over n sources and the first `rows` rows on the CPU (src/depth_attention.c): the
// naive version for version 1, the tiled one alone or fused with its RMSNorm for version 2
static Results cpu_call(const HostInputs& in, size_t n, size_t rows, size_t C, Call call) {
    std::vector<const float*> sources;
    std::vector<std::vector<float>> grads(in.dsources.begin(), in.dsources.begin() + n);
    std::vector<float*> dsources;
    for (size_t i = 0; i < n; i++) {
        sources.push_back(in.sources[i].data());
        dsources.push_back(grads[i].data());
    }
    std::vector<float> out(rows * C), alpha(rows * n), key_rstd(rows * n), xn(rows * C), rstd(rows);
    std::vector<float> dout(rows * C), dquery(in.dquery), dnorm_weight(in.dnorm_weight);
    std::vector<float> dweight(in.dweight);
    if (call == FUSED) {
#ifdef HAS_DEPTH_ATTENTION_RMSNORM  // an earlier commit's src/ may not have the fused call
        DepthSaved saved = {alpha.data(), key_rstd.data(), NULL, NULL, NULL};
        std::vector<float> query(in.query), norm_weight(in.norm_weight);
        DepthParams params = {query.data(), norm_weight.data(), NULL, NULL};
        DepthParams grads = {dquery.data(), dnorm_weight.data(), NULL, NULL};
        depth_attention_rmsnorm_forward(xn.data(), rstd.data(), out.data(), saved, sources.data(),
                                        params, in.weight.data(), n, rows, C);
        depth_attention_rmsnorm_backward(dsources.data(), grads, dweight.data(), dout.data(),
                                         in.dxn.data(), out.data(), rstd.data(), in.weight.data(),
                                         saved, sources.data(), params, n, rows, C);
#endif
    } else {
        (call == NAIVE ? depth_attention_forward_naive : depth_attention_forward)(
            out.data(), alpha.data(), key_rstd.data(), sources.data(), in.query.data(),
            in.norm_weight.data(), n, rows, C);
        (call == NAIVE ? depth_attention_backward_naive : depth_attention_backward)(
            dsources.data(), dquery.data(), dnorm_weight.data(), in.dxn.data(), alpha.data(),
            key_rstd.data(), sources.data(), in.query.data(), in.norm_weight.data(), n, rows, C);
    }
    return named_results(out, alpha, key_rstd, grads, dquery, dnorm_weight, call == FUSED, xn,
                         rstd, dout, dweight);
}

// the same call on the GPU: version 1 (the naive kernels) or version 2 (the kernels the model
// runs); FUSED needs HAS_DEPTH_ATTENTION_RMSNORM
static Results gpu_call(const HostInputs& in, size_t n, size_t rows, size_t C, Call call) {
    std::vector<const float*> sources;
    std::vector<float*> dsources;
    for (size_t i = 0; i < n; i++) {
        sources.push_back(upload(in.sources[i]));
        dsources.push_back(upload(in.dsources[i]));
    }
    float *out = cuda_malloc_floats(rows * C), *alpha = cuda_malloc_floats(rows * n);
    float *key_rstd = cuda_malloc_floats(rows * n), *xn = cuda_malloc_floats(rows * C);
    float *rstd = cuda_malloc_floats(rows), *dout = cuda_malloc_floats(rows * C);
    float *query = upload(in.query), *norm_weight = upload(in.norm_weight);
    float *weight = upload(in.weight), *dxn = upload(in.dxn), *dquery = upload(in.dquery);
    float *dnorm_weight = upload(in.dnorm_weight), *dweight = upload(in.dweight);
    if (call == FUSED) {
#ifdef HAS_DEPTH_ATTENTION_RMSNORM
        DepthSaved saved = {alpha, key_rstd, NULL, NULL, NULL};
        DepthParams params = {query, norm_weight, NULL, NULL};
        DepthParams grads = {dquery, dnorm_weight, NULL, NULL};
        depth_attention_rmsnorm_forward_cuda(xn, rstd, out, saved, sources.data(), params, weight,
                                             n, rows, C);
        depth_attention_rmsnorm_backward_cuda(dsources.data(), grads, dweight, dout, dxn, out,
                                              rstd, weight, saved, sources.data(), params, n,
                                              rows, C);
#endif
    } else {
        (call == NAIVE ? depth_attention_forward_naive_cuda : depth_attention_forward_cuda)(
            out, alpha, key_rstd, sources.data(), query, norm_weight, n, rows, C);
        (call == NAIVE ? depth_attention_backward_naive_cuda : depth_attention_backward_cuda)(
            dsources.data(), dquery, dnorm_weight, dxn, alpha, key_rstd, sources.data(), query,
            norm_weight, n, rows, C);
    }
    std::vector<std::vector<float>> grads;
    for (size_t i = 0; i < n; i++) grads.push_back(download(dsources[i], rows * C));
    bool fused = call == FUSED;
    auto fused_only = [&](const float* p, size_t count) {  // unfused, never written
        return fused ? download(p, count) : std::vector<float>();
    };
    Results r = named_results(download(out, rows * C), download(alpha, rows * n),
                              download(key_rstd, rows * n), grads, download(dquery, C),
                              download(dnorm_weight, C), fused, fused_only(xn, rows * C),
                              fused_only(rstd, rows), fused_only(dout, rows * C),
                              fused_only(dweight, C));
    for (float* p : {out, alpha, key_rstd, xn, rstd, dout, query, norm_weight, weight, dxn,
                     dquery, dnorm_weight, dweight})
        cudaCheck(cudaFree(p));
    for (size_t i = 0; i < n; i++) {
        cudaCheck(cudaFree((void*)sources[i]));
        cudaCheck(cudaFree(dsources[i]));
    }
    return r;
}

// One call over n sources and the first `rows` rows, each version (and, where cuda/ has it,
// version 2 fused with its RMSNorm), on the GPU against the CPU: returns the largest share of
// the tolerance used. The tolerances are the agreement tests' at this size
// (tests/cuda_test_layers.cpp): 1e-4 + 1e-4 |x|, and for the sums over every row (17,408 terms
// of either sign at the bench size, summing to ~0.2, whose float result depends on the order
// of the sum) an atol of 4 x the spread when that is more: the spread is the CPU's result
// against the CPU's with the rows reversed, the same math rounded in another order; for
// version 1, which adds all of a column's terms in one float, also the CPU's naive result
// (summed that way) against its tiled one. The kernels' block shape (DEPTH_ROWS x ROW_THREADS
// x DEPTH_COLS) may be another than the tests': this says that the build being timed computes
// the right thing.
static double check_call(const HostInputs& in, size_t n, size_t rows, size_t C) {
    double used = 0.0;
    HostInputs reversed = in.reversed(rows, C);
    for (Call call : {NAIVE, ALONE, FUSED}) {
        if (call == FUSED && !HAS_FUSED) continue;
        Results gpu = gpu_call(in, n, rows, C, call), cpu = cpu_call(in, n, rows, C, call);
        std::vector<Results> others = {cpu_call(reversed, n, rows, C, call)};
        if (call == NAIVE) others.push_back(cpu_call(in, n, rows, C, ALONE));
        for (size_t k = 0; k < cpu.per_row.size(); k++)
            used = std::max(used, tolerance_used(gpu.per_row[k].second, cpu.per_row[k].second,
                                                 1e-4, 1e-4));
        for (size_t k = 0; k < cpu.sums.size(); k++) {
            const std::vector<float>&g = gpu.sums[k].second, &c = cpu.sums[k].second;
            double most = 0.0;
            for (const Results& other : others)
                for (size_t j = 0; j < c.size(); j++)
                    most = std::max(most, (double)std::fabs(other.sums[k].second[j] - c[j]));
            used = std::max(used, tolerance_used(g, c, std::max(1e-4, 4.0 * most), 1e-4));
        }
    }
    return used;
}

// a line of the table for the calls of one step, the depth attention's through `forward` and
// `backward` (version 1 or 2) and nothing else: what is not the depth attention, the norm's
// traffic, is not counted in the GB/s
template <typename Forward, typename Backward>
static void time_depth_line(int mode, const char* calls, const std::vector<size_t>& counts,
                            Forward forward, Backward backward, int repeats, size_t N, size_t C) {
    Timing t = time_forward_backward([&] { for (size_t n : counts) forward(n); },
                                     [&] { for (size_t n : counts) backward(n); }, repeats);
    print_depth_line(mode, calls, counts, t, N, C);
}

int main(int argc, char** argv) {
    int repeats = bench_repeats(argc, argv, "bench_depth", 100);
    const size_t N = BENCH_B * BENCH_T, C = 256, most = 17;
    HostInputs in(most, N, C);
    cuda_workspace(std::max(depth_attention_workspace_floats_cuda(most, N, C),
                            ceil_div(N, ROWS_PER_PART) * C));  // rmsnorm's partial sums
    // first the check: full's largest call, and block's over rows that no block shape divides
    double used = std::max(check_call(in, most, N, C), check_call(in, 5, N - 3, C));
    std::printf("bench_depth: against the CPU (17 sources x %zu rows, 5 x %zu): %s (%.0f %% of "
                "the tolerance)\n", N, N - 3, used <= 1.0 ? "ok" : "MISMATCH", 100.0 * used);
    // the sources (and their gradients) of the largest call; a call over n takes the first n
    std::vector<const float*> sources;
    std::vector<float*> dsources;
    for (size_t i = 0; i < most; i++) {
        sources.push_back(upload(in.sources[i]));
        dsources.push_back(upload(in.dsources[i]));
    }
    float *out = cuda_malloc_floats(N * C), *dout = upload(random_floats(N * C, 1));
    float *xn = cuda_malloc_floats(N * C), *rstd = cuda_malloc_floats(N);
    float *dxn = upload(in.dxn), *dh = upload(std::vector<float>(N * C, 0.0f));
    float *weight = upload(in.weight), *dweight = upload(in.dweight);
    float *alpha = cuda_malloc_floats(N * most), *key_rstd = cuda_malloc_floats(N * most);
    float *query = upload(in.query), *norm_weight = upload(in.norm_weight);
    float *dquery = upload(in.dquery), *dnorm_weight = upload(in.dnorm_weight);
    const int naive_repeats = std::max(3, repeats / 10);
    std::printf("bench_depth: the depth attention's calls of one training step, bench model "
                "(N=%zu rows, C=%zu), median of %d runs (version 1: %d)\n", N, C, repeats,
                naive_repeats);
    // the least DRAM traffic of a call over n sources of N x C floats: the forward reads the
    // sources and writes out, n + 1 tensors; the backward reads the sources and dout and reads
    // and writes the sources' gradients, 3n + 1. Against the GPU's bandwidth (an H200: about
    // 4.8 TB/s) the GB/s say how far from that bound the kernels run: latency, not bandwidth,
    // limits them at these sizes
    std::printf("%-10s %-26s %-22s %11s %11s %13s %16s\n", "mode", "calls", "sources per call",
                "forward us", "backward us", "us per call", "GB/s fwd / bwd");
    // what `none` spends on the same 17 norms (2L sub-layers and the final one): its
    // residual stream's gradient is added to, nothing zeroed
    const size_t n_norms = 2 * (size_t)bench_config(0).n_layers + 1;
    Timing norms = time_forward_backward(
        [&] { for (size_t l = 0; l < n_norms; l++) rmsnorm_forward_cuda(xn, rstd, out, weight, N, C); },
        [&] {
            for (size_t l = 0; l < n_norms; l++)
                rmsnorm_backward_cuda(dh, dweight, dxn, out, weight, rstd, N, C);
        },
        repeats);
    char calls[32];
    std::snprintf(calls, sizeof(calls), "%zu calls", n_norms);
    std::printf("%-10s %-26s %-22s %11.1f %11.1f %13.1f\n", "none", "rmsnorm alone", calls,
                1000.0 * norms.forward_ms, 1000.0 * norms.backward_ms,
                1000.0 * (norms.forward_ms + norms.backward_ms) / n_norms);
    for (int mode = 1; mode < N_MODES; mode++) {  // full, block
        ModelConfig c = bench_config(mode);
        std::vector<size_t> counts;
        for (int l = 0; l <= 2 * c.n_layers; l++) counts.push_back(count_sources(&c, l));
        time_depth_line(
            mode, "v1: a thread per row", counts,
            [&](size_t n) {
                depth_attention_forward_naive_cuda(out, alpha, key_rstd, sources.data(), query,
                                                   norm_weight, n, N, C);
            },
            [&](size_t n) {
                depth_attention_backward_naive_cuda(dsources.data(), dquery, dnorm_weight, dout,
                                                    alpha, key_rstd, sources.data(), query,
                                                    norm_weight, n, N, C);
            },
            naive_repeats, N, C);
        auto depth_forward = [&](size_t n) {
            depth_attention_forward_cuda(out, alpha, key_rstd, sources.data(), query,
                                         norm_weight, n, N, C);
        };
        auto depth_backward = [&](size_t n, const float* d) {
            depth_attention_backward_cuda(dsources.data(), dquery, dnorm_weight, d, alpha,
                                          key_rstd, sources.data(), query, norm_weight, n, N,
                                          C);
        };
        time_depth_line(mode, "v2: depth_attention.cu", counts, depth_forward,
                        [&](size_t n) { depth_backward(n, dout); }, repeats, N, C);
        Timing separate = time_forward_backward(
            [&] {
                for (size_t n : counts) {
                    depth_forward(n);
                    rmsnorm_forward_cuda(xn, rstd, out, weight, N, C);
                }
            },
            [&] {
                for (size_t n : counts) {
                    cudaCheck(cudaMemsetAsync(dh, 0, N * C * sizeof(float), cuda_stream));
                    rmsnorm_backward_cuda(dh, dweight, dxn, out, weight, rstd, N, C);
                    depth_backward(n, dh);
                }
            },
            repeats);
        print_depth_line(mode, "v2 + rmsnorm, two calls", counts, separate, N, C);
#ifdef HAS_DEPTH_ATTENTION_RMSNORM
        DepthSaved saved = {alpha, key_rstd, NULL, NULL, NULL};
        DepthParams params = {query, norm_weight, NULL, NULL};
        DepthParams grads = {dquery, dnorm_weight, NULL, NULL};
        Timing fused = time_forward_backward(
            [&] {
                for (size_t n : counts)
                    depth_attention_rmsnorm_forward_cuda(xn, rstd, out, saved, sources.data(),
                                                         params, weight, n, N, C);
            },
            [&] {
                for (size_t n : counts)
                    depth_attention_rmsnorm_backward_cuda(dsources.data(), grads, dweight, dh,
                                                          dxn, out, rstd, weight, saved,
                                                          sources.data(), params, n, N, C);
            },
            repeats);
        print_depth_line(mode, "v2 + rmsnorm, one fused", counts, fused, N, C);
        // what the mode adds to a step over none's norms (its partial sums' adds aside)
        std::printf("%-10s %-26s %-22s %11.1f %11.1f   (fused - none's norms)\n",
                    mode == 1 ? "full" : "block S=4", "adds to a step", "",
                    1000.0 * (fused.forward_ms - norms.forward_ms),
                    1000.0 * (fused.backward_ms - norms.backward_ms));
#endif
    }
    return used <= 1.0 ? 0 : 1;
}
