// test_diagnostics.cpp — the statistics of src/diagnostics.h on tiny models: RMS of known
// tensors and of each sub-layer's input and output, per-layer gradient norms that cover
// exactly their slices and add up to the global norm, depth-attention weights (rows sum to
// 1, uniform under zero pseudo-queries, columns where SPEC puts the sources), mHC-lite's
// coefficients (token means, H doubly stochastic, SPEC's init) and the text heatmap. The CSV
// files, and that measuring changes nothing: test_diagnostics_files.cpp.
#include <doctest/doctest.h>
#include "temp_dir.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "diagnostics.h"
#include "gradcheck.h"
#include "layers.h"  // RMSNORM_EPS
#include "model.h"
#include "diagnostics_test.h"

namespace {

typedef std::vector<float> Vec;

// the squares of every gradient group's norm, both arrays: the global norm squared
double groups_squared(const Diagnostics& dg) {
    double total = 0.0;
    for (int i = 0; i < dg.n_sub + 2; i++) {
        total += (double)dg.grad_norm[i] * dg.grad_norm[i];
        total += (double)dg.res_grad_norm[i] * dg.res_grad_norm[i];
    }
    return total;
}

double squares(const float* x, size_t n) {
    double s = 0.0;
    for (size_t i = 0; i < n; i++) s += (double)x[i] * x[i];
    return s;
}

// ---- the variants (SPEC "Variants") ----------------------------------------------------

// V = 9, d = 8, L = 2 (4 sub-layers), H = 2, G = 1, F = 12, each with variant switches
struct VariantRun {
    const char* name;
    ModelConfig c;
};
std::vector<VariantRun> variant_runs() {
    // after S: depth_score, key_norm_off, depth_query, depth_heads, depth_window, mixing
    return {
        {"sigmoid, block S=2", {9, 8, 2, 2, 1, 12, 2, 1, 0, 0, 0, 0, 0}},
        {"2 heads, full", {9, 8, 2, 2, 1, 12, 1, 0, 0, 0, 2, 0, 0}},
        {"window 2, full", {9, 8, 2, 2, 1, 12, 1, 0, 0, 0, 0, 2, 0}},
        {"static mixing, full, window 2", {9, 8, 2, 2, 1, 12, 1, 0, 0, 0, 0, 2, 1}},
        {"DenseFormer, block S=2", {9, 8, 2, 2, 1, 12, 2, 0, 0, 0, 0, 0, 2}},
        {"4 heads, sigmoid, no key norm, input query, full, window 1",
         {9, 8, 2, 2, 1, 12, 1, 1, 1, 1, 4, 1, 0}},
    };
}

// every residual tensor the variant has, random (queries, gains, U, logits, scalars), so that
// no weight is at its init's uniform value
void randomize_residuals(Model& m, uint64_t seed) {
    Rng rng(seed);
    struct { int tensor; float lo, hi; } ranges[] = {
        {PARAM_res_query, -2.0f, 2.0f}, {PARAM_res_norm, 0.5f, 1.5f}, {PARAM_res_qproj, -0.5f, 0.5f},
        {PARAM_res_logits, -2.0f, 2.0f}, {PARAM_res_scalars, -0.5f, 2.0f}};
    float* tensors[] = {m.params.res_query, m.params.res_norm, m.params.res_qproj,
                        m.params.res_logits, m.params.res_scalars};
    for (int t = 0; t < 5; t++)
        for (size_t i = 0; i < m.param_sizes[ranges[t].tensor]; i++)
            tensors[t][i] = rng.uniform(ranges[t].lo, ranges[t].hi);
}

// The weights depth attention l used, from SPEC's definitions applied to the model's own
// sources (gather_sources) and parameters, in double: [k][column] is head k's weight on the
// source in that column, mean over the positions; NaN where row l has no source. A source's
// column comes from which buffer it is: x0 is column 0, partial[p] (f_p in full mode) column
// p/S + 1.
std::vector<std::vector<double>> reference_weights(const Model& m, int l, int n_cols) {
    const ModelConfig& c = m.config;
    size_t N = m.B * m.T, d = (size_t)c.d_model, S = (size_t)c.block_size;
    size_t K = c.depth_heads > 1 ? (size_t)c.depth_heads : 1, Ck = d / K;
    size_t n_res = (size_t)(2 * c.n_layers + 1);
    std::vector<const float*> src(n_res + 1);
    size_t n = gather_sources(&m.acts, &c, N, l, src.data(), nullptr);
    std::vector<int> column(n, -1);
    for (size_t i = 0; i < n; i++) {
        if (src[i] == m.acts.x0) column[i] = 0;
        for (size_t p = 0; p + 1 < n_res; p++)
            if (src[i] == m.acts.sub[p].partial) column[i] = (int)(p / S + 1);
        REQUIRE(column[i] >= 0);
    }
    std::vector<std::vector<double>> mean(K, std::vector<double>((size_t)n_cols, NAN));
    for (size_t k = 0; k < K; k++)
        for (size_t i = 0; i < n; i++) mean[k][(size_t)column[i]] = 0.0;
    for (size_t t = 0; t < N; t++) {
        // the query: w_l, plus U_l rmsnorm(V_last) (no gain) with --depth-query input
        std::vector<double> q(d);
        const float* last = src[n - 1] + t * d;
        double last_ms = 0.0;
        for (size_t j = 0; j < d; j++) last_ms += (double)last[j] * last[j];
        double last_rstd = 1.0 / std::sqrt(last_ms / (double)d + (double)RMSNORM_EPS);
        for (size_t j = 0; j < d && c.mixing == 0; j++) {
            q[j] = m.params.res_query[(size_t)l * d + j];
            for (size_t i = 0; i < d && c.depth_query; i++)
                q[j] += (double)m.params.res_qproj[((size_t)l * d + j) * d + i] * last[i] * last_rstd;
        }
        for (size_t k = 0; k < K; k++) {
            std::vector<double> w(n);
            for (size_t i = 0; i < n; i++) {
                if (c.mixing == 1) { w[i] = m.params.res_logits[(size_t)l * n_res + i]; continue; }
                if (c.mixing == 2) { w[i] = m.params.res_scalars[(size_t)l * n_res + i]; continue; }
                const float* v = src[i] + t * d + k * Ck;
                double ms = 0.0, score = 0.0;
                for (size_t j = 0; j < Ck; j++) ms += (double)v[j] * v[j];
                double r = c.key_norm_off ? 1.0 : 1.0 / std::sqrt(ms / (double)Ck + (double)RMSNORM_EPS);
                for (size_t j = 0; j < Ck; j++) {
                    double g = c.key_norm_off ? 1.0 : m.params.res_norm[(size_t)l * d + k * Ck + j];
                    score += q[k * Ck + j] * g * v[j] * r;
                }
                w[i] = score;
            }
            if (c.mixing == 0 && c.depth_score == 1) {
                for (double& x : w) x = 1.0 / (1.0 + std::exp(-x));
            } else if (c.mixing != 2) {  // softmax: attention, or the static mixing's logits
                double top = *std::max_element(w.begin(), w.end()), sum = 0.0;
                for (double& x : w) sum += (x = std::exp(x - top));
                for (double& x : w) x /= sum;
            }
            for (size_t i = 0; i < n; i++) mean[k][(size_t)column[i]] += w[i] / (double)N;
        }
    }
    return mean;
}

// the model's text heatmap, one string per line
std::vector<std::string> heatmap_lines(const Diagnostics& dg, const std::string& dir) {
    std::string path = dir + "/heatmap.txt";
    FILE* out = std::fopen(path.c_str(), "w");
    REQUIRE(out != nullptr);
    diagnostics_print_heatmap(&dg, out);
    std::fclose(out);
    return read_lines(path);
}

bool has_line(const std::vector<std::string>& lines, const std::string& part) {
    return std::any_of(lines.begin(), lines.end(),
                       [&](const std::string& line) { return line.find(part) != std::string::npos; });
}

std::vector<std::string> split(const std::string& line) {
    std::vector<std::string> fields;
    std::stringstream in(line);
    for (std::string field; std::getline(in, field, ',');) fields.push_back(field);
    return fields;
}

}  // namespace

TEST_CASE("tensor_rms is sqrt(mean(x^2)) of known tensors") {
    const float pair[] = {3.0f, 4.0f};
    CHECK(tensor_rms(pair, 2) == doctest::Approx(std::sqrt(12.5)).epsilon(1e-7));
    Vec constant(1000, -0.25f);
    CHECK(tensor_rms(constant.data(), constant.size()) == doctest::Approx(0.25).epsilon(1e-7));
    Vec zeros(7, 0.0f);
    CHECK(tensor_rms(zeros.data(), zeros.size()) == 0.0f);
}

TEST_CASE("input RMS is that of each sub-layer's input; output RMS that of each f_l (none: h_{l+1} - h_l)") {
    const size_t B = 2, T = 5, N = B * T;
    std::vector<ModelConfig> configs = tiny_configs();
    configs.push_back(ModelConfig{9, 8, 2, 2, 1, 12, 0});
    configs.back().streams = 3;  // mhc: the last row is the 3 streams the head reads
    for (ModelConfig c : configs) {
        INFO("mode ", mode_name(c));
        ScopedModel scoped(c, B, T);
        Model& m = scoped.m;
        init_params(m, 11);
        ScopedDiagnostics sd(c);
        Diagnostics& dg = sd.dg;
        int L2 = 2 * c.n_layers;
        for (int l = 0; l <= L2; l++) dg.input_rms[l] = -1.0f;  // sentinels: measured below
        for (int l = 0; l < L2; l++) dg.output_rms[l] = -1.0f;
        std::vector<int> tokens, targets;
        random_batch(c.vocab_size, N, 5, tokens, targets);
        model_forward(&m, tokens.data(), targets.data(), B, T);
        model_zero_grad(&m);
        model_backward(&m);
        diagnostics_measure_layers(&dg, &m);
        size_t d = (size_t)c.d_model;
        for (int l = 0; l <= L2; l++) {
            const float* h = model_sublayer_input(&m, l);
            REQUIRE(h != nullptr);
            // mhc's final hidden state: its 3 streams after the last sub-layer, each
            // normalised by the head
            bool streams = l == L2 && c.streams > 0;
            size_t width = streams ? (size_t)c.streams * d : d;
            CHECK(model_sublayer_input_width(&m, l) == width);
            if (streams) CHECK(h == m.acts.sub[L2].streams);
            CHECK(dg.input_rms[l] > 0.0f);
            CHECK(dg.input_rms[l] == doctest::Approx(std::sqrt(squares(h, N * width) / (double)(N * width))).epsilon(1e-6));
        }
        // h_0 is the embedding in every mode but mhc (a single source has weight 1; mhc reads
        // sum_s a_pre[s] x0)
        double x0_squares = 0.0;
        for (size_t i = 0; i < N; i++) x0_squares += squares(m.params.wte + (size_t)tokens[i] * d, d);
        if (c.streams == 0) CHECK(dg.input_rms[0] == doctest::Approx(std::sqrt(x0_squares / (double)(N * d))).epsilon(1e-6));
        CHECK(model_sublayer_output(&m, L2) == nullptr);
        for (int l = 0; l < L2; l++) {
            INFO("sub-layer ", l);
            const float* f_l = model_sublayer_output(&m, l);
            REQUIRE(f_l != nullptr);
            CHECK(dg.output_rms[l] > 0.0f);
            CHECK(dg.output_rms[l] == doctest::Approx(std::sqrt(squares(f_l, N * d) / (double)(N * d))).epsilon(1e-6));
            if (c.block_size != 0 || c.streams != 0) continue;
            const float* h = model_sublayer_input(&m, l);
            const float* next = model_sublayer_input(&m, l + 1);
            Vec f(N * d);
            for (size_t i = 0; i < N * d; i++) f[i] = next[i] - h[i];
            CHECK(dg.output_rms[l] == doctest::Approx(tensor_rms(f.data(), f.size())).epsilon(1e-3));
        }
    }
}

TEST_CASE("per-layer gradient norms square-sum to the global norm squared, the first query's is 0") {
    const size_t B = 2, T = 5, N = B * T;
    for (ModelConfig c : tiny_configs()) {
        INFO("mode ", mode_name(c));
        ScopedModel scoped(c, B, T);
        Model& m = scoped.m;
        init_params(m, 21);
        ScopedDiagnostics sd(c);
        std::vector<int> tokens, targets;
        random_batch(c.vocab_size, N, 6, tokens, targets);
        model_forward(&m, tokens.data(), targets.data(), B, T);
        model_zero_grad(&m);
        model_backward(&m);
        int L2 = 2 * c.n_layers;
        // a sentinel in every entry: each one checked below must have been written
        std::fill(sd.dg.grad_norm, sd.dg.grad_norm + L2 + 2, -1.0f);
        std::fill(sd.dg.res_grad_norm, sd.dg.res_grad_norm + L2 + 2, -1.0f);
        diagnostics_measure_layers(&sd.dg, &m);
        for (int i = 0; i < L2 + 2; i++) CHECK(sd.dg.grad_norm[i] > 0.0f);
        double global = model_grad_norm(&m);
        CHECK(groups_squared(sd.dg) == doctest::Approx(global * global).epsilon(1e-5));
        CHECK(sd.dg.res_grad_norm[0] == 0.0f);
        CHECK(sd.dg.res_grad_norm[1] == 0.0f);  // SPEC: w_0, g_0 get exactly zero gradient
        if (c.block_size > 0) CHECK(sd.dg.res_grad_norm[2] > 0.0f);
        else for (int i = 0; i < L2 + 2; i++) CHECK(sd.dg.res_grad_norm[i] == 0.0f);
    }
}

TEST_CASE("with each variant's residual tensors, the gradient groups still square-sum to the global norm") {
    const size_t B = 2, T = 3, N = B * T;
    for (const VariantRun& run : variant_runs()) {
        INFO("variant: ", std::string(run.name));
        ScopedModel scoped(run.c, B, T);
        Model& m = scoped.m;
        model_init_params(&m, 4);
        randomize_residuals(m, 5);
        std::vector<int> tokens, targets;
        random_batch(run.c.vocab_size, N, 6, tokens, targets);
        model_forward(&m, tokens.data(), targets.data(), B, T);
        model_zero_grad(&m);
        model_backward(&m);
        ScopedDiagnostics sd(run.c);
        diagnostics_measure_layers(&sd.dg, &m);
        int L2 = 2 * run.c.n_layers;
        double global = model_grad_norm(&m);
        CHECK(groups_squared(sd.dg) == doctest::Approx(global * global).epsilon(1e-5));
        CHECK(sd.dg.res_grad_norm[L2 + 1] > 0.0f);  // the output aggregation's row
    }
}

TEST_CASE("each gradient group covers exactly its layer's slices of the parameter tensors") {
    // Fill one slice (one layer of one tensor) with ones, everything else zero: exactly one
    // group must see it, with norm sqrt(slice size).
    ModelConfig c = {9, 8, 3, 2, 1, 12, 2};
    ScopedModel scoped(c, 1, 2);
    Model& m = scoped.m;
    ScopedDiagnostics sd(c);
    int L = c.n_layers, L2 = 2 * L;
    size_t offset = 0;
    for (int t = 0; t < N_PARAM_TENSORS; t++) {
        size_t size = m.param_sizes[t];
        bool res = t == PARAM_res_query || t == PARAM_res_norm;
        int slices = (t >= PARAM_attn_norm && t <= PARAM_wd) ? L : res ? L2 + 1 : 1;
        for (int s = 0; s < slices; s++) {
            INFO("tensor ", PARAM_INFO[t].name, " slice ", s);
            size_t slice = size / (size_t)slices;
            std::memset(m.grads_memory, 0, m.num_params * sizeof(float));
            for (size_t i = 0; i < slice; i++) m.grads_memory[offset + (size_t)s * slice + i] = 1.0f;
            // the group that must hold it: index into grad_norm or res_grad_norm
            int group = t == PARAM_wte ? 0
                        : t <= PARAM_wo ? 1 + 2 * s    // attention of layer s
                        : t <= PARAM_wd ? 2 + 2 * s    // MLP of layer s
                        : res ? 1 + s                  // depth attention before sub-layer s
                        : L2 + 1;                      // head
            model_forward(&m, std::vector<int>{1, 2}.data(), nullptr, 1, 2);  // inputs must exist
            diagnostics_measure_layers(&sd.dg, &m);
            for (int g = 0; g < L2 + 2; g++) {
                float expect = g == group ? std::sqrt((float)slice) : 0.0f;
                CHECK(sd.dg.grad_norm[g] == doctest::Approx(res ? 0.0f : expect));
                CHECK(sd.dg.res_grad_norm[g] == doctest::Approx(res ? expect : 0.0f));
            }
        }
        offset += size;
    }
}

TEST_CASE("depth-attention weights: rows sum to 1, uniform for zero queries, SPEC's columns") {
    const size_t B = 2, T = 4, N = B * T;
    for (int S : {1, 2, 4}) {
        ModelConfig c = {9, 8, 2, 2, 1, 12, S};
        INFO("mode ", mode_name(c));
        ScopedModel scoped(c, B, T);
        Model& m = scoped.m;
        ScopedDiagnostics sd(c);
        Diagnostics& dg = sd.dg;
        int L2 = 2 * c.n_layers;
        REQUIRE(dg.n_cols == L2 / S + 1);
        std::vector<int> tokens, targets;
        random_batch(c.vocab_size, N, 7, tokens, targets);
        for (bool zero_queries : {true, false}) {
            INFO("queries: ", zero_queries ? "zero" : "random");
            if (zero_queries) model_init_params(&m, 3);
            else init_params(m, 3);
            model_forward(&m, tokens.data(), targets.data(), B, T);
            diagnostics_measure_alpha(&dg, &m);
            bool any_non_uniform = false;
            for (int l = 0; l <= L2; l++) {
                INFO("row ", l);
                // SPEC: blocks b_0 .. b_{n-1}, then the partial sum in its own block's column
                int n = l == L2 ? L2 / S + 1 : 1 + l / S + (l % S > 0);
                size_t n_model = 0, heads = 0, rows = 0;
                const float* alpha = model_depth_alpha(&m, l, &n_model, &heads, &rows);
                REQUIRE(n_model == (size_t)n);
                REQUIRE(heads == 1);
                REQUIRE(rows == N);
                double sum = 0.0;
                for (int i = 0; i < dg.n_cols; i++) {
                    float a = dg.alpha[(size_t)l * dg.n_cols + i];
                    if (i >= n) { CHECK(std::isnan(a)); continue; }
                    double mean = 0.0;
                    for (size_t t = 0; t < N; t++) mean += alpha[t * n_model + i];
                    CHECK(a == doctest::Approx(mean / (double)N).epsilon(1e-6));
                    if (zero_queries) CHECK(a == doctest::Approx(1.0 / n).epsilon(1e-6));
                    any_non_uniform |= std::fabs(a - 1.0 / n) > 1e-3;
                    sum += a;
                }
                CHECK(sum == doctest::Approx(1.0).epsilon(1e-5));
            }
            CHECK(any_non_uniform == !zero_queries);
        }
    }
    SUBCASE("none mode has no depth attention") {
        ModelConfig c = {9, 8, 2, 2, 1, 12, 0};
        ScopedDiagnostics sd(c);
        CHECK(sd.dg.n_cols == 0);
        CHECK(sd.dg.alpha == nullptr);
    }
}

TEST_CASE("each variant's measured weights are those its depth attention used, per head, in their sources' columns") {
    const size_t B = 2, T = 3, N = B * T;
    for (const VariantRun& run : variant_runs()) {
        INFO("variant: ", std::string(run.name));
        const ModelConfig& c = run.c;
        char err[256];
        REQUIRE_MESSAGE(model_config_check(&c, err, sizeof(err)) == 0, err);
        ScopedModel scoped(c, B, T);
        Model& m = scoped.m;
        model_init_params(&m, 5);
        randomize_residuals(m, 6);
        std::vector<int> tokens, targets;
        random_batch(c.vocab_size, N, 8, tokens, targets);
        model_forward(&m, tokens.data(), targets.data(), B, T);
        ScopedDiagnostics sd(c);
        Diagnostics& dg = sd.dg;
        int K = c.depth_heads > 1 ? c.depth_heads : 1, L2 = 2 * c.n_layers;
        REQUIRE(dg.depth_heads == K);
        REQUIRE((dg.head_alpha != nullptr) == (K > 1));
        size_t cells = (size_t)(L2 + 1) * dg.n_cols;
        std::fill(dg.alpha, dg.alpha + cells, -7.0f);  // sentinels: each must be written
        if (K > 1) std::fill(dg.head_alpha, dg.head_alpha + K * cells, -7.0f);
        diagnostics_measure_alpha(&dg, &m);
        bool any_sum_not_one = false, heads_differ = false;
        for (int l = 0; l <= L2; l++) {
            std::vector<std::vector<double>> expect = reference_weights(m, l, dg.n_cols);
            double row_sum = 0.0;
            for (int col = 0; col < dg.n_cols; col++) {
                INFO("row ", l, ", column ", col);
                bool present = !std::isnan(expect[0][(size_t)col]);
                double over_heads = 0.0;
                for (int k = 0; k < K; k++) {
                    if (!present) break;
                    over_heads += expect[(size_t)k][(size_t)col] / K;
                    heads_differ |= std::fabs(expect[(size_t)k][(size_t)col] - expect[0][(size_t)col]) > 1e-3;
                }
                for (int k = 0; k < K && K > 1; k++) {
                    INFO("head ", k);
                    float got = dg.head_alpha[(size_t)k * cells + (size_t)l * dg.n_cols + col];
                    if (!present) CHECK(std::isnan(got));
                    else CHECK(got == doctest::Approx(expect[(size_t)k][(size_t)col]).epsilon(1e-5));
                }
                float got = dg.alpha[(size_t)l * dg.n_cols + col];
                if (!present) { CHECK(std::isnan(got)); continue; }
                CHECK(got == doctest::Approx(over_heads).epsilon(1e-5));
                row_sum += got;
            }
            any_sum_not_one |= std::fabs(row_sum - 1.0) > 1e-3;
        }
        // softmax rows (the attention's, or static mixing's) sum to 1; sigmoid's and
        // DenseFormer's do not
        bool normalised = c.mixing == 1 || (c.mixing == 0 && c.depth_score == 0);
        CHECK(any_sum_not_one == !normalised);
        CHECK(heads_differ == (K > 1));  // the heads' own weights, not their mean
    }
}

TEST_CASE("alpha.csv with heads and a window: a line per source in its absolute column, each head's weight after the mean") {
    ModelConfig c = {9, 8, 2, 2, 1, 12, 1, 1, 0, 0, 2, 2, 0};  // full, sigmoid, 2 heads, window 2
    ScopedModel scoped(c, 2, 3);
    Model& m = scoped.m;
    model_init_params(&m, 5);
    randomize_residuals(m, 9);
    std::vector<int> tokens, targets;
    random_batch(c.vocab_size, 6, 3, tokens, targets);
    model_forward(&m, tokens.data(), targets.data(), 2, 3);
    TempDir dir;
    char err[256];
    ScopedDiagnostics sd(c);
    Diagnostics& dg = sd.dg;
    REQUIRE(diagnostics_open(&dg, dir.path.c_str(), -1, "./train", err, sizeof(err)) == 0);
    diagnostics_measure_alpha(&dg, &m);
    diagnostics_write_alpha(&dg, 7);
    std::fflush(dg.alpha_csv);
    std::vector<std::string> lines = read_lines(dir.path + "/alpha.csv");
    REQUIRE(lines.size() >= 1);
    CHECK(lines[0] == "step,row,row_name,source,source_name,alpha,alpha_h0,alpha_h1");
    // full mode's columns: emb, a0, m0, a1, m1; rows 3 and 4 keep emb and their 2 latest
    struct Cell { int row; const char* row_name; int col; const char* col_name; };
    std::vector<Cell> cells = {
        {0, "L0.attn", 0, "emb"},
        {1, "L0.mlp", 0, "emb"}, {1, "L0.mlp", 1, "a0"},
        {2, "L1.attn", 0, "emb"}, {2, "L1.attn", 1, "a0"}, {2, "L1.attn", 2, "m0"},
        {3, "L1.mlp", 0, "emb"}, {3, "L1.mlp", 2, "m0"}, {3, "L1.mlp", 3, "a1"},
        {4, "out", 0, "emb"}, {4, "out", 3, "a1"}, {4, "out", 4, "m1"}};
    REQUIRE(lines.size() == 1 + cells.size());
    size_t per_head = (size_t)(2 * c.n_layers + 1) * dg.n_cols;
    for (size_t j = 0; j < cells.size(); j++) {
        INFO("line ", j + 1, ": ", lines[j + 1]);
        std::vector<std::string> f = split(lines[j + 1]);
        REQUIRE(f.size() == 8);
        CHECK(f[0] == "7");
        CHECK(f[1] == std::to_string(cells[j].row));
        CHECK(f[2] == cells[j].row_name);
        CHECK(f[3] == std::to_string(cells[j].col));
        CHECK(f[4] == cells[j].col_name);
        size_t cell = (size_t)cells[j].row * dg.n_cols + (size_t)cells[j].col;
        CHECK(std::stod(f[5]) == doctest::Approx(dg.alpha[cell]).epsilon(1e-5));
        CHECK(std::stod(f[6]) == doctest::Approx(dg.head_alpha[cell]).epsilon(1e-5));
        CHECK(std::stod(f[7]) == doctest::Approx(dg.head_alpha[per_head + cell]).epsilon(1e-5));
        CHECK(std::stod(f[5]) == doctest::Approx((std::stod(f[6]) + std::stod(f[7])) / 2).epsilon(2e-5));
    }
    std::vector<std::string> meta = read_lines(dir.path + "/meta.csv");
    for (const char* line : {"depth_score,sigmoid", "key_norm,on", "depth_query,static",
                             "depth_heads,2", "depth_window,2", "mixing,attention"})
        CHECK_MESSAGE(std::find(meta.begin(), meta.end(), line) != meta.end(), std::string(line));
}

TEST_CASE("the text heatmap says what each variant's weights are: sigmoid's rows do not sum to 100 %, heads averaged, a window's columns") {
    TempDir dir;
    // zero queries and logits, unit scalars: SPEC's init (sigmoid 1/2, uniform softmax, beta 1)
    auto heatmap = [&](const ModelConfig& c) {
        ScopedModel scoped(c, 1, 4);
        model_init_params(&scoped.m, 1);
        std::vector<int> tokens = {1, 2, 3, 4};
        model_forward(&scoped.m, tokens.data(), nullptr, 1, 4);
        ScopedDiagnostics sd(c);
        diagnostics_measure_alpha(&sd.dg, &scoped.m);
        return heatmap_lines(sd.dg, dir.path);
    };
    SUBCASE("sigmoid: every weight 1/2 at zero queries, and the legend says rows do not sum to 100 %") {
        std::vector<std::string> lines = heatmap({9, 8, 2, 2, 1, 12, 2, 1});
        REQUIRE(lines.size() >= 9);
        CHECK(lines[0].rfind("depth attention (sigmoid weights in %, mean over tokens)", 0) == 0);
        CHECK(lines[3] == "L0.attn  ▓▓ 50     ·     ·");
        CHECK(lines[6] == "L1.mlp   ▓▓ 50 ▓▓ 50 ▓▓ 50");
        CHECK(lines[7] == "out      ▓▓ 50 ▓▓ 50 ▓▓ 50");
        CHECK(has_line(lines, "not normalised: rows do not sum to 100 %"));
    }
    SUBCASE("2 heads: the caption says the cells are the mean over the heads and where each head's are") {
        std::vector<std::string> lines = heatmap({9, 8, 2, 2, 1, 12, 1, 0, 0, 0, 2});
        CHECK(lines[0].rfind("depth attention (% of each row, mean over tokens and the 2 heads)", 0) == 0);
        CHECK(lines[4] == "L0.mlp   ▓▓ 50 ▓▓ 50     ·     ·     ·");
        CHECK(has_line(lines, "each cell is the mean over the heads"));
        CHECK(has_line(lines, "alpha_h<k>"));
        CHECK(has_line(lines, "heatmap_h<k>.png"));
    }
    SUBCASE("window 2: rows past it read emb and their 2 latest outputs, in those outputs' columns") {
        std::vector<std::string> lines = heatmap({9, 8, 2, 2, 1, 12, 1, 0, 0, 0, 0, 2});
        CHECK(lines[2] == "           emb    a0    m0    a1    m1");
        CHECK(lines[5] == "L1.attn  ▒▒ 33 ▒▒ 33 ▒▒ 33     ·     ·");
        CHECK(lines[6] == "L1.mlp   ▒▒ 33     · ▒▒ 33 ▒▒ 33     ·");
        CHECK(lines[7] == "out      ▒▒ 33     ·     · ▒▒ 33 ▒▒ 33");
        CHECK(has_line(lines, "--depth-window 2: a row reads emb and its 2 most recent outputs only"));
    }
    SUBCASE("DenseFormer: every scalar 1 at init, shown as 100 in every cell, not normalised") {
        std::vector<std::string> lines = heatmap({9, 8, 2, 2, 1, 12, 2, 0, 0, 0, 0, 0, 2});
        CHECK(lines[0].rfind("DenseFormer depth mixing", 0) == 0);
        CHECK(lines[4] == "L0.mlp   ██100 ██100     ·");
        CHECK(lines[7] == "out      ██100 ██100 ██100");
        CHECK(has_line(lines, "rows do not sum to 100 %, a weight may be negative"));
    }
    SUBCASE("static mixing: uniform at zero logits, the same for every token") {
        std::vector<std::string> lines = heatmap({9, 8, 2, 2, 1, 12, 2, 0, 0, 0, 0, 0, 1});
        CHECK(lines[0].rfind("depth mixing (% of each row, the same for every token)", 0) == 0);
        CHECK(lines[7] == "out      ▒▒ 33 ▒▒ 33 ▒▒ 33");
        CHECK(has_line(lines, "softmax(res_logits row l)"));
    }
}

TEST_CASE("rows and sources are named by sub-layer and by block") {
    char name[32];
    ModelConfig block = {9, 8, 2, 2, 1, 12, 2}, full = {9, 8, 2, 2, 1, 12, 1};
    ScopedDiagnostics b(block), f(full);
    const char* rows[] = {"L0.attn", "L0.mlp", "L1.attn", "L1.mlp", "out"};
    for (int l = 0; l < 5; l++) {
        diagnostics_row_name(&b.dg, l, name, sizeof(name));
        CHECK(std::string(name) == rows[l]);
    }
    const char* block_cols[] = {"emb", "b1", "b2"};
    for (int i = 0; i < 3; i++) {
        diagnostics_source_name(&b.dg, i, name, sizeof(name));
        CHECK(std::string(name) == block_cols[i]);
    }
    const char* full_cols[] = {"emb", "a0", "m0", "a1", "m1"};
    for (int i = 0; i < 5; i++) {
        diagnostics_source_name(&f.dg, i, name, sizeof(name));
        CHECK(std::string(name) == full_cols[i]);
    }
}

TEST_CASE("the text heatmap has a header, one shaded row per sub-layer and the output, and a legend") {
    ModelConfig c = {9, 8, 2, 2, 1, 12, 2};
    ScopedModel scoped(c, 1, 4);
    ScopedDiagnostics sd(c);
    model_init_params(&scoped.m, 1);
    std::vector<int> tokens = {1, 2, 3, 4};
    model_forward(&scoped.m, tokens.data(), nullptr, 1, 4);
    diagnostics_measure_alpha(&sd.dg, &scoped.m);
    TempDir dir;
    std::string path = dir.path + "/heatmap.txt";
    FILE* out = std::fopen(path.c_str(), "w");
    REQUIRE(out != nullptr);
    diagnostics_print_heatmap(&sd.dg, out);
    std::fclose(out);
    std::vector<std::string> lines = read_lines(path);
    REQUIRE(lines.size() == 2 + 1 + 5 + 2);  // title (2 lines), columns, 5 rows, legend (2)
    CHECK(lines[2].find("emb") != std::string::npos);
    CHECK(lines[2].find("b2") != std::string::npos);
    // zero queries: L0.attn = emb alone, L0.mlp and L1.attn = emb/b1 halves, out = thirds
    CHECK(lines[3] == "L0.attn  ██100     ·     ·");
    CHECK(lines[4] == "L0.mlp   ▓▓ 50 ▓▓ 50     ·");
    CHECK(lines[5] == "L1.attn  ▓▓ 50 ▓▓ 50     ·");
    CHECK(lines[6] == "L1.mlp   ▒▒ 33 ▒▒ 33 ▒▒ 33");
    CHECK(lines[7] == "out      ▒▒ 33 ▒▒ 33 ▒▒ 33");
    CHECK(lines[8].find("█ >= 70%") != std::string::npos);
}

// ---- mHC-lite (SPEC "mHC-lite") ----------------------------------------------------------

// V = 9, d = 8, L = 2 (4 sub-layers), H = 2, G = 1, F = 12, mhc with m streams
static ModelConfig mhc_config(int m) {
    ModelConfig c = {9, 8, 2, 2, 1, 12, 0};
    c.streams = m;
    return c;
}

// mhc's parameters away from their init (which gives every token the same coefficients):
// projections, biases and scales random, so the coefficients vary from token to token
static void randomize_mhc(Model& m, uint64_t seed) {
    Rng rng(seed);
    for (size_t i = 0; i < m.param_sizes[PARAM_hc_proj]; i++) m.params.hc_proj[i] = rng.uniform(-0.5f, 0.5f);
    for (size_t i = 0; i < m.param_sizes[PARAM_hc_bias]; i++) m.params.hc_bias[i] = rng.uniform(-1.5f, 1.5f);
    for (size_t i = 0; i < m.param_sizes[PARAM_hc_scale]; i++) m.params.hc_scale[i] = rng.uniform(0.5f, 2.0f);
}

TEST_CASE("mHC-lite's measured coefficients are the token means of a_pre, a_post and H; H doubly stochastic") {
    const size_t B = 2, T = 5, N = B * T;
    for (int streams : {2, 3, 4}) {
        CAPTURE(streams);
        ModelConfig c = mhc_config(streams);
        ScopedModel scoped(c, B, T);
        Model& m = scoped.m;
        model_init_params(&m, 3);
        randomize_mhc(m, 4);
        ScopedDiagnostics sd(c);
        REQUIRE(sd.dg.streams == streams);
        CHECK(sd.dg.alpha == nullptr);  // no depth attention
        std::vector<int> tokens, targets;
        random_batch(c.vocab_size, N, 5, tokens, targets);
        model_forward(&m, tokens.data(), targets.data(), B, T);
        size_t s_m = (size_t)streams, L2 = 2 * (size_t)c.n_layers;
        // a sentinel in every entry: each one checked below must have been written
        std::fill(sd.dg.hc_pre, sd.dg.hc_pre + L2 * s_m, -1.0f);
        std::fill(sd.dg.hc_post, sd.dg.hc_post + L2 * s_m, -1.0f);
        std::fill(sd.dg.hc_h, sd.dg.hc_h + L2 * s_m * s_m, -1.0f);
        diagnostics_measure_alpha(&sd.dg, &m);
        // the reference: layers.h's layout of a row's coefficients, [a_pre | pi | a_post | H]
        size_t R = mhc_permutation_table(NULL, s_m), W = MHC_MIX_WIDTH(s_m);
        for (size_t l = 0; l < L2; l++) {
            CAPTURE(l);
            const float* mix = m.acts.sub[l].hc_mix;
            bool varies = false;  // some coefficient differs between the first token and another
            for (size_t k = W; k < N * W; k++) varies |= mix[k % W] != mix[k];
            CHECK(varies);
            for (size_t s = 0; s < s_m; s++) {
                double pre = 0.0, post = 0.0;
                for (size_t n = 0; n < N; n++) {
                    pre += mix[n * W + s];
                    post += mix[n * W + s_m + R + s];
                }
                float a_pre = sd.dg.hc_pre[l * s_m + s], a_post = sd.dg.hc_post[l * s_m + s];
                CHECK(a_pre == doctest::Approx(pre / N).epsilon(1e-6));
                CHECK(a_post == doctest::Approx(post / N).epsilon(1e-6));
                CHECK(a_pre > 0.0f);
                CHECK(a_pre < 1.0f);
                CHECK(a_post > 0.0f);
                CHECK(a_post < 2.0f);
                double row = 0.0, column = 0.0;
                for (size_t t = 0; t < s_m; t++) {
                    double h = 0.0;
                    for (size_t n = 0; n < N; n++) h += mix[n * W + 2 * s_m + R + s * s_m + t];
                    float got = sd.dg.hc_h[(l * s_m + s) * s_m + t];
                    CHECK(got == doctest::Approx(h / N).epsilon(1e-6));
                    CHECK(got >= 0.0f);
                    CHECK(got <= 1.0f);
                    row += got;
                    column += sd.dg.hc_h[(l * s_m + t) * s_m + s];
                }
                CHECK(row == doctest::Approx(1.0).epsilon(1e-5));
                CHECK(column == doctest::Approx(1.0).epsilon(1e-5));
            }
        }
    }
}

TEST_CASE("at mHC-lite's init sub-layer l reads and writes mostly stream l mod m, and H is nearly the identity") {
    const size_t B = 1, T = 4;
    for (int streams : {2, 4}) {
        CAPTURE(streams);
        ModelConfig c = mhc_config(streams);
        ScopedModel scoped(c, B, T);
        model_init_params(&scoped.m, 8);
        ScopedDiagnostics sd(c);
        std::vector<int> tokens = {1, 2, 3, 4};
        model_forward(&scoped.m, tokens.data(), NULL, B, T);
        diagnostics_measure_alpha(&sd.dg, &scoped.m);
        size_t s_m = (size_t)streams;
        for (size_t l = 0; l < 2 * (size_t)c.n_layers; l++) {
            CAPTURE(l);
            for (size_t s = 0; s < s_m; s++) {
                bool own = s == l % s_m;  // bias +1 there, -1 elsewhere, projections 0
                CHECK(sd.dg.hc_pre[l * s_m + s] == doctest::Approx(own ? 0.7310586 : 0.2689414).epsilon(1e-4));
                CHECK(sd.dg.hc_post[l * s_m + s] == doctest::Approx(own ? 1.4621172 : 0.5378828).epsilon(1e-4));
                CHECK(sd.dg.hc_h[(l * s_m + s) * s_m + s] > 0.99f);
            }
        }
    }
}

TEST_CASE("in mhc mode each sub-layer's stream mixing is a gradient group; all square-sum to the global norm") {
    const size_t B = 2, T = 3, N = B * T;
    ModelConfig c = mhc_config(3);
    ScopedModel scoped(c, B, T);
    Model& m = scoped.m;
    model_init_params(&m, 9);
    randomize_mhc(m, 10);
    ScopedDiagnostics sd(c);
    std::vector<int> tokens, targets;
    random_batch(c.vocab_size, N, 11, tokens, targets);
    model_forward(&m, tokens.data(), targets.data(), B, T);
    model_zero_grad(&m);
    model_backward(&m);
    int L2 = 2 * c.n_layers;
    std::fill(sd.dg.res_grad_norm, sd.dg.res_grad_norm + L2 + 2, -1.0f);
    diagnostics_measure_layers(&sd.dg, &m);
    double global = model_grad_norm(&m);
    CHECK(groups_squared(sd.dg) == doctest::Approx(global * global).epsilon(1e-5));
    CHECK(sd.dg.res_grad_norm[0] == 0.0f);       // the embedding
    CHECK(sd.dg.res_grad_norm[L2 + 1] == 0.0f);  // the head: the streams' sum learns nothing
    // sub-layer l's group is exactly its rows of the four hc_ tensors
    size_t md = 3 * (size_t)c.d_model, E = m.dims.E;
    for (int l = 0; l < L2; l++) {
        double sum = squares(m.grads.hc_norm + l * md, md) + squares(m.grads.hc_proj + l * E * md, E * md)
                   + squares(m.grads.hc_bias + l * E, E) + squares(m.grads.hc_scale + l * 3, 3);
        CHECK(sd.dg.res_grad_norm[1 + l] == doctest::Approx(std::sqrt(sum)).epsilon(1e-6));
        CHECK(sd.dg.res_grad_norm[1 + l] > 0.0f);
    }
}

TEST_CASE("mhc.csv: a line per sub-layer and stream with a_pre, a_post and row s of H; meta names mhc and m") {
    ModelConfig c = mhc_config(3);
    ScopedModel scoped(c, 1, 4);
    Model& m = scoped.m;
    model_init_params(&m, 1);
    randomize_mhc(m, 2);
    std::vector<int> tokens = {1, 2, 3, 4}, targets = {2, 3, 4, -1};
    TempDir dir;
    std::string run = dir.path + "/run";
    char err[256];
    {
        ScopedDiagnostics sd(c);
        REQUIRE(diagnostics_open(&sd.dg, run.c_str(), -1, "./train --mode mhc", err, sizeof(err)) == 0);
        model_forward(&m, tokens.data(), targets.data(), 1, 4);
        model_zero_grad(&m);
        model_backward(&m);
        diagnostics_measure_layers(&sd.dg, &m);
        CHECK(diagnostics_write_layers(&sd.dg, 5) == 0);
        diagnostics_measure_alpha(&sd.dg, &m);
        CHECK(diagnostics_write_alpha(&sd.dg, 5) == 0);
        CHECK(diagnostics_write_alpha(&sd.dg, 6) == 0);
    }
    std::vector<std::string> meta = read_lines(run + "/meta.csv");
    REQUIRE(meta.size() == 17);
    CHECK(meta[1] == "mode,mhc");
    CHECK(meta[2] == "block_size,0");
    CHECK(meta[15] == "streams,3");
    CHECK(meta[16] == "command,./train --mode mhc");
    CHECK(read_lines(run + "/alpha.csv").size() == 1);  // its header only: no depth attention
    std::vector<std::string> layers = read_lines(run + "/layers.csv");
    REQUIRE(layers.size() == 1 + 1 + 4 + 1);
    CHECK(layers[2].back() != ',');  // the sub-layers' res_grad_norm: their stream mixing's
    CHECK(layers[6].back() == ',');  // out: none
    std::vector<std::string> lines = read_lines(run + "/mhc.csv");
    REQUIRE(lines.size() == 1 + 2 * 4 * 3);  // two records of 4 sub-layers x 3 streams
    CHECK(lines[0] == "step,row,row_name,stream,a_pre,a_post,h_0,h_1,h_2");
    for (size_t i = 1; i < lines.size(); i++) {
        CAPTURE(lines[i]);
        int step = 0, row = 0, stream = 0;
        char name[16] = "";
        double pre = 0, post = 0, h[3] = {0, 0, 0};
        REQUIRE(std::sscanf(lines[i].c_str(), "%d,%d,%15[^,],%d,%lf,%lf,%lf,%lf,%lf", &step, &row,
                            name, &stream, &pre, &post, &h[0], &h[1], &h[2]) == 9);
        size_t k = (i - 1) % 12;  // the line within its record
        CHECK(step == (i <= 12 ? 5 : 6));
        CHECK(row == (int)(k / 3));
        CHECK(stream == (int)(k % 3));
        CHECK(std::string(name) == (row % 2 == 0 ? "L" + std::to_string(row / 2) + ".attn"
                                                 : "L" + std::to_string(row / 2) + ".mlp"));
        CHECK(pre > 0.0);
        CHECK(pre < 1.0);
        CHECK(post > 0.0);
        CHECK(post < 2.0);
        CHECK(h[0] + h[1] + h[2] == doctest::Approx(1.0).epsilon(1e-4));  // 5 decimals each
        for (double x : h) CHECK((x >= 0.0 && x <= 1.0));
    }
}
