// inference.c — the incremental decoder (see inference.h for what is cached and why) and
// token sampling.
//
// A step runs one new position t of B sequences through the model of model.c, with N = B
// rows in every layer function:
//   x0 = wte[token]
//   none : h = x0; for each sub-layer l: h = h + f_l(h); out = h
//   block: b_0 = x0; for each block n = 1 .. 2L/S (full: S = 1):
//            phase 1: the S pseudo-queries of block n against b_0 .. b_{n-1}
//            for i = 0 .. S-1, l = (n-1) S + i:
//              phase 2: h_l = merge of phase 1 with the partial sum p (i > 0)
//              p = f_l(h_l) if i = 0, else p + f_l(h_l)
//            b_n = p
//          out = DA_out(b_0 .. b_N)
//   logits = rmsnorm(out) lm_head^T
// An attention sub-layer writes k (after RoPE) and v of position t into its layer's cache and
// attends over positions 0 .. t of it, in the arithmetic order of attention.c.
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "inference.h"
#include "layers.h"
#include "rng.h"
#include "util.h"

static size_t n_blocks(const ModelConfig* c) {
    return c->block_size > 0 ? (size_t)(2 * c->n_layers / c->block_size) : 0;
}

void decoder_build(Decoder* dec, const Model* model, size_t B, size_t max_T) {
    const ModelConfig* c = &model->config;
    memset(dec, 0, sizeof(*dec));
    dec->model = model;
    dec->B = B;
    dec->max_T = max_T;
    size_t d = c->d_model, H = c->n_heads, hs = d / H, F = c->ffn_hidden, V = c->vocab_size;
    size_t q_dim = H * hs, kv_dim = c->n_kv_heads * hs, L = c->n_layers;
    size_t S = c->block_size, N = n_blocks(c);
    dec->k_cache = mallocCheck(L * B * max_T * kv_dim * sizeof(float));
    dec->v_cache = mallocCheck(L * B * max_T * kv_dim * sizeof(float));
    dec->blocks = mallocCheck((N + 1) * B * d * sizeof(float));
    dec->phase_o = mallocCheck(S * B * d * sizeof(float));
    dec->phase_max = mallocCheck(S * B * sizeof(float));
    dec->phase_sumexp = mallocCheck(S * B * sizeof(float));
    float** rows_d[] = {&dec->h, &dec->xn, &dec->f, &dec->out, &dec->xf};
    for (size_t i = 0; i < sizeof(rows_d) / sizeof(rows_d[0]); i++) {
        *rows_d[i] = mallocCheck(B * d * sizeof(float));
    }
    dec->rstd = mallocCheck(B * sizeof(float));
    dec->rstd_f = mallocCheck(B * sizeof(float));
    dec->q = mallocCheck(B * q_dim * sizeof(float));
    dec->y = mallocCheck(B * q_dim * sizeof(float));
    dec->k = mallocCheck(B * kv_dim * sizeof(float));
    dec->v = mallocCheck(B * kv_dim * sizeof(float));
    dec->att = mallocCheck(B * H * max_T * sizeof(float));
    dec->gate = mallocCheck(B * F * sizeof(float));
    dec->up = mallocCheck(B * F * sizeof(float));
    dec->act = mallocCheck(B * F * sizeof(float));
    dec->alpha = mallocCheck(B * (N + 1) * sizeof(float));
    dec->key_rstd = mallocCheck(B * (N + 1) * sizeof(float));
    dec->logits = mallocCheck(B * V * sizeof(float));
}

void decoder_free(Decoder* dec) {
    float* p[] = {dec->k_cache, dec->v_cache, dec->blocks, dec->phase_o, dec->phase_max,
                  dec->phase_sumexp, dec->h, dec->xn, dec->rstd, dec->f, dec->q, dec->k,
                  dec->v, dec->y, dec->att, dec->gate, dec->up, dec->act, dec->out, dec->alpha,
                  dec->key_rstd, dec->xf, dec->rstd_f, dec->logits};
    for (size_t i = 0; i < sizeof(p) / sizeof(p[0]); i++) { free(p[i]); }
    memset(dec, 0, sizeof(*dec));
}

void decoder_reset(Decoder* dec) { dec->T = 0; }

// Attention sub-layer of layer `layer` at position t = dec->T: f (B,d) = Attn(rmsnorm(h)).
static void attention_step(Decoder* dec, size_t layer, const float* h, float* f) {
    const ModelConfig* c = &dec->model->config;
    const ParameterTensors* p = &dec->model->params;
    size_t B = dec->B, t = dec->T, max_T = dec->max_T, d = c->d_model;
    size_t H = c->n_heads, G = c->n_kv_heads, hs = d / H, q_dim = H * hs, kv_dim = G * hs;
    size_t kv_mul = H / G;
    rmsnorm_forward(dec->xn, dec->rstd, h, p->attn_norm + layer * d, B, d);
    linear_forward(dec->q, dec->xn, p->wq + layer * q_dim * d, B, d, q_dim);
    linear_forward(dec->k, dec->xn, p->wk + layer * kv_dim * d, B, d, kv_dim);
    linear_forward(dec->v, dec->xn, p->wv + layer * kv_dim * d, B, d, kv_dim);
    rope_forward_at(dec->q, dec->q, t, B, H, hs);
    rope_forward_at(dec->k, dec->k, t, B, G, hs);
    // append position t to the cache: (B, max_T, G*hs) per layer
    float* k_cache = dec->k_cache + layer * B * max_T * kv_dim;
    float* v_cache = dec->v_cache + layer * B * max_T * kv_dim;
    for (size_t b = 0; b < B; b++) {
        memcpy(k_cache + (b * max_T + t) * kv_dim, dec->k + b * kv_dim, kv_dim * sizeof(float));
        memcpy(v_cache + (b * max_T + t) * kv_dim, dec->v + b * kv_dim, kv_dim * sizeof(float));
    }
    // the query of position t over the cached positions t' <= t (as attention_forward)
    #pragma omp parallel for collapse(2)
    for (size_t b = 0; b < B; b++) {
        for (size_t hd = 0; hd < H; hd++) {
            size_t kv_offset = b * max_T * kv_dim + (hd / kv_mul) * hs;
            attention_query(dec->y + b * q_dim + hd * hs, dec->att + (b * H + hd) * max_T,
                            dec->q + b * q_dim + hd * hs, k_cache + kv_offset, v_cache + kv_offset,
                            t + 1, kv_dim, hs);
        }
    }
    linear_forward(f, dec->y, p->wo + layer * d * q_dim, B, q_dim, d);
}

// MLP sub-layer of layer `layer`: f (B,d) = MLP(rmsnorm(h)).
static void mlp_step(Decoder* dec, size_t layer, const float* h, float* f) {
    const ModelConfig* c = &dec->model->config;
    const ParameterTensors* p = &dec->model->params;
    size_t B = dec->B, d = c->d_model, F = c->ffn_hidden;
    rmsnorm_forward(dec->xn, dec->rstd, h, p->mlp_norm + layer * d, B, d);
    linear_forward(dec->gate, dec->xn, p->wg + layer * F * d, B, d, F);
    linear_forward(dec->up, dec->xn, p->wu + layer * F * d, B, d, F);
    swiglu_forward(dec->act, dec->gate, dec->up, B, F);
    linear_forward(f, dec->act, p->wd + layer * d * F, B, F, d);
}

static void sublayer_step(Decoder* dec, int l, const float* h, float* f) {
    if (l % 2 == 0) { attention_step(dec, (size_t)l / 2, h, f); }
    else { mlp_step(dec, (size_t)l / 2, h, f); }
}

void decoder_step(Decoder* dec, const int* tokens, float* logits) {
    if (dec->T >= dec->max_T) {
        fprintf(stderr, "error: decoder is full (%zu positions)\n", dec->max_T);
        exit(1);
    }
    const ModelConfig* c = &dec->model->config;
    const ParameterTensors* p = &dec->model->params;
    size_t B = dec->B, d = c->d_model, BD = B * d, V = c->vocab_size;
    int L2 = 2 * c->n_layers, S = c->block_size;
    size_t N = n_blocks(c);
    embedding_forward(dec->blocks, tokens, p->wte, B, d);  // b_0 = x0
    const float* out = dec->blocks;
    if (S == 0) {
        // standard PreNorm residual stream, kept in blocks[0]: h_{l+1} = h_l + f_l(h_l)
        float* stream = dec->blocks;
        for (int l = 0; l < L2; l++) {
            sublayer_step(dec, l, stream, dec->f);
            for (size_t i = 0; i < BD; i++) { stream[i] += dec->f[i]; }
        }
    } else {
        const float* sources[N + 1];  // b_0 .. b_N of this position
        for (size_t n = 0; n <= N; n++) { sources[n] = dec->blocks + n * BD; }
        for (size_t n = 1; n <= N; n++) {
            size_t first = (n - 1) * (size_t)S;  // the block's first sub-layer
            depth_attention_phase1(dec->phase_o, dec->phase_max, dec->phase_sumexp, sources,
                                   p->res_query + first * d, p->res_norm + first * d, n,
                                   (size_t)S, B, d);
            float* partial = dec->blocks + n * BD;  // becomes b_n when the block completes
            for (size_t i = 0; i < (size_t)S; i++) {
                size_t l = first + i;
                depth_attention_phase2(dec->h, dec->phase_o + i * BD, dec->phase_max + i * B,
                                       dec->phase_sumexp + i * B, i == 0 ? NULL : partial,
                                       p->res_query + l * d, p->res_norm + l * d, B, d);
                sublayer_step(dec, (int)l, dec->h, dec->f);
                if (i == 0) { memcpy(partial, dec->f, BD * sizeof(float)); }
                else { for (size_t j = 0; j < BD; j++) { partial[j] += dec->f[j]; } }
            }
        }
        depth_attention_forward(dec->out, dec->alpha, dec->key_rstd, sources,
                                p->res_query + (size_t)L2 * d, p->res_norm + (size_t)L2 * d,
                                N + 1, B, d);
        out = dec->out;
    }
    rmsnorm_forward(dec->xf, dec->rstd_f, out, p->final_norm, B, d);
    linear_forward(logits, dec->xf, p->lm_head, B, d, V);
    dec->T++;
}

void decoder_generate(Decoder* dec, const int* prompt, size_t n_prompt, int* out,
                      size_t n_new, float temperature, int top_k, uint64_t* rng) {
    size_t B = dec->B, V = dec->model->config.vocab_size;
    int* tokens = mallocCheck(B * sizeof(int));
    decoder_reset(dec);
    // position t reads prompt[t], or the token drawn at t-1; its logits draw token t+1
    for (size_t t = 0; t + 1 < n_prompt + n_new; t++) {
        for (size_t b = 0; b < B; b++) {
            tokens[b] = t < n_prompt ? prompt[b * n_prompt + t] : out[b * n_new + t - n_prompt];
        }
        decoder_step(dec, tokens, dec->logits);
        if (t + 1 < n_prompt) { continue; }
        for (size_t b = 0; b < B; b++) {
            out[b * n_new + t + 1 - n_prompt] =
                sample_token(dec->logits + b * V, V, temperature, top_k, rng);
        }
    }
    free(tokens);
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
