// cuda_test_depth.cpp — the depth attention's CUDA kernels (cuda/depth_attention.cu,
// cuda/depth_variants.cu, cuda/depth_rows.cuh) against their CPU twins in src/, naive and
// fast, fused with their RMSNorm, every variant switch and mixing, as cuda_test_layers.cpp
// tests the other layers (its header: the emulator's two thread orders, the accumulate
// contract, and the tolerances: depth attention, depth variants and depth mixing 1e-5 +
// 1e-5 |cpu|, reductions over C per source and over N for the parameters).
#include "cuda_test_util.h"

// ---- depth attention ---------------------------------------------------------------------
// x (N,C) with its rows in reverse order
static Floats reverse_rows(const Floats& x, size_t N, size_t C) {
    Floats r(N * C);
    for (size_t n = 0; n < N; n++) std::copy_n(&x[(N - 1 - n) * C], C, &r[n * C]);
    return r;
}

// max_i |a_i - b_i|: for a sum over rows, its spread (the CPU's result with the rows in order
// against reversed)
static double largest_difference(const Floats& a, const Floats& b) {
    double most = 0.0;
    for (size_t i = 0; i < a.size(); i++) most = std::max(most, (double)std::fabs(a[i] - b[i]));
    return most;
}

// The tolerance of a sum over every row (a query's or a gain's gradient), whose float result
// depends on the order of the sum: tol, with atol at least 4 x the spread
static Tolerance sum_tolerance(Tolerance tol, double spread) {
    return {std::max(tol.atol, 4.0 * spread), tol.rtol};
}

// The sources of a depth attention, variant or mixing case: source i of the list is tensor
// uses[i], so a tensor listed twice is one pointer passed twice, and its gradient must sum
// both uses. The gradients start from random contents on both sides (the backward adds into
// them).
struct DepthSources {
    std::vector<size_t> uses;
    std::vector<Floats> tensors, dtensors0;
    DepthSources(size_t N, size_t C, const std::vector<size_t>& uses_, Rng& rng) : uses(uses_) {
        size_t n_tensors = *std::max_element(uses.begin(), uses.end()) + 1;
        for (size_t t = 0; t < n_tensors; t++) {
            float scale = 0.5f + (float)t / (float)n_tensors;  // sources of different sizes
            tensors.push_back(rng.uniform_vector(N * C, -scale, scale));
            dtensors0.push_back(rng.uniform_vector(N * C, -1, 1));
        }
    }
    size_t n() const { return uses.size(); }
    // the same sources with the rows of every tensor in reverse order (the spread of a sum
    // over rows: the same math rounded in another order)
    DepthSources reversed(size_t N, size_t C) const {
        DepthSources r = *this;
        for (size_t t = 0; t < tensors.size(); t++) r.tensors[t] = reverse_rows(tensors[t], N, C);
        return r;
    }
    // the lists of pointers to the sources and to their gradients, on the host (gradients
    // starting as dtensors0, ending as the CPU's results) or in the device memory of d
    struct Lists {
        std::vector<const float*> src;
        std::vector<float*> dsrc;
        std::vector<Floats> dtensors;           // host: the gradient tensors
        std::vector<float*> device_dtensors;    // device: the gradient tensors
    };
    Lists host_lists() const {
        Lists lists;
        lists.dtensors = dtensors0;
        for (size_t t : uses) {
            lists.src.push_back(tensors[t].data());
            lists.dsrc.push_back(lists.dtensors[t].data());
        }
        return lists;
    }
    Lists device_lists(Device& d) const {
        Lists lists;
        std::vector<const float*> device_tensors;
        for (size_t t = 0; t < tensors.size(); t++) {
            device_tensors.push_back(d.upload(tensors[t]));
            lists.device_dtensors.push_back(d.upload(dtensors0[t]));
        }
        for (size_t t : uses) {
            lists.src.push_back(device_tensors[t]);
            lists.dsrc.push_back(lists.device_dtensors[t]);
        }
        return lists;
    }
};

// the source tensors' gradients (device) as outputs, and their check against the CPU's
void add_source_gradients(Outputs& result, const std::vector<float*>& d_dtensors, size_t n) {
    for (size_t t = 0; t < d_dtensors.size(); t++)
        result.push_back({"dsource tensor " + std::to_string(t), download(d_dtensors[t], n)});
}
void check_source_gradients(const Outputs& cuda, size_t first, const std::vector<Floats>& dtensors,
                            Tolerance tol) {
    for (size_t t = 0; t < dtensors.size(); t++) check(cuda[first + t], dtensors[t], tol);
}

// A version of the depth attention on the GPU: its forward and backward, with the arguments
// of depth_attention_forward_cuda and depth_attention_backward_cuda
struct DepthKernels {
    void (*forward)(float*, float*, float*, const float* const*, const float*, const float*,
                    size_t, size_t, size_t);
    void (*backward)(float* const*, float*, float*, const float*, const float*, const float*,
                     const float* const*, const float*, const float*, size_t, size_t, size_t);
};

// The kernels' forward and backward over the sources `uses` (DepthSources) of N rows of C
// against the CPU's (src/depth_attention.c), within tol. serial_sums: the kernels add each
// column's N x n_sources terms of dquery and dnorm_weight one after another in one float (as
// the CPU's naive version does), not in parts of a few rows
static void check_depth_attention(DepthKernels kernels, size_t N, size_t C,
                                  const std::vector<size_t>& uses, Tolerance tol,
                                  bool serial_sums) {
    Rng rng(7);
    DepthSources ds(N, C, uses, rng);
    size_t n_sources = ds.n();
    Floats query = rng.uniform_vector(C, -1, 1), norm_weight = rng.uniform_vector(C, 0.5, 1.5);
    Floats dout = rng.uniform_vector(N * C, -1, 1);
    Floats dquery0 = rng.uniform_vector(C, -1, 1), dnorm_weight0 = rng.uniform_vector(C, -1, 1);

    Floats out(N * C), alpha(N * n_sources), key_rstd(N * n_sources);
    Floats dquery = dquery0, dnorm_weight = dnorm_weight0;
    DepthSources::Lists host = ds.host_lists();
    depth_attention_forward(out.data(), alpha.data(), key_rstd.data(), host.src.data(),
                            query.data(), norm_weight.data(), n_sources, N, C);
    depth_attention_backward(host.dsrc.data(), dquery.data(), dnorm_weight.data(), dout.data(),
                             alpha.data(), key_rstd.data(), host.src.data(), query.data(),
                             norm_weight.data(), n_sources, N, C);

    Outputs cuda = run_cuda([&] {
        Device d;
        DepthSources::Lists dev = ds.device_lists(d);
        float *d_out = d.zeros(N * C), *d_alpha = d.zeros(N * n_sources);
        float *d_key_rstd = d.zeros(N * n_sources);
        float *d_query = d.upload(query), *d_norm_weight = d.upload(norm_weight);
        float *d_dquery = d.upload(dquery0), *d_dnorm_weight = d.upload(dnorm_weight0);
        kernels.forward(d_out, d_alpha, d_key_rstd, dev.src.data(), d_query, d_norm_weight,
                        n_sources, N, C);
        kernels.backward(dev.dsrc.data(), d_dquery, d_dnorm_weight, d.upload(dout), d_alpha,
                         d_key_rstd, dev.src.data(), d_query, d_norm_weight, n_sources, N, C);
        Outputs result{{"out", download(d_out, N * C)}, {"alpha", download(d_alpha, N * n_sources)},
                       {"key_rstd", download(d_key_rstd, N * n_sources)},
                       {"dquery", download(d_dquery, C)},
                       {"dnorm_weight", download(d_dnorm_weight, C)}};
        add_source_gradients(result, dev.device_dtensors, N * C);
        return result;
    });
    check(cuda[0], out, tol);
    check(cuda[1], alpha, tol);
    check(cuda[2], key_rstd, tol);
    // dquery and dnorm_weight are sums over all N*n_sources (row, source) terms, of either
    // sign: at the GPU size 17,408 terms of size ~1 summing to ~0.2, so the float result
    // depends on the order of the sum well above tol. Their tolerance is max(tol, 4 x spread),
    // the rule check_state uses: the spread is the largest difference between the CPU's
    // result and the CPU's result with the rows reversed (the same math rounded in another
    // order). Here (seed 7) the spread is 4.9e-5, the GPU's largest difference 1.24e-4 (H200).
    double spread = 0.0;
    if (N >= 1024) {
        DepthSources reversed = ds.reversed(N, C);  // every tensor's rows, and dout's
        Floats reversed_dout = reverse_rows(dout, N, C), reversed_out(N * C);
        Floats reversed_alpha(N * n_sources), reversed_rstd(N * n_sources);
        Floats dquery2 = dquery0, dnorm_weight2 = dnorm_weight0;
        DepthSources::Lists lists = reversed.host_lists();
        depth_attention_forward(reversed_out.data(), reversed_alpha.data(), reversed_rstd.data(),
                                lists.src.data(), query.data(), norm_weight.data(),
                                n_sources, N, C);
        depth_attention_backward(lists.dsrc.data(), dquery2.data(), dnorm_weight2.data(),
                                 reversed_dout.data(), reversed_alpha.data(), reversed_rstd.data(),
                                 lists.src.data(), query.data(), norm_weight.data(),
                                 n_sources, N, C);
        spread = std::max(largest_difference(dquery2, dquery),
                          largest_difference(dnorm_weight2, dnorm_weight));
    }
    // One float that takes every term in turn rounds more, the more terms (903 at N = 301, 3
    // sources): there the spread is also the CPU's naive result (summed that way) against
    // its tiled one
    if (serial_sums) {
        DepthSources::Lists lists = ds.host_lists();
        Floats out2(N * C), alpha2(N * n_sources), rstd2(N * n_sources);
        Floats dquery2 = dquery0, dnorm_weight2 = dnorm_weight0;
        depth_attention_forward_naive(out2.data(), alpha2.data(), rstd2.data(), lists.src.data(),
                                      query.data(), norm_weight.data(), n_sources, N, C);
        depth_attention_backward_naive(lists.dsrc.data(), dquery2.data(), dnorm_weight2.data(),
                                       dout.data(), alpha2.data(), rstd2.data(),
                                       lists.src.data(), query.data(), norm_weight.data(),
                                       n_sources, N, C);
        spread = std::max({spread, largest_difference(dquery2, dquery),
                           largest_difference(dnorm_weight2, dnorm_weight)});
    }
    CAPTURE(spread);
    check(cuda[3], dquery, sum_tolerance(tol, spread));
    check(cuda[4], dnorm_weight, sum_tolerance(tol, spread));
    check_source_gradients(cuda, 5, host.dtensors, tol);
    if (n_sources == 1) {
        compare_exact("dquery, one source", cuda[3].values.data(), dquery0.data(), C);
        compare_exact("dnorm_weight, one source", cuda[4].values.data(), dnorm_weight0.data(), C);
    }
}

TEST_CASE("depth attention forward and backward on the GPU match the CPU") {
    Tolerance tol{1e-5, 1e-5};  // the GPU sizes: sums of 1024 rows, 1e-4
    size_t N = 0, C = 0;
    std::vector<size_t> uses;  // source i is tensor uses[i] (DepthSources)
    SUBCASE("1 source (its query gets exactly zero gradient)") { N = 3; C = 8; uses = {0}; }
    SUBCASE("2 sources, N=5 C=7") { N = 5; C = 7; uses = {0, 1}; }
    SUBCASE("5 sources, N=9 C=70") { N = 9; C = 70; uses = {0, 1, 2, 3, 4}; }
    SUBCASE("37 sources, more than a warp") {
        N = 3; C = 33;
        for (size_t i = 0; i < 37; i++) uses.push_back(i);
    }
    SUBCASE("6 sources, the first passed again as the last: its gradient sums both uses") {
        N = 9; C = 70; uses = {0, 1, 2, 3, 4, 0};
    }
    SUBCASE("3 sources, N=301: dw and dg summed over 76 parts of 4 rows, 2-3 per group") {
        N = 301; C = 12; uses = {0, 1, 2};
    }
    SUBCASE("2 sources, N=1100: 275 parts, 8-9 per group (two chunks of parts)") {
        N = 1100; C = 12; uses = {0, 1};
    }
    SUBCASE("9 sources, N=5 C=601: a thread's columns in 3 or more groups, the last partial") {
        N = 5; C = 601; uses = {0, 1, 2, 3, 4, 5, 6, 7, 8};
    }
    if (ON_GPU) {
        SUBCASE("GPU: 17 sources, N=1024 C=256") {
            N = 1024; C = 256; tol = {1e-4, 1e-4};
            for (size_t i = 0; i < 17; i++) uses.push_back(i);
        }
    }
    check_depth_attention({depth_attention_forward_cuda, depth_attention_backward_cuda}, N, C,
                          uses, tol, false);
}

// The naive, one-thread-per-row version (cuda/depth_attention.cu's first section), which
// bench_depth times beside the kernels the model runs: the same tolerances, as the same sums
// in another order (each row's in one thread, column by column), but for the weights' sums
// over every row, which one thread per column adds in one float (serial_sums).
TEST_CASE("the naive one-thread-per-row depth attention on the GPU matches the CPU") {
    Tolerance tol{1e-5, 1e-5};  // the GPU sizes: sums of 1024 rows, 1e-4
    size_t N = 0, C = 0;
    std::vector<size_t> uses;  // source i is tensor uses[i] (DepthSources)
    SUBCASE("1 source (its query gets exactly zero gradient)") { N = 3; C = 8; uses = {0}; }
    SUBCASE("5 sources, N=9 C=70") { N = 9; C = 70; uses = {0, 1, 2, 3, 4}; }
    SUBCASE("37 sources, more than a warp") {
        N = 3; C = 33;
        for (size_t i = 0; i < 37; i++) uses.push_back(i);
    }
    SUBCASE("6 sources, the first passed again as the last: its gradient sums both uses") {
        N = 9; C = 70; uses = {0, 1, 2, 3, 4, 0};
    }
    SUBCASE("3 sources, N=301 C=130: rows in three blocks, columns in two") {
        N = 301; C = 130; uses = {0, 1, 2};
    }
    if (ON_GPU) {
        SUBCASE("GPU: 17 sources, N=1024 C=256") {
            N = 1024; C = 256; tol = {1e-4, 1e-4};
            for (size_t i = 0; i < 17; i++) uses.push_back(i);
        }
    }
    check_depth_attention({depth_attention_forward_naive_cuda, depth_attention_backward_naive_cuda},
                          N, C, uses, tol, true);
}

// The depth attention with the RMSNorm of its output, fused into its kernels on the GPU, against
// the CPU's definition: depth_attention_forward, rmsnorm_forward, then rmsnorm_backward into
// a zeroed dout and depth_attention_backward from it.
namespace {
struct FusedResult {
    Floats xn, rstd, out, alpha, key_rstd, dout, dquery, dnorm_weight, dweight;
    std::vector<Floats> dtensors;
};
// the CPU's results for ds and dxn; gain: the norm's weight (NULL: none, and no dweight)
FusedResult fused_on_cpu(const DepthSources& ds, Floats& query, Floats& norm_weight,
                         const float* gain, const Floats& dxn, const Floats& dquery0,
                         const Floats& dnorm_weight0, const Floats& dweight0, size_t N, size_t C) {
    size_t n = ds.n();
    FusedResult r{Floats(N * C), Floats(N), Floats(N * C), Floats(N * n), Floats(N * n),
                  Floats(N * C, 12345.0f), dquery0, dnorm_weight0, dweight0, {}};
    DepthSources::Lists host = ds.host_lists();
    DepthSaved saved = {r.alpha.data(), r.key_rstd.data(), nullptr, nullptr, nullptr};
    DepthParams params = {query.data(), norm_weight.data(), nullptr, nullptr};
    DepthParams grads = {r.dquery.data(), r.dnorm_weight.data(), nullptr, nullptr};
    depth_attention_rmsnorm_forward(r.xn.data(), r.rstd.data(), r.out.data(), saved,
                                    host.src.data(), params, gain, n, N, C);
    depth_attention_rmsnorm_backward(host.dsrc.data(), grads,
                                     gain != nullptr ? r.dweight.data() : nullptr,
                                     r.dout.data(), dxn.data(), r.out.data(), r.rstd.data(),
                                     gain, saved, host.src.data(), params, n, N, C);
    r.dtensors = host.dtensors;
    return r;
}
}  // namespace

TEST_CASE("depth attention with its RMSNorm, fused into its kernels on the GPU, matches the CPU") {
    Tolerance tol{1e-5, 1e-5};  // the GPU sizes: sums of 1024 rows, 1e-4
    size_t N = 0, C = 0;
    std::vector<size_t> uses;  // source i is tensor uses[i] (DepthSources)
    SUBCASE("1 source, N=3 C=8") { N = 3; C = 8; uses = {0}; }
    SUBCASE("5 sources, N=9 C=70: some threads with two columns, some with one") {
        N = 9; C = 70; uses = {0, 1, 2, 3, 4};
    }
    SUBCASE("37 sources, N=3 C=200") {
        N = 3; C = 200;
        for (size_t i = 0; i < 37; i++) uses.push_back(i);
    }
    SUBCASE("6 sources, the first passed again as the last: its gradient sums both uses") {
        N = 9; C = 70; uses = {0, 1, 2, 3, 4, 0};
    }
    SUBCASE("3 sources, N=301: the gains' gradients summed over 76 parts of 4 rows") {
        N = 301; C = 12; uses = {0, 1, 2};
    }
    SUBCASE("2 sources, N=1100: the gains' gradients summed over 275 parts, 8-9 per group") {
        N = 1100; C = 12; uses = {0, 1};
    }
    SUBCASE("9 sources, N=5 C=601: a thread's columns in 3 or more groups, the last partial") {
        N = 5; C = 601; uses = {0, 1, 2, 3, 4, 5, 6, 7, 8};
    }
    if (ON_GPU) {
        SUBCASE("GPU: 17 sources, N=1024 C=256") {
            N = 1024; C = 256; tol = {1e-4, 1e-4};
            for (size_t i = 0; i < 17; i++) uses.push_back(i);
        }
    }
    Rng rng(11);
    DepthSources ds(N, C, uses, rng);
    size_t n_sources = ds.n();
    Floats query = rng.uniform_vector(C, -1, 1), norm_weight = rng.uniform_vector(C, 0.5, 1.5);
    Floats weight = rng.uniform_vector(C, 0.5, 1.5), dxn = rng.uniform_vector(N * C, -1, 1);
    Floats dquery0 = rng.uniform_vector(C, -1, 1), dnorm_weight0 = rng.uniform_vector(C, -1, 1);
    Floats dweight0 = rng.uniform_vector(C, -1, 1);
    for (bool gain : {true, false}) {  // without: the norm's weight and its gradient NULL
        CAPTURE(gain);
        const float* cpu_gain = gain ? weight.data() : nullptr;
        FusedResult cpu = fused_on_cpu(ds, query, norm_weight, cpu_gain, dxn, dquery0,
                                       dnorm_weight0, dweight0, N, C);
        Outputs cuda = run_cuda([&] {
            Device d;
            DepthSources::Lists dev = ds.device_lists(d);
            float *d_xn = d.zeros(N * C), *d_rstd = d.zeros(N), *d_out = d.zeros(N * C);
            float *d_alpha = d.zeros(N * n_sources), *d_key_rstd = d.zeros(N * n_sources);
            float* d_dout = d.upload(Floats(N * C, 12345.0f));  // overwritten
            float *d_query = d.upload(query), *d_norm_weight = d.upload(norm_weight);
            float* d_weight = gain ? d.upload(weight) : nullptr;
            float *d_dquery = d.upload(dquery0), *d_dnorm_weight = d.upload(dnorm_weight0);
            float* d_dweight = d.upload(dweight0);
            DepthSaved saved = {d_alpha, d_key_rstd, nullptr, nullptr, nullptr};
            DepthParams params = {d_query, d_norm_weight, nullptr, nullptr};
            DepthParams grads = {d_dquery, d_dnorm_weight, nullptr, nullptr};
            depth_attention_rmsnorm_forward_cuda(d_xn, d_rstd, d_out, saved, dev.src.data(),
                                                 params, d_weight, n_sources, N, C);
            depth_attention_rmsnorm_backward_cuda(dev.dsrc.data(), grads,
                                                  gain ? d_dweight : nullptr, d_dout,
                                                  d.upload(dxn), d_out, d_rstd, d_weight, saved,
                                                  dev.src.data(), params, n_sources, N, C);
            Outputs result{{"xn", download(d_xn, N * C)}, {"rstd", download(d_rstd, N)},
                           {"out", download(d_out, N * C)},
                           {"alpha", download(d_alpha, N * n_sources)},
                           {"key_rstd", download(d_key_rstd, N * n_sources)},
                           {"dout", download(d_dout, N * C)}, {"dquery", download(d_dquery, C)},
                           {"dnorm_weight", download(d_dnorm_weight, C)},
                           {"dweight", download(d_dweight, C)}};
            add_source_gradients(result, dev.device_dtensors, N * C);
            return result;
        });
        check(cuda[0], cpu.xn, tol);
        check(cuda[1], cpu.rstd, tol);
        check(cuda[2], cpu.out, tol);
        check(cuda[3], cpu.alpha, tol);
        check(cuda[4], cpu.key_rstd, tol);
        check(cuda[5], cpu.dout, tol);
        // the sums over all rows: max(tol, 4 x the spread of the CPU's own result between
        // the rows in order and reversed), as in the depth attention's test above
        Tolerance reduction_tol = tol;
        if (N >= 1024) {
            FusedResult other = fused_on_cpu(ds.reversed(N, C), query, norm_weight, cpu_gain,
                                             reverse_rows(dxn, N, C), dquery0, dnorm_weight0,
                                             dweight0, N, C);
            double spread = std::max({largest_difference(other.dquery, cpu.dquery),
                                      largest_difference(other.dnorm_weight, cpu.dnorm_weight),
                                      largest_difference(other.dweight, cpu.dweight)});
            CAPTURE(spread);
            reduction_tol = sum_tolerance(tol, spread);
        }
        check(cuda[6], cpu.dquery, reduction_tol);
        check(cuda[7], cpu.dnorm_weight, reduction_tol);
        if (gain) check(cuda[8], cpu.dweight, reduction_tol);
        else compare_exact("dweight, no gain: untouched", cuda[8].values.data(), dweight0.data(), C);
        check_source_gradients(cuda, 9, cpu.dtensors, tol);
    }
}

// ---- depth variants ----------------------------------------------------------------------
TEST_CASE("depth attention variants on the GPU match the CPU, every combination of switches") {
    Tolerance tol{1e-5, 1e-5};  // the GPU sizes: sums of 1024 rows, 1e-4
    size_t N = 0, C = 0;
    std::vector<size_t> uses, head_counts = {1, 2, 4};
    SUBCASE("1 source") { N = 3; C = 8; uses = {0}; }
    SUBCASE("3 sources, the first tensor passed twice") { N = 5; C = 12; uses = {0, 1, 0}; }
    SUBCASE("4 sources, N=37 C=72: three tiles of rows, a head over a warp") {
        N = 37; C = 72; uses = {0, 1, 2, 3};
    }
    SUBCASE("37 sources: more (source, head) pairs than warps") {
        N = 3; C = 8;
        for (size_t i = 0; i < 37; i++) uses.push_back(i);
    }
    SUBCASE("5 sources, N=9 C=300: a thread's columns in two groups, a block's rows summed twice") {
        N = 9; C = 300; uses = {0, 1, 2, 3, 4};
    }
    if (ON_GPU) {  // the bench model's shapes (its 16-head row), and odd ones
        SUBCASE("GPU: 17 sources, N=1024 C=256, up to 16 heads") {
            N = 1024; C = 256; tol = {1e-4, 1e-4}; head_counts = {1, 4, 16};
            for (size_t i = 0; i < 17; i++) uses.push_back(i);
        }
        SUBCASE("GPU: 5 sources, N=1021 C=260, odd sizes") {
            N = 1021; C = 260; tol = {1e-4, 1e-4}; uses = {0, 1, 2, 3, 4};
        }
    }
    CAPTURE(N);
    CAPTURE(C);
    CAPTURE(uses.size());
    for (size_t heads : head_counts)
    for (int sigmoid = 0; sigmoid < 2; sigmoid++)
    for (int key_norm = 0; key_norm < 2; key_norm++)
    for (int rows = 0; rows < 2; rows++) {
        CAPTURE(heads);
        CAPTURE(sigmoid);
        CAPTURE(key_norm);
        CAPTURE(rows);
        Rng rng(11);
        DepthSources ds(N, C, uses, rng);
        size_t n = ds.n(), NSK = N * n * heads;
        Floats query = rng.uniform_vector(C, -1, 1), token_query = rng.uniform_vector(N * C, -0.7f, 0.7f);
        Floats norm_weight = rng.uniform_vector(C, 0.5, 1.5), dout = rng.uniform_vector(N * C, -1, 1);
        Floats dquery0 = rng.uniform_vector(C, -1, 1), dtoken_query0 = rng.uniform_vector(N * C, -1, 1);
        Floats dnorm_weight0 = rng.uniform_vector(C, -1, 1);
        // what out, alpha and key_rstd hold before: overwritten
        Floats stale_out = rng.uniform_vector(N * C, -1, 1), stale_alpha = rng.uniform_vector(NSK, -1, 1);

        // the CPU's forward and backward over sources s with row queries rows_in and output
        // gradient dout_in; out, alpha, key_rstd and the gradients land in the arguments
        const float* cpu_gain = key_norm ? norm_weight.data() : nullptr;
        auto on_cpu = [&](const DepthSources::Lists& s, const Floats& rows_in, const Floats& dout_in,
                          Floats& out_, Floats& alpha_, Floats& rstd_, Floats& dquery_,
                          Floats& drows_, Floats& dgain_) {
            const float* cpu_rows = rows ? rows_in.data() : nullptr;
            depth_attention_variant_forward(out_.data(), alpha_.data(), rstd_.data(), s.src.data(),
                                            query.data(), cpu_rows, cpu_gain, n, N, C, heads,
                                            sigmoid);
            depth_attention_variant_backward(s.dsrc.data(), dquery_.data(),
                                             rows ? drows_.data() : nullptr,
                                             key_norm ? dgain_.data() : nullptr, dout_in.data(),
                                             alpha_.data(), rstd_.data(), s.src.data(),
                                             query.data(), cpu_rows, cpu_gain, n, N, C, heads,
                                             sigmoid);
        };
        Floats out(N * C), alpha(NSK), key_rstd(NSK);
        Floats dquery = dquery0, dtoken_query = dtoken_query0, dnorm_weight = dnorm_weight0;
        DepthSources::Lists host = ds.host_lists();
        on_cpu(host, token_query, dout, out, alpha, key_rstd, dquery, dtoken_query, dnorm_weight);

        Outputs cuda = run_cuda([&] {
            Device d;
            DepthSources::Lists dev = ds.device_lists(d);
            float *d_out = d.upload(stale_out), *d_alpha = d.upload(stale_alpha);
            float* d_key_rstd = d.upload(stale_alpha);
            float *d_query = d.upload(query), *d_dquery = d.upload(dquery0);
            float* d_rows = rows ? d.upload(token_query) : nullptr;
            float* d_drows = rows ? d.upload(dtoken_query0) : nullptr;
            float* d_gain = key_norm ? d.upload(norm_weight) : nullptr;
            float* d_dgain = key_norm ? d.upload(dnorm_weight0) : nullptr;
            depth_attention_variant_forward_cuda(d_out, d_alpha, d_key_rstd, dev.src.data(),
                                                 d_query, d_rows, d_gain, n, N, C, heads, sigmoid);
            depth_attention_variant_backward_cuda(dev.dsrc.data(), d_dquery, d_drows, d_dgain,
                                                  d.upload(dout), d_alpha, d_key_rstd,
                                                  dev.src.data(), d_query, d_rows, d_gain, n, N, C,
                                                  heads, sigmoid);
            Outputs result{{"out", download(d_out, N * C)}, {"alpha", download(d_alpha, NSK)},
                           {"key_rstd", download(d_key_rstd, NSK)},
                           {"dquery", download(d_dquery, C)},
                           {"dtoken_query", rows ? download(d_drows, N * C) : dtoken_query0},
                           {"dnorm_weight", key_norm ? download(d_dgain, C) : dnorm_weight0}};
            add_source_gradients(result, dev.device_dtensors, N * C);
            return result;
        });
        check(cuda[0], out, tol);
        check(cuda[1], alpha, tol);
        check(cuda[2], key_rstd, tol);
        // dquery and dnorm_weight sum over all N*n (row, source) terms: at the GPU sizes
        // sum_tolerance, the rule of the depth attention's test above. Without it the H200
        // failed one element of 256 (17 sources, 1 head, key norm, row queries: dquery 0.51224
        // on the CPU, 0.51240 on the GPU; that case's spread is 4.3e-5, so 4 x spread = 1.7e-4)
        Tolerance reduction_tol = tol;
        if (N >= 1024) {
            Floats out2(N * C), alpha2(NSK), rstd2(NSK);
            Floats dquery2 = dquery0, drows2 = dtoken_query0, dnorm_weight2 = dnorm_weight0;
            on_cpu(ds.reversed(N, C).host_lists(), reverse_rows(token_query, N, C),
                   reverse_rows(dout, N, C), out2, alpha2, rstd2, dquery2, drows2, dnorm_weight2);
            double spread = std::max(largest_difference(dquery2, dquery),
                                     largest_difference(dnorm_weight2, dnorm_weight));
            CAPTURE(spread);
            reduction_tol = sum_tolerance(tol, spread);
        }
        check(cuda[3], dquery, reduction_tol);
        check(cuda[4], dtoken_query, tol);
        check(cuda[5], dnorm_weight, reduction_tol);
        check_source_gradients(cuda, 6, host.dtensors, tol);
        if (n == 1 && !sigmoid) {  // one softmax weight, exactly 1: no gradient to the query, gain
            compare_exact("alpha, one source", cuda[1].values.data(), Floats(NSK, 1.0f).data(), NSK);
            compare_exact("dquery, one source", cuda[3].values.data(), dquery0.data(), C);
            compare_exact("dtoken_query, one source", cuda[4].values.data(), dtoken_query0.data(), N * C);
            compare_exact("dnorm_weight, one source", cuda[5].values.data(), dnorm_weight0.data(), C);
        }
    }
}

TEST_CASE("static mixing and DenseFormer on the GPU match the CPU") {
    Tolerance tol{1e-5, 1e-5};  // the GPU sizes: sums of 1024 rows, 1e-4
    size_t N = 0, C = 0;
    std::vector<size_t> uses;
    SUBCASE("1 source") { N = 3; C = 8; uses = {0}; }
    SUBCASE("4 sources, the second tensor passed twice") { N = 5; C = 7; uses = {0, 1, 2, 1}; }
    SUBCASE("3 sources, N=70 C=20: five tiles of rows, the forward in six blocks") {
        N = 70; C = 20; uses = {0, 1, 2};
    }
    SUBCASE("37 sources, more than the warps of a block") {
        N = 3; C = 33;
        for (size_t i = 0; i < 37; i++) uses.push_back(i);
    }
    if (ON_GPU) {
        SUBCASE("GPU: 17 sources, N=1024 C=256") {
            N = 1024; C = 256; tol = {1e-4, 1e-4};
            for (size_t i = 0; i < 17; i++) uses.push_back(i);
        }
    }
    CAPTURE(N);
    CAPTURE(uses.size());
    for (int normalise = 0; normalise < 2; normalise++) {
        CAPTURE(normalise);
        Rng rng(12);
        DepthSources ds(N, C, uses, rng);
        size_t n = ds.n();
        Floats coefficients = rng.uniform_vector(n, -1.5f, 1.5f), dout = rng.uniform_vector(N * C, -1, 1);
        Floats dcoefficients0 = rng.uniform_vector(n, -1, 1);
        // what out and weights hold before: overwritten
        Floats stale_out = rng.uniform_vector(N * C, -1, 1), stale_weights = rng.uniform_vector(n, -1, 1);

        Floats out(N * C), weights(n), dcoefficients = dcoefficients0;
        DepthSources::Lists host = ds.host_lists();
        depth_mixing_forward(out.data(), weights.data(), host.src.data(), coefficients.data(), n,
                             N, C, normalise);
        depth_mixing_backward(host.dsrc.data(), dcoefficients.data(), dout.data(), weights.data(),
                              host.src.data(), n, N, C, normalise);

        Outputs cuda = run_cuda([&] {
            Device d;
            DepthSources::Lists dev = ds.device_lists(d);
            float *d_out = d.upload(stale_out), *d_weights = d.upload(stale_weights);
            float* d_dcoefficients = d.upload(dcoefficients0);
            depth_mixing_forward_cuda(d_out, d_weights, dev.src.data(), d.upload(coefficients), n,
                                      N, C, normalise);
            depth_mixing_backward_cuda(dev.dsrc.data(), d_dcoefficients, d.upload(dout), d_weights,
                                       dev.src.data(), n, N, C, normalise);
            Outputs result{{"out", download(d_out, N * C)}, {"weights", download(d_weights, n)},
                           {"dcoefficients", download(d_dcoefficients, n)}};
            add_source_gradients(result, dev.device_dtensors, N * C);
            return result;
        });
        check(cuda[0], out, tol);
        check(cuda[1], weights, tol);
        check(cuda[2], dcoefficients, tol);
        check_source_gradients(cuda, 3, host.dtensors, tol);
        if (n == 1 && normalise)  // softmax of one logit: weight 1, no gradient
            compare_exact("dcoefficients, one source", cuda[2].values.data(), dcoefficients0.data(), 1);
    }
}

TEST_CASE("DenseFormer on the GPU at scalars 1 is the sum of the sources in order, exactly") {
    const size_t N = 5, C = 9;
    Rng rng(13);
    DepthSources ds(N, C, {0, 1, 2, 3}, rng);
    Floats running(N * C, 0.0f), ones(ds.n(), 1.0f);
    for (size_t t : ds.uses)
        for (size_t j = 0; j < N * C; j++) running[j] += ds.tensors[t][j];
    Outputs cuda = run_cuda([&] {
        Device d;
        DepthSources::Lists dev = ds.device_lists(d);
        float *d_out = d.zeros(N * C), *d_weights = d.zeros(ds.n());
        depth_mixing_forward_cuda(d_out, d_weights, dev.src.data(), d.upload(ones), ds.n(), N, C, 0);
        return Outputs{{"out", download(d_out, N * C)}};
    });
    compare_exact("DenseFormer at ones", cuda[0].values.data(), running.data(), N * C);
}

