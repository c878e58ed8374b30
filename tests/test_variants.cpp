// test_variants.cpp — SPEC's depth-attention variants (src/depth_variants.c), operator by
// operator: each forward against a double-precision reference written from SPEC, each
// backward against central finite differences over every element of every tensor, for every
// combination of the switches; the accumulate (+=) contract; and the facts SPEC states
// (sigmoid weights of 1/2 at a zero query, the all-off variant equal to depth_attention.c bit
// for bit, static mixing's mean at zero logits, DenseFormer's plain sum at ones).
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "gradcheck.h"
#include "layers.h"

using gradcheck::check_gradient;
using gradcheck::compare_exact;
using gradcheck::compare_within;
using gradcheck::Rng;
using gradcheck::Tolerance;
using gradcheck::weighted_sum;

namespace {

typedef std::vector<float> Vec;

// As test_layers.cpp's depth attention: steps of 2e-2 (fourth-order differences), inputs O(1).
// Beside each tolerance, the largest error of the correct code over every subcase below
// (GRADCHECK_VERBOSE=1); dropping one term of a backward makes errors of 1e-2 or more.
// The attention's: max error 5.5e-5, in dquery summed over the 37 rows of the tiles case
// (the loss sums 148 outputs, and its rounding over the step is the finite difference's
// noise); elsewhere below 2.6e-5.
const float VARIANT_STEP = 2e-2f;
const Tolerance VARIANT_GRAD_TOL = {1.5e-4, 1e-5};
const float MIXING_STEP = 0.25f;                   // linear in the sources; smooth in the logits
const Tolerance MIXING_GRAD_TOL = {2e-5, 1e-5};     // max error 8.5e-6
const Tolerance VARIANT_FORWARD_TOL = {1e-6, 2e-6};
const Tolerance ACCUMULATE_TOL = {1e-5, 1e-6};

// The switches of one case.
struct Switches {
    size_t heads;
    int sigmoid, key_norm, token_query;
    std::string name() const {
        return std::string(sigmoid ? "sigmoid" : "softmax") + (key_norm ? "" : ", no key norm") +
               (token_query ? ", input-dependent query" : "") + ", " + std::to_string(heads) +
               " head(s)";
    }
};

std::vector<Switches> every_combination(size_t C) {
    std::vector<Switches> all;
    for (size_t heads : {(size_t)1, (size_t)2, C / 2})
        for (int sigmoid = 0; sigmoid < 2; sigmoid++)
            for (int key_norm = 0; key_norm < 2; key_norm++)
                for (int rows = 0; rows < 2; rows++) all.push_back({heads, sigmoid, key_norm, rows});
    return all;
}

// Sources drawn from distinct tensors: source i is tensor uses[i] (a tensor listed twice is
// one pointer passed twice, and its gradient must sum both uses).
struct VariantCase {
    size_t N, C;
    Switches sw;
    std::vector<size_t> uses;
    std::vector<Vec> tensors, dtensors;
    Vec query, token_query, norm_weight;
    std::vector<const float*> sources;
    std::vector<float*> dsources;

    VariantCase(size_t N_, size_t C_, Switches sw_, std::vector<size_t> uses_, Rng& rng)
        : N(N_), C(C_), sw(sw_), uses(std::move(uses_)) {
        size_t n_tensors = *std::max_element(uses.begin(), uses.end()) + 1;
        for (size_t i = 0; i < n_tensors; i++) {
            // sources of different scales, so that keys (normalised) and values differ, with
            // magnitudes away from 0: a head of two channels near 0 has a key norm so curved
            // that no finite-difference step resolves it
            float scale = rng.uniform(0.5f, 2.0f);
            tensors.push_back(rng.signed_vector(N * C, 0.25f * scale, scale));
            dtensors.push_back(Vec(N * C, 0.0f));
        }
        query = rng.uniform_vector(C, -1, 1);
        token_query = rng.uniform_vector(N * C, -0.7f, 0.7f);
        norm_weight = rng.signed_vector(C, 0.5f, 1.5f);
        for (size_t i : uses) {
            sources.push_back(tensors[i].data());
            dsources.push_back(dtensors[i].data());
        }
    }
    size_t n() const { return uses.size(); }
    const float* rows() const { return sw.token_query ? token_query.data() : nullptr; }
    const float* gain() const { return sw.key_norm ? norm_weight.data() : nullptr; }
    void forward(Vec& out, Vec& alpha, Vec& key_rstd) const {
        depth_attention_variant_forward(out.data(), alpha.data(), key_rstd.data(), sources.data(),
                                        query.data(), rows(), gain(), n(), N, C, sw.heads,
                                        sw.sigmoid);
    }
    void backward(Vec& dquery, Vec& dtoken_query, Vec& dnorm_weight, const Vec& dout,
                  const Vec& alpha, const Vec& key_rstd) const {
        depth_attention_variant_backward(dsources.data(), dquery.data(),
                                         sw.token_query ? dtoken_query.data() : nullptr,
                                         sw.key_norm ? dnorm_weight.data() : nullptr, dout.data(),
                                         alpha.data(), key_rstd.data(), sources.data(),
                                         query.data(), rows(), gain(), n(), N, C, sw.heads,
                                         sw.sigmoid);
    }
};

// SPEC's definition in double: per row and head, q = w + u_n, s_i = (q * g) . V_i * r_i over
// the head's channels (r = 1, g = 1 without the key norm), softmax or sigmoid, out = sum alpha V
void variant_reference(std::vector<double>& out, std::vector<double>& alpha, const VariantCase& vc) {
    size_t N = vc.N, C = vc.C, S = vc.n(), K = vc.sw.heads, Ck = C / K;
    out.assign(N * C, 0.0);
    alpha.assign(N * S * K, 0.0);
    for (size_t n = 0; n < N; n++) {
        for (size_t k = 0; k < K; k++) {
            std::vector<double> a(S);
            for (size_t i = 0; i < S; i++) {
                const float* v = vc.sources[i] + n * C + k * Ck;
                double ms = 0.0, s = 0.0;
                for (size_t c = 0; c < Ck; c++) ms += (double)v[c] * v[c];
                double r = vc.sw.key_norm ? 1.0 / std::sqrt(ms / Ck + (double)RMSNORM_EPS) : 1.0;
                for (size_t c = 0; c < Ck; c++) {
                    size_t cc = k * Ck + c;
                    double q = (double)vc.query[cc] + (vc.sw.token_query ? vc.token_query[n * C + cc] : 0.0);
                    double g = vc.sw.key_norm ? vc.norm_weight[cc] : 1.0;
                    s += q * g * v[c] * r;
                }
                a[i] = s;
            }
            if (vc.sw.sigmoid) {
                for (double& x : a) x = 1.0 / (1.0 + std::exp(-x));
            } else {
                double m = *std::max_element(a.begin(), a.end()), sum = 0.0;
                for (double& x : a) sum += (x = std::exp(x - m));
                for (double& x : a) x /= sum;
            }
            for (size_t i = 0; i < S; i++) {
                alpha[(n * S + i) * K + k] = a[i];
                for (size_t c = 0; c < Ck; c++)
                    out[n * C + k * Ck + c] += a[i] * vc.sources[i][n * C + k * Ck + c];
            }
        }
    }
}

}  // namespace

TEST_CASE("variant depth attention forward matches SPEC in double, every combination of switches") {
    const size_t N = 5, C = 8;
    for (const Switches& sw : every_combination(C)) {
        CAPTURE(sw.name());
        Rng rng(201);
        VariantCase vc(N, C, sw, {0, 1, 2}, rng);
        Vec out(N * C), alpha(N * vc.n() * sw.heads), key_rstd(N * vc.n() * sw.heads);
        vc.forward(out, alpha, key_rstd);
        std::vector<double> out_ref, alpha_ref;
        variant_reference(out_ref, alpha_ref, vc);
        compare_within("out", out.data(), out_ref.data(), N * C, VARIANT_FORWARD_TOL);
        compare_within("alpha", alpha.data(), alpha_ref.data(), alpha.size(), VARIANT_FORWARD_TOL);
    }
}

TEST_CASE("variant depth attention backward matches finite differences, every combination of switches") {
    size_t N = 0, C = 0;
    std::vector<size_t> uses;
    SUBCASE("1 source") { N = 2; C = 4; uses = {0}; }
    SUBCASE("3 sources") { N = 3; C = 8; uses = {0, 1, 2}; }
    SUBCASE("3 sources, the first tensor passed twice") { N = 3; C = 8; uses = {0, 1, 0}; }
    SUBCASE("3 sources, N=37: three tiles of rows, their sums added") { N = 37; C = 4; uses = {0, 1, 2}; }
    CAPTURE(N);
    CAPTURE(uses.size());
    for (const Switches& sw : every_combination(C)) {
        CAPTURE(sw.name());
        Rng rng(202);
        VariantCase vc(N, C, sw, uses, rng);
        size_t n = vc.n();
        Vec R = rng.uniform_vector(N * C, -1, 1), out(N * C), alpha(N * n * sw.heads),
            key_rstd(N * n * sw.heads);
        Vec dquery(C, 0.0f), dtoken_query(N * C, 0.0f), dnorm_weight(C, 0.0f);
        vc.forward(out, alpha, key_rstd);
        vc.backward(dquery, dtoken_query, dnorm_weight, R, alpha, key_rstd);
        auto loss = [&] {
            vc.forward(out, alpha, key_rstd);
            return weighted_sum(R.data(), out.data(), N * C);
        };
        for (size_t i = 0; i < vc.tensors.size(); i++)
            check_gradient("source tensor " + std::to_string(i), vc.tensors[i].data(),
                           vc.dtensors[i].data(), N * C, loss, VARIANT_STEP, VARIANT_GRAD_TOL);
        check_gradient("query", vc.query.data(), dquery.data(), C, loss, VARIANT_STEP, VARIANT_GRAD_TOL);
        if (sw.token_query)
            check_gradient("token_query", vc.token_query.data(), dtoken_query.data(), N * C, loss,
                           VARIANT_STEP, VARIANT_GRAD_TOL);
        if (sw.key_norm)
            check_gradient("norm_weight", vc.norm_weight.data(), dnorm_weight.data(), C, loss,
                           VARIANT_STEP, VARIANT_GRAD_TOL);
    }
}

TEST_CASE("variant depth attention backward adds into its gradients") {
    const size_t N = 4, C = 8;
    for (const Switches& sw : every_combination(C)) {
        CAPTURE(sw.name());
        Rng rng(203);
        VariantCase vc(N, C, sw, {0, 1}, rng);
        Vec R = rng.uniform_vector(N * C, -1, 1), out(N * C), alpha(N * 2 * sw.heads),
            key_rstd(N * 2 * sw.heads);
        vc.forward(out, alpha, key_rstd);
        Vec dq0(C, 0.0f), dr0(N * C, 0.0f), dg0(C, 0.0f);
        vc.backward(dq0, dr0, dg0, R, alpha, key_rstd);
        std::vector<Vec> once = vc.dtensors;
        // again on top of random contents R0: must give R0 + the first result
        Vec dq = rng.uniform_vector(C, -1, 1), dr = rng.uniform_vector(N * C, -1, 1),
            dg = rng.uniform_vector(C, -1, 1);
        Vec dq_start = dq, dr_start = dr, dg_start = dg;
        std::vector<Vec> start;
        for (Vec& t : vc.dtensors) {  // in place: vc.dsources points into these
            Vec p = rng.uniform_vector(N * C, -1, 1);
            std::copy(p.begin(), p.end(), t.begin());
            start.push_back(p);
        }
        vc.backward(dq, dr, dg, R, alpha, key_rstd);
        auto expect_sum = [](const std::string& name, const Vec& got, const Vec& p, const Vec& g) {
            std::vector<double> sum(got.size());
            for (size_t i = 0; i < got.size(); i++) sum[i] = (double)p[i] + g[i];
            compare_within(name, got.data(), sum.data(), got.size(), ACCUMULATE_TOL);
        };
        for (size_t i = 0; i < vc.dtensors.size(); i++)
            expect_sum("dsource " + std::to_string(i), vc.dtensors[i], start[i], once[i]);
        expect_sum("dquery", dq, dq_start, dq0);
        if (sw.token_query) expect_sum("dtoken_query", dr, dr_start, dr0);
        if (sw.key_norm) expect_sum("dnorm_weight", dg, dg_start, dg0);
    }
}

TEST_CASE("the variant operator with every switch off is depth_attention.c, bit for bit") {
    const size_t N = 37, C = 16;
    Rng rng(204);
    VariantCase vc(N, C, {1, 0, 1, 0}, {0, 1, 2, 1}, rng);
    size_t n = vc.n();
    Vec out(N * C), alpha(N * n), key_rstd(N * n), out2(N * C), alpha2(N * n), key_rstd2(N * n);
    vc.forward(out, alpha, key_rstd);
    depth_attention_forward(out2.data(), alpha2.data(), key_rstd2.data(), vc.sources.data(),
                            vc.query.data(), vc.norm_weight.data(), n, N, C);
    compare_exact("out", out.data(), out2.data(), N * C);
    compare_exact("alpha", alpha.data(), alpha2.data(), N * n);
    compare_exact("key_rstd", key_rstd.data(), key_rstd2.data(), N * n);
}

TEST_CASE("sigmoid weights are 1/2 at a zero query, with no normaliser: out = (sum of the sources) / 2") {
    const size_t N = 3, C = 8;
    for (size_t heads : {(size_t)1, (size_t)4}) {
        Rng rng(205);
        VariantCase vc(N, C, {heads, 1, 1, 0}, {0, 1, 2}, rng);
        std::fill(vc.query.begin(), vc.query.end(), 0.0f);
        Vec out(N * C), alpha(N * 3 * heads), key_rstd(N * 3 * heads);
        vc.forward(out, alpha, key_rstd);
        for (float a : alpha) CHECK(a == 0.5f);
        std::vector<double> half_sum(N * C);
        for (size_t j = 0; j < N * C; j++)
            half_sum[j] = 0.5 * ((double)vc.tensors[0][j] + vc.tensors[1][j] + vc.tensors[2][j]);
        compare_within("out", out.data(), half_sum.data(), N * C, VARIANT_FORWARD_TOL);
    }
}

// ---- the mixings ---------------------------------------------------------------------------

TEST_CASE("static mixing and DenseFormer: forward against SPEC, backward against finite differences") {
    size_t N = 0, C = 0;
    std::vector<size_t> uses;
    SUBCASE("1 source") { N = 2; C = 4; uses = {0}; }
    SUBCASE("4 sources, the second tensor passed twice") { N = 3; C = 5; uses = {0, 1, 2, 1}; }
    SUBCASE("3 sources, N=37: three tiles of rows") { N = 37; C = 4; uses = {0, 1, 2}; }
    for (int normalise = 0; normalise < 2; normalise++) {
        CAPTURE(normalise);
        Rng rng(206);
        VariantCase vc(N, C, {1, 0, 1, 0}, uses, rng);
        size_t n = vc.n();
        Vec coefficients = rng.uniform_vector(n, -1.5f, 1.5f), dcoefficients(n, 0.0f);
        Vec weights(n), out(N * C), R = rng.uniform_vector(N * C, -1, 1);
        auto forward = [&] {
            depth_mixing_forward(out.data(), weights.data(), vc.sources.data(), coefficients.data(),
                                 n, N, C, normalise);
        };
        forward();
        // SPEC: weight = softmax(c) (static) or c (dense); out = sum_i weight_i V_i
        std::vector<double> w(n), out_ref(N * C, 0.0);
        double m = *std::max_element(coefficients.begin(), coefficients.end()), sum = 0.0;
        for (size_t i = 0; i < n; i++) sum += (w[i] = normalise ? std::exp(coefficients[i] - m) : coefficients[i]);
        for (size_t i = 0; i < n; i++) {
            if (normalise) w[i] /= sum;
            for (size_t j = 0; j < N * C; j++) out_ref[j] += w[i] * vc.sources[i][j];
        }
        compare_within("weights", weights.data(), w.data(), n, VARIANT_FORWARD_TOL);
        compare_within("out", out.data(), out_ref.data(), N * C, VARIANT_FORWARD_TOL);
        depth_mixing_backward(vc.dsources.data(), dcoefficients.data(), R.data(), weights.data(),
                              vc.sources.data(), n, N, C, normalise);
        auto loss = [&] {
            forward();
            return weighted_sum(R.data(), out.data(), N * C);
        };
        for (size_t i = 0; i < vc.tensors.size(); i++)
            check_gradient("source tensor " + std::to_string(i), vc.tensors[i].data(),
                           vc.dtensors[i].data(), N * C, loss, MIXING_STEP, MIXING_GRAD_TOL);
        check_gradient("coefficients", coefficients.data(), dcoefficients.data(), n, loss,
                       MIXING_STEP / 4, MIXING_GRAD_TOL);
    }
}

TEST_CASE("static mixing at zero logits is the mean of the sources; DenseFormer at ones their sum") {
    const size_t N = 3, C = 6, n = 4;
    Rng rng(207);
    VariantCase vc(N, C, {1, 0, 1, 0}, {0, 1, 2, 3}, rng);
    Vec weights(n), out(N * C);
    Vec zeros(n, 0.0f), ones(n, 1.0f);
    depth_mixing_forward(out.data(), weights.data(), vc.sources.data(), zeros.data(), n, N, C, 1);
    for (float w : weights) CHECK(w == 0.25f);
    std::vector<double> mean(N * C, 0.0), sum(N * C, 0.0);
    for (size_t i = 0; i < n; i++)
        for (size_t j = 0; j < N * C; j++) sum[j] += vc.tensors[i][j];
    for (size_t j = 0; j < N * C; j++) mean[j] = sum[j] / n;
    compare_within("static mixing at zero logits", out.data(), mean.data(), N * C, VARIANT_FORWARD_TOL);
    depth_mixing_forward(out.data(), weights.data(), vc.sources.data(), ones.data(), n, N, C, 0);
    // in order, weight 1: exactly the sum the PreNorm stream forms, h + f_0 + f_1 + ...
    Vec running(N * C, 0.0f);
    for (size_t i = 0; i < n; i++)
        for (size_t j = 0; j < N * C; j++) running[j] += vc.tensors[i][j];
    compare_exact("DenseFormer at ones", out.data(), running.data(), N * C);
}
