// test_mhc.cpp — mHC-lite's operators (src/mhc.c): every backward against central finite
// differences over every element, for m = 2, 3, 4 streams; the permutation table; H doubly
// stochastic; the accumulate (+=) contract of every backward.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "gradcheck.h"
#include "layers.h"

using gradcheck::check_gradient;
using gradcheck::compare_within;
using gradcheck::Rng;
using gradcheck::Tolerance;
using gradcheck::weighted_sum;

typedef std::vector<float> Vec;

// Beside each tolerance: the largest error of the correct operators over m = 2, 3, 4, as
// printed with GRADCHECK_VERBOSE=1; dropping any one term of a backward errs by 1e-2 or more.
static const float MHC_LINEAR_STEP = 0.25f;
static const Tolerance MHC_LINEAR_TOL = {2e-6, 1e-6};  // max error 4.3e-7
static const float MHC_STEP = 2e-2f;
static const Tolerance MHC_INPUT_TOL = {5e-5, 1e-5};   // max error 2.3e-5
// forward against double precision: a few roundings of O(1) values
static const Tolerance MHC_FORWARD_TOL = {1e-6, 2e-6};
// a backward run twice adds twice (the rounding of a second addition on a non-zero buffer)
static const Tolerance MHC_ACCUMULATE_TOL = {1e-5, 1e-6};

namespace {

// One m-stream case: streams X (N, m*d), the sub-layer's output f (N, d) and the parameters
// of mhc_input_forward with random values (Phi's init is 0; random makes every term count).
struct MhcCase {
    size_t N, d, m, R, E, W;
    Vec X, f, norm_weight, proj, bias, scale;
    Vec u, mix, e, z, rstd, Xnext;
    MhcCase(size_t N_, size_t d_, size_t m_, Rng& rng) : N(N_), d(d_), m(m_) {
        R = mhc_permutation_table(nullptr, m);
        E = 2 * m + R;
        W = MHC_MIX_WIDTH(m);
        X = rng.uniform_vector(N * m * d, -1, 1);
        f = rng.uniform_vector(N * d, -1, 1);
        norm_weight = rng.signed_vector(m * d, 0.5f, 1.5f);
        proj = rng.uniform_vector(E * m * d, -0.5f, 0.5f);
        bias = rng.uniform_vector(E, -1, 1);
        scale = rng.signed_vector(3, 0.5f, 1.5f);
        u.assign(N * d, 0.0f);
        mix.assign(N * W, 0.0f);
        e.assign(N * E, 0.0f);
        z.assign(N * m * d, 0.0f);
        rstd.assign(N, 0.0f);
        Xnext.assign(N * m * d, 0.0f);
    }
    void input_forward() {
        mhc_input_forward(u.data(), mix.data(), e.data(), z.data(), rstd.data(), X.data(),
                          params(), N, d, m);
    }
    void output_forward() { mhc_output_forward(Xnext.data(), X.data(), f.data(), mix.data(), N, d, m); }
    MhcParams params() { return {norm_weight.data(), proj.data(), bias.data(), scale.data()}; }
};

// The gradients of one MhcCase's backward, zeroed (de and dz: scratch), and the calls that
// fill them
struct MhcGrads {
    Vec dX, df, dmix, dnorm, dproj, dbias, dscale, de, dz;
    explicit MhcGrads(const MhcCase& c)
        : dX(c.X.size(), 0.0f), df(c.f.size(), 0.0f), dmix(c.mix.size(), 0.0f),
          dnorm(c.m * c.d, 0.0f), dproj(c.proj.size(), 0.0f), dbias(c.E, 0.0f), dscale(3, 0.0f),
          de(c.N * c.E, 7.0f), dz(c.X.size(), 7.0f) {}
    void output_backward(const MhcCase& c, const Vec& dnext) {
        mhc_output_backward(dX.data(), df.data(), dmix.data(), dnext.data(), c.X.data(),
                            c.f.data(), c.mix.data(), c.N, c.d, c.m);
    }
    void input_backward(MhcCase& c, const Vec& du) {
        MhcParams grads = {dnorm.data(), dproj.data(), dbias.data(), dscale.data()};
        mhc_input_backward(dX.data(), grads, dmix.data(), de.data(), dz.data(), du.data(),
                           c.X.data(), c.z.data(), c.rstd.data(), c.e.data(), c.mix.data(),
                           c.params(), c.N, c.d, c.m);
    }
    // the streams' and every parameter's gradient against finite differences of loss
    void check_input_gradients(MhcCase& c, const std::function<double()>& loss) {
        check_gradient("X", c.X.data(), dX.data(), dX.size(), loss, MHC_STEP, MHC_INPUT_TOL);
        check_gradient("norm_weight", c.norm_weight.data(), dnorm.data(), dnorm.size(), loss,
                       MHC_STEP, MHC_INPUT_TOL);
        check_gradient("proj", c.proj.data(), dproj.data(), dproj.size(), loss, MHC_STEP,
                       MHC_INPUT_TOL);
        check_gradient("bias", c.bias.data(), dbias.data(), dbias.size(), loss, MHC_STEP,
                       MHC_INPUT_TOL);
        check_gradient("scale", c.scale.data(), dscale.data(), dscale.size(), loss, MHC_STEP,
                       MHC_INPUT_TOL);
    }
};

// the parts of a row's coefficient vector
size_t post_at(const MhcCase& c) { return c.m + c.R; }
size_t h_at(const MhcCase& c) { return 2 * c.m + c.R; }

}  // namespace

TEST_CASE("the permutation table lists the m! permutations in lexicographic order, the identity first") {
    int perms[MHC_MAX_PERMUTATIONS * MHC_MAX_STREAMS];
    CHECK(mhc_permutation_table(nullptr, 2) == 2);
    CHECK(mhc_permutation_table(nullptr, 3) == 6);
    CHECK(mhc_permutation_table(nullptr, 4) == 24);
    for (size_t m : {2u, 3u, 4u}) {
        CAPTURE(m);
        size_t R = mhc_permutation_table(perms, m);
        std::vector<int> expected(m);
        for (size_t i = 0; i < m; i++) expected[i] = (int)i;
        for (size_t r = 0; r < R; r++) {
            CAPTURE(r);
            CHECK(std::equal(expected.begin(), expected.end(), perms + r * m));
            std::next_permutation(expected.begin(), expected.end());
        }
    }
}

TEST_CASE("mHC-lite's H is doubly stochastic, a_pre in (0,1), a_post in (0,2), u the a_pre-weighted sum") {
    for (size_t m : {2u, 3u, 4u}) {
        CAPTURE(m);
        Rng rng(300 + m);
        MhcCase c(3, 5, m, rng);
        c.input_forward();
        for (size_t n = 0; n < c.N; n++) {
            const float* row = &c.mix[n * c.W];
            for (size_t s = 0; s < m; s++) {
                CHECK(row[s] > 0.0f);
                CHECK(row[s] < 1.0f);
                CHECK(row[post_at(c) + s] > 0.0f);
                CHECK(row[post_at(c) + s] < 2.0f);
                double row_sum = 0.0, column_sum = 0.0;
                for (size_t t = 0; t < m; t++) {
                    row_sum += row[h_at(c) + s * m + t];
                    column_sum += row[h_at(c) + t * m + s];
                }
                CHECK(row_sum == doctest::Approx(1.0).epsilon(1e-6));
                CHECK(column_sum == doctest::Approx(1.0).epsilon(1e-6));
            }
            for (size_t k = 0; k < c.d; k++) {
                double u = 0.0;
                for (size_t s = 0; s < m; s++) u += (double)row[s] * c.X[(n * m + s) * c.d + k];
                CHECK(c.u[n * c.d + k] == doctest::Approx(u).epsilon(1e-6));
            }
        }
    }
}

TEST_CASE("mHC-lite's forward matches a double-precision reference of SPEC") {
    for (size_t m : {2u, 3u, 4u}) {
        CAPTURE(m);
        Rng rng(360 + m);
        MhcCase c(3, 5, m, rng);
        c.input_forward();
        c.output_forward();
        int perms[MHC_MAX_PERMUTATIONS * MHC_MAX_STREAMS];
        mhc_permutation_table(perms, m);
        size_t N = c.N, d = c.d, R = c.R, E = c.E, md = m * d;
        std::vector<double> mix(N * c.W), u(N * d), next(N * md);
        for (size_t n = 0; n < N; n++) {
            const float* x = &c.X[n * md];
            double mean_square = 0.0;
            for (size_t i = 0; i < md; i++) mean_square += (double)x[i] * x[i];
            double r = 1.0 / std::sqrt(mean_square / md + (double)RMSNORM_EPS);
            std::vector<double> p(E);
            for (size_t k = 0; k < E; k++) {
                double e = 0.0;
                for (size_t i = 0; i < md; i++) e += c.norm_weight[i] * x[i] * r * c.proj[k * md + i];
                size_t group = k < m ? 0 : k < m + R ? 1 : 2;
                p[k] = c.scale[group] * e + c.bias[k];
            }
            double* row = &mix[n * c.W];
            double max_logit = -INFINITY, sum = 0.0;
            for (size_t k = m; k < m + R; k++) max_logit = std::max(max_logit, p[k]);
            for (size_t k = m; k < m + R; k++) sum += std::exp(p[k] - max_logit);
            for (size_t s = 0; s < m; s++) row[s] = 1.0 / (1.0 + std::exp(-p[s]));
            for (size_t k = 0; k < R; k++) row[m + k] = std::exp(p[m + k] - max_logit) / sum;
            for (size_t t = 0; t < m; t++) row[m + R + t] = 2.0 / (1.0 + std::exp(-p[m + R + t]));
            for (size_t k = 0; k < R; k++)
                for (size_t i = 0; i < m; i++) row[h_at(c) + i * m + perms[k * m + i]] += row[m + k];
            for (size_t k = 0; k < d; k++) {
                for (size_t s = 0; s < m; s++) u[n * d + k] += row[s] * x[s * d + k];
                for (size_t t = 0; t < m; t++) {
                    double v = row[m + R + t] * c.f[n * d + k];
                    for (size_t s = 0; s < m; s++) v += row[h_at(c) + s * m + t] * x[s * d + k];
                    next[n * md + t * d + k] = v;
                }
            }
        }
        compare_within("mix", c.mix.data(), mix.data(), mix.size(), MHC_FORWARD_TOL);
        compare_within("u", c.u.data(), u.data(), u.size(), MHC_FORWARD_TOL);
        compare_within("Xnext", c.Xnext.data(), next.data(), next.size(), MHC_FORWARD_TOL);
        Vec sum(N * d), streams(N * md);
        mhc_reduce_forward(sum.data(), c.X.data(), N, d, m);
        mhc_expand_forward(streams.data(), c.f.data(), N, d, m);
        for (size_t n = 0; n < N; n++)
            for (size_t k = 0; k < d; k++) {
                double total = 0.0;
                for (size_t s = 0; s < m; s++) {
                    total += c.X[n * md + s * d + k];
                    CHECK(streams[n * md + s * d + k] == c.f[n * d + k]);
                }
                CHECK(sum[n * d + k] == doctest::Approx(total).epsilon(1e-6));
            }
    }
}

TEST_CASE("mHC-lite's stream expand and reduce backwards match finite differences") {
    for (size_t m : {2u, 3u, 4u}) {
        CAPTURE(m);
        size_t N = 3, d = 5;
        Rng rng(310 + m);
        Vec x0 = rng.uniform_vector(N * d, -1, 1), X = rng.uniform_vector(N * m * d, -1, 1);
        Vec R_streams = rng.uniform_vector(N * m * d, -1, 1), R_sum = rng.uniform_vector(N * d, -1, 1);
        Vec streams(N * m * d), sum(N * d), dx0(N * d, 0.0f), dX(N * m * d, 0.0f);
        mhc_expand_backward(dx0.data(), R_streams.data(), N, d, m);
        check_gradient("x0", x0.data(), dx0.data(), N * d, [&] {
            mhc_expand_forward(streams.data(), x0.data(), N, d, m);
            return weighted_sum(R_streams.data(), streams.data(), N * m * d);
        }, MHC_LINEAR_STEP, MHC_LINEAR_TOL);
        mhc_reduce_backward(dX.data(), R_sum.data(), N, d, m);
        check_gradient("X", X.data(), dX.data(), N * m * d, [&] {
            mhc_reduce_forward(sum.data(), X.data(), N, d, m);
            return weighted_sum(R_sum.data(), sum.data(), N * d);
        }, MHC_LINEAR_STEP, MHC_LINEAR_TOL);
    }
}

TEST_CASE("mHC-lite's output backward matches finite differences, for the streams, f, H and a_post") {
    for (size_t m : {2u, 3u, 4u}) {
        CAPTURE(m);
        Rng rng(320 + m);
        MhcCase c(3, 5, m, rng);
        c.input_forward();  // a real mix: then H and a_post are perturbed as inputs
        Vec R = rng.uniform_vector(c.N * m * c.d, -1, 1);
        Vec dX(c.X.size(), 0.0f), df(c.f.size(), 0.0f), dmix(c.mix.size(), 0.0f);
        mhc_output_backward(dX.data(), df.data(), dmix.data(), R.data(), c.X.data(), c.f.data(),
                            c.mix.data(), c.N, c.d, m);
        auto loss = [&] {
            c.output_forward();
            return weighted_sum(R.data(), c.Xnext.data(), R.size());
        };
        check_gradient("X", c.X.data(), dX.data(), dX.size(), loss, MHC_LINEAR_STEP, MHC_LINEAR_TOL);
        check_gradient("f", c.f.data(), df.data(), df.size(), loss, MHC_LINEAR_STEP, MHC_LINEAR_TOL);
        for (size_t n = 0; n < c.N; n++) {  // the a_post and H parts of every row
            size_t at = n * c.W + post_at(c), count = m + m * m;
            check_gradient("mix[" + std::to_string(n) + "] post and H", &c.mix[at], &dmix[at],
                           count, loss, MHC_LINEAR_STEP, MHC_LINEAR_TOL);
        }
    }
}

TEST_CASE("mHC-lite's input backward matches finite differences, for the streams and every parameter") {
    for (size_t m : {2u, 3u, 4u}) {
        CAPTURE(m);
        Rng rng(330 + m);
        MhcCase c(3, 5, m, rng);
        // L = R_u . u + R_mix . (a_post and H): the gradients mhc_output_backward would hand in
        Vec R_u = rng.uniform_vector(c.N * c.d, -1, 1), R_mix(c.N * c.W, 0.0f);
        for (size_t n = 0; n < c.N; n++)
            for (size_t k = post_at(c); k < c.W; k++) R_mix[n * c.W + k] = rng.uniform(-1, 1);
        c.input_forward();
        MhcGrads g(c);
        g.dmix = R_mix;
        g.input_backward(c, R_u);
        g.check_input_gradients(c, [&] {
            c.input_forward();
            return weighted_sum(R_u.data(), c.u.data(), R_u.size()) +
                   weighted_sum(R_mix.data(), c.mix.data(), R_mix.size());
        });
    }
}

TEST_CASE("mHC-lite's input and output in sequence match finite differences, as a sub-layer uses them") {
    for (size_t m : {2u, 3u, 4u}) {
        CAPTURE(m);
        Rng rng(340 + m);
        MhcCase c(2, 4, m, rng);
        // f = u * Fw elementwise stands in for the sub-layer, so the streams reach Xnext
        // through u as well as through the mixing
        Vec Fw = rng.uniform_vector(c.N * c.d, -1, 1);
        Vec R_next = rng.uniform_vector(c.N * m * c.d, -1, 1);
        auto forward = [&] {
            c.input_forward();
            for (size_t i = 0; i < c.f.size(); i++) c.f[i] = c.u[i] * Fw[i];
            c.output_forward();
        };
        forward();
        MhcGrads g(c);
        g.output_backward(c, R_next);
        Vec du(c.u.size());
        for (size_t i = 0; i < du.size(); i++) du[i] = g.df[i] * Fw[i];
        g.input_backward(c, du);
        g.check_input_gradients(c, [&] {
            forward();
            return weighted_sum(R_next.data(), c.Xnext.data(), R_next.size());
        });
    }
}

TEST_CASE("every mHC-lite backward accumulates into its gradients (+=), never overwrites them") {
    size_t m = 3;
    Rng rng(350);
    MhcCase c(3, 5, m, rng);
    c.input_forward();
    Vec R_u = rng.uniform_vector(c.N * c.d, -1, 1), R_next = rng.uniform_vector(c.N * m * c.d, -1, 1);
    Vec R_sum = rng.uniform_vector(c.N * c.d, -1, 1);
    MhcGrads g(c);
    Vec dx0(c.N * c.d);
    // run twice from zero: every gradient doubles
    auto twice = [&](const char* name, std::vector<Vec*> grads, const std::function<void()>& backward) {
        INFO(name);
        for (Vec* g : grads) std::fill(g->begin(), g->end(), 0.0f);
        backward();
        std::vector<Vec> once;
        for (Vec* g : grads) once.push_back(*g);
        backward();
        for (size_t i = 0; i < grads.size(); i++) {
            float largest = 0.0f;
            for (float x : once[i]) largest = std::max(largest, std::fabs(x));
            CHECK_MESSAGE(largest > 0.01f, "gradient " << i << " is (almost) zero");
            std::vector<double> doubled(once[i].begin(), once[i].end());
            for (double& x : doubled) x *= 2.0;
            compare_within(std::string(name) + " gradient " + std::to_string(i),
                           grads[i]->data(), doubled.data(), doubled.size(), MHC_ACCUMULATE_TOL);
        }
    };
    twice("expand", {&dx0}, [&] { mhc_expand_backward(dx0.data(), R_next.data(), c.N, c.d, m); });
    twice("reduce", {&g.dX}, [&] { mhc_reduce_backward(g.dX.data(), R_sum.data(), c.N, c.d, m); });
    twice("output", {&g.dX, &g.df}, [&] { g.output_backward(c, R_next); });
    twice("input", {&g.dX, &g.dnorm, &g.dproj, &g.dbias, &g.dscale}, [&] { g.input_backward(c, R_u); });
}

TEST_CASE("mHC-lite with every stream equal (the first sub-layer) gives pi's logits exactly zero gradient") {
    for (size_t m : {2u, 3u, 4u}) {
        CAPTURE(m);
        Rng rng(370 + m);
        MhcCase c(3, 5, m, rng);
        for (size_t n = 0; n < c.N; n++)  // X_s = X_0 for every s, as mhc_expand_forward leaves them
            for (size_t s = 1; s < m; s++)
                for (size_t k = 0; k < c.d; k++) c.X[(n * m + s) * c.d + k] = c.X[n * m * c.d + k];
        c.input_forward();
        c.output_forward();
        Vec R = rng.uniform_vector(c.N * m * c.d, -1, 1), R_u = rng.uniform_vector(c.N * c.d, -1, 1);
        MhcGrads g(c);
        g.output_backward(c, R);
        g.input_backward(c, R_u);
        const Vec &dbias = g.dbias, &dscale = g.dscale, &de = g.de;
        // H mixes equal streams into equal streams whatever pi is: no gradient reaches pi's
        // logits, and the sums that say so cancel exactly
        for (size_t r = 0; r < c.R; r++) CHECK(dbias[m + r] == 0.0f);
        CHECK(dscale[1] == 0.0f);
        for (size_t n = 0; n < c.N; n++)
            for (size_t r = 0; r < c.R; r++) CHECK(de[n * c.E + m + r] == 0.0f);
        // and the pre and post logits do get gradient
        CHECK(std::fabs(dbias[0]) > 0.0f);
        CHECK(std::fabs(dbias[m + c.R]) > 0.0f);
    }
}
