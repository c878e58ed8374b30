// gradcheck.c — `make gradcheck`: every layer's backward, and the whole model's, against
// finite differences, printed as one table.
//
// ./build/gradcheck [LAYER ...]   checks every layer, or only the ones named:
//   embedding rmsnorm linear linear_naive rope attention swiglu depth_attention
//   depth_variants crossentropy model model_variants model_mhc
// Exit status: 0 when every tensor is within its tolerance, 1 otherwise (the failing layers
// are named on the last line) or for an unknown layer name.
//
// How one check works. A backward pass maps the gradient of a scalar loss with respect to a
// layer's output (dout) to the gradients with respect to its inputs and parameters. To test
// one, take the loss
//   L = sum_i R_i * out_i        (R: fixed random numbers; the sum taken in double)
// so that dL/dout = R exactly: the backward fed dout = R returns the analytic dL/dx. The
// numeric dL/dx perturbs one element of x at a time and recomputes L through the forward
// alone (central_difference). Every element of every input and parameter tensor is checked.
// The whole model's loss is its own: the mean cross-entropy, recomputed in double from the
// float logits.
//
// One row per tensor: the largest |analytic - numeric| over its elements; that error
// relative to the tensor's largest numeric gradient; the tolerance, which admits an element
// when |analytic - numeric| <= atol + rtol * |numeric|; `used`, the largest fraction of its
// own tolerance any element used (above 1 is a FAIL); and ok / FAIL.
//
// Everything runs on one thread: the thousands of tiny forward passes would otherwise mostly
// start and join OpenMP regions (and crawl on a busy machine); no layer's results depend on
// the thread count.
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "layers.h"
#include "model.h"
#include "rng.h"
#include "util.h"
#include "../bench/bench_util.h"

// ---- steps and tolerances ------------------------------------------------------------------
// The numeric gradient is not exact. The forward runs in float32, so L carries a rounding error
// of a few units in its last place, and a difference quotient divides that by the step: small
// steps drown in rounding. Large steps err by the curvature of the loss (Taylor), whose leading
// h^2 term Richardson extrapolation cancels (central_difference), so the steps can be large:
// 2e-2 .. 5e-2, and 0.25 for the maps that are linear in each input (embedding, linear, RoPE),
// which have no such error at all. An element passes when
//   |analytic - numeric| <= atol + rtol * |numeric|
// rtol for the large gradients, atol for the ones near zero (where a ratio means nothing).
//
// The numbers are those of the doctest checks (tests/test_layers.cpp, tests/test_model.cpp),
// except two, changed after measuring them over 80 random draws of the inputs: rmsnorm's
// step (their 2e-2 let the rounding of the sum of squares through: 1.3x the tolerance on 2 of
// 80 draws) and the whole model's step and tolerance (their step 5e-3 left the curvature's
// error at up to 25x the tolerance on 7 of 40 draws; at 2e-3 it is small, but the rounding
// grows 2.5x, to 1.6x their tolerance at worst, so the tolerance doubles). Beside each: the
// largest |analytic - numeric| on this program's draw, and the largest fraction of the
// tolerance used over the 80 draws. Dropping one term of a backward makes errors of 1e-2 .. 1
// (docs/gradcheck.md): 20 to 60000 times the tolerance.
typedef struct {
    double atol, rtol;
} Tolerance;

static const float LINEAR_STEP = 0.25f;                      // embedding, linear, RoPE
static const Tolerance EMBEDDING_TOL = {5e-7, 1e-6};         // 7.5e-8; 80 draws: 0.09
static const Tolerance ROPE_TOL = {5e-7, 1e-6};              // 2.9e-7; 0.48
static const Tolerance LINEAR_TOL = {1.5e-5, 1e-6};          // 5.7e-6; 0.70 (naive: 0.07)
static const float RMSNORM_STEP = 5e-2f;
static const Tolerance RMSNORM_TOL = {5e-5, 1e-5};           // 1.1e-5; 0.36
static const float ATTENTION_STEP = 5e-2f;
static const Tolerance ATTENTION_TOL = {2e-5, 1e-5};         // 1.5e-5; 0.80
static const float SWIGLU_STEP = 5e-2f;
static const Tolerance SWIGLU_TOL = {2e-5, 1e-5};            // 5.2e-6; 0.36
static const float DEPTH_STEP = 2e-2f;
static const Tolerance DEPTH_TOL = {5e-5, 1e-5};             // 7.9e-6; 0.57
static const Tolerance VARIANT_TOL = {1.5e-4, 1e-5};         // the variants (test_variants.cpp)
static const float CROSSENTROPY_STEP = 5e-2f;
static const Tolerance CROSSENTROPY_TOL = {6e-6, 1e-5};      // 1.7e-6; 0.45
// The whole model: a long chain of float roundings, gradients from 1e-4 to 0.7.
static const float MODEL_STEP = 2e-3f;
static const Tolerance MODEL_TOL = {3e-4, 6e-4};             // 1.1e-4; 0.78

// ---- the loss, and its numeric derivative --------------------------------------------------

// A loss to differentiate: fn(ctx) recomputes the forward from the current inputs and returns L.
typedef struct {
    double (*fn)(void* ctx);
    void* ctx;
} Loss;

// L = sum_i weights_i * out_i, in double (each product of two floats is exact in double)
static double weighted_sum(const float* weights, const float* out, size_t n) {
    double sum = 0.0;
    for (size_t i = 0; i < n; i++) { sum += (double)weights[i] * (double)out[i]; }
    return sum;
}

// The slope of the loss along element *x. The central difference D(h) = (L(x+h) - L(x-h)) / 2h
// errs by c h^2 + O(h^4) (Taylor); Richardson's (4 D(h) - D(2h)) / 3 cancels the h^2 term.
// Each D divides by the step actually taken in float (x + h is rounded); *x is restored exactly.
static double central_difference(float* x, Loss loss, float step) {
    float original = *x;
    double slope[2];
    for (int k = 0; k < 2; k++) {
        float plus = original + (float)(k + 1) * step, minus = original - (float)(k + 1) * step;
        *x = plus;
        double loss_plus = loss.fn(loss.ctx);
        *x = minus;
        double loss_minus = loss.fn(loss.ctx);
        slope[k] = (loss_plus - loss_minus) / ((double)plus - (double)minus);
    }
    *x = original;
    return (4.0 * slope[0] - slope[1]) / 3.0;
}

// ---- the table -----------------------------------------------------------------------------

// One layer check in progress: its name, the case (sizes, variant) and how to differentiate it.
typedef struct {
    const char* layer;
    char shape[64];
    float step;
    Tolerance tol;
    Loss loss;
} Case;

typedef struct {
    size_t rows, failed_rows;
} Table;

static void print_header(void) {
    printf("%-15s %-24s %-16s %5s  %-9s  %-8s  %-22s  %7s  %s\n", "layer", "case", "tensor",
           "size", "max|a-n|", "rel.err", "tolerance", "used", "result");
}

// Compares analytic (n) with the numeric gradient of every element of x (n) and prints the row.
static void check_tensor(Table* table, const Case* c, const char* tensor, float* x,
                         const float* analytic, size_t n) {
    double max_err = 0.0, max_numeric = 0.0, used = 0.0;
    int finite = 1;
    for (size_t i = 0; i < n; i++) {
        double numeric = central_difference(&x[i], c->loss, c->step);
        double err = fabs((double)analytic[i] - numeric);
        double allowed = c->tol.atol + c->tol.rtol * fabs(numeric);
        if (!isfinite(analytic[i]) || !isfinite(numeric)) { finite = 0; }
        if (err > max_err) { max_err = err; }
        if (fabs(numeric) > max_numeric) { max_numeric = fabs(numeric); }
        if (err / allowed > used) { used = err / allowed; }
    }
    int ok = finite && used <= 1.0;
    char tolerance[32], used_text[16];
    snprintf(tolerance, sizeof tolerance, "%.1e + %.1e|n|", c->tol.atol, c->tol.rtol);
    snprintf(used_text, sizeof used_text, used < 1000.0 ? "%.2f" : "%.1e", used);
    // relative to the tensor's scale: an element-wise ratio means nothing where the gradient is 0
    double relative = max_numeric > 0.0 ? max_err / max_numeric : max_err;
    printf("%-15s %-24s %-16s %5zu  %-9.2e  %-8.1e  %-22s  %7s  %s\n", c->layer, c->shape,
           tensor, n, max_err, relative, tolerance, used_text, ok ? "ok" : "FAIL");
    fflush(stdout);
    table->rows++;
    table->failed_rows += !ok;
}

// ---- tensors -------------------------------------------------------------------------------
// Every tensor of a layer check comes from here, filled from the check's own random stream,
// and is freed when the check returns.

#define MAX_TENSORS 128
typedef struct {
    float* memory[MAX_TENSORS];
    size_t count;
    uint64_t rng;
} Tensors;

static float* zeros(Tensors* t, size_t n) {
    if (t->count == MAX_TENSORS) {
        fprintf(stderr, "error: gradcheck: more than %d tensors in one check\n", MAX_TENSORS);
        exit(1);
    }
    return t->memory[t->count++] = callocCheck(n, sizeof(float));
}

// n numbers uniform in [lo, hi)
static float* uniform(Tensors* t, size_t n, float lo, float hi) {
    float* x = zeros(t, n);
    for (size_t i = 0; i < n; i++) { x[i] = (float)(lo + (hi - lo) * rng_uniform(&t->rng)); }
    return x;
}

// n numbers of magnitude uniform in [lo, hi) and random sign: gains bounded away from zero
static float* signed_uniform(Tensors* t, size_t n, float lo, float hi) {
    float* x = uniform(t, n, lo, hi);
    for (size_t i = 0; i < n; i++) { x[i] = (rng_next(&t->rng) & 1) ? x[i] : -x[i]; }
    return x;
}

static void free_tensors(Tensors* t) {
    for (size_t i = 0; i < t->count; i++) { free(t->memory[i]); }
    t->count = 0;
}

// ---- the layers, one check each --------------------------------------------------------------
// Each check: random inputs, the forward, the backward with dout = R into zeroed gradients,
// then check_tensor on every input. The context structs hold what the loss recomputes.

typedef struct {
    float* out;
    const float *wte, *R;
    const int* tokens;
    size_t N, C;
} EmbeddingCase;

static double embedding_loss(void* ctx) {
    EmbeddingCase* s = ctx;
    embedding_forward(s->out, s->tokens, s->wte, s->N, s->C);
    return weighted_sum(s->R, s->out, s->N * s->C);
}

// repeated tokens: a row of wte used three times must receive the sum of three gradients
static void check_embedding(Table* table, Tensors* t) {
    static const int tokens[] = {10, 0, 10, 5, 2, 5, 5, 0, 9};
    size_t V = 11, C = 17, N = sizeof tokens / sizeof tokens[0];
    float* wte = uniform(t, V * C, -1, 1);
    EmbeddingCase s = {zeros(t, N * C), wte, uniform(t, N * C, -1, 1), tokens, N, C};
    float* dwte = zeros(t, V * C);
    embedding_backward(dwte, s.R, tokens, N, C);
    Case c = {"embedding", "", LINEAR_STEP, EMBEDDING_TOL, {embedding_loss, &s}};
    snprintf(c.shape, sizeof c.shape, "N=%zu V=%zu C=%zu", N, V, C);
    check_tensor(table, &c, "wte", wte, dwte, V * C);
}

typedef struct {
    float *out, *rstd;
    const float *inp, *weight, *R;
    size_t N, C;
} RmsnormCase;

static double rmsnorm_loss(void* ctx) {
    RmsnormCase* s = ctx;
    rmsnorm_forward(s->out, s->rstd, s->inp, s->weight, s->N, s->C);
    return weighted_sum(s->R, s->out, s->N * s->C);
}

static void check_rmsnorm(Table* table, Tensors* t) {
    size_t N = 4, C = 33;
    float* inp = uniform(t, N * C, -1, 1);
    float* weight = signed_uniform(t, C, 0.5f, 1.5f);
    RmsnormCase s = {zeros(t, N * C), zeros(t, N), inp, weight, uniform(t, N * C, -1, 1), N, C};
    float *dinp = zeros(t, N * C), *dweight = zeros(t, C);
    rmsnorm_forward(s.out, s.rstd, inp, weight, N, C);
    rmsnorm_backward(dinp, dweight, s.R, inp, weight, s.rstd, N, C);
    Case c = {"rmsnorm", "", RMSNORM_STEP, RMSNORM_TOL, {rmsnorm_loss, &s}};
    snprintf(c.shape, sizeof c.shape, "N=%zu C=%zu", N, C);
    check_tensor(table, &c, "inp", inp, dinp, N * C);
    check_tensor(table, &c, "weight", weight, dweight, C);
}

// the tiled matmul the model runs, or the three plain loops beside it
typedef void (*LinearForward)(float*, const float*, const float*, size_t, size_t, size_t);
typedef void (*LinearBackward)(float*, float*, const float*, const float*, const float*,
                               size_t, size_t, size_t);

typedef struct {
    LinearForward forward;
    float* out;
    const float *inp, *weight, *R;
    size_t N, IN, OUT;
} LinearCase;

static double linear_loss(void* ctx) {
    LinearCase* s = ctx;
    s->forward(s->out, s->inp, s->weight, s->N, s->IN, s->OUT);
    return weighted_sum(s->R, s->out, s->N * s->OUT);
}

static void linear_case(Table* table, Tensors* t, const char* layer, LinearForward forward,
                        LinearBackward backward, size_t N, size_t IN, size_t OUT) {
    float *inp = uniform(t, N * IN, -1, 1), *weight = uniform(t, OUT * IN, -1, 1);
    LinearCase s = {forward, zeros(t, N * OUT), inp, weight, uniform(t, N * OUT, -1, 1),
                    N, IN, OUT};
    float *dinp = zeros(t, N * IN), *dweight = zeros(t, OUT * IN);
    backward(dinp, dweight, s.R, inp, weight, N, IN, OUT);
    Case c = {layer, "", LINEAR_STEP, LINEAR_TOL, {linear_loss, &s}};
    snprintf(c.shape, sizeof c.shape, "N=%zu IN=%zu OUT=%zu", N, IN, OUT);
    check_tensor(table, &c, "inp", inp, dinp, N * IN);
    check_tensor(table, &c, "weight", weight, dweight, OUT * IN);
}

// sizes that are not multiples of the 6x16 register tile: whole tiles plus remainders
static void check_linear(Table* table, Tensors* t) {
    linear_case(table, t, "linear", linear_forward, linear_backward, 9, 33, 70);
}

static void check_linear_naive(Table* table, Tensors* t) {
    linear_case(table, t, "linear_naive", linear_forward_naive, linear_backward_naive, 5, 7, 3);
}

typedef struct {
    float* x;
    const float *inp, *R;
    size_t B, T, n_heads, hs;
} RopeCase;

// the forward in place, as the model runs it: x = inp, then x = rope(x)
static double rope_loss(void* ctx) {
    RopeCase* s = ctx;
    size_t n = s->B * s->T * s->n_heads * s->hs;
    memcpy(s->x, s->inp, n * sizeof(float));
    rope_forward(s->x, s->x, s->B, s->T, s->n_heads, s->hs);
    return weighted_sum(s->R, s->x, n);
}

static void check_rope(Table* table, Tensors* t) {
    size_t B = 2, T = 7, n_heads = 3, hs = 4, n = B * T * n_heads * hs;
    float* inp = uniform(t, n, -1, 1);
    RopeCase s = {zeros(t, n), inp, uniform(t, n, -1, 1), B, T, n_heads, hs};
    float* dinp = zeros(t, n);
    rope_backward(dinp, s.R, B, T, n_heads, hs);
    Case c = {"rope", "", LINEAR_STEP, ROPE_TOL, {rope_loss, &s}};
    snprintf(c.shape, sizeof c.shape, "B=%zu T=%zu heads=%zu hs=%zu", B, T, n_heads, hs);
    check_tensor(table, &c, "inp", inp, dinp, n);
}

typedef struct {
    float *out, *lse;
    const float *q, *k, *v, *R;
    size_t B, T, H, G, hs;
} AttentionCase;

static double attention_loss(void* ctx) {
    AttentionCase* s = ctx;
    attention_forward(s->out, s->lse, s->q, s->k, s->v, s->B, s->T, s->H, s->G, s->hs);
    return weighted_sum(s->R, s->out, s->B * s->T * s->H * s->hs);
}

static void attention_case(Table* table, Tensors* t, const char* variant, size_t B, size_t T,
                           size_t H, size_t G, size_t hs) {
    size_t nq = B * T * H * hs, nkv = B * T * G * hs;
    float *q = uniform(t, nq, -1.5f, 1.5f), *k = uniform(t, nkv, -1.5f, 1.5f);
    float* v = uniform(t, nkv, -1, 1);
    AttentionCase s = {zeros(t, nq), zeros(t, B * H * T), q, k, v, uniform(t, nq, -1, 1),
                       B, T, H, G, hs};
    float *dq = zeros(t, nq), *dk = zeros(t, nkv), *dv = zeros(t, nkv);
    attention_forward(s.out, s.lse, q, k, v, B, T, H, G, hs);
    attention_backward(dq, dk, dv, s.R, s.out, s.lse, q, k, v, B, T, H, G, hs);
    Case c = {"attention", "", ATTENTION_STEP, ATTENTION_TOL, {attention_loss, &s}};
    snprintf(c.shape, sizeof c.shape, "%s B=%zu T=%zu H=%zu G=%zu", variant, B, T, H, G);
    check_tensor(table, &c, "q", q, dq, nq);
    check_tensor(table, &c, "k", k, dk, nkv);
    check_tensor(table, &c, "v", v, dv, nkv);
}

// one key/value head per query head (MHA), one per two (GQA), one for all (MQA); odd T;
// the last past attention.c's tiles (matmul_tile.h's, by build), edge tiles included:
// without AVX-512 (6 x 16) in every product, T = 19 queries and keys and hs = 20; with it
// (12 x 32) in the tile's rows alone (19 queries; keys in dK and dV)
static void check_attention(Table* table, Tensors* t) {
    attention_case(table, t, "MHA", 2, 5, 2, 2, 4);
    attention_case(table, t, "GQA", 2, 7, 4, 2, 4);
    attention_case(table, t, "MQA", 2, 7, 4, 1, 2);
    attention_case(table, t, "MQA", 1, 19, 2, 1, 20);
}

typedef struct {
    float* out;
    const float *gate, *up, *R;
    size_t N, F;
} SwigluCase;

static double swiglu_loss(void* ctx) {
    SwigluCase* s = ctx;
    swiglu_forward(s->out, s->gate, s->up, s->N, s->F);
    return weighted_sum(s->R, s->out, s->N * s->F);
}

static void check_swiglu(Table* table, Tensors* t) {
    size_t N = 4, F = 37;
    // gates over [-4, 4] reach both tails of the sigmoid
    float *gate = uniform(t, N * F, -4, 4), *up = uniform(t, N * F, -2, 2);
    SwigluCase s = {zeros(t, N * F), gate, up, uniform(t, N * F, -1, 1), N, F};
    float *dgate = zeros(t, N * F), *dup = zeros(t, N * F);
    swiglu_backward(dgate, dup, s.R, gate, up, N, F);
    Case c = {"swiglu", "", SWIGLU_STEP, SWIGLU_TOL, {swiglu_loss, &s}};
    snprintf(c.shape, sizeof c.shape, "N=%zu F=%zu", N, F);
    check_tensor(table, &c, "gate", gate, dgate, N * F);
    check_tensor(table, &c, "up", up, dup, N * F);
}

typedef struct {
    float *out, *alpha, *key_rstd;
    const float* const* sources;
    const float *query, *norm_weight, *R;
    size_t n_sources, N, C;
} DepthCase;

static double depth_attention_loss(void* ctx) {
    DepthCase* s = ctx;
    depth_attention_forward(s->out, s->alpha, s->key_rstd, s->sources, s->query, s->norm_weight,
                            s->n_sources, s->N, s->C);
    return weighted_sum(s->R, s->out, s->N * s->C);
}

// Four sources drawn from three tensors: source 3 is tensor 1 again (one pointer passed twice,
// as the model passes a block to many sub-layers), so dtensor 1 must sum both uses.
static void check_depth_attention(Table* table, Tensors* t) {
    enum { N_TENSORS = 3, N_SOURCES = 4 };
    static const size_t uses[N_SOURCES] = {0, 1, 2, 1};
    static const char* names[N_TENSORS] = {"source 0", "source 1 (twice)", "source 2"};
    size_t N = 3, C = 8;
    float *tensors[N_TENSORS], *dtensors[N_TENSORS];
    for (size_t i = 0; i < N_TENSORS; i++) {
        // sources of different scales, so that keys (normalised) and values differ
        float scale = (float)(0.5 + 1.5 * rng_uniform(&t->rng));
        tensors[i] = uniform(t, N * C, -scale, scale);
        dtensors[i] = zeros(t, N * C);
    }
    const float* sources[N_SOURCES];
    float* dsources[N_SOURCES];
    for (size_t i = 0; i < N_SOURCES; i++) {
        sources[i] = tensors[uses[i]];
        dsources[i] = dtensors[uses[i]];
    }
    float *query = uniform(t, C, -1, 1), *norm_weight = signed_uniform(t, C, 0.5f, 1.5f);
    DepthCase s = {zeros(t, N * C), zeros(t, N * N_SOURCES), zeros(t, N * N_SOURCES), sources,
                   query, norm_weight, uniform(t, N * C, -1, 1), N_SOURCES, N, C};
    float *dquery = zeros(t, C), *dnorm_weight = zeros(t, C);
    depth_attention_forward(s.out, s.alpha, s.key_rstd, sources, query, norm_weight, N_SOURCES,
                            N, C);
    depth_attention_backward(dsources, dquery, dnorm_weight, s.R, s.alpha, s.key_rstd, sources,
                             query, norm_weight, N_SOURCES, N, C);
    Case c = {"depth_attention", "", DEPTH_STEP, DEPTH_TOL, {depth_attention_loss, &s}};
    snprintf(c.shape, sizeof c.shape, "%d sources N=%zu C=%zu", N_SOURCES, N, C);
    for (size_t i = 0; i < N_TENSORS; i++) {
        check_tensor(table, &c, names[i], tensors[i], dtensors[i], N * C);
    }
    check_tensor(table, &c, "query", query, dquery, C);
    check_tensor(table, &c, "norm_weight", norm_weight, dnorm_weight, C);
}

// SPEC's variants of the operator (depth_variants.c) on the same four sources: per case the
// switches heads, sigmoid, key norm, and a per-row query part.
typedef struct {
    float *out, *alpha, *key_rstd;
    const float* const* sources;
    const float *query, *token_query, *norm_weight, *R;
    size_t n_sources, N, C, heads;
    int sigmoid;
} VariantCase;

static double depth_variant_loss(void* ctx) {
    VariantCase* s = ctx;
    depth_attention_variant_forward(s->out, s->alpha, s->key_rstd, s->sources, s->query,
                                    s->token_query, s->norm_weight, s->n_sources, s->N, s->C,
                                    s->heads, s->sigmoid);
    return weighted_sum(s->R, s->out, s->N * s->C);
}

typedef struct {
    float *out, *weights;
    const float* const* sources;
    const float *coefficients, *R;
    size_t n_sources, N, C;
    int normalise;
} MixingCase;

static double depth_mixing_loss(void* ctx) {
    MixingCase* s = ctx;
    depth_mixing_forward(s->out, s->weights, s->sources, s->coefficients, s->n_sources, s->N,
                         s->C, s->normalise);
    return weighted_sum(s->R, s->out, s->N * s->C);
}

// Four sources drawn from three tensors (source 3 is tensor 1 again), magnitudes away from
// zero: a head of few channels near zero has a key norm too curved for any step.
static void variant_sources(Tensors* t, float** tensors, float** dtensors, const float** sources,
                            float** dsources, size_t N, size_t C) {
    static const size_t uses[4] = {0, 1, 2, 1};
    for (size_t i = 0; i < 3; i++) {
        float scale = (float)(0.5 + 1.5 * rng_uniform(&t->rng));
        tensors[i] = signed_uniform(t, N * C, 0.25f * scale, scale);
        dtensors[i] = zeros(t, N * C);
    }
    for (size_t i = 0; i < 4; i++) {
        sources[i] = tensors[uses[i]];
        dsources[i] = dtensors[uses[i]];
    }
}

static const char* SOURCE_NAMES[3] = {"source 0", "source 1 (twice)", "source 2"};

static void variant_case(Table* table, Tensors* t, size_t heads, int sigmoid, int key_norm,
                         int rows) {
    size_t N = 3, C = 8, n = 4;
    float *tensors[3], *dtensors[3], *dsources[4];
    const float* sources[4];
    variant_sources(t, tensors, dtensors, sources, dsources, N, C);
    float *query = uniform(t, C, -1, 1), *token_query = uniform(t, N * C, -0.7f, 0.7f);
    float* norm_weight = signed_uniform(t, C, 0.5f, 1.5f);
    VariantCase s = {zeros(t, N * C), zeros(t, N * n * heads), zeros(t, N * n * heads), sources,
                     query, rows ? token_query : NULL, key_norm ? norm_weight : NULL,
                     uniform(t, N * C, -1, 1), n, N, C, heads, sigmoid};
    float *dquery = zeros(t, C), *dtoken_query = zeros(t, N * C), *dnorm_weight = zeros(t, C);
    depth_variant_loss(&s);
    depth_attention_variant_backward(dsources, dquery, rows ? dtoken_query : NULL,
                                     key_norm ? dnorm_weight : NULL, s.R, s.alpha, s.key_rstd,
                                     sources, query, s.token_query, s.norm_weight, n, N, C, heads,
                                     sigmoid);
    Case c = {"depth_variants", "", DEPTH_STEP, VARIANT_TOL, {depth_variant_loss, &s}};
    snprintf(c.shape, sizeof c.shape, "%s K=%zu%s%s", sigmoid ? "sigmoid" : "softmax", heads,
             key_norm ? "" : " no-norm", rows ? " q-rows" : "");
    for (size_t i = 0; i < 3; i++) { check_tensor(table, &c, SOURCE_NAMES[i], tensors[i], dtensors[i], N * C); }
    check_tensor(table, &c, "query", query, dquery, C);
    if (rows) { check_tensor(table, &c, "token_query", token_query, dtoken_query, N * C); }
    if (key_norm) { check_tensor(table, &c, "norm_weight", norm_weight, dnorm_weight, C); }
}

static void mixing_case(Table* table, Tensors* t, int normalise) {
    size_t N = 3, C = 8, n = 4;
    float *tensors[3], *dtensors[3], *dsources[4];
    const float* sources[4];
    variant_sources(t, tensors, dtensors, sources, dsources, N, C);
    float *coefficients = uniform(t, n, -1.5f, 1.5f), *dcoefficients = zeros(t, n);
    MixingCase s = {zeros(t, N * C), zeros(t, n), sources, coefficients,
                    uniform(t, N * C, -1, 1), n, N, C, normalise};
    depth_mixing_loss(&s);
    depth_mixing_backward(dsources, dcoefficients, s.R, s.weights, sources, n, N, C, normalise);
    Case c = {"depth_variants", "", DEPTH_STEP, VARIANT_TOL, {depth_mixing_loss, &s}};
    snprintf(c.shape, sizeof c.shape, "%s mixing", normalise ? "static" : "dense");
    for (size_t i = 0; i < 3; i++) { check_tensor(table, &c, SOURCE_NAMES[i], tensors[i], dtensors[i], N * C); }
    check_tensor(table, &c, normalise ? "logits" : "scalars", coefficients, dcoefficients, n);
}

// every switch of the operator at least once, and the two mixings
static void check_depth_variants(Table* table, Tensors* t) {
    //                       K  sigmoid key_norm rows
    variant_case(table, t, 1, 1, 1, 0);
    variant_case(table, t, 2, 0, 0, 0);
    variant_case(table, t, 1, 0, 1, 1);
    variant_case(table, t, 4, 1, 0, 1);
    mixing_case(table, t, 1);
    mixing_case(table, t, 0);
}

typedef struct {
    float *losses, *probs;
    const float* logits;
    const int* targets;
    float scale;
    size_t N, V;
} CrossentropyCase;

// the mean loss over the counted rows: scale * sum of the row losses
static double crossentropy_loss(void* ctx) {
    CrossentropyCase* s = ctx;
    crossentropy_forward(s->losses, s->probs, s->logits, s->targets, s->N, s->V);
    double sum = 0.0;
    for (size_t n = 0; n < s->N; n++) { sum += s->losses[n]; }
    return (double)s->scale * sum;
}

// two ignored targets (-1): their rows get no gradient and do not count in the mean
static void check_crossentropy(Table* table, Tensors* t) {
    static const int targets[] = {9, -1, -1, 0, 4, 4};
    size_t N = sizeof targets / sizeof targets[0], V = 10;
    float* logits = uniform(t, N * V, -2, 2);
    float scale = 1.0f / (float)crossentropy_count(targets, N);
    CrossentropyCase s = {zeros(t, N), zeros(t, N * V), logits, targets, scale, N, V};
    float* dlogits = zeros(t, N * V);
    crossentropy_forward(s.losses, s.probs, logits, targets, N, V);
    crossentropy_backward(dlogits, s.probs, targets, scale, N, V);
    Case c = {"crossentropy", "", CROSSENTROPY_STEP, CROSSENTROPY_TOL, {crossentropy_loss, &s}};
    snprintf(c.shape, sizeof c.shape, "N=%zu V=%zu, 2 ignored", N, V);
    check_tensor(table, &c, "logits", logits, dlogits, N * V);
}

// ---- the whole model -----------------------------------------------------------------------

typedef struct {
    Model* m;
    const int *tokens, *targets;
    size_t B, T;
} ModelCase;

// the mean cross-entropy of the forward's float logits, in double
static double model_loss(void* ctx) {
    ModelCase* s = ctx;
    size_t V = s->m->dims.V, count = 0;
    model_forward(s->m, s->tokens, s->targets, s->B, s->T);
    const float* logits = model_logits(s->m);
    double sum = 0.0;
    for (size_t i = 0; i < s->B * s->T; i++) {
        if (s->targets[i] < 0) { continue; }
        const float* z = logits + i * V;
        double max_logit = z[0], sum_exp = 0.0;
        for (size_t v = 1; v < V; v++) { max_logit = fmax(max_logit, (double)z[v]); }
        for (size_t v = 0; v < V; v++) { sum_exp += exp((double)z[v] - max_logit); }
        sum += max_logit + log(sum_exp) - (double)z[s->targets[i]];
        count++;
    }
    return sum / (double)count;
}

// Not SPEC's init (tiny matrices, unit gains, zero queries: every depth attention a plain
// mean) but one that exercises every path: gains (and DenseFormer's scalars) 1 + 0.3 N(0,1),
// pseudo-queries and static-mixing logits N(0, 0.5), wte N(0,1) (large enough that rmsnorm is
// not too curved for the step), the query projections U N(0, 0.3/sqrt(d)), matrices N(0, 0.3)
// (mHC-lite's Phi too), mHC-lite's biases N(0, 0.5) and scales 0.5 + 0.3 N(0,1). In mhc the
// head reads the sum of m normed streams, so lm_head is N(0, 0.3/m): logits of the other
// modes' scale (with N(0, 0.3) the m = 4 model's float rounding used up to 2.2 of the
// tolerance over 20 draws; with 0.3/m at most 0.67).
static void randomise_params(Model* m, uint64_t* rng) {
    float* p = m->params_memory;
    for (int i = 0; i < N_PARAM_TENSORS; i++) {
        int gain = i == PARAM_attn_norm || i == PARAM_mlp_norm || i == PARAM_res_norm ||
                   i == PARAM_final_norm || i == PARAM_res_scalars || i == PARAM_hc_norm;
        for (size_t j = 0; j < m->param_sizes[i]; j++) {
            double z = rng_normal(rng);
            p[j] = (float)(gain ? 1.0 + 0.3 * z
                           : i == PARAM_res_query || i == PARAM_res_logits ? 0.5 * z
                           : i == PARAM_wte ? z
                           : i == PARAM_res_qproj ? 0.3 / sqrt((double)m->config.d_model) * z
                           : i == PARAM_hc_bias ? 0.5 * z
                           : i == PARAM_hc_scale ? 0.5 + 0.3 * z
                           : i == PARAM_lm_head && m->dims.streams > 0 ? 0.3 / (double)m->dims.streams * z
                           : 0.3 * z);
        }
        p += m->param_sizes[i];
    }
}

// B=2 T=5 with two ignored targets; every parameter tensor checked (none has no depth
// attention, so no res_query or res_norm)
static void model_case(Table* table, Tensors* t, const char* mode, ModelConfig config) {
    enum { B = 2, T = 5 };
    int tokens[B * T], targets[B * T];
    for (size_t i = 0; i < B * T; i++) {
        tokens[i] = (int)(rng_next(&t->rng) % (uint64_t)config.vocab_size);
        targets[i] = (i == 0 || i == 7) ? -1 : (int)(rng_next(&t->rng) % (uint64_t)config.vocab_size);
    }
    Model m;
    model_build(&m, &config, B, T);
    randomise_params(&m, &t->rng);
    model_forward(&m, tokens, targets, B, T);
    model_zero_grad(&m);
    model_backward(&m);  // the forward passes of the check never touch m.grads
    ModelCase s = {&m, tokens, targets, B, T};
    Case c = {"model", "", MODEL_STEP, MODEL_TOL, {model_loss, &s}};
    snprintf(c.shape, sizeof c.shape, "%s L=%d H=%d G=%d", mode, config.n_layers,
             config.n_heads, config.n_kv_heads);
    size_t offset = 0;
    for (int i = 0; i < N_PARAM_TENSORS; i++) {
        if (m.param_sizes[i] > 0) {
            check_tensor(table, &c, PARAM_INFO[i].name, m.params_memory + offset,
                         m.grads_memory + offset, m.param_sizes[i]);
        }
        offset += m.param_sizes[i];
    }
    model_free(&m);
}

// every residual mode; MQA in none and S=2, MHA in full and S=4 (one block of 4 sub-layers)
static void check_model(Table* table, Tensors* t) {
    //                                    V  d  L  H  G   F  S
    model_case(table, t, "none",       (ModelConfig){7, 8, 2, 2, 1, 12, 0});
    model_case(table, t, "full",       (ModelConfig){7, 8, 2, 2, 2, 12, 1});
    model_case(table, t, "block S=2",  (ModelConfig){7, 8, 2, 2, 1, 12, 2});
    model_case(table, t, "block S=4",  (ModelConfig){7, 8, 2, 2, 2, 12, 4});
}

// SPEC's variants in the whole model: each switch once, in full or block, and a combination
static void check_model_variants(Table* table, Tensors* t) {
    //                                         V  d  L  H  G   F  S sig kn- qin K  W  mix
    model_case(table, t, "S=2 sigmoid",   (ModelConfig){7, 8, 2, 2, 1, 12, 2, 1});
    model_case(table, t, "full no-norm",  (ModelConfig){7, 8, 2, 2, 2, 12, 1, 0, 1});
    model_case(table, t, "S=2 input-q",   (ModelConfig){7, 8, 2, 2, 1, 12, 2, 0, 0, 1});
    model_case(table, t, "full K=2",      (ModelConfig){7, 8, 2, 2, 2, 12, 1, 0, 0, 0, 2});
    model_case(table, t, "full W=2",      (ModelConfig){7, 8, 3, 2, 1, 12, 1, 0, 0, 0, 0, 2});
    model_case(table, t, "S=4 static",    (ModelConfig){7, 8, 2, 2, 2, 12, 4, 0, 0, 0, 0, 0, 1});
    model_case(table, t, "full dense",    (ModelConfig){7, 8, 2, 2, 1, 12, 1, 0, 0, 0, 0, 0, 2});
    model_case(table, t, "S=2 all four",  (ModelConfig){7, 8, 2, 2, 2, 12, 2, 1, 1, 1, 2});
}

// mHC-lite (--mode mhc) with m = 2, 3, 4 streams
static void check_model_mhc(Table* table, Tensors* t) {
    //                                    V  d  L  H  G   F  S sig kn- qin K  W  mix m
    model_case(table, t, "mhc m=2", (ModelConfig){7, 8, 2, 2, 1, 12, 0, 0, 0, 0, 0, 0, 0, 2});
    model_case(table, t, "mhc m=3", (ModelConfig){7, 8, 2, 2, 2, 12, 0, 0, 0, 0, 0, 0, 0, 3});
    model_case(table, t, "mhc m=4", (ModelConfig){7, 8, 2, 2, 1, 12, 0, 0, 0, 0, 0, 0, 0, 4});
}

// ---- main ----------------------------------------------------------------------------------

typedef struct {
    const char* name;
    void (*check)(Table* table, Tensors* t);
} Layer;

static const Layer LAYERS[] = {
    {"embedding", check_embedding},       {"rmsnorm", check_rmsnorm},
    {"linear", check_linear},             {"linear_naive", check_linear_naive},
    {"rope", check_rope},                 {"attention", check_attention},
    {"swiglu", check_swiglu},             {"depth_attention", check_depth_attention},
    {"depth_variants", check_depth_variants}, {"crossentropy", check_crossentropy},
    {"model", check_model},               {"model_variants", check_model_variants},
    {"model_mhc", check_model_mhc},
};
enum { N_LAYERS = sizeof LAYERS / sizeof LAYERS[0] };
static const uint64_t SEED = 1000;

int main(int argc, char** argv) {
    int selected[N_LAYERS];
    for (size_t j = 0; j < N_LAYERS; j++) { selected[j] = argc == 1; }
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
            printf("usage: build/gradcheck [LAYER ...]   (no LAYER: all of them)\n"
                   "  checks each layer's backward against central finite differences\n  layers:");
            for (size_t k = 0; k < N_LAYERS; k++) { printf(" %s", LAYERS[k].name); }
            printf("\n");
            return 0;
        }
        size_t j = 0;
        while (j < N_LAYERS && strcmp(argv[i], LAYERS[j].name) != 0) { j++; }
        if (j == N_LAYERS) {
            fprintf(stderr, "error: unknown layer '%s' (layers:", argv[i]);
            for (size_t k = 0; k < N_LAYERS; k++) { fprintf(stderr, " %s", LAYERS[k].name); }
            fprintf(stderr, ")\n");
            return 1;
        }
        selected[j] = 1;
    }
    omp_set_num_threads(1);
    double start = now_seconds();
    Table table = {0, 0};
    Tensors tensors = {{NULL}, 0, 0};
    int failed[N_LAYERS];
    print_header();
    for (size_t j = 0; j < N_LAYERS; j++) {
        size_t failed_before = table.failed_rows;
        tensors.rng = SEED + j;  // each layer draws the same numbers whichever others run
        if (selected[j]) { LAYERS[j].check(&table, &tensors); }
        free_tensors(&tensors);
        failed[j] = table.failed_rows > failed_before;
    }
    double seconds = now_seconds() - start;
    if (table.failed_rows == 0) {
        printf("gradcheck: all %zu tensors within tolerance (%.1f s)\n", table.rows, seconds);
        return 0;
    }
    printf("gradcheck: %zu of %zu tensors FAIL, in:", table.failed_rows, table.rows);
    for (size_t j = 0; j < N_LAYERS; j++) {
        if (failed[j]) { printf(" %s", LAYERS[j].name); }
    }
    printf(" (%.1f s)\n", seconds);
    return 1;
}
