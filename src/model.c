// model.c — forward and backward of the whole model, for every residual mode.
//
// Sub-layer l = 0 .. 2L-1: even l is the attention of layer l/2, odd l its MLP. Each is
// f_l(h) = Attn(rmsnorm(h)) or MLP(rmsnorm(h)). What feeds h depends on the mode (SPEC.md):
//   none : h_0 = x0, h_{l+1} = h_l + f_l(h_l), out = h_{2L}
//   block: sources are the completed blocks b_0 = x0, b_1, ... and the partial sum p of the
//          current block; h_l = DA_l(b_0..b_{n-1}[, p]); out = DA_out(b_0..b_N)
//   full : block with S = 1 (every sub-layer output is its own block)
// Block bookkeeping: partial[l] is the running sum of the outputs of the sub-layers of l's
// block up to and including l, so block k >= 1 is partial[k*S - 1], and the partial sum that
// sub-layer l sees (when it is not first in its block) is partial[l-1].
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "diagnostics.h"
#include "layers.h"
#include "model.h"
#include "rng.h"
#include "util.h"

const char* const PARAM_NAMES[N_PARAM_TENSORS] = {
    "wte", "attn_norm", "wq", "wk", "wv", "wo", "mlp_norm", "wg", "wu", "wd",
    "res_query", "res_norm", "final_norm", "lm_head"};

int model_config_check(const ModelConfig* c, char* err, size_t err_len) {
    const int values[] = {c->vocab_size, c->d_model, c->n_layers, c->n_heads, c->n_kv_heads,
                          c->ffn_hidden};
    const char* names[] = {"vocab size", "d", "L", "H", "G", "F"};
    // upper limits keep every size product (e.g. 2L + 1, V * d) far from int overflow
    const int limits[] = {1 << 24, 1 << 16, 1 << 12, 1 << 12, 1 << 12, 1 << 20};
    for (int i = 0; i < 6; i++) {
        if (values[i] <= 0 || values[i] > limits[i]) {
            snprintf(err, err_len, "%s must be positive and at most %d (got %d)", names[i], limits[i], values[i]);
            return -1;
        }
    }
    if (c->d_model % c->n_heads != 0) {
        snprintf(err, err_len, "d=%d is not divisible by H=%d", c->d_model, c->n_heads);
        return -1;
    }
    if (c->n_heads % c->n_kv_heads != 0) {
        snprintf(err, err_len, "H=%d is not divisible by G=%d", c->n_heads, c->n_kv_heads);
        return -1;
    }
    if ((c->d_model / c->n_heads) % 2 != 0) {
        snprintf(err, err_len, "head size d/H=%d must be even for RoPE", c->d_model / c->n_heads);
        return -1;
    }
    if (c->block_size < 0) {
        snprintf(err, err_len, "block size must be >= 0 (got %d)", c->block_size);
        return -1;
    }
    if (c->block_size > 0 && (2 * c->n_layers) % c->block_size != 0) {
        snprintf(err, err_len, "block size S=%d does not divide 2L=%d sub-layers",
                 c->block_size, 2 * c->n_layers);
        return -1;
    }
    return 0;
}

size_t param_sizes(const ModelConfig* c, size_t sizes[N_PARAM_TENSORS]) {
    size_t V = c->vocab_size, d = c->d_model, L = c->n_layers, F = c->ffn_hidden;
    size_t hs = d / c->n_heads, q_dim = c->n_heads * hs, kv_dim = c->n_kv_heads * hs;
    size_t n_res = c->block_size > 0 ? (2 * L + 1) * d : 0;
    size_t s[N_PARAM_TENSORS] = {V * d, L * d, L * q_dim * d, L * kv_dim * d, L * kv_dim * d,
                                 L * d * q_dim, L * d, L * F * d, L * F * d, L * d * F,
                                 n_res, n_res, d, V * d};
    size_t total = 0;
    for (int i = 0; i < N_PARAM_TENSORS; i++) { sizes[i] = s[i]; total += s[i]; }
    return total;
}

int param_is_matrix(int i) {
    return !(i == 1 || i == 6 || i == 10 || i == 11 || i == 12);
}

void point_tensors(ParameterTensors* t, float* memory, const size_t* sizes) {
    float** ptrs[N_PARAM_TENSORS] = {&t->wte, &t->attn_norm, &t->wq, &t->wk, &t->wv, &t->wo,
                                     &t->mlp_norm, &t->wg, &t->wu, &t->wd, &t->res_query,
                                     &t->res_norm, &t->final_norm, &t->lm_head};
    for (int i = 0; i < N_PARAM_TENSORS; i++) { *ptrs[i] = memory; memory += sizes[i]; }
}

// ---------------------------------------------------------------------------------------
// Activations: what the backward needs from the forward, per sub-layer, plus scratch.
typedef struct {
    float* h;         // (N,d) sub-layer input (residual stream, or depth-attention output)
    float* xn;        // (N,d) rmsnorm(h)
    float* rstd;      // (N)
    float* q;         // (N,H*hs) after RoPE              [attention]
    float* k;         // (N,G*hs) after RoPE              [attention]
    float* v;         // (N,G*hs)                         [attention]
    float* att;       // (B,H,T,T) softmax probabilities  [attention]
    float* y;         // (N,H*hs) heads concatenated      [attention]
    float* gate;      // (N,F) xn Wg^T                     [MLP]
    float* up;        // (N,F) xn Wu^T                     [MLP]
    float* act;       // (N,F) silu(gate) * up             [MLP]
    float* partial;   // (N,d) partial block sum after l  [AttnRes]
    float* alpha;     // (N,n_sources) depth-attention weights    [AttnRes]
    float* key_rstd;  // (N,n_sources)                            [AttnRes]
    size_t n_sources;
} SubLayer;

struct Activations {
    SubLayer* sub;    // 2L sub-layers, then slot 2L: the output aggregation (AttnRes)
    float* x0;        // (N,d) embeddings
    float* out;       // (N,d) final hidden state
    float* xf;        // (N,d) rmsnorm(out; final_norm)
    float* rstd_f;    // (N)
    float* logits;    // (N,V)
    float* probs;     // (N,V)
    float* losses;    // (N)
    float* f;         // (N,d) scratch: the output of the current sub-layer
    // backward scratch
    float *dlogits, *dxf, *dout, *dh, *dxn, *dx0;
    float *dq, *dk, *dv, *dq_pre, *dk_pre, *dy, *dgate, *dup, *dact;
    float* dpartial;  // (2L, N, d) gradients of partial[l]  [AttnRes]
};

static int n_sub(const Model* m) { return 2 * m->config.n_layers; }
static int is_attnres(const Model* m) { return m->config.block_size > 0; }

size_t count_sources(const ModelConfig* c, int l) {
    int S = c->block_size;
    if (l == 2 * c->n_layers) { return (size_t)(2 * c->n_layers / S + 1); }
    return (size_t)(1 + l / S + (l % S > 0));
}

// The sources of sub-layer l (l = 2L: output aggregation) and their gradient buffers:
// blocks b_0 .. b_{n-1} (b_0 = x0, b_k = partial[k*S-1]), then partial[l-1] if l is not
// first in its block.
static size_t gather_sources(const Model* m, int l, const float** src, float** dsrc) {
    const Activations* a = m->acts;
    int S = m->config.block_size;
    size_t N = m->B * m->T, d = m->config.d_model;
    int n_blocks = (l == n_sub(m)) ? n_sub(m) / S + 1 : 1 + l / S;
    size_t count = 0;
    for (int k = 0; k < n_blocks; k++, count++) {
        src[count] = k == 0 ? a->x0 : a->sub[k * S - 1].partial;
        dsrc[count] = k == 0 ? a->dx0 : a->dpartial + (size_t)(k * S - 1) * N * d;
    }
    if (l < n_sub(m) && l % S > 0) {
        src[count] = a->sub[l - 1].partial;
        dsrc[count] = a->dpartial + (size_t)(l - 1) * N * d;
        count++;
    }
    return count;
}

void model_build(Model* m, const ModelConfig* c, size_t max_B, size_t max_T) {
    memset(m, 0, sizeof(*m));
    m->config = *c;
    m->num_params = param_sizes(c, m->param_sizes);
    m->params_memory = callocCheck(m->num_params, sizeof(float));
    m->grads_memory = callocCheck(m->num_params, sizeof(float));
    m->m_memory = callocCheck(m->num_params, sizeof(float));
    m->v_memory = callocCheck(m->num_params, sizeof(float));
    point_tensors(&m->params, m->params_memory, m->param_sizes);
    point_tensors(&m->grads, m->grads_memory, m->param_sizes);
    m->max_B = max_B;
    m->max_T = max_T;

    size_t N = max_B * max_T, V = c->vocab_size, d = c->d_model, F = c->ffn_hidden;
    size_t H = c->n_heads, hs = d / H, q_dim = H * hs, kv_dim = c->n_kv_heads * hs;
    int L2 = 2 * c->n_layers;
    Activations* a = callocCheck(1, sizeof(Activations));
    m->acts = a;
    a->sub = callocCheck((size_t)L2 + 1, sizeof(SubLayer));
    for (int l = 0; l <= L2; l++) {
        SubLayer* s = &a->sub[l];
        if (l < L2) {
            s->h = mallocCheck(N * d * sizeof(float));
            s->xn = mallocCheck(N * d * sizeof(float));
            s->rstd = mallocCheck(N * sizeof(float));
            if (l % 2 == 0) {
                s->q = mallocCheck(N * q_dim * sizeof(float));
                s->k = mallocCheck(N * kv_dim * sizeof(float));
                s->v = mallocCheck(N * kv_dim * sizeof(float));
                s->att = mallocCheck(max_B * H * max_T * max_T * sizeof(float));
                s->y = mallocCheck(N * q_dim * sizeof(float));
            } else {
                s->gate = mallocCheck(N * F * sizeof(float));
                s->up = mallocCheck(N * F * sizeof(float));
                s->act = mallocCheck(N * F * sizeof(float));
            }
        }
        if (c->block_size > 0) {
            if (l < L2) { s->partial = mallocCheck(N * d * sizeof(float)); }
            s->n_sources = count_sources(c, l);
            s->alpha = mallocCheck(N * s->n_sources * sizeof(float));
            s->key_rstd = mallocCheck(N * s->n_sources * sizeof(float));
        }
    }
    size_t big = q_dim > F ? q_dim : F;
    float** bufs[] = {&a->x0, &a->out, &a->xf, &a->f, &a->dxf, &a->dout, &a->dh, &a->dxn,
                      &a->dx0};
    for (size_t i = 0; i < sizeof(bufs) / sizeof(bufs[0]); i++) {
        *bufs[i] = mallocCheck(N * d * sizeof(float));
    }
    a->rstd_f = mallocCheck(N * sizeof(float));
    a->losses = mallocCheck(N * sizeof(float));
    a->logits = mallocCheck(N * V * sizeof(float));
    a->probs = mallocCheck(N * V * sizeof(float));
    a->dlogits = mallocCheck(N * V * sizeof(float));
    a->dq = mallocCheck(N * q_dim * sizeof(float));
    a->dq_pre = mallocCheck(N * q_dim * sizeof(float));
    a->dy = mallocCheck(N * big * sizeof(float));
    a->dk = mallocCheck(N * kv_dim * sizeof(float));
    a->dk_pre = mallocCheck(N * kv_dim * sizeof(float));
    a->dv = mallocCheck(N * kv_dim * sizeof(float));
    a->dgate = mallocCheck(N * F * sizeof(float));
    a->dup = mallocCheck(N * F * sizeof(float));
    a->dact = mallocCheck(N * F * sizeof(float));
    if (c->block_size > 0) { a->dpartial = mallocCheck((size_t)L2 * N * d * sizeof(float)); }
}

void model_free(Model* m) {
    Activations* a = m->acts;
    if (a != NULL) {
        for (int l = 0; l <= n_sub(m); l++) {
            SubLayer* s = &a->sub[l];
            float* p[] = {s->h, s->xn, s->rstd, s->q, s->k, s->v, s->att, s->y, s->gate, s->up,
                          s->act, s->partial, s->alpha, s->key_rstd};
            for (size_t i = 0; i < sizeof(p) / sizeof(p[0]); i++) { free(p[i]); }
        }
        free(a->sub);
        float* p[] = {a->x0, a->out, a->xf, a->rstd_f, a->logits, a->probs, a->losses, a->f,
                      a->dlogits, a->dxf, a->dout, a->dh, a->dxn, a->dx0, a->dq, a->dk, a->dv,
                      a->dq_pre, a->dk_pre, a->dy, a->dgate, a->dup, a->dact, a->dpartial};
        for (size_t i = 0; i < sizeof(p) / sizeof(p[0]); i++) { free(p[i]); }
        free(a);
    }
    free(m->params_memory);
    free(m->grads_memory);
    free(m->m_memory);
    free(m->v_memory);
    memset(m, 0, sizeof(*m));
}

void model_init_params(Model* m, uint64_t seed) {
    const ModelConfig* c = &m->config;
    uint64_t state = seed;
    float std_out = 0.02f / sqrtf(2.0f * (float)c->n_layers);
    float* p = m->params_memory;
    for (int i = 0; i < N_PARAM_TENSORS; i++) {
        size_t n = m->param_sizes[i];
        int is_gain = (i == 1 || i == 6 || i == 11 || i == 12);
        float std = (i == 5 || i == 9) ? std_out : 0.02f;
        for (size_t j = 0; j < n; j++) {
            if (i == 10) { p[j] = 0.0f; }               // pseudo-queries: 0
            else if (is_gain) { p[j] = 1.0f; }          // gains: 1
            else { p[j] = (float)(std * rng_normal(&state)); }
        }
        p += n;
    }
}

// ---------------------------------------------------------------------------------------
// The sub-layers, forward and backward. Layer index = l / 2.

static void attention_sublayer_forward(Model* m, int l, float* f_out) {
    const ModelConfig* c = &m->config;
    SubLayer* s = &m->acts->sub[l];
    size_t B = m->B, T = m->T, N = B * T, d = c->d_model, layer = l / 2;
    size_t H = c->n_heads, G = c->n_kv_heads, hs = d / H, q_dim = H * hs, kv_dim = G * hs;
    const ParameterTensors* p = &m->params;
    rmsnorm_forward(s->xn, s->rstd, s->h, p->attn_norm + layer * d, N, d);
    linear_forward(s->q, s->xn, p->wq + layer * q_dim * d, N, d, q_dim);
    linear_forward(s->k, s->xn, p->wk + layer * kv_dim * d, N, d, kv_dim);
    linear_forward(s->v, s->xn, p->wv + layer * kv_dim * d, N, d, kv_dim);
    rope_forward(s->q, s->q, B, T, H, hs);
    rope_forward(s->k, s->k, B, T, G, hs);
    attention_forward(s->y, s->att, s->q, s->k, s->v, B, T, H, G, hs);
    linear_forward(f_out, s->y, p->wo + layer * d * q_dim, N, q_dim, d);
}

// df: gradient of the sub-layer output; accumulates into dh (the input's gradient)
static void attention_sublayer_backward(Model* m, int l, const float* df, float* dh) {
    const ModelConfig* c = &m->config;
    SubLayer* s = &m->acts->sub[l];
    Activations* a = m->acts;
    size_t B = m->B, T = m->T, N = B * T, d = c->d_model, layer = l / 2;
    size_t H = c->n_heads, G = c->n_kv_heads, hs = d / H, q_dim = H * hs, kv_dim = G * hs;
    const ParameterTensors* p = &m->params;
    const ParameterTensors* g = &m->grads;
    memset(a->dy, 0, N * q_dim * sizeof(float));
    linear_backward(a->dy, g->wo + layer * d * q_dim, df, s->y, p->wo + layer * d * q_dim,
                    N, q_dim, d);
    memset(a->dq, 0, N * q_dim * sizeof(float));
    memset(a->dk, 0, N * kv_dim * sizeof(float));
    memset(a->dv, 0, N * kv_dim * sizeof(float));
    attention_backward(a->dq, a->dk, a->dv, a->dy, s->att, s->q, s->k, s->v, B, T, H, G, hs);
    memset(a->dq_pre, 0, N * q_dim * sizeof(float));
    memset(a->dk_pre, 0, N * kv_dim * sizeof(float));
    rope_backward(a->dq_pre, a->dq, B, T, H, hs);
    rope_backward(a->dk_pre, a->dk, B, T, G, hs);
    memset(a->dxn, 0, N * d * sizeof(float));
    linear_backward(a->dxn, g->wq + layer * q_dim * d, a->dq_pre, s->xn,
                    p->wq + layer * q_dim * d, N, d, q_dim);
    linear_backward(a->dxn, g->wk + layer * kv_dim * d, a->dk_pre, s->xn,
                    p->wk + layer * kv_dim * d, N, d, kv_dim);
    linear_backward(a->dxn, g->wv + layer * kv_dim * d, a->dv, s->xn,
                    p->wv + layer * kv_dim * d, N, d, kv_dim);
    rmsnorm_backward(dh, g->attn_norm + layer * d, a->dxn, s->h, p->attn_norm + layer * d,
                     s->rstd, N, d);
}

static void mlp_sublayer_forward(Model* m, int l, float* f_out) {
    const ModelConfig* c = &m->config;
    SubLayer* s = &m->acts->sub[l];
    size_t N = m->B * m->T, d = c->d_model, F = c->ffn_hidden, layer = l / 2;
    const ParameterTensors* p = &m->params;
    rmsnorm_forward(s->xn, s->rstd, s->h, p->mlp_norm + layer * d, N, d);
    linear_forward(s->gate, s->xn, p->wg + layer * F * d, N, d, F);
    linear_forward(s->up, s->xn, p->wu + layer * F * d, N, d, F);
    swiglu_forward(s->act, s->gate, s->up, N, F);
    linear_forward(f_out, s->act, p->wd + layer * d * F, N, F, d);
}

static void mlp_sublayer_backward(Model* m, int l, const float* df, float* dh) {
    const ModelConfig* c = &m->config;
    SubLayer* s = &m->acts->sub[l];
    Activations* a = m->acts;
    size_t N = m->B * m->T, d = c->d_model, F = c->ffn_hidden, layer = l / 2;
    const ParameterTensors* p = &m->params;
    const ParameterTensors* g = &m->grads;
    memset(a->dact, 0, N * F * sizeof(float));
    linear_backward(a->dact, g->wd + layer * d * F, df, s->act, p->wd + layer * d * F, N, F, d);
    memset(a->dgate, 0, N * F * sizeof(float));
    memset(a->dup, 0, N * F * sizeof(float));
    swiglu_backward(a->dgate, a->dup, a->dact, s->gate, s->up, N, F);
    memset(a->dxn, 0, N * d * sizeof(float));
    linear_backward(a->dxn, g->wg + layer * F * d, a->dgate, s->xn, p->wg + layer * F * d,
                    N, d, F);
    linear_backward(a->dxn, g->wu + layer * F * d, a->dup, s->xn, p->wu + layer * F * d,
                    N, d, F);
    rmsnorm_backward(dh, g->mlp_norm + layer * d, a->dxn, s->h, p->mlp_norm + layer * d,
                     s->rstd, N, d);
}

// sqrt(mean(x^2)) over n values, accumulated in double
static void sublayer_forward(Model* m, int l, float* f_out) {
    if (l % 2 == 0) { attention_sublayer_forward(m, l, f_out); }
    else { mlp_sublayer_forward(m, l, f_out); }
    if (m->sublayer_rms != NULL) {  // diagnostics only; off by default
        m->sublayer_rms[l] = tensor_rms(f_out, m->B * m->T * (size_t)m->config.d_model);
    }
}

static void sublayer_backward(Model* m, int l, const float* df, float* dh) {
    if (l % 2 == 0) { attention_sublayer_backward(m, l, df, dh); }
    else { mlp_sublayer_backward(m, l, df, dh); }
}

// depth attention of sub-layer l (l = 2L: output aggregation) into out
static void depth_forward(Model* m, int l, float* out) {
    const float* src[2 * m->config.n_layers + 2];
    float* dsrc[2 * m->config.n_layers + 2];
    size_t n = gather_sources(m, l, src, dsrc);
    SubLayer* s = &m->acts->sub[l];
    size_t d = m->config.d_model;
    depth_attention_forward(out, s->alpha, s->key_rstd, src, m->params.res_query + l * d,
                            m->params.res_norm + l * d, n, m->B * m->T, d);
}

static void depth_backward(Model* m, int l, const float* dout) {
    const float* src[2 * m->config.n_layers + 2];
    float* dsrc[2 * m->config.n_layers + 2];
    size_t n = gather_sources(m, l, src, dsrc);
    SubLayer* s = &m->acts->sub[l];
    size_t d = m->config.d_model;
    depth_attention_backward(dsrc, m->grads.res_query + l * d, m->grads.res_norm + l * d, dout,
                             s->alpha, s->key_rstd, src, m->params.res_query + l * d,
                             m->params.res_norm + l * d, n, m->B * m->T, d);
}

float model_forward(Model* m, const int* tokens, const int* targets, size_t B, size_t T) {
    if (B > m->max_B || T > m->max_T) {
        fprintf(stderr, "error: batch %zux%zu exceeds the model's buffers %zux%zu\n", B, T,
                m->max_B, m->max_T);
        exit(1);
    }
    const ModelConfig* c = &m->config;
    Activations* a = m->acts;
    m->B = B;
    m->T = T;
    m->tokens = tokens;
    m->targets = targets;
    size_t N = B * T, d = c->d_model, V = c->vocab_size;
    int L2 = n_sub(m), S = c->block_size;
    embedding_forward(a->x0, tokens, m->params.wte, N, d);

    if (!is_attnres(m)) {
        // standard PreNorm residual stream: h_{l+1} = h_l + f_l(h_l)
        memcpy(a->sub[0].h, a->x0, N * d * sizeof(float));
        for (int l = 0; l < L2; l++) {
            sublayer_forward(m, l, a->f);
            float* next = (l + 1 < L2) ? a->sub[l + 1].h : a->out;
            const float* h = a->sub[l].h;
            #pragma omp parallel for
            for (size_t i = 0; i < N * d; i++) { next[i] = h[i] + a->f[i]; }
        }
    } else {
        for (int l = 0; l < L2; l++) {
            SubLayer* s = &a->sub[l];
            depth_forward(m, l, s->h);
            sublayer_forward(m, l, a->f);
            // partial block sum: p = f_l if l starts its block, else p_{l-1} + f_l
            if (l % S == 0) {
                memcpy(s->partial, a->f, N * d * sizeof(float));
            } else {
                const float* prev = a->sub[l - 1].partial;
                #pragma omp parallel for
                for (size_t i = 0; i < N * d; i++) { s->partial[i] = prev[i] + a->f[i]; }
            }
        }
        depth_forward(m, L2, a->out);
    }

    rmsnorm_forward(a->xf, a->rstd_f, a->out, m->params.final_norm, N, d);
    linear_forward(a->logits, a->xf, m->params.lm_head, N, d, V);
    if (targets == NULL) {
        // probabilities only (for decoding): every row counts as ignored
        int* none = mallocCheck(N * sizeof(int));
        for (size_t i = 0; i < N; i++) { none[i] = -1; }
        crossentropy_forward(a->losses, a->probs, a->logits, none, N, V);
        free(none);
        m->loss = -1.0f;
        return m->loss;
    }
    size_t count = crossentropy_forward(a->losses, a->probs, a->logits, targets, N, V);
    double sum = 0.0;
    for (size_t i = 0; i < N; i++) { sum += a->losses[i]; }
    m->loss = count > 0 ? (float)(sum / (double)count) : 0.0f;
    return m->loss;
}

const float* model_logits(const Model* m) { return m->acts->logits; }
const float* model_probs(const Model* m) { return m->acts->probs; }

void model_zero_grad(Model* m) {
    memset(m->grads_memory, 0, m->num_params * sizeof(float));
}

void model_backward(Model* m) {
    if (m->targets == NULL) {
        fprintf(stderr, "error: model_backward needs a forward with targets\n");
        exit(1);
    }
    const ModelConfig* c = &m->config;
    Activations* a = m->acts;
    size_t N = m->B * m->T, d = c->d_model, V = c->vocab_size;
    int L2 = n_sub(m), S = c->block_size;
    size_t count = 0;
    for (size_t i = 0; i < N; i++) { count += m->targets[i] >= 0; }

    // head: loss -> logits -> xf -> out
    memset(a->dlogits, 0, N * V * sizeof(float));
    crossentropy_backward(a->dlogits, a->probs, m->targets,
                          count > 0 ? 1.0f / (float)count : 0.0f, N, V);
    memset(a->dxf, 0, N * d * sizeof(float));
    linear_backward(a->dxf, m->grads.lm_head, a->dlogits, a->xf, m->params.lm_head, N, d, V);
    memset(a->dout, 0, N * d * sizeof(float));
    rmsnorm_backward(a->dout, m->grads.final_norm, a->dxf, a->out, m->params.final_norm,
                     a->rstd_f, N, d);

    memset(a->dx0, 0, N * d * sizeof(float));
    if (!is_attnres(m)) {
        // h_{l+1} = h_l + f_l(h_l): the residual gradient flows straight through, and each
        // sub-layer adds its input gradient to it. dx0 carries the running gradient.
        memcpy(a->dx0, a->dout, N * d * sizeof(float));
        for (int l = L2 - 1; l >= 0; l--) {
            memcpy(a->dh, a->dx0, N * d * sizeof(float));  // df_l = dh_{l+1}
            sublayer_backward(m, l, a->dh, a->dx0);
        }
    } else {
        memset(a->dpartial, 0, (size_t)L2 * N * d * sizeof(float));
        depth_backward(m, L2, a->dout);
        for (int l = L2 - 1; l >= 0; l--) {
            // every consumer of partial[l] comes later, so its gradient is complete here.
            // partial[l] = partial[l-1] + f_l (or f_l when l starts its block)
            const float* dp = a->dpartial + (size_t)l * N * d;
            if (l % S != 0) {
                float* dprev = a->dpartial + (size_t)(l - 1) * N * d;
                #pragma omp parallel for
                for (size_t i = 0; i < N * d; i++) { dprev[i] += dp[i]; }
            }
            memset(a->dh, 0, N * d * sizeof(float));
            sublayer_backward(m, l, dp, a->dh);
            depth_backward(m, l, a->dh);
        }
    }
    embedding_backward(m->grads.wte, a->dx0, m->tokens, N, d);
}

float model_grad_norm(const Model* m) {
    double sum_sq = 0.0;
    for (size_t i = 0; i < m->num_params; i++) {
        double g = m->grads_memory[i];
        sum_sq += g * g;
    }
    return (float)sqrt(sum_sq);
}

void model_update(Model* m, float lr, float beta1, float beta2, float eps,
                  float weight_decay, int t) {
    size_t offset = 0;
    for (int i = 0; i < N_PARAM_TENSORS; i++) {
        size_t n = m->param_sizes[i];
        adamw_update(m->params_memory + offset, m->grads_memory + offset, m->m_memory + offset,
                     m->v_memory + offset, n, lr, beta1, beta2, eps,
                     param_is_matrix(i) ? weight_decay : 0.0f, t);
        offset += n;
    }
}

const float* model_depth_alpha(const Model* m, int l, size_t* n_sources) {
    if (!is_attnres(m) || l < 0 || l > n_sub(m)) { return NULL; }
    *n_sources = m->acts->sub[l].n_sources;
    return m->acts->sub[l].alpha;
}

const float* model_sublayer_input(const Model* m, int l) {
    if (l < 0 || l > n_sub(m)) { return NULL; }
    return l == n_sub(m) ? m->acts->out : m->acts->sub[l].h;
}
