// test_attention.cpp — the causal attention (attention.c): its backward against central finite
// differences across several key tiles, its tiled forward against the online query
// (attention_query_online) bit for bit and against the definition (attention_query) and a
// double-precision reference of SPEC.md (out and lse), overflow safety, and the lse that the
// backward's recomputed probabilities rest on.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "gradcheck.h"
#include "layers.h"
#include "matmul_tile.h"  // TILE_ROWS, TILE_COLS

using gradcheck::check_gradient;
using gradcheck::compare_exact;
using gradcheck::compare_within;
using gradcheck::Rng;
using gradcheck::Tolerance;
using gradcheck::weighted_sum;

typedef std::vector<float> Vec;

// As test_layers.cpp's (its steps and tolerances say how they were set), with the errors
// measured here (GRADCHECK_VERBOSE=1): the finite differences, max error 1.4e-5 (dk at T = 33;
// 9.5e-6 at T = 71), where the analytic gradients agree with the materialised version's
// (dev/bench/attention_v1_materialised.c) to 4e-7 relative: the finite differences' losses
// carry the online softmax's roundings; a forward against the double reference (max error
// 1.4e-7 on out, 4.2e-7 on lse); huge scores (below).
static const float ATTENTION_STEP = 5e-2f;
static const Tolerance ATTENTION_GRAD_TOL = {2e-5, 1e-5};
static const Tolerance FORWARD_TOL = {1e-6, 2e-6};
static const Tolerance HUGE_SCORE_TOL = {1e-5, 1e-5};
// The online softmax against the whole-row one (attention_query): the same scores, but each
// output is a sum of per-tile parts, each rescaled by e^{m_tile - m} at every later merge and
// divided once by l at the end, where attention_query divides each probability by its sum
// first: a few roundings of numbers below 1 per merge, at most 4 key tiles here (7 of 16). Max error
// 2.4e-7 on outputs below 1 (gcc 12, AVX-512); a dropped rescale or a missing tile errs by O(1).
static const Tolerance ONLINE_TOL = {1e-6, 1e-6};

namespace {

Vec nan_vector(size_t n) { return Vec(n, std::numeric_limits<float>::quiet_NaN()); }

// SPEC's attention in double: out (B,T,H*hs) and lse (B,H,T) = log sum_t' e^{s_t'}
void attention_reference(std::vector<double>& out, std::vector<double>& lse, const Vec& q,
                         const Vec& k, const Vec& v, size_t B, size_t T, size_t H, size_t G,
                         size_t hs) {
    out.assign(B * T * H * hs, 0.0);
    lse.assign(B * H * T, 0.0);
    std::vector<double> row(T);
    for (size_t b = 0; b < B; b++)
        for (size_t h = 0; h < H; h++) {
            size_t g = h / (H / G);
            for (size_t t = 0; t < T; t++) {
                const float* qt = &q[(b * T + t) * H * hs + h * hs];
                double max_score = -INFINITY, sum = 0.0;
                for (size_t u = 0; u <= t; u++) {
                    const float* ku = &k[(b * T + u) * G * hs + g * hs];
                    double score = 0.0;
                    for (size_t c = 0; c < hs; c++) score += (double)qt[c] * ku[c];
                    row[u] = score / std::sqrt((double)hs);
                    max_score = std::max(max_score, row[u]);
                }
                for (size_t u = 0; u <= t; u++) sum += (row[u] = std::exp(row[u] - max_score));
                lse[(b * H + h) * T + t] = max_score + std::log(sum);
                for (size_t u = 0; u <= t; u++) {
                    const float* vu = &v[(b * T + u) * G * hs + g * hs];
                    for (size_t c = 0; c < hs; c++)
                        out[(b * T + t) * H * hs + h * hs + c] += row[u] / sum * vu[c];
                }
            }
        }
}

struct Shape {
    size_t B, T, H, G, hs;
};

}  // namespace

TEST_CASE("attention backward matches finite differences (causal; MHA, GQA, MQA; several key tiles)") {
    size_t B = 0, T = 0, H = 0, G = 0, hs = 0;
    SUBCASE("B=1 T=5 H=4 G=2 hs=4") { B = 1; T = 5; H = 4; G = 2; hs = 4; }
    SUBCASE("B=2 T=7 H=4 G=1 hs=2") { B = 2; T = 7; H = 4; G = 1; hs = 2; }
    SUBCASE("B=2 T=5 H=2 G=2 hs=4") { B = 2; T = 5; H = 2; G = 2; hs = 4; }
    SUBCASE("B=2 T=7 H=6 G=3 hs=6") { B = 2; T = 7; H = 6; G = 3; hs = 6; }
    SUBCASE("B=2 T=1 H=2 G=1 hs=2") { B = 2; T = 1; H = 2; G = 1; hs = 2; }
    // past the tiles of attention.c (TILE_ROWS queries, TILE_COLS keys or dimensions), with
    // edge tiles in every product: 19 = 3 x 6 + 1 queries, 20 = 16 + 4 dimensions
    SUBCASE("B=1 T=19 H=2 G=1 hs=20") { B = 1; T = 19; H = 2; G = 1; hs = 20; }
    SUBCASE("B=2 T=33 H=4 G=2 hs=16") { B = 2; T = 33; H = 4; G = 2; hs = 16; }
    // a head wider than the AVX-512 tile's 32 columns: an edge tile of dimensions there too
    SUBCASE("B=1 T=19 H=2 G=1 hs=40") { B = 1; T = 19; H = 2; G = 1; hs = 40; }
    // several key tiles and a ragged last one (71 = 2 x 32 + 7 = 4 x 16 + 7 keys; 71 = 5 x 12
    // + 11 = 11 x 6 + 5 queries), each head layout: one kv head per query head (MHA), one per
    // two (GQA), one for all (MQA)
    SUBCASE("B=1 T=71 H=2 G=2 hs=8, MHA") { B = 1; T = 71; H = 2; G = 2; hs = 8; }
    SUBCASE("B=1 T=71 H=4 G=2 hs=6, GQA") { B = 1; T = 71; H = 4; G = 2; hs = 6; }
    SUBCASE("B=2 T=71 H=3 G=1 hs=5, MQA") { B = 2; T = 71; H = 3; G = 1; hs = 5; }
    CAPTURE(B);
    CAPTURE(T);
    CAPTURE(H);
    CAPTURE(G);
    CAPTURE(hs);
    REQUIRE(71 % TILE_COLS != 0);  // the last key tile is ragged
    REQUIRE(71 > 2 * TILE_COLS);   // and there are more than two
    size_t nq = B * T * H * hs, nkv = B * T * G * hs;
    Rng rng(105);
    Vec q = rng.uniform_vector(nq, -1.5f, 1.5f), k = rng.uniform_vector(nkv, -1.5f, 1.5f);
    Vec v = rng.uniform_vector(nkv, -1, 1), R = rng.uniform_vector(nq, -1, 1);
    Vec out(nq), lse(B * H * T), dq(nq, 0.0f), dk(nkv, 0.0f), dv(nkv, 0.0f);
    attention_forward(out.data(), lse.data(), q.data(), k.data(), v.data(), B, T, H, G, hs);
    attention_backward(dq.data(), dk.data(), dv.data(), R.data(), out.data(), lse.data(), q.data(),
                       k.data(), v.data(), B, T, H, G, hs);
    auto loss = [&] {
        attention_forward(out.data(), lse.data(), q.data(), k.data(), v.data(), B, T, H, G, hs);
        return weighted_sum(R.data(), out.data(), nq);
    };
    check_gradient("q", q.data(), dq.data(), nq, loss, ATTENTION_STEP, ATTENTION_GRAD_TOL);
    check_gradient("k", k.data(), dk.data(), nkv, loss, ATTENTION_STEP, ATTENTION_GRAD_TOL);
    check_gradient("v", v.data(), dv.data(), nkv, loss, ATTENTION_STEP, ATTENTION_GRAD_TOL);
}

// attention_forward runs attention_query_online for a tile of queries at once: each score
// one fmaf chain over the dimensions, each tile's weighted sum one chain over its keys, the
// same tile parts and merges (a key past a query's position gives e^s = 0 exactly, and
// fmaf(0, v, o) = o). So the two agree bit for bit, out and lse, at shapes that end inside a
// tile and shapes that fill them. Against the whole-row softmax of attention_query, out
// agrees within ONLINE_TOL.
TEST_CASE("attention forward: the tiled one equals attention_query_online bit for bit, and attention_query closely") {
    for (Shape sh : {Shape{1, 1, 2, 1, 4}, Shape{2, 6, 4, 2, 16}, Shape{1, 17, 2, 2, 20},
                     Shape{2, 40, 4, 1, 32}, Shape{1, 23, 3, 3, 2}, Shape{1, 100, 2, 1, 36}}) {
        size_t B = sh.B, T = sh.T, H = sh.H, G = sh.G, hs = sh.hs;
        CAPTURE(T);
        CAPTURE(hs);
        size_t q_dim = H * hs, kv_dim = G * hs, nq = B * T * q_dim, nkv = B * T * kv_dim;
        Rng rng(111);
        Vec q = rng.uniform_vector(nq, -2, 2), k = rng.uniform_vector(nkv, -2, 2);
        Vec v = rng.uniform_vector(nkv, -1, 1);
        Vec out = nan_vector(nq), lse = nan_vector(B * H * T);
        Vec out_online = nan_vector(nq), lse_online = nan_vector(B * H * T), out_rows = nan_vector(nq);
        Vec att_row(T);
        attention_forward(out.data(), lse.data(), q.data(), k.data(), v.data(), B, T, H, G, hs);
        for (size_t b = 0; b < B; b++)
            for (size_t h = 0; h < H; h++)
                for (size_t t = 0; t < T; t++) {
                    size_t kv_offset = b * T * kv_dim + (h / (H / G)) * hs;
                    size_t row = (b * T + t) * q_dim + h * hs;
                    attention_query_online(&out_online[row], &lse_online[(b * H + h) * T + t],
                                           &q[row], &k[kv_offset], &v[kv_offset], t + 1, kv_dim, hs);
                    attention_query(&out_rows[row], att_row.data(), &q[row], &k[kv_offset],
                                    &v[kv_offset], t + 1, kv_dim, hs);
                }
        compare_exact("out", out.data(), out_online.data(), nq);
        compare_exact("lse", lse.data(), lse_online.data(), B * H * T);
        compare_within("out against attention_query", out.data(), out_rows.data(), nq, ONLINE_TOL);
    }
}

TEST_CASE("attention forward matches a double-precision reference (out and lse) and overwrites its outputs") {
    size_t B = 2, T = 7, H = 4, G = 2, hs = 4;
    SUBCASE("T=7 hs=4") {}
    SUBCASE("T=37 hs=20 (edge tiles)") { T = 37; hs = 20; }
    SUBCASE("T=71 hs=8 (several key tiles)") { T = 71; hs = 8; }
    CAPTURE(T);
    Rng rng(110);
    size_t nq = B * T * H * hs, nkv = B * T * G * hs;
    Vec q = rng.uniform_vector(nq, -1.5f, 1.5f), k = rng.uniform_vector(nkv, -1.5f, 1.5f);
    Vec v = rng.uniform_vector(nkv, -1, 1), out = nan_vector(nq), lse = nan_vector(B * H * T);
    std::vector<double> out_ref, lse_ref;
    attention_forward(out.data(), lse.data(), q.data(), k.data(), v.data(), B, T, H, G, hs);
    attention_reference(out_ref, lse_ref, q, k, v, B, T, H, G, hs);
    compare_within("attention out", out.data(), out_ref.data(), nq, FORWARD_TOL);
    compare_within("attention lse", lse.data(), lse_ref.data(), B * H * T, FORWARD_TOL);
}

// What the backward's recomputed probabilities rest on: a_t' = e^{s_t' - lse_t} over t' <= t
// is a distribution, each row summing to 1, in double from the float lse: lse's rounding (half
// an ulp, 4.8e-7 for lse in [4, 8)) scales every term alike; max error 9.5e-7.
TEST_CASE("attention lse makes each row's e^{s - lse} sum to 1") {
    size_t B = 2, T = 45, H = 4, G = 2, hs = 4, nq = B * T * H * hs, nkv = B * T * G * hs;
    Rng rng(115);
    Vec q = rng.uniform_vector(nq, -3, 3), k = rng.uniform_vector(nkv, -3, 3), v = rng.uniform_vector(nkv, -1, 1);
    Vec out(nq), lse = nan_vector(B * H * T);
    attention_forward(out.data(), lse.data(), q.data(), k.data(), v.data(), B, T, H, G, hs);
    for (size_t b = 0; b < B; b++)
        for (size_t h = 0; h < H; h++)
            for (size_t t = 0; t < T; t++) {
                const float* qt = &q[(b * T + t) * H * hs + h * hs];
                double sum = 0.0;
                for (size_t u = 0; u <= t; u++) {
                    const float* ku = &k[(b * T + u) * G * hs + (h / (H / G)) * hs];
                    double score = 0.0;
                    for (size_t c = 0; c < hs; c++) score += (double)qt[c] * ku[c];
                    sum += std::exp(score / std::sqrt((double)hs) - lse[(b * H + h) * T + t]);
                }
                INFO("b " << b << ", head " << h << ", row " << t);
                CHECK(std::fabs(sum - 1.0) <= 2e-6);
            }
}

// Scores past expf's range: q in [10, 11], k in [1.5, 2.5], hs = 20 give scores of 94 +- 3,
// whose e^s is inf in float. Each tile's part subtracts its own maximum and each merge the
// larger of two, so nothing overflows and the outputs are the reference's; without it every
// output is NaN. A score near 94 carries a rounding of ~1e-5 (its ulp is 7.6e-6), which moves
// a probability p by up to p (1 - p) 1e-5, and lse (about 94) by an ulp or two: the
// tolerance below (max error 3.7e-6 on out, 2.0e-5 on lse of 94), not FORWARD_TOL's 1e-6.
// The backward's e^{s - lse} stays at most 1, so its gradients stay finite.
TEST_CASE("attention stays finite and correct with huge scores") {
    size_t B = 1, T = 45, H = 2, G = 1, hs = 20, nq = B * T * H * hs, nkv = B * T * G * hs;
    Rng rng(114);
    Vec q = rng.uniform_vector(nq, 10, 11), k = rng.uniform_vector(nkv, 1.5f, 2.5f);
    Vec v = rng.uniform_vector(nkv, -1, 1), dout = rng.uniform_vector(nq, -1, 1);
    Vec out = nan_vector(nq), lse = nan_vector(B * H * T);
    Vec dq(nq, 0.0f), dk(nkv, 0.0f), dv(nkv, 0.0f);
    std::vector<double> out_ref, lse_ref;
    attention_forward(out.data(), lse.data(), q.data(), k.data(), v.data(), B, T, H, G, hs);
    attention_reference(out_ref, lse_ref, q, k, v, B, T, H, G, hs);
    size_t overflowing_rows = 0;  // rows whose largest score has e^s = inf in float: all
    for (size_t h = 0; h < H; h++)
        for (size_t t = 0; t < T; t++) {
            double largest = -INFINITY;
            for (size_t t2 = 0; t2 <= t; t2++) {
                double score = 0.0;
                for (size_t c = 0; c < hs; c++) score += (double)q[(t * H + h) * hs + c] * k[t2 * hs + c];
                largest = std::max(largest, score / std::sqrt((double)hs));
            }
            overflowing_rows += largest > 88.73;
        }
    CHECK(overflowing_rows == H * T);
    compare_within("attention out", out.data(), out_ref.data(), nq, HUGE_SCORE_TOL);
    compare_within("attention lse", lse.data(), lse_ref.data(), B * H * T, HUGE_SCORE_TOL);
    attention_backward(dq.data(), dk.data(), dv.data(), dout.data(), out.data(), lse.data(),
                       q.data(), k.data(), v.data(), B, T, H, G, hs);
    CHECK(gradcheck::all_finite(dq.data(), nq));
    CHECK(gradcheck::all_finite(dk.data(), nkv));
    CHECK(gradcheck::all_finite(dv.data(), nkv));
}
