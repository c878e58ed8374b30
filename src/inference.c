// inference.c — the incremental decoder (see inference.h for what is cached and why) and
// token sampling.
//
// A step runs one new position t of B sequences through the model of model.c, one position
// per sequence (N = B rows) in every layer function, and the same residual bookkeeping
// (model.h: gather_sources, residual_update) on the model's activation buffers:
//   x0 = wte[token]
//   for each sub-layer l:
//     none   : h_l is the residual stream (h_0 = x0)
//     AttnRes: h_l by two-phase depth attention: at the first sub-layer of block n, phase 1
//              scores the block's S pseudo-queries against b_0 .. b_{n-1} at once; every
//              sub-layer then merges that with its block's partial sum (phase 2). Each kind
//              of depth attention has its own pair of phases (the default operator, the
//              attention variants, the mixings); the input-dependent query has none and runs
//              the sequential definition (inference.h says why)
//     mhc    : h_l = u_l = sum_s a_pre[s] X_s from the position's m streams
//     f_l = f_l(h_l); then h_{l+1} = h_l + f_l (none), the partial sum partial += f_l
//           (AttnRes), or the streams mixed and f_l added (mhc)
//   out = h_{2L} (none) or DA_out(b_0 .. b_{n_blocks}); logits = rmsnorm(out) lm_head^T
//   (mhc: logits = (sum_s rmsnorm(X_s)) lm_head^T)
// An attention sub-layer writes k (after RoPE) and v of position t into its layer's cache and
// attends over positions 0 .. t of it, in the arithmetic order of attention.c.
// A prefill feeds positions 0 .. n-1 at once: model_forward over them (matmuls over all the
// positions, where a step multiplies one position per sequence), whose k and v fill the caches.
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "inference.h"
#include "layers.h"
#include "rng.h"
#include "util.h"

// A decoder's float buffers, in one table: decoder_build allocates each, decoder_floats adds
// them up, decoder_free frees them
#define DECODER_BUFFERS 6
static void buffer_slots(Decoder* dec, float** slots[DECODER_BUFFERS]) {
    float** all[DECODER_BUFFERS] = {&dec->k_cache, &dec->v_cache, &dec->acts_memory,
                                    &dec->phase_o, &dec->phase_max, &dec->phase_sumexp};
    memcpy(slots, all, sizeof(all));
}

// their sizes in floats for B sequences of max_T positions (Decoder says what each holds)
static void buffer_sizes(size_t sizes[DECODER_BUFFERS], const ModelConfig* c, size_t B,
                         size_t max_T) {
    ModelDims z = model_dims(c);
    Activations sizing;
    sizing.sub = callocCheck(z.n_sub + 1, sizeof(SubLayer));
    size_t cache = z.L * B * max_T * z.kv_dim;
    size_t all[DECODER_BUFFERS] = {cache, cache, point_activations(&sizing, c, B, 1, 0, NULL),
                                   z.S * B * z.d, z.S * B * z.depth_heads, z.S * B * z.depth_heads};
    memcpy(sizes, all, sizeof(all));
    free(sizing.sub);
}

void decoder_build(Decoder* dec, Model* model, size_t max_B, size_t max_T) {
    if (model->max_B < max_B) {
        fprintf(stderr, "error: a decoder of %zu sequences needs a model built for as many (%zu)\n",
                max_B, model->max_B);
        exit(1);
    }
    memset(dec, 0, sizeof(*dec));
    dec->model = model;
    dec->max_B = dec->B = max_B;  // every buffer for one position of max_B sequences
    dec->max_T = max_T;
    float** slots[DECODER_BUFFERS];
    size_t sizes[DECODER_BUFFERS];
    buffer_slots(dec, slots);
    buffer_sizes(sizes, &model->config, max_B, max_T);
    for (int i = 0; i < DECODER_BUFFERS; i++) { *slots[i] = mallocCheck(sizes[i] * sizeof(float)); }
    dec->acts.sub = callocCheck(model->dims.n_sub + 1, sizeof(SubLayer));
    point_activations(&dec->acts, &model->config, max_B, 1, 0, dec->acts_memory);
    dec->window_tokens = mallocCheck(max_B * max_T * sizeof(int));
}

size_t decoder_floats(const ModelConfig* c, size_t max_B, size_t max_T) {
    size_t sizes[DECODER_BUFFERS], floats = 0;
    buffer_sizes(sizes, c, max_B, max_T);
    for (int i = 0; i < DECODER_BUFFERS; i++) { floats += sizes[i]; }
    return floats + (max_B * max_T * sizeof(int) + sizeof(float) - 1) / sizeof(float);  // tokens
}

void decoder_free(Decoder* dec) {
    float** slots[DECODER_BUFFERS];
    buffer_slots(dec, slots);
    for (int i = 0; i < DECODER_BUFFERS; i++) { free(*slots[i]); }
    free(dec->acts.sub);
    free(dec->window_tokens);
    memset(dec, 0, sizeof(*dec));
}

void decoder_reset(Decoder* dec, size_t B) {
    if (B < 1 || B > dec->max_B) {
        fprintf(stderr, "error: %zu sequences do not fit the decoder (%zu)\n", B, dec->max_B);
        exit(1);
    }
    dec->B = B;
    dec->T = 0;
}

// Attention sub-layer of layer `layer` at position t = dec->T: s->f = Attn(rmsnorm(s->h)).
static void attention_step(Decoder* dec, size_t layer, SubLayer* s) {
    const ModelDims* z = &dec->model->dims;
    const ParameterTensors* params = &dec->model->params;
    size_t B = dec->B, t = dec->T, max_T = dec->max_T, d = z->d;
    size_t H = z->H, G = z->G, hs = z->hs, q_dim = z->q_dim, kv_dim = z->kv_dim;
    size_t kv_mul = H / G;
    rmsnorm_forward(s->xn, s->rstd, s->h, params->attn_norm + layer * d, B, d);
    linear_forward(s->q, s->xn, params->wq + layer * q_dim * d, B, d, q_dim);
    linear_forward(s->k, s->xn, params->wk + layer * kv_dim * d, B, d, kv_dim);
    linear_forward(s->v, s->xn, params->wv + layer * kv_dim * d, B, d, kv_dim);
    rope_forward_at(s->q, s->q, t, B, H, hs);
    rope_forward_at(s->k, s->k, t, B, G, hs);
    // append position t to the cache: (B, max_T, G*hs) per layer
    float* k_cache = dec->k_cache + layer * B * max_T * kv_dim;
    float* v_cache = dec->v_cache + layer * B * max_T * kv_dim;
    for (size_t b = 0; b < B; b++) {
        memcpy(k_cache + (b * max_T + t) * kv_dim, s->k + b * kv_dim, kv_dim * sizeof(float));
        memcpy(v_cache + (b * max_T + t) * kv_dim, s->v + b * kv_dim, kv_dim * sizeof(float));
    }
    // the query of position t over the cached positions t' <= t, by attention_forward's
    // online softmax (the same bits as its row t)
    #pragma omp parallel for collapse(2)
    for (size_t b = 0; b < B; b++) {
        for (size_t hd = 0; hd < H; hd++) {
            size_t kv_offset = b * max_T * kv_dim + (hd / kv_mul) * hs;
            float lse;
            attention_query_online(s->y + b * q_dim + hd * hs, &lse, s->q + b * q_dim + hd * hs,
                                   k_cache + kv_offset, v_cache + kv_offset, t + 1, kv_dim, hs);
        }
    }
    linear_forward(s->f, s->y, params->wo + layer * d * q_dim, B, q_dim, d);
}

// The residual rows of depth attention l (model.h): the query w_l, the key norm's gain g_l,
// U_l and the mixing coefficients, NULL where the variant has no such tensor
static DepthParams residual_rows(const Model* m, size_t l) {
    return model_depth_params(m, &m->params, l);
}

// h (B,d) = the depth attention of sub-layer l, in two phases (SPEC "Two-phase inference")
static void default_depth_step(Decoder* dec, int l, float* h) {
    const ModelDims* z = &dec->model->dims;
    const ParameterTensors* params = &dec->model->params;
    const Activations* a = &dec->acts;
    size_t B = dec->B, d = z->d, S = z->S, i = (size_t)l % S, first = (size_t)l - i;
    if (i == 0) {  // phase 1, once per block: its S queries against the completed blocks
        const float* blocks[z->n_sub + 2];
        size_t n = gather_sources(a, &dec->model->config, B, l, blocks, NULL);
        depth_attention_phase1(dec->phase_o, dec->phase_max, dec->phase_sumexp, blocks,
                               params->res_query + first * d, params->res_norm + first * d, n,
                               S, B, d);
    }
    depth_attention_phase2(h, dec->phase_o + i * B * d, dec->phase_max + i * B,
                           dec->phase_sumexp + i * B, i == 0 ? NULL : a->sub[l - 1].partial,
                           params->res_query + (size_t)l * d,
                           params->res_norm + (size_t)l * d, B, d);
}

// The same for the attention variants (sigmoid, key norm off, K heads): phase 1 per head
static void variant_depth_step(Decoder* dec, int l, float* h) {
    const ModelConfig* c = &dec->model->config;
    const ModelDims* z = &dec->model->dims;
    const Activations* a = &dec->acts;
    size_t B = dec->B, d = z->d, S = z->S, K = z->depth_heads, i = (size_t)l % S, first = (size_t)l - i;
    DepthParams block = residual_rows(dec->model, first);  // rows first .. first + S - 1
    DepthParams own = residual_rows(dec->model, (size_t)l);
    if (i == 0) {
        const float* blocks[z->n_sub + 2];
        size_t n = gather_sources(a, c, B, l, blocks, NULL);
        depth_attention_variant_phase1(dec->phase_o, dec->phase_max, dec->phase_sumexp, blocks,
                                       block.query, block.norm, n, S, B, d, K, c->depth_score);
    }
    depth_attention_variant_phase2(h, dec->phase_o + i * B * d, dec->phase_max + i * B * K,
                                   dec->phase_sumexp + i * B * K,
                                   i == 0 ? NULL : a->sub[l - 1].partial, own.query, own.norm,
                                   B, d, K, c->depth_score);
}

// The same for the mixings: coefficient rows in place of queries. Sub-layer l's partial sum is
// the last of its count_sources(l) sources, so its coefficient is entry count_sources(l) - 1.
static void mixing_depth_step(Decoder* dec, int l, float* h) {
    const ModelConfig* c = &dec->model->config;
    const ModelDims* z = &dec->model->dims;
    const Activations* a = &dec->acts;
    size_t B = dec->B, d = z->d, S = z->S, i = (size_t)l % S, first = (size_t)l - i;
    int normalise = c->mixing == 1;
    if (i == 0) {
        const float* blocks[z->n_sub + 2];
        size_t n = gather_sources(a, c, B, l, blocks, NULL);
        depth_mixing_phase1(dec->phase_o, dec->phase_max, dec->phase_sumexp, blocks,
                            residual_rows(dec->model, first).mix, z->n_res, n, S, B, d, normalise);
    }
    const float* coefficients = residual_rows(dec->model, (size_t)l).mix;
    float partial_coefficient = i == 0 ? 0.0f : coefficients[count_sources(c, l) - 1];
    depth_mixing_phase2(h, dec->phase_o + i * B * d, dec->phase_max[i], dec->phase_sumexp[i],
                        i == 0 ? NULL : a->sub[l - 1].partial, partial_coefficient, B, d,
                        normalise);
}

// out (B,d) = depth attention l over all its sources in one call, model.c's sequential
// definition on the decoder's buffers: the output aggregation in every configuration, and
// every depth attention with --depth-query input, whose query needs V_last (inference.h)
static void depth_sequential(Decoder* dec, int l, float* out) {
    depth_forward_rows(dec->model, &dec->acts, dec->B, l, out);
}

// h_l of an AttnRes sub-layer: each kind of depth attention by its own two phases, but the
// input-dependent query, which runs sequentially
static void depth_step(Decoder* dec, int l, float* h) {
    const ModelConfig* c = &dec->model->config;
    if (c->depth_query) { depth_sequential(dec, l, h); }
    else if (c->mixing) { mixing_depth_step(dec, l, h); }
    else if (depth_variant(c)) { variant_depth_step(dec, l, h); }
    else { default_depth_step(dec, l, h); }
}

void decoder_step(Decoder* dec, const int* tokens, float* logits) {
    if (dec->T >= dec->max_T) {
        fprintf(stderr, "error: decoder is full (%zu positions)\n", dec->max_T);
        exit(1);
    }
    const Model* m = dec->model;
    const ParameterTensors* params = &m->params;
    Activations* a = &dec->acts;
    size_t B = dec->B, d = m->dims.d;
    int n_sub = (int)m->dims.n_sub, attnres = m->dims.S > 0, mhc = m->dims.streams > 0;
    embedding_forward(a->x0, tokens, params->wte, B, d);
    if (mhc) { mhc_expand_forward(a->sub[0].streams, a->x0, B, d, m->dims.streams); }  // X_s = x0
    else if (!attnres) { memcpy(a->sub[0].h, a->x0, B * d * sizeof(float)); }  // none: h_0 = x0
    for (int l = 0; l < n_sub; l++) {
        SubLayer* s = &a->sub[l];
        if (attnres) { depth_step(dec, l, s->h); }
        if (mhc) { mhc_forward_rows(m, a, B, l); }  // h_l = u_l = sum_s a_pre[s] X_s
        if (l % 2 == 0) { attention_step(dec, (size_t)l / 2, s); }
        else {
            rmsnorm_forward(s->xn, s->rstd, s->h, params->mlp_norm + (size_t)l / 2 * d, B, d);
            mlp_sublayer_forward(m, s, l, B);
        }
        residual_update(m, a, l, B);
    }
    if (attnres) { depth_sequential(dec, n_sub, a->out); }  // DA_out(b_0 .. b_{n_blocks})
    if (mhc) { mhc_forward_rows(m, a, B, n_sub); }  // xf = sum_s rmsnorm(X_s)
    else { rmsnorm_forward(a->xf, a->rstd_f, a->out, params->final_norm, B, d); }
    linear_forward(logits, a->xf, params->lm_head, B, d, m->dims.V);
    dec->T++;
}

// The positions [0, n): model_forward over (B, n), then each attention layer's k (after RoPE)
// and v rows, (B, n, G*hs), copied into the caches' first n positions
void decoder_prefill(Decoder* dec, const int* tokens, size_t n, float* logits) {
    if (n < 1 || n > dec->max_T || n > dec->model->max_T) {
        fprintf(stderr, "error: a prefill of %zu positions does not fit the decoder (%zu) or the "
                "model's buffers (%zu)\n", n, dec->max_T, dec->model->max_T);
        exit(1);
    }
    Model* w = dec->model;
    const ModelDims* z = &w->dims;
    size_t B = dec->B, max_T = dec->max_T, kv_dim = z->kv_dim, V = z->V;
    model_forward(w, tokens, NULL, B, n);
    for (size_t layer = 0; layer < z->L; layer++) {
        const SubLayer* s = &w->acts.sub[2 * layer];
        for (size_t b = 0; b < B; b++) {
            size_t cache = (layer * B + b) * max_T * kv_dim;
            memcpy(dec->k_cache + cache, s->k + b * n * kv_dim, n * kv_dim * sizeof(float));
            memcpy(dec->v_cache + cache, s->v + b * n * kv_dim, n * kv_dim * sizeof(float));
        }
    }
    for (size_t b = 0; b < B; b++) {
        memcpy(logits + b * V, model_logits(w) + (b * n + n - 1) * V, V * sizeof(float));
    }
    dec->T = n;
}

void decoder_generate(Decoder* dec, size_t B, const int* prompt, size_t n_prompt, int* out,
                      size_t n_new, float temperature, int top_k, uint64_t* rng,
                      TokenCallback on_token, void* context) {
    decoder_reset(dec, B);
    size_t V = dec->model->config.vocab_size, total = n_prompt + n_new;
    int* seq = mallocCheck(B * total * sizeof(int));    // (B, total): prompt, then drawn
    int* tokens = mallocCheck(B * sizeof(int));
    for (size_t b = 0; b < B; b++) { memcpy(seq + b * total, prompt + b * n_prompt, n_prompt * sizeof(int)); }
    size_t start = 0;  // the cache holds the positions seq[start .. start + dec->T)
    // position pos reads seq[pos]; its logits draw seq[pos+1]. The prompt is fed when the first
    // draw needs it, at pos = n_prompt - 1.
    for (size_t pos = n_prompt - 1; pos + 1 < total; pos++) {
        if (dec->T > 0 && start + dec->T == pos && dec->T < dec->max_T) {
            // the cache ends just before pos and has room: append pos
            for (size_t b = 0; b < B; b++) { tokens[b] = seq[b * total + pos]; }
            decoder_step(dec, tokens, dec->acts.logits);
        } else {
            // the prompt, or past the window: the last max_T tokens up to pos, afresh
            start = pos + 1 > dec->max_T ? pos + 1 - dec->max_T : 0;
            size_t n = pos + 1 - start;
            for (size_t b = 0; b < B; b++) {
                memcpy(dec->window_tokens + b * n, seq + b * total + start, n * sizeof(int));
            }
            decoder_prefill(dec, dec->window_tokens, n, dec->acts.logits);
        }
        for (size_t b = 0; b < B; b++) {
            tokens[b] = sample_token(dec->acts.logits + b * V, V, temperature, top_k, rng);
            seq[b * total + pos + 1] = tokens[b];
        }
        if (on_token != NULL) { on_token(context, tokens, B); }
    }
    for (size_t b = 0; b < B; b++) { memcpy(out + b * n_new, seq + b * total + n_prompt, n_new * sizeof(int)); }
    free(tokens);
    free(seq);
}

int sample_token(const float* logits, size_t V, float temperature, int top_k, uint64_t* rng) {
    size_t best = 0;
    for (size_t i = 1; i < V; i++) { if (logits[i] > logits[best]) { best = i; } }
    if (temperature <= 0.0f || top_k == 1) { return (int)best; }
    size_t k = (top_k <= 0 || (size_t)top_k >= V) ? V : (size_t)top_k;
    // order[0..k) are the candidates: all tokens, or the k largest logits by selection
    size_t* order = mallocCheck(V * sizeof(size_t));
    for (size_t i = 0; i < V; i++) { order[i] = i; }
    for (size_t i = 0; k < V && i < k; i++) {
        size_t top = i;
        for (size_t j = i + 1; j < V; j++) {
            if (logits[order[j]] > logits[order[top]]) { top = j; }
        }
        size_t swap = order[i]; order[i] = order[top]; order[top] = swap;
    }
    // p_i proportional to e^{(logit_i - max) / temperature}; one uniform draw walks the sum
    double sum = 0.0;
    for (size_t i = 0; i < k; i++) { sum += exp((logits[order[i]] - logits[best]) / temperature); }
    double u = rng_uniform(rng) * sum, cumulative = 0.0;
    int token = (int)order[k - 1];
    for (size_t i = 0; i < k; i++) {
        cumulative += exp((logits[order[i]] - logits[best]) / temperature);
        if (u < cumulative) { token = (int)order[i]; break; }
    }
    free(order);
    return token;
}
