// test_pipeline.cpp — what the pipeline (src/pipeline.h) decides without MPI: the schedule
// (every forward and backward once, in an order no stage waits on for ever, the bubble the
// formula gives), the bytes that travel against the paper's eqs. 14 and 15, each chunk's
// share of the parameters, and the one-line refusals. tests/mpi_tests.sh runs the pipeline
// itself against one process.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "model.h"
#include "pipeline.h"

namespace {

std::vector<PipelineOp> schedule(int P, int V, int M, int stage, std::vector<int>* slots) {
    std::vector<PipelineOp> ops(2 * (size_t)M * V);
    slots->assign((size_t)V, 0);
    int n = pipeline_schedule(P, V, M, stage, ops.data(), slots->data());
    ops.resize((size_t)n);
    return ops;
}

// floats per token that travel forward over a whole step's transitions (every chunk c >= 1
// receives once a microbatch), in units of d
double travelling_blocks(const ModelConfig& c, int P, int V, int cache) {
    double total = 0.0;
    for (int chunk = 1; chunk < P * V; chunk++) {
        total += (double)pipeline_floats_into(&c, P, V, chunk, cache) / c.d_model;
    }
    return total;
}

}  // namespace

TEST_CASE("pipeline_schedule: each stage runs every forward and backward of its chunks once, a forward first, in at most the slots it counts") {
    for (int P : {2, 3, 4}) {
        for (int V : {1, 2, 3}) {
            for (int M : {P, 2 * P, 3 * P}) {
                for (int stage = 0; stage < P; stage++) {
                    CAPTURE(P); CAPTURE(V); CAPTURE(M); CAPTURE(stage);
                    std::vector<int> slots;
                    std::vector<PipelineOp> ops = schedule(P, V, M, stage, &slots);
                    REQUIRE(ops.size() == 2 * (size_t)M * V);
                    std::vector<int> forward((size_t)V * M, 0), backward((size_t)V * M, 0);
                    std::vector<int> in_flight((size_t)V, 0), slot_busy((size_t)V * M, 0);
                    for (const PipelineOp& op : ops) {
                        size_t at = (size_t)op.v * M + op.micro;
                        REQUIRE(op.v >= 0); REQUIRE(op.v < V);
                        REQUIRE(op.micro >= 0); REQUIRE(op.micro < M);
                        REQUIRE(op.slot >= 0); REQUIRE(op.slot < slots[(size_t)op.v]);
                        size_t slot = (size_t)op.v * M + op.slot;
                        if (op.kind == 'F') {
                            CHECK(forward[at]++ == 0);
                            CHECK(slot_busy[slot]++ == 0);  // a slot holds one microbatch
                            in_flight[(size_t)op.v]++;
                        } else {
                            CHECK(forward[at] == 1);  // its forward came first
                            CHECK(backward[at]++ == 0);
                            slot_busy[slot]--;
                            in_flight[(size_t)op.v]--;
                        }
                    }
                    for (int v = 0; v < V; v++) { CHECK(in_flight[(size_t)v] == 0); }
                    if (V == 1) { CHECK(slots[0] == P - stage); }  // 1F1B: P - s in flight at most
                }
            }
        }
    }
}

TEST_CASE("pipeline_simulate: 1F1B and the interleaved schedule never deadlock, and the bubble is (P-1)/(V*M+P-1)") {
    for (int P : {2, 4}) {
        for (int V : {1, 2}) {
            for (int M : {P, 2 * P, 4 * P}) {
                CAPTURE(P); CAPTURE(V); CAPTURE(M);
                double bubble = -1.0;
                double makespan = pipeline_simulate(P, V, M, &bubble);
                REQUIRE(makespan > 0.0);
                CHECK(bubble == doctest::Approx((double)(P - 1) / (V * M + P - 1)).epsilon(1e-12));
                CHECK(makespan == doctest::Approx(3.0 * (V * M + P - 1)).epsilon(1e-12));
            }
        }
    }
}

TEST_CASE("the bytes that travel are eqs. 14 and 15 with b_0 and a stage's own previous output counted exactly, and approach them") {
    ModelConfig c = {7, 16, 8, 2, 1, 24, 2};  // L = 8: 16 sub-layers, blocks of S = 2
    for (int P : {2, 4}) {
        for (int V : {1, 2}) {
            int C = P * V;
            double Np = 16.0 / C / 2;  // blocks a chunk
            CAPTURE(P); CAPTURE(V);
            double naive = travelling_blocks(c, P, V, 0), cached = travelling_blocks(c, P, V, 1);
            double eq14 = C * (C - 1) / 2.0 * Np;                        // the paper's naive sum
            double eq15 = P * (P - 1) / 2.0 * Np + (V - 1) * P * P * Np;  // and its cached one
            // b_0 travels on each of the C-1 transitions (naive) or the first P-1 (cached); a
            // later transition carries the (P-1)*N_p blocks made on the other stages, where
            // eq. 15 counts P*N_p
            CHECK(naive == eq14 + (C - 1));
            CHECK(cached == eq15 + (P - 1) - (V - 1) * P * Np);
            CHECK(pipeline_floats_into(&c, P, V, C - 1, 0) == (size_t)(((C - 1) * Np + 1) * 16));
            if (V > 1) {  // a later transition, cached: the (P-1)*N_p blocks made since
                CHECK(pipeline_floats_into(&c, P, V, C - 1, 1) == (size_t)((P - 1) * Np * 16));
            }
            // the peaks (docs/pipeline.md): naively the last transition, (C-1)*N_p + 1 blocks;
            // cached the first round's last, into chunk P-1, (P-1)*N_p + 1
            size_t peak_naive = 0, peak_cached = 0;
            for (int into = 1; into < C; into++) {
                peak_naive = std::max(peak_naive, pipeline_floats_into(&c, P, V, into, 0));
                peak_cached = std::max(peak_cached, pipeline_floats_into(&c, P, V, into, 1));
            }
            CHECK(peak_naive == (size_t)(((C - 1) * Np + 1) * 16));
            CHECK(peak_cached == (size_t)(((P - 1) * Np + 1) * 16));
            CHECK(pipeline_floats_into(&c, P, V, P - 1, 1) == peak_cached);
        }
    }
    // as the chunks hold more blocks, b_0's share vanishes: naive -> eq. 14, and with V = 1
    // (no later transition) cached -> eq. 15, both within 1 / N_p
    for (int L : {16, 64, 256}) {
        ModelConfig big = {7, 16, L, 2, 1, 24, 2};
        int P = 4, V = 1;
        double Np = 2.0 * L / P / 2;
        double eq14 = P * (P - 1) / 2.0 * Np;
        CHECK(std::fabs(travelling_blocks(big, P, V, 0) / eq14 - 1.0) <= 1.0 / Np);
        CHECK(std::fabs(travelling_blocks(big, P, V, 1) / eq14 - 1.0) <= 1.0 / Np);
    }
    // none and mhc carry one stream (m streams) whatever the cache
    ModelConfig none = {7, 16, 8, 2, 1, 24, 0}, mhc = {7, 16, 8, 2, 1, 24, 0};
    mhc.streams = 3;
    CHECK(pipeline_floats_into(&none, 2, 2, 3, 1) == 16);
    CHECK(pipeline_floats_into(&mhc, 2, 2, 3, 0) == 48);
}

TEST_CASE("a chunk holds its share of each tensor: the shares of the C chunks tile the whole model, and model_build_chunk allocates that share alone") {
    std::vector<ModelConfig> configs = {{7, 16, 4, 2, 1, 24, 2}, {7, 16, 4, 2, 1, 24, 1},
                                        {7, 16, 4, 2, 1, 24, 0}};
    configs.push_back(configs[0]);
    configs.back().depth_query = 1;
    configs.push_back(configs[0]);
    configs.back().mixing = 2;
    configs.push_back(configs[2]);
    configs.back().streams = 2;
    for (const ModelConfig& c : configs) {
        size_t whole[N_PARAM_TENSORS];
        size_t total = param_sizes(&c, whole);
        for (int C : {1, 2, 4}) {
            CAPTURE(c.block_size); CAPTURE(c.streams); CAPTURE(C);
            std::vector<int> covered(total, 0);
            size_t sum = 0;
            int U = 8 / C;
            for (int chunk = 0; chunk < C; chunk++) {
                size_t offsets[N_PARAM_TENSORS], sizes[N_PARAM_TENSORS];
                size_t n = param_share(&c, chunk * U, (chunk + 1) * U, offsets, sizes);
                sum += n;
                for (int i = 0; i < N_PARAM_TENSORS; i++) {
                    for (size_t j = 0; j < sizes[i]; j++) { covered[offsets[i] + j]++; }
                }
                // the per-layer tensors: exactly 1/C of the whole
                CHECK(sizes[PARAM_wq] * (size_t)C == whole[PARAM_wq]);
                CHECK(sizes[PARAM_wte] == (chunk == 0 ? whole[PARAM_wte] : 0));
                CHECK(sizes[PARAM_lm_head] == (chunk == C - 1 ? whole[PARAM_lm_head] : 0));
                Model m;
                model_build_chunk(&m, &c, chunk * U, (chunk + 1) * U);
                CHECK(m.num_params == n);
                model_free(&m);
            }
            CHECK(sum == total);
            for (size_t j = 0; j < total; j++) { REQUIRE(covered[j] == 1); }
        }
    }
}

TEST_CASE("pipeline_check refuses, in one line each, what the pipeline cannot cut or schedule") {
    ModelConfig c = {7, 16, 4, 2, 1, 24, 2};  // 8 sub-layers, blocks of 2
    char err[256];
    CHECK(pipeline_check(&c, 2, 1, 2, 2, err, sizeof(err)) == 0);
    CHECK(pipeline_check(&c, 2, 2, 4, 4, err, sizeof(err)) == 0);
    struct Case { int P, V, M, world; ModelConfig c; const char* says; };
    ModelConfig block4 = c, odd = c;
    block4.block_size = 8;
    odd.n_layers = 3;
    odd.block_size = 3;
    Case cases[] = {
        {2, 1, 2, 3, c, "does not divide the 3 processes"},
        {4, 2, 4, 4, c, "8 chunks cannot each hold whole layers and whole blocks"},
        {2, 1, 2, 2, block4, "cannot each hold whole layers and whole blocks"},
        {2, 1, 2, 2, odd, "cannot each hold whole layers and whole blocks"},
        {4, 1, 2, 4, c, "--microbatches 2 is fewer than the 4 stages"},
        {2, 2, 3, 2, c, "must be a multiple of --pipeline 2"},
        {0, 1, 2, 2, c, "both must be at least 1"},
    };
    for (const Case& k : cases) {
        CAPTURE(k.says);
        err[0] = '\0';
        CHECK(pipeline_check(&k.c, k.P, k.V, k.M, k.world, err, sizeof(err)) == -1);
        CHECK(std::string(err).find(k.says) != std::string::npos);
        CHECK(std::strchr(err, '\n') == nullptr);
    }
}
