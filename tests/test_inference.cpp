// test_inference.cpp — decoding with caches (inference.h): the decoder against model_forward
// over the whole sequence, greedy generation against the argmax of full forwards over the
// growing sequence, the two-phase depth attention against the sequential definition
// (depth_attention_forward), and token sampling.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "gradcheck.h"
#include "inference.h"
#include "layers.h"
#include "model.h"

using gradcheck::compare_within;
using gradcheck::Rng;
using gradcheck::Tolerance;

typedef std::vector<float> Vec;

// ---- tolerances --------------------------------------------------------------------------
// Decoder logits against the full forward: max over positions of max_v |diff| / max_v |full|.
// Linear maps, RoPE and attention run the same arithmetic in the same order in both paths
// (bit-identical: none mode measures exactly 0); only the depth attention sums in another
// order (phase 1 + merge instead of one softmax), a few float roundings: measured 8.6e-7
// (full), 1.0e-6 (S=2), 5.2e-7 (S=3), 5.5e-7 (S=4), 1.1e-6 (S=6). Set GRADCHECK_VERBOSE=1 to
// print them.
static const double DECODER_LOGITS_RTOL = 1e-5;
// Two-phase against the sequential definition, outputs up to ~8 (huge scores included):
// measured max error 9.5e-7, at most 0.19 of this tolerance.
static const Tolerance TWO_PHASE_TOL = {1e-6, 1e-6};

static ModelConfig small_config(int n_layers, int block_size) {
    // d=16, H=4 query heads over G=2 key/value heads (hs = 4), F=24, V=11
    return ModelConfig{11, 16, n_layers, 4, 2, 24, block_size};
}

// Random parameters of unit-scale activations: matrices U(-a, a) with variance 1/d, embeddings
// U(-1, 1), gains U(0.5, 1.5) and pseudo-queries U(-1, 1), so every depth attention has
// uneven weights (not the zero-query average of the init).
static void randomize_params(Model* m, uint64_t seed) {
    Rng rng(seed);
    float a = std::sqrt(3.0f / (float)m->config.d_model);
    float* p = m->params_memory;
    for (int i = 0; i < N_PARAM_TENSORS; i++) {
        for (size_t j = 0; j < m->param_sizes[i]; j++) {
            if (i == PARAM_wte) p[j] = rng.uniform(-1.0f, 1.0f);
            else if (i == PARAM_res_query) p[j] = rng.uniform(-1.0f, 1.0f);
            else if (PARAM_INFO[i].decayed) p[j] = rng.uniform(-a, a);
            else p[j] = rng.uniform(0.5f, 1.5f);
        }
        p += m->param_sizes[i];
    }
}

static std::vector<int> random_tokens(size_t n, int V, uint64_t seed) {
    Rng rng(seed);
    std::vector<int> out(n);
    for (int& t : out) t = (int)(rng.next() % (uint64_t)V);
    return out;
}

static size_t argmax(const float* x, size_t n) {
    return (size_t)(std::max_element(x, x + n) - x);
}

struct ModeCase {
    const char* name;
    int n_layers, block_size;
};
static const ModeCase MODES[] = {
    {"none", 2, 0}, {"full", 2, 1}, {"block S=2", 2, 2}, {"block S=3 (L=3)", 3, 3},
    {"block S=4", 2, 4}, {"block S=6 (L=3)", 3, 6},
};

TEST_CASE("decoding with caches gives the logits of a full forward at every position") {
    for (const ModeCase& mode : MODES) {
        SUBCASE(mode.name) {
            const size_t B = 2, T = 9;
            ModelConfig c = small_config(mode.n_layers, mode.block_size);
            size_t V = c.vocab_size;
            Model m;
            model_build(&m, &c, B, T);
            randomize_params(&m, 7);
            std::vector<int> tokens = random_tokens(B * T, c.vocab_size, 11);
            model_forward(&m, tokens.data(), nullptr, B, T);
            const float* full = model_logits(&m);

            Decoder dec;
            decoder_build(&dec, &m, B, T);
            // a first sequence fills the caches, so the reset must really forget it
            std::vector<int> other = random_tokens(B * T, c.vocab_size, 12), step_tokens(B);
            Vec logits(B * V);
            for (size_t t = 0; t < T; t++) {
                for (size_t b = 0; b < B; b++) step_tokens[b] = other[b * T + t];
                decoder_step(&dec, step_tokens.data(), logits.data());
            }
            decoder_reset(&dec);
            double max_rel = 0.0;
            for (size_t t = 0; t < T; t++) {
                for (size_t b = 0; b < B; b++) step_tokens[b] = tokens[b * T + t];
                decoder_step(&dec, step_tokens.data(), logits.data());
                for (size_t b = 0; b < B; b++) {
                    const float* want = full + (b * T + t) * V;
                    const float* got = logits.data() + b * V;
                    double scale = 0.0, diff = 0.0;
                    for (size_t v = 0; v < V; v++) {
                        scale = std::max(scale, (double)std::fabs(want[v]));
                        diff = std::max(diff, std::fabs((double)got[v] - want[v]));
                    }
                    double rel = diff / scale;
                    if (!(rel <= DECODER_LOGITS_RTOL)) {
                        FAIL_CHECK("b=" << b << " t=" << t << ": max |diff| " << diff
                                        << " relative " << rel);
                    }
                    max_rel = std::max(max_rel, rel);
                }
            }
            CHECK(dec.T == T);
            if (gradcheck::verbose()) {
                MESSAGE(std::string(mode.name) << ": max relative logit difference " << max_rel);
            }
            CHECK(max_rel <= DECODER_LOGITS_RTOL);
            decoder_free(&dec);
            model_free(&m);
        }
    }
}

// The greedy continuation (B, n_new) of prompt (B, n_prompt) computed without a cache: each
// token is the argmax of model_forward over the last `window` tokens of the sequence so far
// (as positions 0 .. window-1), the whole prefix when window >= its length.
static std::vector<int> greedy_by_full_forwards(Model* m, const std::vector<int>& prompt,
                                                size_t B, size_t n_prompt, size_t n_new,
                                                size_t window) {
    size_t V = m->config.vocab_size, total = n_prompt + n_new;
    std::vector<int> seq(B * total), out(B * n_new);
    for (size_t b = 0; b < B; b++)
        for (size_t t = 0; t < n_prompt; t++) seq[b * total + t] = prompt[b * n_prompt + t];
    for (size_t k = 0; k < n_new; k++) {
        size_t len = n_prompt + k, first = len > window ? len - window : 0, n = len - first;
        std::vector<int> tokens(B * n);
        for (size_t b = 0; b < B; b++)
            std::copy(seq.begin() + b * total + first, seq.begin() + b * total + len,
                      tokens.begin() + b * n);
        model_forward(m, tokens.data(), nullptr, B, n);
        for (size_t b = 0; b < B; b++) {
            int next = (int)argmax(model_logits(m) + (b * n + n - 1) * V, V);
            seq[b * total + len] = next;
            out[b * n_new + k] = next;
        }
    }
    return out;
}

// Greedy decoding with a decoder of max_T = window positions against
// greedy_by_full_forwards, in every mode.
static void check_greedy_decoding(size_t n_prompt, size_t n_new, size_t window, uint64_t seed) {
    const size_t B = 2;
    for (const ModeCase& mode : MODES) {
        SUBCASE(mode.name) {
            ModelConfig c = small_config(mode.n_layers, mode.block_size);
            Model m;
            model_build(&m, &c, B, window);
            randomize_params(&m, seed);
            std::vector<int> prompt = random_tokens(B * n_prompt, c.vocab_size, seed + 1);
            Decoder dec;
            decoder_build(&dec, &m, B, window);
            std::vector<int> generated(B * n_new);
            uint64_t rng = 1;
            decoder_generate(&dec, prompt.data(), n_prompt, generated.data(), n_new, 0.0f, 0,
                             &rng);
            CHECK(rng == 1);  // greedy draws no random numbers
            std::vector<int> want = greedy_by_full_forwards(&m, prompt, B, n_prompt, n_new, window);
            for (size_t i = 0; i < B * n_new; i++)
                CHECK_MESSAGE(generated[i] == want[i], "b=" << i / n_new << " token " << i % n_new);
            decoder_free(&dec);
            model_free(&m);
        }
    }
}

TEST_CASE("greedy decoding with caches equals the argmax of full forwards of the growing prefix") {
    check_greedy_decoding(3, 7, 3 + 7, 21);  // the window holds the whole sequence
}

TEST_CASE("past the trained context, greedy decoding reads the window of the last T tokens") {
    // a window of 4 positions, 9 tokens after a 6-token prompt (longer than the window
    // itself): 15 positions
    check_greedy_decoding(6, 9, 4, 23);
}

TEST_CASE("two-phase depth attention equals the sequential definition, every block size") {
    const size_t N = 3, C = 16;
    // sources = scale * (u + spread * noise) with a random scale per source and u shared by
    // the sources of a row; spread 1: sources differ by O(1). With spread 1e-4 the normalised
    // keys nearly coincide, so huge queries give scores of thousands (e^s overflows a float
    // past 88) that differ by O(1): the softmax stays spread out, not one-hot.
    // Huge queries on unrelated sources give scores thousands apart: one-hot softmaxes, where
    // the phase that holds the max must not be rescaled by e^{+thousands}.
    float query_scale = 1.0f, spread = 1.0f;
    SUBCASE("scores of order 1") {}
    SUBCASE("huge scores, O(1) apart: nothing overflows") {
        query_scale = 1000.0f;
        spread = 1e-4f;
    }
    SUBCASE("huge scores, thousands apart: nothing overflows") { query_scale = 1000.0f; }
    Rng rng(99);
    Vec shared = rng.uniform_vector(N * C, -2.0f, 2.0f);
    auto draw_source = [&]() {
        Vec v(N * C);
        for (size_t n = 0; n < N; n++) {
            float scale = rng.uniform(0.5f, 2.0f);
            for (size_t c = 0; c < C; c++) {
                v[n * C + c] = scale * (shared[n * C + c] + spread * rng.uniform(-2.0f, 2.0f));
            }
        }
        return v;
    };
    double max_err = 0.0, min_top_alpha = 1.0, max_score = 0.0;
    for (size_t S = 1; S <= 6; S++) {
        for (size_t n : {1, 2, 3, 5}) {
            // completed blocks b_0 .. b_{n-1}, and the partial sums p_1 .. p_{S-1}
            std::vector<Vec> blocks(n), partials(S);
            for (Vec& b : blocks) b = draw_source();
            for (Vec& p : partials) p = draw_source();
            Vec queries = rng.uniform_vector(S * C, -query_scale, query_scale);
            Vec gains = rng.uniform_vector(S * C, 0.5f, 1.5f);
            std::vector<const float*> block_ptrs;
            for (const Vec& b : blocks) block_ptrs.push_back(b.data());

            Vec o(S * N * C), max(S * N), sumexp(S * N);
            depth_attention_phase1(o.data(), max.data(), sumexp.data(), block_ptrs.data(),
                                   queries.data(), gains.data(), n, S, N, C);
            for (float m : max) max_score = std::max(max_score, (double)std::fabs(m));
            for (size_t i = 0; i < S; i++) {
                Vec two_phase(N * C), sequential(N * C), alpha(N * (n + 1)), rstd(N * (n + 1));
                depth_attention_phase2(two_phase.data(), o.data() + i * N * C,
                                       max.data() + i * N, sumexp.data() + i * N,
                                       i == 0 ? nullptr : partials[i].data(),
                                       queries.data() + i * C, gains.data() + i * C, N, C);
                std::vector<const float*> sources = block_ptrs;
                if (i > 0) sources.push_back(partials[i].data());
                size_t n_sources = sources.size();
                depth_attention_forward(sequential.data(), alpha.data(), rstd.data(),
                                        sources.data(), queries.data() + i * C,
                                        gains.data() + i * C, n_sources, N, C);
                std::string name = "S=" + std::to_string(S) + " n=" + std::to_string(n) +
                                   " i=" + std::to_string(i);
                compare_within(name, two_phase.data(), sequential.data(), N * C, TWO_PHASE_TOL);
                for (size_t j = 0; j < N * C; j++) {
                    max_err = std::max(max_err, (double)std::fabs(two_phase[j] - sequential[j]));
                }
                for (size_t r = 0; r < N && n_sources > 1; r++) {
                    const float* a = &alpha[r * n_sources];
                    double top = *std::max_element(a, a + n_sources);
                    min_top_alpha = std::min(min_top_alpha, top);
                }
            }
        }
    }
    if (gradcheck::verbose()) {
        MESSAGE("two-phase max |error| " << max_err << ", smallest top weight " << min_top_alpha
                                         << ", largest |score| " << max_score);
    }
    if (spread < 1.0f || query_scale == 1.0f) {
        CHECK(min_top_alpha < 0.6);  // some softmax is far from one-hot: the merge really mixes
    }
    if (query_scale > 1.0f) CHECK(max_score > 1000.0);
}

TEST_CASE("sampling: greedy limits, a fixed seed, top-k support and the softmax frequencies") {
    const float logits[] = {0.5f, 2.0f, -1.0f, 1.5f, 2.0f, 0.0f};
    const size_t V = 6;  // the argmax is token 1 (first of the two 2.0s)
    uint64_t rng = 42;
    SUBCASE("temperature 0 is the argmax and draws nothing") {
        CHECK(sample_token(logits, V, 0.0f, 0, &rng) == 1);
        CHECK(sample_token(logits, V, 0.0f, 3, &rng) == 1);
        CHECK(rng == 42);
    }
    SUBCASE("top_k 1 is the argmax at any temperature") {
        for (float temperature : {0.5f, 1.0f, 5.0f}) {
            CHECK(sample_token(logits, V, temperature, 1, &rng) == 1);
        }
    }
    SUBCASE("a fixed seed gives a fixed sequence, another seed another") {
        std::vector<int> first, again, other;
        uint64_t a = 7, b = 7, c = 8;
        for (int i = 0; i < 64; i++) {
            first.push_back(sample_token(logits, V, 1.0f, 0, &a));
            again.push_back(sample_token(logits, V, 1.0f, 0, &b));
            other.push_back(sample_token(logits, V, 1.0f, 0, &c));
        }
        CHECK(first == again);
        CHECK(first != other);
    }
    SUBCASE("frequencies follow softmax(logits / temperature) over the top k") {
        for (int top_k : {0, 3}) {
            const float temperature = 0.7f;
            std::vector<double> want(V, 0.0);
            double sum = 0.0;
            for (size_t v = 0; v < V; v++) {
                bool kept = top_k == 0 || v == 1 || v == 4 || v == 3;  // the top 3
                want[v] = kept ? std::exp((logits[v] - 2.0) / temperature) : 0.0;
                sum += want[v];
            }
            const int draws = 40000;
            std::vector<int> count(V, 0);
            for (int i = 0; i < draws; i++) {
                count[sample_token(logits, V, temperature, top_k, &rng)]++;
            }
            for (size_t v = 0; v < V; v++) {
                double freq = (double)count[v] / draws, p = want[v] / sum;
                // 5 standard deviations of a binomial frequency
                double allowed = 5.0 * std::sqrt(p * (1.0 - p) / draws) + 1e-12;
                CHECK_MESSAGE(std::fabs(freq - p) <= allowed,
                              "top_k=" << top_k << " token " << v << ": frequency " << freq
                                       << ", probability " << p);
            }
        }
    }
}
