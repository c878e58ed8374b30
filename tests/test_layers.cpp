// test_layers.cpp — every layer of layers.h but the causal attention (test_attention.cpp):
// each backward against central finite differences, each forward against a double-precision
// reference of SPEC.md, the accumulate (+=) contract (the attention's too), and the facts the
// model relies on (zero-query averaging, exact single-source identity, overflow safety, RoPE
// at t = 0, AdamW's two first steps).
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "gradcheck.h"
#include "layers.h"
#include "util.h"  // expf_vectorizable

using gradcheck::check_gradient;
using gradcheck::compare_exact;
using gradcheck::compare_within;
using gradcheck::Rng;
using gradcheck::Tolerance;
using gradcheck::weighted_sum;

typedef std::vector<float> Vec;

// ---- steps and tolerances ----------------------------------------------------------------
// A gradient check accepts |fd - analytic| <= atol + rtol * |fd|, fd from steps of STEP and
// 2 STEP (gradcheck.h; fourth-order, so steps can be large against float rounding). Inputs
// are O(1).
// Beside each tolerance: the largest error of the correct layers over all the subcases, as
// printed with GRADCHECK_VERBOSE=1. Tolerances sit 1.8-4.2 times above it; dropping any one term
// of a backward pass makes errors of 1e-2 or more.
// Linear maps have no truncation error at all: a large step leaves only float rounding.
static const float LINEAR_STEP = 0.25f;
static const Tolerance EMBEDDING_GRAD_TOL = {5e-7, 1e-6};  // max error 1.2e-7
static const Tolerance ROPE_GRAD_TOL = {5e-7, 1e-6};       // max error 2.5e-7
static const Tolerance LINEAR_GRAD_TOL = {1.5e-5, 1e-6};   // max error 5.8e-6
static const float RMSNORM_STEP = 2e-2f;
static const Tolerance RMSNORM_GRAD_TOL = {5e-5, 1e-5};    // max error 1.8e-5
static const float SWIGLU_STEP = 5e-2f;
static const Tolerance SWIGLU_GRAD_TOL = {2e-5, 1e-5};     // max error 7.9e-6
static const float DEPTH_STEP = 2e-2f;
static const Tolerance DEPTH_GRAD_TOL = {5e-5, 1e-5};      // max error 2.7e-5 (naive, dnorm_weight)
// the depth attention followed by an RMSNorm of its output: a norm of a weighted sum bends
// more than either alone, and sums over N = 7 rows (max error 3.2e-5)
static const Tolerance FUSED_GRAD_TOL = {1e-4, 1e-5};
static const float CROSSENTROPY_STEP = 5e-2f;
static const Tolerance CROSSENTROPY_GRAD_TOL = {6e-6, 1e-5};  // max error 2.0e-6
// Forward passes against a double-precision reference: a few float roundings of the result
// (max error 5.7e-7 on outputs up to 12); a dot product of IN terms can cancel to near zero,
// so linear's error scales with its terms (max 8e-7).
static const Tolerance FORWARD_TOL = {1e-6, 2e-6};
static const Tolerance LINEAR_FORWARD_TOL = {4e-6, 1e-6};
// A backward that adds its terms one by one into the buffer rounds differently on top of a
// non-zero buffer (max error 4.8e-6: linear's dinp, 70 terms of size 1); overwriting instead
// of adding errs by the buffer's contents, O(1).
static const Tolerance ACCUMULATE_TOL = {1e-5, 1e-6};

// helpers live in an anonymous namespace: other test files link into the same binary
namespace {

Vec nan_vector(size_t n) { return Vec(n, std::numeric_limits<float>::quiet_NaN()); }

// ---- double-precision references of SPEC.md ----------------------------------------------

static void rmsnorm_reference(std::vector<double>& out, std::vector<double>& rstd, const Vec& inp,
                              const Vec& weight, size_t N, size_t C) {
    out.assign(N * C, 0.0);
    rstd.assign(N, 0.0);
    for (size_t n = 0; n < N; n++) {
        double mean_square = 0.0;
        for (size_t c = 0; c < C; c++) mean_square += (double)inp[n * C + c] * inp[n * C + c];
        rstd[n] = 1.0 / std::sqrt(mean_square / C + (double)RMSNORM_EPS);
        for (size_t c = 0; c < C; c++) out[n * C + c] = weight[c] * inp[n * C + c] * rstd[n];
    }
}

static void rope_reference(std::vector<double>& out, const Vec& inp, size_t B, size_t T,
                           size_t n_heads, size_t hs) {
    out.assign(inp.size(), 0.0);
    for (size_t b = 0; b < B; b++)
        for (size_t t = 0; t < T; t++)
            for (size_t h = 0; h < n_heads; h++)
                for (size_t j = 0; j < hs / 2; j++) {
                    size_t i = ((b * T + t) * n_heads + h) * hs + 2 * j;
                    double theta = t * std::pow(ROPE_BASE, -2.0 * j / hs);
                    double a = inp[i], c = inp[i + 1];
                    out[i] = a * std::cos(theta) - c * std::sin(theta);
                    out[i + 1] = a * std::sin(theta) + c * std::cos(theta);
                }
}

// k_i = rmsnorm(V_i; g), s_i = w . k_i, alpha = softmax_i(s), out = sum_i alpha_i V_i
static void depth_attention_reference(std::vector<double>& out, std::vector<double>& alpha,
                                      std::vector<double>& key_rstd,
                                      const std::vector<const float*>& sources, const Vec& query,
                                      const Vec& norm_weight, size_t N, size_t C) {
    size_t n_sources = sources.size();
    out.assign(N * C, 0.0);
    alpha.assign(N * n_sources, 0.0);
    key_rstd.assign(N * n_sources, 0.0);
    for (size_t n = 0; n < N; n++) {
        std::vector<double> scores(n_sources);
        double max_score = -INFINITY, sum = 0.0;
        for (size_t i = 0; i < n_sources; i++) {
            const float* x = sources[i] + n * C;
            double mean_square = 0.0, score = 0.0;
            for (size_t c = 0; c < C; c++) mean_square += (double)x[c] * x[c];
            double rstd = 1.0 / std::sqrt(mean_square / C + (double)RMSNORM_EPS);
            for (size_t c = 0; c < C; c++) score += (double)query[c] * norm_weight[c] * x[c] * rstd;
            key_rstd[n * n_sources + i] = rstd;
            scores[i] = score;
            max_score = std::max(max_score, score);
        }
        for (size_t i = 0; i < n_sources; i++) sum += (scores[i] = std::exp(scores[i] - max_score));
        for (size_t i = 0; i < n_sources; i++) {
            alpha[n * n_sources + i] = scores[i] / sum;
            for (size_t c = 0; c < C; c++) out[n * C + c] += scores[i] / sum * sources[i][n * C + c];
        }
    }
}

// losses of the rows whose target is not -1 (others 0), probs of those rows, and their count
static size_t crossentropy_reference(std::vector<double>& losses, std::vector<double>& probs,
                                     const Vec& logits, const std::vector<int>& targets, size_t V) {
    size_t N = targets.size(), count = 0;
    losses.assign(N, 0.0);
    probs.assign(N * V, 0.0);
    for (size_t n = 0; n < N; n++) {
        const float* row = &logits[n * V];
        double max_logit = *std::max_element(row, row + V), sum = 0.0;
        for (size_t i = 0; i < V; i++) sum += std::exp((double)row[i] - max_logit);
        for (size_t i = 0; i < V; i++) probs[n * V + i] = std::exp((double)row[i] - max_logit) / sum;
        if (targets[n] == -1) continue;
        losses[n] = max_logit + std::log(sum) - row[targets[n]];
        count++;
    }
    return count;
}

}  // namespace

// ---- backward passes against finite differences ------------------------------------------

TEST_CASE("embedding backward matches finite differences, with repeated tokens") {
    size_t V = 0, C = 0;
    std::vector<int> tokens;
    SUBCASE("V=5 C=3") { V = 5; C = 3; tokens = {1, 3, 1, 1, 0, 3}; }
    SUBCASE("V=7 C=8, one token everywhere") { V = 7; C = 8; tokens = {4, 4, 4, 4, 4}; }
    SUBCASE("V=11 C=17") { V = 11; C = 17; tokens = {10, 0, 10, 5, 2, 5, 5, 0, 9}; }
    size_t N = tokens.size();
    Rng rng(101);
    Vec wte = rng.uniform_vector(V * C, -1, 1), R = rng.uniform_vector(N * C, -1, 1), out(N * C);
    Vec dwte(V * C, 0.0f);
    embedding_backward(dwte.data(), R.data(), tokens.data(), N, C);
    auto loss = [&] {
        embedding_forward(out.data(), tokens.data(), wte.data(), N, C);
        return weighted_sum(R.data(), out.data(), N * C);
    };
    check_gradient("wte", wte.data(), dwte.data(), V * C, loss, LINEAR_STEP, EMBEDDING_GRAD_TOL);
}

TEST_CASE("rmsnorm backward matches finite differences, with a gain and without (NULL)") {
    size_t N = 0, C = 0;
    SUBCASE("N=1 C=4") { N = 1; C = 4; }
    SUBCASE("N=3 C=8") { N = 3; C = 8; }
    SUBCASE("N=4 C=33") { N = 4; C = 33; }
    CAPTURE(N);
    CAPTURE(C);
    Rng rng(102);
    Vec inp = rng.uniform_vector(N * C, -1, 1), weight = rng.signed_vector(C, 0.5f, 1.5f);
    Vec R = rng.uniform_vector(N * C, -1, 1), out(N * C), rstd(N);
    // without a gain (the input-dependent depth query's norm): weight and dweight NULL
    for (bool gain : {true, false}) {
        CAPTURE(gain);
        const float* w = gain ? weight.data() : nullptr;
        Vec dinp(N * C, 0.0f), dweight(C, 0.0f);
        rmsnorm_forward(out.data(), rstd.data(), inp.data(), w, N, C);
        rmsnorm_backward(dinp.data(), gain ? dweight.data() : nullptr, R.data(), inp.data(), w,
                         rstd.data(), N, C);
        auto loss = [&] {
            rmsnorm_forward(out.data(), rstd.data(), inp.data(), w, N, C);
            return weighted_sum(R.data(), out.data(), N * C);
        };
        check_gradient("inp", inp.data(), dinp.data(), N * C, loss, RMSNORM_STEP, RMSNORM_GRAD_TOL);
        if (gain)
            check_gradient("weight", weight.data(), dweight.data(), C, loss, RMSNORM_STEP,
                           RMSNORM_GRAD_TOL);
    }
}

TEST_CASE("linear backward matches finite differences, tiled and naive, on sizes around the register tile") {
    size_t N = 0, IN = 0, OUT = 0;
    SUBCASE("N=1 IN=1 OUT=1") { N = 1; IN = 1; OUT = 1; }
    SUBCASE("N=5 IN=7 OUT=3") { N = 5; IN = 7; OUT = 3; }
    // whole register tiles (6x16, or 12x32 with AVX-512), then remainders in every dimension
    SUBCASE("N=12 IN=32 OUT=32, whole tiles") { N = 12; IN = 32; OUT = 32; }
    SUBCASE("N=9 IN=33 OUT=70, tiles plus remainders") { N = 9; IN = 33; OUT = 70; }
    CAPTURE(N);
    CAPTURE(IN);
    CAPTURE(OUT);
    struct Version {
        const char* name;
        void (*forward)(float*, const float*, const float*, size_t, size_t, size_t);
        void (*backward)(float*, float*, const float*, const float*, const float*, size_t, size_t,
                         size_t);
    };
    for (Version v : {Version{"tiled", linear_forward, linear_backward},
                      Version{"naive", linear_forward_naive, linear_backward_naive}}) {
        CAPTURE(v.name);
        Rng rng(103);
        Vec inp = rng.uniform_vector(N * IN, -1, 1), weight = rng.uniform_vector(OUT * IN, -1, 1);
        Vec R = rng.uniform_vector(N * OUT, -1, 1), out(N * OUT);
        Vec dinp(N * IN, 0.0f), dweight(OUT * IN, 0.0f);
        v.backward(dinp.data(), dweight.data(), R.data(), inp.data(), weight.data(), N, IN, OUT);
        auto loss = [&] {
            v.forward(out.data(), inp.data(), weight.data(), N, IN, OUT);
            return weighted_sum(R.data(), out.data(), N * OUT);
        };
        check_gradient("inp", inp.data(), dinp.data(), N * IN, loss, LINEAR_STEP, LINEAR_GRAD_TOL);
        check_gradient("weight", weight.data(), dweight.data(), OUT * IN, loss, LINEAR_STEP, LINEAR_GRAD_TOL);
    }
}

TEST_CASE("the tiled linear equals the naive three loops bit for bit, forward and backward") {
    size_t N = 0, IN = 0, OUT = 0;
    SUBCASE("N=1 IN=1 OUT=1") { N = 1; IN = 1; OUT = 1; }
    SUBCASE("N=6 IN=16 OUT=16, one whole tile") { N = 6; IN = 16; OUT = 16; }
    SUBCASE("N=13 IN=35 OUT=50, remainders everywhere") { N = 13; IN = 35; OUT = 50; }
    SUBCASE("N=64 IN=48 OUT=176, the default model's MLP") { N = 64; IN = 48; OUT = 176; }
    // past linear.c's blocks (KC = 256 steps of k, NC = 512 columns): the forward's k = 600
    // and m = 1100, the backward's dinp k = 1100, m = 600 and dweight k = N = 530, so every
    // product walks several blocks of k, or of columns, or both
    SUBCASE("N=530 IN=600 OUT=1100, several blocks of k and of columns") { N = 530; IN = 600; OUT = 1100; }
    CAPTURE(N);
    CAPTURE(IN);
    CAPTURE(OUT);
    Rng rng(109);
    Vec inp = rng.uniform_vector(N * IN, -1, 1), weight = rng.uniform_vector(OUT * IN, -1, 1);
    Vec dout = rng.uniform_vector(N * OUT, -1, 1);
    Vec out = nan_vector(N * OUT), out_naive = nan_vector(N * OUT);
    linear_forward(out.data(), inp.data(), weight.data(), N, IN, OUT);
    linear_forward_naive(out_naive.data(), inp.data(), weight.data(), N, IN, OUT);
    compare_exact("out", out.data(), out_naive.data(), N * OUT);
    // both accumulate into the same non-zero starting gradients
    Vec dinp = rng.uniform_vector(N * IN, -1, 1), dweight = rng.uniform_vector(OUT * IN, -1, 1);
    Vec dinp_naive = dinp, dweight_naive = dweight;
    linear_backward(dinp.data(), dweight.data(), dout.data(), inp.data(), weight.data(), N, IN, OUT);
    linear_backward_naive(dinp_naive.data(), dweight_naive.data(), dout.data(), inp.data(),
                          weight.data(), N, IN, OUT);
    compare_exact("dinp", dinp.data(), dinp_naive.data(), N * IN);
    compare_exact("dweight", dweight.data(), dweight_naive.data(), OUT * IN);
}

TEST_CASE("rope backward matches finite differences, with the forward in place") {
    size_t B = 0, T = 0, n_heads = 0, hs = 0;
    SUBCASE("B=1 T=5 heads=1 hs=2") { B = 1; T = 5; n_heads = 1; hs = 2; }
    SUBCASE("B=2 T=7 heads=3 hs=4") { B = 2; T = 7; n_heads = 3; hs = 4; }
    SUBCASE("B=2 T=3 heads=2 hs=8") { B = 2; T = 3; n_heads = 2; hs = 8; }
    CAPTURE(B);
    CAPTURE(T);
    CAPTURE(n_heads);
    CAPTURE(hs);
    size_t n = B * T * n_heads * hs;
    Rng rng(104);
    Vec inp = rng.uniform_vector(n, -1, 1), R = rng.uniform_vector(n, -1, 1), x(n), dinp(n, 0.0f);
    rope_backward(dinp.data(), R.data(), B, T, n_heads, hs);
    auto loss = [&] {
        x = inp;
        rope_forward(x.data(), x.data(), B, T, n_heads, hs);
        return weighted_sum(R.data(), x.data(), n);
    };
    check_gradient("inp", inp.data(), dinp.data(), n, loss, LINEAR_STEP, ROPE_GRAD_TOL);
}

TEST_CASE("swiglu backward matches finite differences") {
    size_t N = 0, F = 0;
    SUBCASE("N=1 F=1") { N = 1; F = 1; }
    SUBCASE("N=3 F=5") { N = 3; F = 5; }
    SUBCASE("N=4 F=37") { N = 4; F = 37; }
    CAPTURE(N);
    CAPTURE(F);
    Rng rng(106);
    // gates over [-4, 4] reach both tails of the sigmoid
    Vec gate = rng.uniform_vector(N * F, -4, 4), up = rng.uniform_vector(N * F, -2, 2);
    Vec R = rng.uniform_vector(N * F, -1, 1), out(N * F), dgate(N * F, 0.0f), dup(N * F, 0.0f);
    swiglu_backward(dgate.data(), dup.data(), R.data(), gate.data(), up.data(), N, F);
    auto loss = [&] {
        swiglu_forward(out.data(), gate.data(), up.data(), N, F);
        return weighted_sum(R.data(), out.data(), N * F);
    };
    check_gradient("gate", gate.data(), dgate.data(), N * F, loss, SWIGLU_STEP, SWIGLU_GRAD_TOL);
    check_gradient("up", up.data(), dup.data(), N * F, loss, SWIGLU_STEP, SWIGLU_GRAD_TOL);
}

namespace {

// Depth-attention sources drawn from `n_tensors` distinct tensors: source i is tensor uses[i],
// so a tensor listed twice is one pointer passed twice, and its gradient must sum both uses.
struct DepthCase {
    size_t N, C;
    std::vector<size_t> uses;
    std::vector<Vec> tensors, dtensors;
    Vec query, norm_weight;
    std::vector<const float*> sources;
    std::vector<float*> dsources;

    DepthCase(size_t N_, size_t C_, std::vector<size_t> uses_, Rng& rng, float query_scale)
        : N(N_), C(C_), uses(std::move(uses_)) {
        size_t n_tensors = *std::max_element(uses.begin(), uses.end()) + 1;
        for (size_t i = 0; i < n_tensors; i++) {
            // sources of different scales, so that keys (normalised) and values differ
            float scale = rng.uniform(0.5f, 2.0f);
            Vec x = rng.uniform_vector(N * C, -scale, scale);
            tensors.push_back(x);
            dtensors.push_back(Vec(N * C, 0.0f));
        }
        query = rng.uniform_vector(C, -query_scale, query_scale);
        norm_weight = rng.signed_vector(C, 0.5f, 1.5f);
        for (size_t i : uses) {
            sources.push_back(tensors[i].data());
            dsources.push_back(dtensors[i].data());
        }
    }
    size_t n_sources() const { return uses.size(); }
    bool naive = false;  // forward and backward: the naive row-by-row version, not the tiled
    void forward(Vec& out, Vec& alpha, Vec& key_rstd) const {
        (naive ? depth_attention_forward_naive : depth_attention_forward)(
            out.data(), alpha.data(), key_rstd.data(), sources.data(), query.data(),
            norm_weight.data(), n_sources(), N, C);
    }
    void backward(Vec& dquery, Vec& dnorm_weight, const Vec& dout, const Vec& alpha,
                  const Vec& key_rstd) const {
        (naive ? depth_attention_backward_naive : depth_attention_backward)(
            dsources.data(), dquery.data(), dnorm_weight.data(), dout.data(), alpha.data(),
            key_rstd.data(), sources.data(), query.data(), norm_weight.data(), n_sources(), N,
            C);
    }
    // every source tensor's, the query's and the norm weight's gradient against finite
    // differences of loss (which reruns the forward)
    void check_gradients(const std::function<double()>& loss, const Vec& dquery,
                         const Vec& dnorm_weight, Tolerance tol) {
        for (size_t i = 0; i < tensors.size(); i++)
            check_gradient("source tensor " + std::to_string(i), tensors[i].data(),
                           dtensors[i].data(), N * C, loss, DEPTH_STEP, tol);
        check_gradient("query", query.data(), dquery.data(), C, loss, DEPTH_STEP, tol);
        check_gradient("norm_weight", norm_weight.data(), dnorm_weight.data(), C, loss,
                       DEPTH_STEP, tol);
    }
};

// the depth attention's gradients (tiled, or naive) against finite differences of
// sum(R * out) for a random R
void check_depth_gradients(size_t N, size_t C, const std::vector<size_t>& uses, bool naive) {
    CAPTURE(N);
    CAPTURE(C);
    CAPTURE(uses.size());
    Rng rng(107);
    DepthCase dc(N, C, uses, rng, 1.0f);
    dc.naive = naive;
    size_t n = dc.n_sources();
    Vec R = rng.uniform_vector(N * C, -1, 1), out(N * C), alpha(N * n), key_rstd(N * n);
    Vec dquery(C, 0.0f), dnorm_weight(C, 0.0f);
    dc.forward(out, alpha, key_rstd);
    dc.backward(dquery, dnorm_weight, R, alpha, key_rstd);
    auto loss = [&] {
        dc.forward(out, alpha, key_rstd);
        return weighted_sum(R.data(), out.data(), N * C);
    };
    dc.check_gradients(loss, dquery, dnorm_weight, DEPTH_GRAD_TOL);
}

}  // namespace

TEST_CASE("depth attention backward matches finite differences, for every source, query and norm") {
    size_t N = 0, C = 0;
    std::vector<size_t> uses;
    SUBCASE("1 source") { N = 2; C = 4; uses = {0}; }
    SUBCASE("2 sources") { N = 3; C = 8; uses = {0, 1}; }
    SUBCASE("3 sources") { N = 4; C = 5; uses = {0, 1, 2}; }
    SUBCASE("5 sources") { N = 3; C = 16; uses = {0, 1, 2, 3, 4}; }
    SUBCASE("3 sources, the first tensor passed twice") { N = 3; C = 8; uses = {0, 1, 0}; }
    SUBCASE("2 sources, both the same tensor") { N = 2; C = 6; uses = {0, 0}; }
    SUBCASE("3 sources, N=37: three tiles of rows (DEPTH_TILE 16), their sums added") {
        N = 37; C = 4; uses = {0, 1, 2};
    }
    check_depth_gradients(N, C, uses, false);
}

TEST_CASE("the naive depth attention backward matches finite differences, for every source, query and norm") {
    size_t N = 0, C = 0;
    std::vector<size_t> uses;
    SUBCASE("1 source") { N = 2; C = 4; uses = {0}; }
    SUBCASE("3 sources, the first tensor passed twice") { N = 3; C = 8; uses = {0, 1, 0}; }
    SUBCASE("4 sources, N=5 C=19: a dot product of 16 lanes and a remainder") {
        N = 5; C = 19; uses = {0, 1, 2, 3};
    }
    check_depth_gradients(N, C, uses, true);
}

// dquery and dnorm_weight sum N * n_sources terms ds_i k_i per column in another
// order: the naive version adds them row by row into the gradients, the tiled one sums
// ds_i r_i V_i over tiles of 16 rows, adds the tiles' sums in turn and multiplies by the gain
// at the end. Reordering float additions moves the result by a few ulps of its partial sums:
// here at most 1e-5 on sums up to about 10, 36 % of 1e-5 + 1e-5 |x| (GRADCHECK_VERBOSE=1),
// the tolerance the GPU agreement tests allow these sums; any dropped term moves them by
// 1e-2 or more. Everything else is the same arithmetic in the same order: bit for bit.
static const Tolerance DEPTH_NAIVE_SUM_TOL = {1e-5, 1e-5};

TEST_CASE("the tiled depth attention equals the naive row-by-row one, bit for bit but the weights' column sums") {
    size_t N = 0, C = 0;
    std::vector<size_t> uses;
    SUBCASE("1 source, N=3 C=8") { N = 3; C = 8; uses = {0}; }
    SUBCASE("3 sources, N=5 C=5") { N = 5; C = 5; uses = {0, 1, 2}; }
    SUBCASE("5 sources, N=17 C=33: one whole tile of rows and one row, dots with remainders") {
        N = 17; C = 33; uses = {0, 1, 2, 3, 4};
    }
    SUBCASE("6 sources, the first passed again as the last, N=40 C=16: three tiles") {
        N = 40; C = 16; uses = {0, 1, 2, 3, 4, 0};
    }
    SUBCASE("17 sources (full mode at L=8), N=37 C=64") {
        N = 37; C = 64;
        for (size_t i = 0; i < 17; i++) uses.push_back(i);
    }
    CAPTURE(N);
    CAPTURE(C);
    CAPTURE(uses.size());
    Rng rng(113);
    DepthCase tiled(N, C, uses, rng, 1.0f);
    DepthCase naive = tiled;  // the same inputs, its own gradient tensors
    naive.naive = true;
    naive.sources.clear();
    naive.dsources.clear();
    for (size_t t : uses) {
        naive.sources.push_back(naive.tensors[t].data());
        naive.dsources.push_back(naive.dtensors[t].data());
    }
    for (size_t t = 0; t < tiled.dtensors.size(); t++) {  // both add into the same values
        Vec start = rng.uniform_vector(N * C, -1, 1);  // copied in: dsources point at them
        std::copy(start.begin(), start.end(), tiled.dtensors[t].begin());
        std::copy(start.begin(), start.end(), naive.dtensors[t].begin());
    }
    size_t n = tiled.n_sources();
    Vec dout = rng.uniform_vector(N * C, -1, 1);
    Vec dquery0 = rng.uniform_vector(C, -1, 1), dnorm_weight0 = rng.uniform_vector(C, -1, 1);
    Vec out = nan_vector(N * C), alpha = nan_vector(N * n), key_rstd = nan_vector(N * n);
    Vec out_naive = nan_vector(N * C), alpha_naive = nan_vector(N * n);
    Vec key_rstd_naive = nan_vector(N * n);
    tiled.forward(out, alpha, key_rstd);
    naive.forward(out_naive, alpha_naive, key_rstd_naive);
    compare_exact("out", out.data(), out_naive.data(), N * C);
    compare_exact("alpha", alpha.data(), alpha_naive.data(), N * n);
    compare_exact("key_rstd", key_rstd.data(), key_rstd_naive.data(), N * n);
    Vec dquery = dquery0, dnorm_weight = dnorm_weight0;
    Vec dquery_naive = dquery0, dnorm_weight_naive = dnorm_weight0;
    tiled.backward(dquery, dnorm_weight, dout, alpha, key_rstd);
    naive.backward(dquery_naive, dnorm_weight_naive, dout, alpha, key_rstd);
    for (size_t t = 0; t < tiled.dtensors.size(); t++)
        compare_exact("dsource tensor " + std::to_string(t), tiled.dtensors[t].data(),
                      naive.dtensors[t].data(), N * C);
    compare_within("dquery", dquery.data(), dquery_naive.data(), C, DEPTH_NAIVE_SUM_TOL);
    compare_within("dnorm_weight", dnorm_weight.data(), dnorm_weight_naive.data(), C,
                   DEPTH_NAIVE_SUM_TOL);
}

TEST_CASE("depth attention with its RMSNorm (one call) matches finite differences, gain and dout included") {
    size_t N = 0, C = 0;
    std::vector<size_t> uses;
    SUBCASE("1 source") { N = 2; C = 4; uses = {0}; }
    SUBCASE("3 sources, the first tensor passed twice") { N = 3; C = 8; uses = {0, 1, 0}; }
    SUBCASE("4 sources, N=7 C=6") { N = 7; C = 6; uses = {0, 1, 2, 3}; }
    CAPTURE(N);
    CAPTURE(C);
    Rng rng(108);
    DepthCase dc(N, C, uses, rng, 1.0f);
    size_t n = dc.n_sources();
    Vec gain = rng.signed_vector(C, 0.5f, 1.5f), R = rng.uniform_vector(N * C, -1, 1);
    Vec xn(N * C), rstd(N), out(N * C), alpha(N * n), key_rstd(N * n);
    Vec dquery(C, 0.0f), dnorm_weight(C, 0.0f), dgain(C, 0.0f);
    Vec dout(N * C, 1e3f);  // overwritten with out's gradient
    DepthSaved saved = {alpha.data(), key_rstd.data(), nullptr, nullptr, nullptr};
    DepthParams params = {dc.query.data(), dc.norm_weight.data(), nullptr, nullptr};
    DepthParams grads = {dquery.data(), dnorm_weight.data(), nullptr, nullptr};
    auto forward = [&] {
        depth_attention_rmsnorm_forward(xn.data(), rstd.data(), out.data(), saved,
                                        dc.sources.data(), params, gain.data(), n, N, C);
    };
    forward();
    depth_attention_rmsnorm_backward(dc.dsources.data(), grads, dgain.data(), dout.data(),
                                     R.data(), out.data(), rstd.data(), gain.data(), saved,
                                     dc.sources.data(), params, n, N, C);
    // dout is rmsnorm's input gradient of R alone
    Vec dout_ref(N * C, 0.0f);
    rmsnorm_backward(dout_ref.data(), nullptr, R.data(), out.data(), gain.data(), rstd.data(),
                     N, C);
    compare_exact("dout", dout.data(), dout_ref.data(), N * C);
    auto loss = [&] {
        forward();
        return weighted_sum(R.data(), xn.data(), N * C);
    };
    dc.check_gradients(loss, dquery, dnorm_weight, FUSED_GRAD_TOL);
    check_gradient("gain", gain.data(), dgain.data(), C, loss, DEPTH_STEP, FUSED_GRAD_TOL);
}

TEST_CASE("crossentropy backward matches finite differences of the mean loss, with ignored targets") {
    size_t V = 0;
    std::vector<int> targets;
    SUBCASE("N=4 V=3") { V = 3; targets = {0, 2, -1, 1}; }
    SUBCASE("N=6 V=10") { V = 10; targets = {9, -1, -1, 0, 4, 4}; }
    SUBCASE("N=3 V=2") { V = 2; targets = {-1, 1, 0}; }
    CAPTURE(V);
    size_t N = targets.size();
    size_t expected_count = N - (size_t)std::count(targets.begin(), targets.end(), -1);
    Rng rng(108);
    Vec logits = rng.uniform_vector(N * V, -2, 2), losses(N), probs(N * V), dlogits(N * V, 0.0f);
    crossentropy_forward(losses.data(), probs.data(), logits.data(), targets.data(), N, V);
        size_t count = crossentropy_count(targets.data(), N);
    REQUIRE(count == expected_count);
    float scale = 1.0f / (float)count;
    crossentropy_backward(dlogits.data(), probs.data(), targets.data(), scale, N, V);
    auto loss = [&] {
        crossentropy_forward(losses.data(), probs.data(), logits.data(), targets.data(), N, V);
        double sum = 0.0;
        for (float l : losses) sum += l;
        return (double)scale * sum;
    };
    check_gradient("logits", logits.data(), dlogits.data(), N * V, loss, CROSSENTROPY_STEP,
                   CROSSENTROPY_GRAD_TOL);
}

// ---- the accumulate contract -------------------------------------------------------------

namespace {

// Runs backward() on zeroed gradient buffers (result G), then again on top of G (must give 2G),
// then on top of random contents R0 (must give R0 + G): a backward adds, it never overwrites.
static void check_accumulates(const std::vector<std::pair<std::string, Vec*>>& grads,
                              const std::function<void()>& backward) {
    Rng rng(999);
    for (auto& g : grads) std::fill(g.second->begin(), g.second->end(), 0.0f);
    backward();
    std::vector<Vec> once;
    for (auto& g : grads) {
        once.push_back(*g.second);
        float largest = 0.0f;
        for (float x : once.back()) largest = std::max(largest, std::fabs(x));
        CHECK_MESSAGE(largest > 0.1f, g.first << " is (almost) zero, so the check would be vacuous");
    }
    backward();
    for (size_t i = 0; i < grads.size(); i++) {
        std::vector<double> twice(once[i].begin(), once[i].end());
        for (double& x : twice) x *= 2.0;
        compare_within(grads[i].first + " after two calls", grads[i].second->data(), twice.data(),
                       twice.size(), ACCUMULATE_TOL);
    }
    std::vector<Vec> prefilled;
    for (auto& g : grads) {
        // written in place: the buffers may be pointed to (depth attention's dsources)
        Vec random = rng.uniform_vector(g.second->size(), -1, 1);
        std::copy(random.begin(), random.end(), g.second->begin());
        prefilled.push_back(random);
    }
    backward();
    for (size_t i = 0; i < grads.size(); i++) {
        std::vector<double> sum(once[i].size());
        for (size_t j = 0; j < sum.size(); j++) sum[j] = (double)prefilled[i][j] + once[i][j];
        compare_within(grads[i].first + " added to pre-filled", grads[i].second->data(), sum.data(),
                       sum.size(), ACCUMULATE_TOL);
    }
}

}  // namespace

TEST_CASE("every backward accumulates into its gradients (+=), never overwrites them") {
    Rng rng(109);
    SUBCASE("embedding") {
        size_t V = 6, C = 5;
        std::vector<int> tokens = {2, 5, 2, 0};
        Vec dout = rng.uniform_vector(tokens.size() * C, -1, 1), dwte(V * C);
        check_accumulates({{"dwte", &dwte}}, [&] {
            embedding_backward(dwte.data(), dout.data(), tokens.data(), tokens.size(), C);
        });
    }
    SUBCASE("rmsnorm") {
        size_t N = 3, C = 8;
        Vec inp = rng.uniform_vector(N * C, -1, 1), weight = rng.signed_vector(C, 0.5f, 1.5f);
        Vec dout = rng.uniform_vector(N * C, -1, 1), out(N * C), rstd(N), dinp(N * C), dweight(C);
        rmsnorm_forward(out.data(), rstd.data(), inp.data(), weight.data(), N, C);
        check_accumulates({{"dinp", &dinp}, {"dweight", &dweight}}, [&] {
            rmsnorm_backward(dinp.data(), dweight.data(), dout.data(), inp.data(), weight.data(),
                             rstd.data(), N, C);
        });
    }
    SUBCASE("linear") {
        size_t N = 9, IN = 33, OUT = 70;
        Vec inp = rng.uniform_vector(N * IN, -1, 1), weight = rng.uniform_vector(OUT * IN, -1, 1);
        Vec dout = rng.uniform_vector(N * OUT, -1, 1), dinp(N * IN), dweight(OUT * IN);
        check_accumulates({{"dinp", &dinp}, {"dweight", &dweight}}, [&] {
            linear_backward(dinp.data(), dweight.data(), dout.data(), inp.data(), weight.data(), N, IN, OUT);
        });
    }
    SUBCASE("rope") {
        size_t B = 2, T = 5, n_heads = 2, hs = 4, n = B * T * n_heads * hs;
        Vec dout = rng.uniform_vector(n, -1, 1), dinp(n);
        check_accumulates({{"dinp", &dinp}}, [&] { rope_backward(dinp.data(), dout.data(), B, T, n_heads, hs); });
    }
    SUBCASE("attention") {
        size_t B = 2, T = 19, H = 4, G = 2, hs = 20, nq = B * T * H * hs, nkv = B * T * G * hs;
        Vec q = rng.uniform_vector(nq, -1.5f, 1.5f), k = rng.uniform_vector(nkv, -1.5f, 1.5f);
        Vec v = rng.uniform_vector(nkv, -1, 1), dout = rng.uniform_vector(nq, -1, 1);
        Vec out(nq), lse(B * H * T), dq(nq), dk(nkv), dv(nkv);
        attention_forward(out.data(), lse.data(), q.data(), k.data(), v.data(), B, T, H, G, hs);
        check_accumulates({{"dq", &dq}, {"dk", &dk}, {"dv", &dv}}, [&] {
            attention_backward(dq.data(), dk.data(), dv.data(), dout.data(), out.data(), lse.data(),
                               q.data(), k.data(), v.data(), B, T, H, G, hs);
        });
    }
    SUBCASE("swiglu") {
        size_t N = 3, F = 7;
        Vec gate = rng.uniform_vector(N * F, -4, 4), up = rng.uniform_vector(N * F, -2, 2);
        Vec dout = rng.uniform_vector(N * F, -1, 1), dgate(N * F), dup(N * F);
        check_accumulates({{"dgate", &dgate}, {"dup", &dup}}, [&] {
            swiglu_backward(dgate.data(), dup.data(), dout.data(), gate.data(), up.data(), N, F);
        });
    }
    SUBCASE("depth attention, one tensor passed twice") {
        size_t N = 3, C = 8;
        DepthCase dc(N, C, {0, 1, 2, 1}, rng, 1.0f);
        size_t n = dc.n_sources();
        Vec dout = rng.uniform_vector(N * C, -1, 1), out(N * C), alpha(N * n), key_rstd(N * n);
        Vec dquery(C), dnorm_weight(C);
        dc.forward(out, alpha, key_rstd);
        check_accumulates({{"dsource 0", &dc.dtensors[0]}, {"dsource 1", &dc.dtensors[1]},
                           {"dsource 2", &dc.dtensors[2]}, {"dquery", &dquery},
                           {"dnorm_weight", &dnorm_weight}},
                          [&] { dc.backward(dquery, dnorm_weight, dout, alpha, key_rstd); });
    }
    SUBCASE("crossentropy") {
        size_t N = 4, V = 5;
        std::vector<int> targets = {1, -1, 4, 0};
        Vec logits = rng.uniform_vector(N * V, -2, 2), losses(N), probs(N * V), dlogits(N * V);
        crossentropy_forward(losses.data(), probs.data(), logits.data(), targets.data(), N, V);
        size_t count = crossentropy_count(targets.data(), N);
        // scale 1 rather than 1/count keeps the gradients large enough to see
        CHECK(count == 3);
        check_accumulates({{"dlogits", &dlogits}}, [&] {
            crossentropy_backward(dlogits.data(), probs.data(), targets.data(), 1.0f, N, V);
        });
    }
}

// ---- forward passes against SPEC.md ------------------------------------------------------

TEST_CASE("every forward matches a double-precision reference and overwrites its outputs") {
    Rng rng(110);
    SUBCASE("embedding copies rows exactly") {
        size_t V = 6, C = 5;
        std::vector<int> tokens = {2, 5, 2, 0};
        size_t N = tokens.size();
        Vec wte = rng.uniform_vector(V * C, -1, 1), out = nan_vector(N * C), expected;
        embedding_forward(out.data(), tokens.data(), wte.data(), N, C);
        for (int token : tokens) expected.insert(expected.end(), &wte[token * C], &wte[token * C] + C);
        compare_exact("embedding out", out.data(), expected.data(), N * C);
    }
    SUBCASE("rmsnorm") {
        size_t N = 4, C = 33;
        Vec inp = rng.uniform_vector(N * C, -2, 2), weight = rng.signed_vector(C, 0.5f, 1.5f);
        for (size_t c = 0; c < C; c++) inp[C + c] *= 1e-3f;  // mean(x^2) ~ eps: eps matters
        Vec out = nan_vector(N * C), rstd = nan_vector(N);
        std::vector<double> out_ref, rstd_ref;
        rmsnorm_forward(out.data(), rstd.data(), inp.data(), weight.data(), N, C);
        rmsnorm_reference(out_ref, rstd_ref, inp, weight, N, C);
        compare_within("rmsnorm out", out.data(), out_ref.data(), N * C, FORWARD_TOL);
        compare_within("rmsnorm rstd", rstd.data(), rstd_ref.data(), N, FORWARD_TOL);
    }
    SUBCASE("linear, y = x W^T") {
        size_t N = 9, IN = 33, OUT = 70;
        Vec inp = rng.uniform_vector(N * IN, -1, 1), weight = rng.uniform_vector(OUT * IN, -1, 1);
        Vec out = nan_vector(N * OUT);
        std::vector<double> out_ref(N * OUT, 0.0);
        linear_forward(out.data(), inp.data(), weight.data(), N, IN, OUT);
        for (size_t n = 0; n < N; n++)
            for (size_t o = 0; o < OUT; o++)
                for (size_t i = 0; i < IN; i++) out_ref[n * OUT + o] += (double)inp[n * IN + i] * weight[o * IN + i];
        compare_within("linear out", out.data(), out_ref.data(), N * OUT, LINEAR_FORWARD_TOL);
    }
    SUBCASE("rope turns pair j at position t by t * 10000^(-2j/hs)") {
        size_t B = 2, T = 7, n_heads = 3, hs = 8, n = B * T * n_heads * hs;
        Vec inp = rng.uniform_vector(n, -1, 1), out = nan_vector(n);
        std::vector<double> out_ref;
        rope_forward(out.data(), inp.data(), B, T, n_heads, hs);
        rope_reference(out_ref, inp, B, T, n_heads, hs);
        compare_within("rope out", out.data(), out_ref.data(), n, FORWARD_TOL);
    }
    SUBCASE("swiglu, silu(gate) * up") {
        size_t N = 3, F = 37;
        Vec gate = rng.uniform_vector(N * F, -6, 6), up = rng.uniform_vector(N * F, -2, 2);
        Vec out = nan_vector(N * F);
        std::vector<double> out_ref(N * F);
        swiglu_forward(out.data(), gate.data(), up.data(), N, F);
        for (size_t i = 0; i < N * F; i++) out_ref[i] = gate[i] / (1.0 + std::exp(-(double)gate[i])) * up[i];
        compare_within("swiglu out", out.data(), out_ref.data(), N * F, FORWARD_TOL);
    }
    SUBCASE("depth attention") {
        size_t N = 4, C = 16;
        DepthCase dc(N, C, {0, 1, 2, 3, 1}, rng, 1.0f);
        for (float& x : dc.tensors[3]) x *= 1e-3f;  // mean(V^2) ~ eps: the key's eps matters
        size_t n = dc.n_sources();
        Vec out = nan_vector(N * C), alpha = nan_vector(N * n), key_rstd = nan_vector(N * n);
        std::vector<double> out_ref, alpha_ref, key_rstd_ref;
        dc.forward(out, alpha, key_rstd);
        depth_attention_reference(out_ref, alpha_ref, key_rstd_ref, dc.sources, dc.query, dc.norm_weight, N, C);
        compare_within("depth attention out", out.data(), out_ref.data(), N * C, FORWARD_TOL);
        compare_within("depth attention alpha", alpha.data(), alpha_ref.data(), N * n, FORWARD_TOL);
        compare_within("depth attention key_rstd", key_rstd.data(), key_rstd_ref.data(), N * n, FORWARD_TOL);
    }
    SUBCASE("crossentropy, ignored rows have loss 0") {
        size_t V = 10;
        std::vector<int> targets = {3, -1, 9, 0, -1};
        size_t N = targets.size();
        Vec logits = rng.uniform_vector(N * V, -3, 3), losses = nan_vector(N), probs = nan_vector(N * V);
        std::vector<double> losses_ref, probs_ref;
        crossentropy_forward(losses.data(), probs.data(), logits.data(), targets.data(), N, V);
        size_t count = crossentropy_count(targets.data(), N);
        CHECK(count == crossentropy_reference(losses_ref, probs_ref, logits, targets, V));
        CHECK(count == 3);
        compare_within("crossentropy losses", losses.data(), losses_ref.data(), N, FORWARD_TOL);
        for (size_t row = 0; row < N; row++)
            if (targets[row] != -1)
                compare_within("crossentropy probs row " + std::to_string(row), &probs[row * V],
                               &probs_ref[row * V], V, FORWARD_TOL);
    }
}

// The attention softmax's lane helpers (util.h). max_of equals the plain loop's maximum for
// every length around its sixteen lanes, with the largest value at every position, NaNs
// skipped as the plain loop skips them. sum_of and dot run over values that are multiples of
// 1/4 and small, so that every product and partial sum is exact in float: each must equal
// the exact sum. A lane or a tail element left out shows in all three.
TEST_CASE("max_of is the plain maximum, sum_of and dot the exact sums, for lengths around the lanes") {
    Rng rng(112);
    auto plain_max = [](const Vec& x) {
        float m = -INFINITY;
        for (float v : x) m = v > m ? v : m;
        return m;
    };
    for (size_t n = 0; n <= 50; n++) {
        CAPTURE(n);
        Vec x(n), w(n);
        double exact = 0.0, exact_dot = 0.0;
        for (size_t i = 0; i < n; i++) {
            x[i] = std::round(rng.uniform(-20, 20)) / 4.0f;
            w[i] = std::round(rng.uniform(-20, 20)) / 4.0f;
            exact += x[i];
            exact_dot += (double)x[i] * w[i];
        }
        CHECK(sum_of(x.data(), n) == (float)exact);
        CHECK(dot(x.data(), w.data(), n) == (float)exact_dot);
        CHECK(max_of(x.data(), n) == plain_max(x));
        for (size_t at = 0; at < n; at++) {  // the largest in each lane and in the tail
            Vec y = x;
            y[at] = 100.0f;
            CHECK(max_of(y.data(), n) == 100.0f);
        }
        if (n > 0) {
            x[n / 2] = NAN;
            CHECK(max_of(x.data(), n) == plain_max(x));
        }
    }
}

TEST_CASE("expf_vectorizable is within 1 ulp of libm's expf, and 0, inf and NaN where expf is") {
    // how many floats apart two finite, non-negative results are (their bit patterns, as ints)
    auto floats_apart = [](float a, float b) {
        int32_t ia, ib;
        std::memcpy(&ia, &a, sizeof a);
        std::memcpy(&ib, &b, sizeof b);
        return std::abs((int64_t)ia - (int64_t)ib);
    };
    // every 1021st float of [-105, 90] (the whole range was checked once: at most 1 apart),
    // and each end of the range: the smallest subnormal result, the largest finite one
    const float lo = -103.97208404541015625f, hi = 88.72283935546875f;
    std::vector<float> xs = {0.0f, -0.0f, 1e-30f, -1e-30f, 1.0f, -1.0f, lo, hi,
                             std::nextafter(lo, 0.0f), std::nextafter(hi, 0.0f), -87.33655f, -87.3f};
    for (uint32_t bits = 0; bits < 0xFF800000u; bits += 1021) {
        float x;
        std::memcpy(&x, &bits, sizeof x);
        if (x >= -105.0f && x <= 90.0f) xs.push_back(x);
    }
    int64_t worst = 0;
    float worst_x = 0.0f;
    for (float x : xs) {
        float got = expf_vectorizable(x), want = std::exp(x);
        REQUIRE_MESSAGE(std::isfinite(got) == std::isfinite(want), "x = " << x);
        if (!std::isfinite(want)) continue;
        int64_t apart = floats_apart(got, want);
        if (apart > worst) {
            worst = apart;
            worst_x = x;
        }
    }
    INFO("worst at x = ", worst_x, " (", xs.size(), " values)");
    CHECK(worst <= 1);
    CHECK(xs.size() > 2000000);
    CHECK(expf_vectorizable(-0.0f) == 1.0f);
    CHECK(expf_vectorizable(std::nextafter(lo, -200.0f)) == 0.0f);  // below the subnormals
    CHECK(expf_vectorizable(-1000.0f) == 0.0f);
    CHECK(expf_vectorizable(-INFINITY) == 0.0f);
    CHECK(expf_vectorizable(std::nextafter(hi, 200.0f)) == INFINITY);  // past FLT_MAX
    CHECK(expf_vectorizable(INFINITY) == INFINITY);
    CHECK(std::isnan(expf_vectorizable(NAN)));
    CHECK(std::isnan(expf_vectorizable(-NAN)));
}

// ---- layer facts -------------------------------------------------------------------------

TEST_CASE("depth attention with a zero query is the plain average of its sources") {
    size_t n_sources = 0;
    SUBCASE("2 sources") { n_sources = 2; }
    SUBCASE("3 sources") { n_sources = 3; }
    SUBCASE("5 sources") { n_sources = 5; }
    CAPTURE(n_sources);
    size_t N = 4, C = 8;
    Rng rng(111);
    std::vector<size_t> uses(n_sources);
    for (size_t i = 0; i < n_sources; i++) uses[i] = i;
    DepthCase dc(N, C, uses, rng, 1.0f);
    std::fill(dc.query.begin(), dc.query.end(), 0.0f);
    Vec out(N * C), alpha(N * n_sources), key_rstd(N * n_sources);
    dc.forward(out, alpha, key_rstd);
    Vec uniform(N * n_sources, 1.0f / (float)n_sources);
    compare_exact("alpha", alpha.data(), uniform.data(), N * n_sources);
    // the mean, to the rounding of a sum of n terms of size up to max |V_i|
    for (size_t j = 0; j < N * C; j++) {
        double sum = 0.0, sum_abs = 0.0;
        for (size_t i = 0; i < n_sources; i++) {
            sum += dc.tensors[i][j];
            sum_abs += std::fabs(dc.tensors[i][j]);
        }
        INFO("element " << j);
        CHECK(std::fabs(out[j] - sum / n_sources) <= 1e-6 * sum_abs / n_sources);
    }
}

TEST_CASE("depth attention over a single source returns it exactly, and no query or norm gradient") {
    size_t N = 3, C = 8;
    Rng rng(112);
    DepthCase dc(N, C, {0}, rng, 1.0f);
    Vec out(N * C), alpha(N), key_rstd(N), dout = rng.uniform_vector(N * C, -1, 1);
    Vec dquery(C, 0.0f), dnorm_weight(C, 0.0f), zeros(C, 0.0f), ones(N, 1.0f);
    dc.forward(out, alpha, key_rstd);
    compare_exact("out", out.data(), dc.tensors[0].data(), N * C);
    compare_exact("alpha", alpha.data(), ones.data(), N);
    dc.backward(dquery, dnorm_weight, dout, alpha, key_rstd);
    compare_exact("dquery", dquery.data(), zeros.data(), C);
    compare_exact("dnorm_weight", dnorm_weight.data(), zeros.data(), C);
    compare_exact("dsource", dc.dtensors[0].data(), dout.data(), N * C);
}

TEST_CASE("depth attention stays finite and correct with huge scores") {
    float query_scale = 0.0f;
    SUBCASE("query entries up to 80") { query_scale = 80.0f; }
    SUBCASE("query entries up to 1e4") { query_scale = 1e4f; }
    CAPTURE(query_scale);
    size_t N = 6, C = 8;
    Rng rng(113);
    DepthCase dc(N, C, {0, 1, 2}, rng, query_scale);
    size_t n = dc.n_sources();
    Vec out(N * C), alpha(N * n), key_rstd(N * n), dout = rng.uniform_vector(N * C, -1, 1);
    Vec dquery(C, 0.0f), dnorm_weight(C, 0.0f);
    std::vector<double> out_ref, alpha_ref, key_rstd_ref;
    dc.forward(out, alpha, key_rstd);
    depth_attention_reference(out_ref, alpha_ref, key_rstd_ref, dc.sources, dc.query, dc.norm_weight, N, C);
    // large scores carry a larger rounding (max error 4.2e-7), but only where alpha is not 0 or 1
    compare_within("out", out.data(), out_ref.data(), N * C, {2e-6, 1e-5});
    compare_within("alpha", alpha.data(), alpha_ref.data(), N * n, {2e-6, 1e-5});
    dc.backward(dquery, dnorm_weight, dout, alpha, key_rstd);
    for (size_t i = 0; i < dc.dtensors.size(); i++) CHECK(gradcheck::all_finite(dc.dtensors[i].data(), N * C));
    CHECK(gradcheck::all_finite(dquery.data(), C));
    CHECK(gradcheck::all_finite(dnorm_weight.data(), C));
}

TEST_CASE("crossentropy stays finite and correct with huge logits") {
    float lo = 0.0f, hi = 0.0f;
    SUBCASE("logits in [80, 100], beyond exp's float range") { lo = 80.0f; hi = 100.0f; }
    SUBCASE("logits in [-1e4, 1e4]") { lo = -1e4f; hi = 1e4f; }
    SUBCASE("logits in [-1e4, -9e3]") { lo = -1e4f; hi = -9e3f; }
    CAPTURE(lo);
    CAPTURE(hi);
    size_t V = 7;
    std::vector<int> targets = {0, 6, -1, 3, 2};
    size_t N = targets.size();
    Rng rng(114);
    Vec logits = rng.uniform_vector(N * V, lo, hi), losses(N), probs(N * V), dlogits(N * V, 0.0f);
    std::vector<double> losses_ref, probs_ref;
    crossentropy_forward(losses.data(), probs.data(), logits.data(), targets.data(), N, V);
        size_t count = crossentropy_count(targets.data(), N);
    CHECK(count == crossentropy_reference(losses_ref, probs_ref, logits, targets, V));
    // a loss of size |logit| carries the rounding of the logits themselves (max error 3.7e-4 at 1e4)
    double largest = std::max(std::fabs(lo), std::fabs(hi));
    compare_within("losses", losses.data(), losses_ref.data(), N, {1e-7 * largest, 1e-6});
    for (size_t row = 0; row < N; row++)
        if (targets[row] != -1)
            compare_within("probs row " + std::to_string(row), &probs[row * V], &probs_ref[row * V], V, {3e-7, 1e-6});
    crossentropy_backward(dlogits.data(), probs.data(), targets.data(), 1.0f / (float)count, N, V);
    CHECK(gradcheck::all_finite(dlogits.data(), N * V));
}

TEST_CASE("rope is the identity at T=1, in place equals out of place, and decoding turns alike") {
    size_t B = 3, n_heads = 2, hs = 8;
    Rng rng(116);
    SUBCASE("T=1 leaves every row unchanged") {
        Vec inp = rng.uniform_vector(B * n_heads * hs, -1, 1), out = nan_vector(inp.size());
        rope_forward(out.data(), inp.data(), B, 1, n_heads, hs);
        compare_exact("rope out at T=1", out.data(), inp.data(), inp.size());
    }
    SUBCASE("T=5 in place") {
        size_t T = 5;
        Vec inp = rng.uniform_vector(B * T * n_heads * hs, -1, 1), out(inp.size()), x = inp;
        rope_forward(out.data(), inp.data(), B, T, n_heads, hs);
        rope_forward(x.data(), x.data(), B, T, n_heads, hs);
        compare_exact("rope in place", x.data(), out.data(), x.size());
    }
    SUBCASE("rope_forward_at(t) turns rows exactly as rope_forward does at position t") {
        size_t T = 6, C = n_heads * hs;
        Vec inp = rng.uniform_vector(B * T * C, -1, 1), out(inp.size());
        rope_forward(out.data(), inp.data(), B, T, n_heads, hs);
        for (size_t t = 0; t < T; t++) {
            CAPTURE(t);
            Vec rows, expected;  // row t of every sequence
            for (size_t b = 0; b < B; b++) {
                rows.insert(rows.end(), &inp[(b * T + t) * C], &inp[(b * T + t) * C] + C);
                expected.insert(expected.end(), &out[(b * T + t) * C], &out[(b * T + t) * C] + C);
            }
            Vec at = nan_vector(B * C);
            rope_forward_at(at.data(), rows.data(), t, B, n_heads, hs);
            compare_exact("rope_forward_at", at.data(), expected.data(), B * C);
            rope_forward_at(rows.data(), rows.data(), t, B, n_heads, hs);
            compare_exact("rope_forward_at in place", rows.data(), expected.data(), B * C);
        }
    }
}

TEST_CASE("adamw matches hand-computed values over two steps, t counting from 1") {
    float lr = 0.1f, beta1 = 0.9f, beta2 = 0.95f, eps = 1e-8f, weight_decay = 0.0f, grad_scale = 1.0f;
    SUBCASE("no weight decay") {}
    SUBCASE("weight decay 0.5") { weight_decay = 0.5f; }
    // gradients of the size of eps tell sqrt(v_hat) + eps from sqrt(v_hat + eps)
    SUBCASE("eps added after the square root") { eps = 1e-3f; grad_scale = 1e-3f; weight_decay = 0.1f; }
    CAPTURE(weight_decay);
    CAPTURE(eps);
    size_t n = 7;
    Rng rng(117);
    Vec params = rng.uniform_vector(n, -2, 2), m(n, 0.0f), v(n, 0.0f);
    std::vector<double> p_ref(params.begin(), params.end()), m_ref(n, 0.0), v_ref(n, 0.0);
    for (int t = 1; t <= 2; t++) {
        CAPTURE(t);
        Vec grads = rng.uniform_vector(n, -grad_scale, grad_scale);
        adamw_update(params.data(), grads.data(), m.data(), v.data(), n, lr, beta1, beta2, eps, weight_decay, t);
        for (size_t i = 0; i < n; i++) {
            double g = grads[i];
            m_ref[i] = beta1 * m_ref[i] + (1.0 - beta1) * g;
            v_ref[i] = beta2 * v_ref[i] + (1.0 - beta2) * g * g;
            double m_hat = m_ref[i] / (1.0 - std::pow((double)beta1, t));
            double v_hat = v_ref[i] / (1.0 - std::pow((double)beta2, t));
            p_ref[i] -= lr * (m_hat / (std::sqrt(v_hat) + eps) + weight_decay * p_ref[i]);
        }
        // max errors: params 8e-8 (of size 2), m and v 3e-8 relative
        compare_within("params", params.data(), p_ref.data(), n, {2e-7, 2e-7});
        compare_within("m", m.data(), m_ref.data(), n, {1e-8 * grad_scale, 2e-7});
        compare_within("v", v.data(), v_ref.data(), n, {1e-8 * grad_scale * grad_scale, 2e-7});
    }
}
