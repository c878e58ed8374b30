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
// order (phase 1 + merge instead of one softmax), a few float roundings: measured 4.5e-7
// (full), 6.1e-7 (S=2), 4.8e-7 (S=3), 1.0e-6 (S=4), 8.7e-7 (S=6). The variants: at most
// 1.6e-6 (key norm off, S=3), window 2 + static mixing 1.4e-6, 2 heads 1.0e-6 (S=2), window
// 2 5.6e-7, static mixing 6.1e-7 (gcc 12, AMD EPYC Zen 3; other roundings elsewhere move
// these by a few 1e-7); exactly 0 for sigmoid scores and DenseFormer, whose two phases sum in the
// sequential order, and for the input-dependent query, which decodes by the sequential
// definition, and for mHC-lite, whose steps run the forward's row operations in its order.
// Set GRADCHECK_VERBOSE=1 to print them.
static const double DECODER_LOGITS_RTOL = 1e-5;
// Two-phase against the sequential definition, outputs up to ~8 (huge scores included):
// measured max error 9.5e-7, at most 0.22 of this tolerance; the same for the softmax
// variants and static mixing (9.5e-7, at most 0.19); exactly 0 for sigmoid and DenseFormer.
static const Tolerance TWO_PHASE_TOL = {1e-6, 1e-6};

static ModelConfig small_config(int n_layers, int block_size) {
    // d=16, H=4 query heads over G=2 key/value heads (hs = 4), F=24, V=11
    return ModelConfig{11, 16, n_layers, 4, 2, 24, block_size};
}

// Random parameters of unit-scale activations: matrices U(-a, a) with variance 1/d (U_l of
// the input-dependent query too), embeddings U(-1, 1), gains and DenseFormer scalars
// U(0.5, 1.5), pseudo-queries and static mixing logits U(-1, 1), so every depth attention
// has uneven weights (not the zero-query average, or the ones, of the init). mHC-lite: Phi
// like the matrices, biases U(-1, 1), gains and scales U(0.5, 1.5).
static void randomize_params(Model* m, uint64_t seed) {
    Rng rng(seed);
    float a = std::sqrt(3.0f / (float)m->config.d_model);
    float* p = m->params_memory;
    for (int i = 0; i < N_PARAM_TENSORS; i++) {
        for (size_t j = 0; j < m->param_sizes[i]; j++) {
            if (i == PARAM_wte || i == PARAM_res_query || i == PARAM_res_logits ||
                i == PARAM_hc_bias) {
                p[j] = rng.uniform(-1.0f, 1.0f);
            } else if (PARAM_INFO[i].decayed || i == PARAM_res_qproj || i == PARAM_hc_proj) {
                p[j] = rng.uniform(-a, a);
            } else {
                p[j] = rng.uniform(0.5f, 1.5f);
            }
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

// Decodes B = 2 sequences of T = 9 tokens with caches, after a first pair of sequences that
// the reset must forget, and compares the logits with model_forward's over the whole
// sequences at every position. The first n_prefill positions (0: none) go in by one
// decoder_prefill, whose logits are those of its last position; every later position by a
// step, which reads the keys and values the prefill left in the caches. Returns the largest
// max_v |diff| / max_v |full| over positions; each position past DECODER_LOGITS_RTOL fails.
static double decoding_error(const ModelConfig& c, uint64_t seed, size_t n_prefill = 0) {
    const size_t B = 2, T = 9;
    size_t V = c.vocab_size;
    Model m;
    model_build(&m, &c, B, T);
    randomize_params(&m, seed);
    std::vector<int> tokens = random_tokens(B * T, c.vocab_size, seed + 4);
    model_forward(&m, tokens.data(), nullptr, B, T);
    // a prefill runs on the model's buffers: the full forward's logits are kept apart
    const Vec full(model_logits(&m), model_logits(&m) + B * T * V);

    Decoder dec;
    decoder_build(&dec, &m, B, T);
    // a first sequence fills the caches, so the reset must really forget it
    std::vector<int> other = random_tokens(B * T, c.vocab_size, seed + 5), step_tokens(B);
    Vec logits(B * V);
    for (size_t t = 0; t < T; t++) {
        for (size_t b = 0; b < B; b++) step_tokens[b] = other[b * T + t];
        decoder_step(&dec, step_tokens.data(), logits.data());
    }
    decoder_reset(&dec, B);
    double max_rel = 0.0;
    std::vector<int> window(B * n_prefill);
    for (size_t b = 0; b < B; b++)
        for (size_t t = 0; t < n_prefill; t++) window[b * n_prefill + t] = tokens[b * T + t];
    for (size_t t = n_prefill > 0 ? n_prefill - 1 : 0; t < T; t++) {
        bool prefilled = n_prefill > 0 && t == n_prefill - 1;
        if (prefilled) {
            decoder_prefill(&dec, window.data(), n_prefill, logits.data());
        } else {
            for (size_t b = 0; b < B; b++) step_tokens[b] = tokens[b * T + t];
            decoder_step(&dec, step_tokens.data(), logits.data());
        }
        for (size_t b = 0; b < B; b++) {
            const float* want = full.data() + (b * T + t) * V;
            const float* got = logits.data() + b * V;
            double scale = 0.0, diff = 0.0;
            for (size_t v = 0; v < V; v++) {
                scale = std::max(scale, (double)std::fabs(want[v]));
                diff = std::max(diff, std::fabs((double)got[v] - want[v]));
            }
            double rel = diff / scale;
            // a prefill is model_forward over a prefix of the same sequences: every operation of
            // a position reads that position and the ones before it, so the bits are the same
            if (prefilled) CHECK_MESSAGE(diff == 0.0, "prefill b=" << b << ": max |diff| " << diff);
            if (!(rel <= DECODER_LOGITS_RTOL)) {
                FAIL_CHECK("b=" << b << " t=" << t << ": max |diff| " << diff << " relative "
                                << rel);
            }
            max_rel = std::max(max_rel, rel);
        }
    }
    CHECK(dec.T == T);
    decoder_free(&dec);
    model_free(&m);
    return max_rel;
}

TEST_CASE("decoding with caches gives the logits of a full forward at every position") {
    for (const ModeCase& mode : MODES) {
        SUBCASE(mode.name) {
            double max_rel = decoding_error(small_config(mode.n_layers, mode.block_size), 7);
            if (gradcheck::verbose()) {
                MESSAGE(std::string(mode.name) << ": max relative logit difference " << max_rel);
            }
            CHECK(max_rel <= DECODER_LOGITS_RTOL);
        }
    }
}

// A prefill is model_forward itself (the same logits at its last position, bit for bit,
// checked by decoding_error); the steps after it read its keys and values from the caches: a
// prefill that left the caches empty, or filled them at the wrong positions, turns the later
// positions red.
TEST_CASE("a prefill of the first positions, then steps, gives the logits of a full forward") {
    for (const ModeCase& mode : MODES) {
        SUBCASE(mode.name) {
            ModelConfig c = small_config(mode.n_layers, mode.block_size);
            for (size_t n_prefill : {1, 5, 9}) {
                CAPTURE(n_prefill);
                double max_rel = decoding_error(c, 11, n_prefill);
                CHECK(max_rel <= DECODER_LOGITS_RTOL);
            }
        }
    }
}

// A variant (SPEC "Variants") in one mode: the switches of ModelConfig after block_size.
struct VariantDecoding {
    const char* name;
    int n_layers, block_size;
    int depth_score, key_norm_off, depth_query, depth_heads, depth_window, mixing;
};
static const VariantDecoding VARIANTS[] = {
    // name                                 L  S  sig off inp K  W  mix
    {"sigmoid, full",                       2, 1, 1,  0,  0,  0, 0, 0},
    {"sigmoid, block S=2",                  2, 2, 1,  0,  0,  0, 0, 0},
    {"sigmoid, block S=4",                  2, 4, 1,  0,  0,  0, 0, 0},
    {"key norm off, full",                  2, 1, 0,  1,  0,  0, 0, 0},
    {"key norm off, block S=2",             2, 2, 0,  1,  0,  0, 0, 0},
    {"key norm off, block S=3 (L=3)",       3, 3, 0,  1,  0,  0, 0, 0},
    {"input query, full",                   2, 1, 0,  0,  1,  0, 0, 0},
    {"input query, block S=2",              2, 2, 0,  0,  1,  0, 0, 0},
    {"input query, block S=4",              2, 4, 0,  0,  1,  0, 0, 0},
    {"2 heads, full",                       2, 1, 0,  0,  0,  2, 0, 0},
    {"2 heads, block S=2",                  2, 2, 0,  0,  0,  2, 0, 0},
    {"4 heads, full",                       2, 1, 0,  0,  0,  4, 0, 0},
    {"4 heads, block S=4",                  2, 4, 0,  0,  0,  4, 0, 0},
    {"window 2, full (L=3)",                3, 1, 0,  0,  0,  0, 2, 0},
    {"static mixing, full",                 2, 1, 0,  0,  0,  0, 0, 1},
    {"static mixing, block S=2",            2, 2, 0,  0,  0,  0, 0, 1},
    {"static mixing, block S=3 (L=3)",      3, 3, 0,  0,  0,  0, 0, 1},
    {"dense mixing, full",                  2, 1, 0,  0,  0,  0, 0, 2},
    {"dense mixing, block S=2",             2, 2, 0,  0,  0,  0, 0, 2},
    {"dense mixing, block S=6 (L=3)",       3, 6, 0,  0,  0,  0, 0, 2},
    {"window 2 + static mixing, full (L=3)", 3, 1, 0, 0,  0,  0, 2, 1},
    {"window 2 + dense mixing, full (L=3)", 3, 1, 0,  0,  0,  0, 2, 2},
    {"sigmoid + 4 heads + key norm off, full",        2, 1, 1, 1, 0, 4, 0, 0},
    {"sigmoid + 4 heads + key norm off, block S=2",   2, 2, 1, 1, 0, 4, 0, 0},
    {"input query + sigmoid, block S=4",              2, 4, 1, 0, 1, 0, 0, 0},
    {"input query + 2 heads + key norm off, block S=3 (L=3)", 3, 3, 0, 1, 1, 2, 0, 0},
    {"every attention switch, block S=2",             2, 2, 1, 1, 1, 2, 0, 0},
    {"sigmoid + 2 heads + window 2, full (L=3)",      3, 1, 1, 0, 0, 2, 2, 0},
    {"input query + window 2, full (L=3)",            3, 1, 0, 0, 1, 0, 2, 0},
};

TEST_CASE("decoding mode mhc with caches gives the logits of a full forward at every position, m = 2, 3, 4") {
    for (int streams : {2, 3, 4}) {
        CAPTURE(streams);
        ModelConfig c = small_config(2, 0);
        c.streams = streams;
        char err[256];
        REQUIRE_MESSAGE(model_config_check(&c, err, sizeof err) == 0, err);
        double max_rel = decoding_error(c, 41 + (uint64_t)streams);
        if (gradcheck::verbose()) {
            MESSAGE("mhc m=" << streams << ": max relative logit difference " << max_rel);
        }
        CHECK(max_rel <= DECODER_LOGITS_RTOL);
        CHECK(decoding_error(c, 47, 4) <= DECODER_LOGITS_RTOL);  // a prefill, then steps
    }
}

TEST_CASE("decoding every variant with caches gives the logits of a full forward at every position") {
    for (const VariantDecoding& v : VARIANTS) {
        SUBCASE(v.name) {
            ModelConfig c = small_config(v.n_layers, v.block_size);
            c.depth_score = v.depth_score;
            c.key_norm_off = v.key_norm_off;
            c.depth_query = v.depth_query;
            c.depth_heads = v.depth_heads;
            c.depth_window = v.depth_window;
            c.mixing = v.mixing;
            char err[256];
            REQUIRE_MESSAGE(model_config_check(&c, err, sizeof err) == 0, err);
            double max_rel = decoding_error(c, 31);
            if (gradcheck::verbose()) {
                MESSAGE(std::string(v.name) << ": max relative logit difference " << max_rel);
            }
            CHECK(max_rel <= DECODER_LOGITS_RTOL);
            CHECK(decoding_error(c, 37, 4) <= DECODER_LOGITS_RTOL);  // a prefill, then steps
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

// decoder_generate's TokenCallback for the tests: every draw, position after position
struct Seen {
    std::vector<int> tokens;
};
static void record_tokens(void* context, const int* tokens, size_t B) {
    Seen* seen = static_cast<Seen*>(context);
    seen->tokens.insert(seen->tokens.end(), tokens, tokens + B);
}

// Greedy decoding with a decoder of max_T = window positions against
// greedy_by_full_forwards, in every mode. The decoder holds 3 sequences and decodes 3 other
// ones first, then the B = 2 of the test, then the second of them alone: each decode must
// forget the one before, whatever its number of sequences.
static void check_greedy_decoding(size_t n_prompt, size_t n_new, size_t window, uint64_t seed) {
    const size_t B = 2, max_B = 3;
    for (const ModeCase& mode : MODES) {
        SUBCASE(mode.name) {
            ModelConfig c = small_config(mode.n_layers, mode.block_size);
            Model m;
            model_build(&m, &c, max_B, window);
            randomize_params(&m, seed);
            std::vector<int> prompt = random_tokens(B * n_prompt, c.vocab_size, seed + 1);
            std::vector<int> others = random_tokens(max_B * n_prompt, c.vocab_size, seed + 2);
            Decoder dec;
            decoder_build(&dec, &m, max_B, window);
            std::vector<int> generated(max_B * n_new);
            uint64_t rng = 1;
            decoder_generate(&dec, max_B, others.data(), n_prompt, generated.data(), n_new,
                             0.0f, 0, &rng, nullptr, nullptr);
            Seen seen;
            decoder_generate(&dec, B, prompt.data(), n_prompt, generated.data(), n_new, 0.0f, 0,
                             &rng, record_tokens, &seen);
            CHECK(rng == 1);  // greedy draws no random numbers
            // the callback saw every position's B draws, in order, as out holds them
            REQUIRE(seen.tokens.size() == B * n_new);
            for (size_t k = 0; k < n_new; k++)
                for (size_t b = 0; b < B; b++)
                    CHECK(seen.tokens[k * B + b] == generated[b * n_new + k]);
            std::vector<int> want = greedy_by_full_forwards(&m, prompt, B, n_prompt, n_new, window);
            for (size_t i = 0; i < B * n_new; i++)
                CHECK_MESSAGE(generated[i] == want[i], "b=" << i / n_new << " token " << i % n_new);
            decoder_generate(&dec, 1, prompt.data() + n_prompt, n_prompt, generated.data(), n_new,
                             0.0f, 0, &rng, nullptr, nullptr);
            for (size_t i = 0; i < n_new; i++)
                CHECK_MESSAGE(generated[i] == want[n_new + i], "alone: token " << i);
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

// The scores of a two-phase test, one subcase each. Sources are scale * (u + spread * noise)
// with a random scale per source and row and u shared by the sources of a row; spread 1:
// sources differ by O(1). With spread 1e-4 the normalised keys nearly coincide, so huge
// queries give scores of thousands (e^s overflows a float past 88) that differ by O(1): the
// softmax stays spread out, not one-hot. Huge queries on unrelated sources give scores
// thousands apart: one-hot softmaxes, where the phase that holds the max must not be
// rescaled by e^{+thousands}.
struct ScoreScale {
    float query_scale, spread;
};
static ScoreScale score_scale_subcases() {
    ScoreScale scale = {1.0f, 1.0f};
    SUBCASE("scores of order 1") {}
    SUBCASE("huge scores, O(1) apart: nothing overflows") { scale = {1000.0f, 1e-4f}; }
    SUBCASE("huge scores, thousands apart: nothing overflows") { scale = {1000.0f, 1.0f}; }
    return scale;
}

// Draws the (N,C) sources of ScoreScale: the u shared by a row's sources is drawn first.
struct SourceDrawer {
    Rng& rng;
    size_t N, C;
    float spread;
    Vec shared;
    SourceDrawer(Rng& rng_, size_t N_, size_t C_, float spread_)
        : rng(rng_), N(N_), C(C_), spread(spread_),
          shared(rng_.uniform_vector(N_ * C_, -2.0f, 2.0f)) {}
    Vec operator()() {
        Vec v(N * C);
        for (size_t n = 0; n < N; n++) {
            float scale = rng.uniform(0.5f, 2.0f);
            for (size_t c = 0; c < C; c++) {
                v[n * C + c] = scale * (shared[n * C + c] + spread * rng.uniform(-2.0f, 2.0f));
            }
        }
        return v;
    }
};

// The sources of one block of S sub-layers: the completed blocks b_0 .. b_{n-1}, then the
// partial sums p_1 .. p_{S-1} (p_0 is drawn, never used). Sub-layer i reads the blocks, then
// p_i when i > 0.
struct BlockSources {
    std::vector<Vec> blocks, partials;
    std::vector<const float*> block_ptrs;
    BlockSources(SourceDrawer& draw, size_t n, size_t S) : blocks(n), partials(S) {
        for (Vec& b : blocks) b = draw();
        for (Vec& p : partials) p = draw();
        for (const Vec& b : blocks) block_ptrs.push_back(b.data());
    }
    const float* partial(size_t i) const { return i == 0 ? nullptr : partials[i].data(); }
    std::vector<const float*> sources(size_t i) const {
        std::vector<const float*> list = block_ptrs;
        if (i > 0) list.push_back(partials[i].data());
        return list;
    }
};

// Two-phase against the sequential output within TWO_PHASE_TOL; max_err keeps the largest
// |difference|.
static void check_two_phase(const std::string& name, const Vec& two_phase, const Vec& sequential,
                            double& max_err) {
    compare_within(name, two_phase.data(), sequential.data(), two_phase.size(), TWO_PHASE_TOL);
    for (size_t j = 0; j < two_phase.size(); j++) {
        max_err = std::max(max_err, (double)std::fabs(two_phase[j] - sequential[j]));
    }
}

// The smallest, over rows and heads, of the largest softmax weight alpha (rows, n_sources,
// heads): below ~0.6, some softmax is far from one-hot, so a merge really mixes. 1 for a
// single source.
static double smallest_top_weight(const Vec& alpha, size_t rows, size_t n_sources, size_t heads) {
    double smallest = 1.0;
    for (size_t r = 0; r < rows && n_sources > 1; r++) {
        for (size_t k = 0; k < heads; k++) {
            double top = 0.0;
            for (size_t i = 0; i < n_sources; i++) {
                top = std::max(top, (double)alpha[(r * n_sources + i) * heads + k]);
            }
            smallest = std::min(smallest, top);
        }
    }
    return smallest;
}

static std::string block_case(size_t S, size_t n, size_t i) {
    return "S=" + std::to_string(S) + " n=" + std::to_string(n) + " i=" + std::to_string(i);
}

TEST_CASE("two-phase depth attention equals the sequential definition, every block size") {
    const size_t N = 3, C = 16;
    ScoreScale scale = score_scale_subcases();
    Rng rng(99);
    SourceDrawer draw_source(rng, N, C, scale.spread);
    double max_err = 0.0, min_top_alpha = 1.0, max_score = 0.0;
    for (size_t S = 1; S <= 6; S++) {
        for (size_t n : {1, 2, 3, 5}) {
            BlockSources src(draw_source, n, S);
            Vec queries = rng.uniform_vector(S * C, -scale.query_scale, scale.query_scale);
            Vec gains = rng.uniform_vector(S * C, 0.5f, 1.5f);
            Vec o(S * N * C), max(S * N), sumexp(S * N);
            depth_attention_phase1(o.data(), max.data(), sumexp.data(), src.block_ptrs.data(),
                                   queries.data(), gains.data(), n, S, N, C);
            for (float m : max) max_score = std::max(max_score, (double)std::fabs(m));
            for (size_t i = 0; i < S; i++) {
                std::vector<const float*> sources = src.sources(i);
                size_t n_sources = sources.size();
                Vec two_phase(N * C), sequential(N * C), alpha(N * n_sources), rstd(N * n_sources);
                depth_attention_phase2(two_phase.data(), o.data() + i * N * C,
                                       max.data() + i * N, sumexp.data() + i * N, src.partial(i),
                                       queries.data() + i * C, gains.data() + i * C, N, C);
                depth_attention_forward(sequential.data(), alpha.data(), rstd.data(),
                                        sources.data(), queries.data() + i * C,
                                        gains.data() + i * C, n_sources, N, C);
                check_two_phase(block_case(S, n, i), two_phase, sequential, max_err);
                min_top_alpha =
                    std::min(min_top_alpha, smallest_top_weight(alpha, N, n_sources, 1));
            }
        }
    }
    if (gradcheck::verbose()) {
        MESSAGE("two-phase max |error| " << max_err << ", smallest top weight " << min_top_alpha
                                         << ", largest |score| " << max_score);
    }
    if (scale.spread < 1.0f || scale.query_scale == 1.0f) CHECK(min_top_alpha < 0.6);
    if (scale.query_scale > 1.0f) CHECK(max_score > 1000.0);
}

// The switches of a two-phase variant case.
struct AttentionSwitches {
    size_t heads;
    int sigmoid, key_norm;
    std::string name() const {
        return std::string(sigmoid ? "sigmoid" : "softmax") + (key_norm ? "" : " no key norm") +
               " heads=" + std::to_string(heads) + " ";
    }
};

TEST_CASE("two-phase variant depth attention equals the sequential definition, every block size and switch") {
    const size_t N = 3, C = 16;
    ScoreScale scale = score_scale_subcases();
    Rng rng(101);
    SourceDrawer draw_source(rng, N, C, scale.spread);
    std::vector<AttentionSwitches> every_switch;
    for (size_t heads : {1, 2, 4})
        for (int sigmoid = 0; sigmoid < 2; sigmoid++)
            for (int key_norm = 0; key_norm < 2; key_norm++)
                every_switch.push_back({heads, sigmoid, key_norm});
    double max_err[2] = {0.0, 0.0}, min_top_alpha = 1.0;  // max_err by score: softmax, sigmoid
    for (const AttentionSwitches& sw : every_switch) {
        size_t K = sw.heads;
        for (size_t S = 1; S <= 6; S++) {
            for (size_t n : {1, 2, 3, 5}) {
                BlockSources src(draw_source, n, S);
                Vec queries = rng.uniform_vector(S * C, -scale.query_scale, scale.query_scale);
                Vec gains = rng.uniform_vector(S * C, 0.5f, 1.5f);
                const float* norm = sw.key_norm ? gains.data() : nullptr;
                Vec o(S * N * C), max(S * N * K), sumexp(S * N * K);
                depth_attention_variant_phase1(o.data(), max.data(), sumexp.data(),
                                               src.block_ptrs.data(), queries.data(), norm, n, S,
                                               N, C, K, sw.sigmoid);
                for (size_t i = 0; i < S; i++) {
                    std::vector<const float*> sources = src.sources(i);
                    size_t n_sources = sources.size();
                    const float* query = queries.data() + i * C;
                    const float* gain = norm != nullptr ? norm + i * C : nullptr;
                    Vec two_phase(N * C), sequential(N * C);
                    Vec alpha(N * n_sources * K), rstd(N * n_sources * K);
                    depth_attention_variant_phase2(two_phase.data(), o.data() + i * N * C,
                                                   max.data() + i * N * K,
                                                   sumexp.data() + i * N * K, src.partial(i),
                                                   query, gain, N, C, K, sw.sigmoid);
                    depth_attention_variant_forward(sequential.data(), alpha.data(), rstd.data(),
                                                    sources.data(), query, nullptr, gain,
                                                    n_sources, N, C, K, sw.sigmoid);
                    check_two_phase(sw.name() + block_case(S, n, i), two_phase, sequential,
                                    max_err[sw.sigmoid]);
                    if (!sw.sigmoid) {
                        min_top_alpha = std::min(min_top_alpha,
                                                 smallest_top_weight(alpha, N, n_sources, K));
                    }
                }
            }
        }
    }
    if (gradcheck::verbose()) {
        MESSAGE("two-phase variants: max |error| softmax " << max_err[0] << ", sigmoid "
                << max_err[1] << ", smallest top softmax weight " << min_top_alpha);
    }
    if (scale.spread < 1.0f || scale.query_scale == 1.0f) CHECK(min_top_alpha < 0.6);
}

TEST_CASE("two-phase static mixing and DenseFormer equal the sequential definition, every block size") {
    const size_t N = 3, C = 16;
    // static logits of order 1 (uneven softmaxes) or thousands (one-hot: e^{c - m} must not
    // overflow); DenseFormer scalars of either sign
    float logit_scale = 2.0f;
    SUBCASE("logits of order 1") {}
    SUBCASE("huge logits: nothing overflows") { logit_scale = 1000.0f; }
    Rng rng(103);
    SourceDrawer draw_source(rng, N, C, 1.0f);
    double max_err[2] = {0.0, 0.0}, min_top_weight = 1.0;  // max_err: dense, static
    for (int normalise = 0; normalise < 2; normalise++) {
        float range = normalise ? logit_scale : 1.5f;
        for (size_t S = 1; S <= 6; S++) {
            for (size_t n : {1, 2, 3, 5}) {
                BlockSources src(draw_source, n, S);
                // S rows of n + 3 coefficients: the first n weigh the blocks, entry n the partial
                // sum; the last two belong to no source and are NaN, so reading them fails
                const size_t stride = n + 3;
                Vec coefficients = rng.uniform_vector(S * stride, -range, range);
                for (size_t j = 0; j < S; j++) {
                    coefficients[j * stride + n + 1] = coefficients[j * stride + n + 2] = NAN;
                }
                Vec o(S * N * C), max(S), sumexp(S);
                depth_mixing_phase1(o.data(), max.data(), sumexp.data(), src.block_ptrs.data(),
                                    coefficients.data(), stride, n, S, N, C, normalise);
                for (size_t i = 0; i < S; i++) {
                    const float* row = coefficients.data() + i * stride;
                    std::vector<const float*> sources = src.sources(i);
                    size_t n_sources = sources.size();
                    Vec two_phase(N * C), sequential(N * C), weights(n_sources);
                    depth_mixing_phase2(two_phase.data(), o.data() + i * N * C, max[i], sumexp[i],
                                        src.partial(i), i == 0 ? 0.0f : row[n], N, C, normalise);
                    depth_mixing_forward(sequential.data(), weights.data(), sources.data(), row,
                                         n_sources, N, C, normalise);
                    check_two_phase(std::string(normalise ? "static " : "dense ") +
                                        block_case(S, n, i),
                                    two_phase, sequential, max_err[normalise]);
                    if (normalise) {
                        min_top_weight = std::min(min_top_weight,
                                                  smallest_top_weight(weights, 1, n_sources, 1));
                    }
                }
            }
        }
    }
    if (gradcheck::verbose()) {
        MESSAGE("two-phase mixing: max |error| static " << max_err[1] << ", dense "
                << max_err[0] << ", smallest top weight " << min_top_weight);
    }
    if (logit_scale < 10.0f) CHECK(min_top_weight < 0.6);  // the static merge really mixes
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
