// diagnostics_test.h — what the tests of src/diagnostics.h (tests/test_diagnostics*.cpp)
// share: a model and a Diagnostics freed at the end of their scope, the tiny configs of the
// three modes, SPEC's init with non-zero pseudo-queries, a random batch, a file's lines.
#ifndef ATTNRES_DIAGNOSTICS_TEST_H
#define ATTNRES_DIAGNOSTICS_TEST_H

#include <cstdint>
#include <fstream>
#include <string>
#include <vector>

#include "diagnostics.h"
#include "gradcheck.h"
#include "model.h"

namespace diagnostics_test {

using gradcheck::Rng;

struct ScopedModel {
    Model m;
    ScopedModel(const ModelConfig& c, size_t B, size_t T) { model_build(&m, &c, B, T); }
    ~ScopedModel() { model_free(&m); }
};

struct ScopedDiagnostics {
    Diagnostics dg;
    explicit ScopedDiagnostics(const ModelConfig& c) { diagnostics_init(&dg, &c); }
    ~ScopedDiagnostics() { diagnostics_free(&dg); }
};

inline std::vector<std::string> read_lines(const std::string& path) {
    std::ifstream in(path);
    std::vector<std::string> lines;
    for (std::string line; std::getline(in, line);) lines.push_back(line);
    return lines;
}

inline std::string mode_name(const ModelConfig& c) {
    if (c.streams > 0) return "mhc m=" + std::to_string(c.streams);
    return c.block_size == 0 ? "none" : c.block_size == 1 ? "full" : "block S=" + std::to_string(c.block_size);
}

// V = 9, d = 8, L = 2 (4 sub-layers), H = 2, G = 1, F = 12 in the three modes
inline std::vector<ModelConfig> tiny_configs() {
    std::vector<ModelConfig> configs;
    for (int S : {0, 1, 2}) configs.push_back(ModelConfig{9, 8, 2, 2, 1, 12, S});
    return configs;
}

// SPEC init with non-zero pseudo-queries, so depth attention is not uniform
inline void init_params(Model& m, uint64_t seed) {
    model_init_params(&m, seed);
    Rng rng(seed + 1);
    size_t n = (size_t)(2 * m.config.n_layers + 1) * m.config.d_model;
    for (size_t i = 0; i < n && m.config.block_size > 0; i++) m.params.res_query[i] = rng.uniform(-2.0f, 2.0f);
}

inline void random_batch(int V, size_t n, uint64_t seed, std::vector<int>& tokens, std::vector<int>& targets) {
    Rng rng(seed);
    tokens.resize(n);
    targets.resize(n);
    for (size_t i = 0; i < n; i++) {
        tokens[i] = (int)(rng.next() % (uint64_t)V);
        targets[i] = (int)(rng.next() % (uint64_t)V);
    }
}

}  // namespace diagnostics_test

using namespace diagnostics_test;

#endif
