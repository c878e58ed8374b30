// model.c — forward and backward of the whole model, for every residual mode, on the CPU or
// on the GPU: every layer call goes through the model's kernel table (kernels.h), so this file
// is the one copy of the orchestration, and cuda/model.cu only builds a Model on the device.
//
// Sub-layer l = 0 .. 2L-1: even l is the attention of layer l/2, odd l its MLP. Each is
// f_l(h) = Attn(rmsnorm(h)) or MLP(rmsnorm(h)). What feeds h depends on the mode (SPEC.md);
// a function below that branches on the mode tests them in this order:
//   mhc  : m streams X_0 .. X_{m-1}, all x0 at first; h_l = sum_s a_pre[s] X_s, then
//          X_t <- sum_s H_res[s][t] X_s + a_post[t] f_l (mhc.c); the head reads
//          sum_s rmsnorm(X_s)
//   none : h_0 = x0, h_{l+1} = h_l + f_l(h_l), out = h_{2L}
//   block: h_l = DA_l(b_0 .. b_{l/S}[, partial]) over b_0 = x0, the completed blocks and the
//          partial sum of l's block; out = DA_out(b_0 .. b_{n_blocks})
//   full : block with S = 1 (every sub-layer output is its own block)
// Which buffers those are, forward and backward, with a worked example: the comment above
// count_sources.
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "layers.h"
#include "model.h"
#include "rng.h"
#include "util.h"

// ---------------------------------------------------------------------------------------
// Config, sizes, parameters.

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
    if (c->streams != 0 && (c->streams < 2 || c->streams > MHC_MAX_STREAMS)) {
        snprintf(err, err_len, "--streams must be 2 .. %d (got %d)", MHC_MAX_STREAMS, c->streams);
        return -1;
    }
    if (c->streams != 0 && c->block_size != 0) {
        snprintf(err, err_len, "--streams is for --mode mhc, not an AttnRes mode (block size %d)",
                 c->block_size);
        return -1;
    }
    return variant_check(c, err, err_len);
}

// SPEC "Variants": each switch's values, the modes it applies to, and the combinations.
int variant_check(const ModelConfig* c, char* err, size_t err_len) {
    const int values[] = {c->depth_score, c->key_norm_off, c->depth_query, c->mixing};
    const int limits[] = {1, 1, 1, 2};
    const char* flags[] = {"--depth-score", "--key-norm", "--depth-query", "--mixing"};
    for (int i = 0; i < 4; i++) {
        if (values[i] < 0 || values[i] > limits[i]) {
            snprintf(err, err_len, "%s: unknown value %d", flags[i], values[i]);
            return -1;
        }
    }
    if (c->depth_heads < 0 || (c->depth_heads > 0 && c->d_model % c->depth_heads != 0)) {
        snprintf(err, err_len, "--depth-heads %d must be 0 (one head) or a positive divisor of d=%d",
                 c->depth_heads, c->d_model);
        return -1;
    }
    if (c->depth_window < 0) {
        snprintf(err, err_len, "--depth-window must be >= 0 (got %d)", c->depth_window);
        return -1;
    }
    int attention = c->depth_score || c->key_norm_off || c->depth_query || c->depth_heads > 1;
    const char* first = c->depth_score ? "--depth-score sigmoid" : c->key_norm_off ? "--key-norm off"
                        : c->depth_query ? "--depth-query input" : "--depth-heads";
    if (c->block_size == 0 && (attention || c->depth_window > 0 || c->mixing)) {
        snprintf(err, err_len, "%s applies to AttnRes (mode full or block), not mode %s",
                 attention ? first : c->mixing ? "--mixing" : "--depth-window",
                 c->streams ? "mhc" : "none");
        return -1;
    }
    if (c->depth_window > 0 && c->block_size != 1) {
        snprintf(err, err_len, "--depth-window applies to mode full only");
        return -1;
    }
    if (c->mixing && attention) {
        snprintf(err, err_len, "--mixing replaces the depth attention: it does not combine with %s",
                 first);
        return -1;
    }
    return 0;
}

void variant_describe(const ModelConfig* c, char* out, size_t len) {
    size_t used = 0;
    out[0] = '\0';
    const char* parts[] = {c->depth_score ? "--depth-score sigmoid" : NULL,
                           c->key_norm_off ? "--key-norm off" : NULL,
                           c->depth_query ? "--depth-query input" : NULL,
                           c->mixing == 1 ? "--mixing static" : c->mixing == 2 ? "--mixing dense" : NULL};
    for (int i = 0; i < 4; i++) {
        if (parts[i] != NULL && used < len) {
            used += (size_t)snprintf(out + used, len - used, "%s%s", used ? " " : "", parts[i]);
        }
    }
    if (c->depth_heads > 1 && used < len) {
        used += (size_t)snprintf(out + used, len - used, "%s--depth-heads %d", used ? " " : "", c->depth_heads);
    }
    if (c->depth_window > 0 && used < len) {
        used += (size_t)snprintf(out + used, len - used, "%s--depth-window %d", used ? " " : "", c->depth_window);
    }
    if (used == 0) { snprintf(out, len, "no variant"); }
}

int depth_variant(const ModelConfig* c) {
    return c->depth_score || c->key_norm_off || c->depth_query || c->depth_heads > 1;
}

ModelDims model_dims(const ModelConfig* c) {
    ModelDims z;
    z.V = (size_t)c->vocab_size;
    z.d = (size_t)c->d_model;
    z.L = (size_t)c->n_layers;
    z.H = (size_t)c->n_heads;
    z.G = (size_t)c->n_kv_heads;
    z.hs = z.d / z.H;
    z.F = (size_t)c->ffn_hidden;
    z.q_dim = z.H * z.hs;
    z.kv_dim = z.G * z.hs;
    z.n_sub = 2 * z.L;
    z.S = (size_t)c->block_size;
    z.n_blocks = z.S > 0 ? z.n_sub / z.S : 0;
    z.n_res = z.S > 0 ? z.n_sub + 1 : 0;
    z.depth_heads = c->depth_heads > 1 ? (size_t)c->depth_heads : 1;
    size_t attention = c->mixing == 0 ? z.n_res : 0;
    z.n_query_slices = attention;
    z.n_norm_slices = c->key_norm_off ? 0 : attention;
    z.n_qproj_slices = c->depth_query ? attention : 0;
    z.n_logit_slices = c->mixing == 1 ? z.n_res : 0;
    z.n_scalar_slices = c->mixing == 2 ? z.n_res : 0;
    z.streams = c->streams > 0 ? (size_t)c->streams : 0;
    z.R = z.streams > 0 ? mhc_permutation_table(NULL, z.streams) : 0;
    z.E = z.streams > 0 ? 2 * z.streams + z.R : 0;
    z.n_mix = z.streams > 0 ? MHC_MIX_WIDTH(z.streams) : 0;
    z.n_hc_slices = z.streams > 0 ? z.n_sub : 0;
    return z;
}

#define PARAM_INFO_ENTRY(name, size, init, decay, split) {#name, init, decay, split},
const ParamInfo PARAM_INFO[N_PARAM_TENSORS] = {PARAMETER_TENSORS(PARAM_INFO_ENTRY)};
#undef PARAM_INFO_ENTRY

size_t param_sizes(const ModelConfig* c, size_t sizes[N_PARAM_TENSORS]) {
    ModelDims dims = model_dims(c);  // the PARAMETER_TENSORS size column reads `dims`
    #define PARAM_SIZE(name, size, init, decay, split) size,
    const size_t s[N_PARAM_TENSORS] = {PARAMETER_TENSORS(PARAM_SIZE)};
    #undef PARAM_SIZE
    size_t total = 0;
    for (int i = 0; i < N_PARAM_TENSORS; i++) { sizes[i] = s[i]; total += s[i]; }
    return total;
}

size_t param_share(const ModelConfig* c, int begin, int end, size_t offsets[N_PARAM_TENSORS],
                   size_t sizes[N_PARAM_TENSORS]) {
    size_t whole[N_PARAM_TENSORS], offset = 0, total = 0, n_sub = 2 * (size_t)c->n_layers;
    param_sizes(c, whole);
    size_t b = (size_t)begin, e = (size_t)end;
    for (int i = 0; i < N_PARAM_TENSORS; i++) {
        size_t slices = 1, first = 0, count = 1;  // the whole tensor, one slice
        switch (PARAM_INFO[i].split) {
        case SPLIT_FIRST: count = b == 0; break;
        case SPLIT_LAST: count = e == n_sub; break;
        case SPLIT_LAYER: slices = n_sub / 2; first = b / 2; count = (e - b) / 2; break;
        case SPLIT_SUB: slices = n_sub; first = b; count = e - b; break;
        case SPLIT_DEPTH: slices = n_sub + 1; first = b; count = e - b + (e == n_sub); break;
        }
        size_t slice = whole[i] / slices;  // its floats
        offsets[i] = offset + first * slice;
        sizes[i] = count * slice;
        total += sizes[i];
        offset += whole[i];
    }
    return total;
}

void point_tensors(ParameterTensors* t, float* memory, const size_t* sizes) {
    #define PARAM_POINTER(name, size, init, decay, split) &t->name,
    float** ptrs[N_PARAM_TENSORS] = {PARAMETER_TENSORS(PARAM_POINTER)};
    #undef PARAM_POINTER
    for (int i = 0; i < N_PARAM_TENSORS; i++) { *ptrs[i] = memory; memory += sizes[i]; }
}

// SPEC's hc_bias init, entry j of hc_bias (2L, E): for sub-layer l = j / E, the pre and the
// post biases are -1 except +1 at stream l mod m (l reads and writes mostly that stream), the
// res biases -8 except 0 at the identity r = 0 (so H_res starts near the identity)
static float hc_bias_init(const ModelDims* z, size_t j) {
    size_t l = j / z->E, k = j % z->E, favoured = l % z->streams;
    if (k < z->streams) { return k == favoured ? 1.0f : -1.0f; }             // pre
    if (k < z->streams + z->R) { return k == z->streams ? 0.0f : -8.0f; }          // res
    return k - z->streams - z->R == favoured ? 1.0f : -1.0f;                 // post
}

void model_init_params(Model* model, uint64_t seed) {
    uint64_t state = seed;
    float std_out = 0.02f / sqrtf(2.0f * (float)model->config.n_layers);
    float* tensor = model->params_memory;
    for (int i = 0; i < N_PARAM_TENSORS; i++) {
        ParamInit init = PARAM_INFO[i].init;
        float std = init == INIT_NORMAL_OUT ? std_out : 0.02f;
        for (size_t j = 0; j < model->param_sizes[i]; j++) {
            if (init == INIT_ZERO) { tensor[j] = 0.0f; }
            else if (init == INIT_ONE) { tensor[j] = 1.0f; }
            else if (init == INIT_HC_BIAS) { tensor[j] = hc_bias_init(&model->dims, j); }
            else if (init == INIT_HC_SCALE) { tensor[j] = 0.01f; }
            else { tensor[j] = (float)(std * rng_normal(&state)); }
        }
        tensor += model->param_sizes[i];
    }
}

// ---------------------------------------------------------------------------------------
// The residual bookkeeping: which sources each depth attention reads.
//
// Block mode (SPEC.md "Residual mode"; full mode is S = 1). Blocks count from 1, as in SPEC:
// the 2L sub-layers l = 0 .. 2L-1 fall into n_blocks = 2L/S blocks of S, sub-layer l in block
// n = 1 + l/S. partial[l] is the running sum of the outputs of l's block up to and including
// l: partial[l] = f_l when l starts its block (f_l's own buffer, no copy), else
// partial[l-1] + f_l (residual_update). The block sources are b_0 = x0 and the completed
// blocks b_n = partial[n*S - 1], n = 1 .. n_blocks.
// Sub-layer l of block n reads b_0 .. b_{n-1} (every block before its own), then, unless l
// starts its block, partial[l-1]: the sum of the outputs before it in its block. The output
// aggregation (l = 2L) reads b_0 .. b_{n_blocks}. A depth window W (full mode only) keeps x0
// and the W most recent of those.
// Gradients: b_0's is dx0. Every other source is a partial sum, and the backward keeps ONE
// gradient buffer a block, db_n for block n (block_gradient: a->dpartial holds n_blocks of
// them): b_n and the partial[l-1] that a sub-layer l of block n reads both add into db_n. One
// buffer is enough because the backward walks l downwards: when it reaches sub-layer l, every
// reader of partial[l] is done, so db_n (n = 1 + l/S) holds d partial[l] = d f_l in full
// (attention_sublayer_backward or mlp_sublayer_backward reads it there); partial[l] =
// partial[l-1] + f_l hands that same gradient to partial[l-1], so the buffer simply becomes
// partial[l-1]'s, and sub-layer l's depth attention adds its share on top.
// L = 2, S = 2 (n_blocks = 2: block 1 = sub-layers 0, 1 with b_1 = partial[1], block 2 =
// sub-layers 2, 3 with b_2 = partial[3]):
//   sub-layer     l   sources (in order)            its depth attention adds into   f_l's grad
//   L0.attn       0   x0                            dx0                              db_1
//   L0.mlp        1   x0, partial[0] (= f_0)        dx0, db_1                        db_1
//   L1.attn       2   x0, b_1                       dx0, db_1                        db_2
//   L1.mlp        3   x0, b_1, partial[2] (= f_2)   dx0, db_1, db_2                  db_2
//   output        4   x0, b_1, b_2                  dx0, db_1, db_2                  -
// Backward order: output, then l = 3, 2, 1, 0, each sub-layer first reading f_l's gradient,
// then adding its depth attention's into the buffers on its line; dx0 ends in the embedding.

size_t count_sources(const ModelConfig* c, int l) {
    int S = c->block_size, W = c->depth_window;
    if (W > 0 && l > W) { return (size_t)(1 + W); }  // full: x0 and the W most recent outputs
    if (l == 2 * c->n_layers) { return (size_t)(2 * c->n_layers / S + 1); }
    return (size_t)(1 + l / S + (l % S > 0));
}

// db_n, the gradient buffer of block n >= 1 (the comment above): (N,d), kept with b_n, the
// partial sum of the block's last sub-layer (point_range: a slice of a->dpartial)
static float* block_gradient(const Activations* a, const ModelConfig* c, int n) {
    return a->sub[n * c->block_size - 1].dpartial;
}

size_t gather_sources(const Activations* a, const ModelConfig* c, size_t N, int l,
                      const float** src, float** dsrc) {
    int S = c->block_size, n_sub = 2 * c->n_layers;
    int last = (l == n_sub) ? n_sub / S : l / S;  // b_0 .. b_last: the blocks before l's own
    size_t count = 0;
    for (int n = 0; n <= last; n++, count++) {
        src[count] = n == 0 ? a->x0 : a->sub[n * S - 1].partial;
        if (dsrc != NULL) { dsrc[count] = n == 0 ? a->dx0 : block_gradient(a, c, n); }
    }
    if (l < n_sub && l % S > 0) {  // partial[l-1], in l's own block 1 + l/S
        src[count] = a->sub[l - 1].partial;
        if (dsrc != NULL) { dsrc[count] = block_gradient(a, c, 1 + l / S); }
        count++;
    }
    size_t keep = count_sources(c, l);  // a window (full only) keeps x0 and the last W
    if (keep < count) {
        size_t drop = count - keep;
        for (size_t i = 1; i < keep; i++) {
            src[i] = src[i + drop];
            if (dsrc != NULL) { dsrc[i] = dsrc[i + drop]; }
        }
    }
    return keep;
}

void residual_update(const Model* model, Activations* a, int l, size_t N) {
    const Kernels* kernels = model->kernels;
    int n_sub = (int)model->dims.n_sub, S = (int)model->dims.S;
    size_t nd = N * model->dims.d;
    const float* f = a->sub[l].f;
    if (model->dims.streams > 0) {  // mhc: X_{l+1,t} = sum_s H_res[s][t] X_{l,s} + a_post[t] f
        kernels->mhc_output_forward(a->sub[l + 1].streams, a->sub[l].streams, f,
                                    a->sub[l].hc_mix, N, model->dims.d, model->dims.streams);
    } else if (S == 0) {
        float* next = (l + 1 < n_sub) ? a->sub[l + 1].h : a->out;
        kernels->add(next, a->sub[l].h, f, nd);                    // h_{l+1} = h_l + f_l
    } else if (l % S > 0) {  // (when l starts its block, partial[l] is f_l's own buffer)
        // partial[l] = partial[l-1] + f_l
        kernels->add(a->sub[l].partial, a->sub[l - 1].partial, f, nd);
    }
}

// ---------------------------------------------------------------------------------------
// Activations: one size table, one block of memory.

// A cursor into the block: take() hands out the next `count` floats (NULL for none, and
// while only counting), each buffer starting a multiple of 16 floats (64 bytes) in.
typedef struct {
    float* memory;
    size_t used;
} Layout;

static float* take(Layout* layout, size_t count) {
    if (count == 0) { return NULL; }
    float* buffer = layout->memory != NULL ? layout->memory + layout->used : NULL;
    layout->used += (count + 15) / 16 * 16;
    return buffer;
}

// The size table of the sub-layers [begin, end) (the whole model: [0, 2L)); point_activations
// and point_chunk_activations say what it holds.
static size_t point_range(Activations* a, const ModelConfig* c, size_t B, size_t T,
                          int backward, float* memory, size_t begin, size_t end) {
    ModelDims z = model_dims(c);
    size_t N = B * T, d = z.d, F = z.F, V = z.V, attnres = z.S > 0, none = !attnres && !z.streams;
    size_t head = end == z.n_sub, first = begin == 0;
    Layout at = {memory, 0};
    for (size_t l = 0; l <= z.n_sub; l++) {
        SubLayer* s = &a->sub[l];
        size_t sub = l >= begin && l < end, here = sub || (l == z.n_sub && head);
        size_t attention = sub && l % 2 == 0, mlp = sub && l % 2 == 1;
        size_t before = attnres && l < begin && (l + 1) % z.S == 0;  // a block received
        s->n_sources = attnres ? count_sources(c, (int)l) : 0;
        s->h        = take(&at, (sub || (none && l == end && !head)) * N * d);
        s->xn       = take(&at, sub * N * d);
        s->rstd     = take(&at, sub * N);
        s->f        = take(&at, sub * N * d);
        s->q        = take(&at, attention * N * z.q_dim);
        s->k        = take(&at, attention * N * z.kv_dim);
        s->v        = take(&at, attention * N * z.kv_dim);
        s->lse      = take(&at, attention * B * z.H * T);
        s->y        = take(&at, attention * N * z.q_dim);
        s->gate     = take(&at, mlp * N * F);
        s->up       = take(&at, mlp * N * F);
        s->act      = take(&at, mlp * N * F);
        // the partial sum that starts a block is f_l itself: the same buffer, no copy
        s->partial  = attnres && sub && l % z.S == 0 ? s->f : take(&at, (sub || before) * attnres * N * d);
        s->depth.alpha      = take(&at, here * N * s->n_sources * z.depth_heads);
        s->depth.key_rstd   = take(&at, here * N * s->n_sources * z.depth_heads);
        s->depth.last_xn    = take(&at, here * (z.n_qproj_slices > 0) * N * d);
        s->depth.last_rstd  = take(&at, here * (z.n_qproj_slices > 0) * N);
        s->depth.token_query = take(&at, here * (z.n_qproj_slices > 0) * N * d);
        // mhc: the streams entering l (slot 2L: after the last sub-layer); the final norm's
        // rstd is one a stream
        s->streams  = take(&at, (here || l == end) * N * z.streams * d);
        s->hc_z     = take(&at, here * N * z.streams * d);
        s->hc_rstd  = take(&at, here * (sub ? (z.streams > 0) * N : N * z.streams));
        s->hc_e     = take(&at, sub * N * z.E);
        s->hc_mix   = take(&at, sub * N * z.n_mix);
    }
    a->x0      = take(&at, (first || attnres) * N * d);
    a->out     = take(&at, head * N * d);
    a->xf      = take(&at, head * N * d);
    a->rstd_f  = take(&at, head * N);
    a->logits  = take(&at, head * N * V);
    a->probs   = take(&at, head * N * V);
    a->losses  = take(&at, head * N);
    size_t b = backward != 0;
    a->dlogits = take(&at, b * head * N * V);
    a->dxf     = take(&at, b * head * N * d);
    a->df      = take(&at, b * (z.streams > 0) * N * d);
    a->dh      = take(&at, b * (attnres || z.streams > 0) * N * d);
    a->dxn     = take(&at, b * N * d);
    a->dx0     = take(&at, b * N * d);
    a->dq      = take(&at, b * N * z.q_dim);
    a->dk      = take(&at, b * N * z.kv_dim);
    a->dv      = take(&at, b * N * z.kv_dim);
    a->dq_pre  = take(&at, b * N * z.q_dim);
    a->dk_pre  = take(&at, b * N * z.kv_dim);
    a->dy      = take(&at, b * N * z.q_dim);
    a->dgate   = take(&at, b * N * F);
    a->dup     = take(&at, b * N * F);
    a->dact    = take(&at, b * N * F);
    // db_1 .. db_{end/S} (every block the range reads or writes), one after the other
    size_t n_blocks = attnres ? end / z.S : 0;
    a->dpartial = take(&at, b * n_blocks * N * d);
    for (size_t l = 0; l <= z.n_sub; l++) {
        size_t n = attnres && l < end && (l + 1) % z.S == 0 ? (l + 1) / z.S : 0;  // l ends block n
        a->sub[l].dpartial = n > 0 && a->dpartial != NULL ? a->dpartial + (n - 1) * N * d : NULL;
    }
    a->dtoken_query = take(&at, b * (z.n_qproj_slices > 0) * N * d);
    a->dlast_xn = take(&at, b * (z.n_qproj_slices > 0) * N * d);
    a->dstreams = take(&at, b * N * z.streams * d);
    a->dstreams_before = take(&at, b * N * z.streams * d);
    a->dhc_z   = take(&at, b * N * z.streams * d);
    a->dhc_e   = take(&at, b * N * z.E);
    a->dhc_mix = take(&at, b * N * z.n_mix);
    return at.used;
}

size_t point_activations(Activations* a, const ModelConfig* c, size_t B, size_t T,
                         int backward, float* memory) {
    return point_range(a, c, B, T, backward, memory, 0, 2 * (size_t)c->n_layers);
}

size_t point_chunk_activations(Activations* a, const ModelConfig* c, size_t B, size_t T,
                               int begin, int end, float* memory) {
    return point_range(a, c, B, T, 1, memory, (size_t)begin, (size_t)end);
}

// ---------------------------------------------------------------------------------------
// Building: the same for every kernel table; the table's alloc decides where memory lives.

// The share of the parameters [sub_begin, sub_end) holds, their gradients and AdamW moments,
// zeroed, in four flat buffers
static void allocate_params(Model* model) {
    model->num_params = param_share(&model->config, model->sub_begin, model->sub_end,
                                    model->param_offsets, model->param_sizes);
    float** flat[] = {&model->params_memory, &model->grads_memory, &model->m_memory,
                      &model->v_memory};
    for (int i = 0; i < 4; i++) { *flat[i] = model->kernels->alloc_zeroed(model->num_params); }
    point_tensors(&model->params, model->params_memory, model->param_sizes);
    point_tensors(&model->grads, model->grads_memory, model->param_sizes);
}

void model_build_chunk(Model* model, const ModelConfig* c, int begin, int end) {
    memset(model, 0, sizeof(*model));
    model->config = *c;
    model->dims = model_dims(c);
    model->kernels = &cpu_kernels;
    model->sub_begin = begin;
    model->sub_end = end;
    allocate_params(model);
}

void model_build_on(Model* model, const ModelConfig* c, size_t max_B, size_t max_T,
                    const Kernels* kernels) {
    memset(model, 0, sizeof(*model));
    model->config = *c;
    model->dims = model_dims(c);
    model->kernels = kernels;
    model->sub_begin = 0;
    model->sub_end = (int)model->dims.n_sub;
    allocate_params(model);
    model->max_B = max_B;
    model->max_T = max_T;
    model->acts.sub = callocCheck(model->dims.n_sub + 1, sizeof(SubLayer));
    size_t n_acts = point_activations(&model->acts, c, max_B, max_T, 1, NULL);
    model->acts_memory = kernels->alloc_zeroed(n_acts);
    point_activations(&model->acts, c, max_B, max_T, 1, model->acts_memory);
}

void model_build(Model* model, const ModelConfig* c, size_t max_B, size_t max_T) {
    model_build_on(model, c, max_B, max_T, &cpu_kernels);
}

void model_free(Model* model) {
    const Kernels* kernels = model->kernels;
    if (kernels != NULL) {
        float* memory[] = {model->params_memory, model->grads_memory, model->m_memory,
                           model->v_memory, model->acts_memory};
        for (int i = 0; i < 5; i++) { kernels->release(memory[i]); }
    }
    free(model->acts.sub);
    memset(model, 0, sizeof(*model));
}

// ---------------------------------------------------------------------------------------
// The sub-layers, forward and backward. Layer index = l / 2.

// The index of sub-layer l's layer in the model's share of the per-layer tensors: l / 2 in
// the whole model; a pipeline's chunk holds the layers from sub_begin / 2 on (ParamSplit)
static size_t layer_index(const Model* model, int l) { return (size_t)(l - model->sub_begin) / 2; }

static void attention_sublayer_forward(const Model* model, SubLayer* s, int l) {
    const Kernels* kernels = model->kernels;
    const ModelDims* z = &model->dims;
    const ParameterTensors* params = &model->params;
    size_t B = model->B, T = model->T, N = B * T, d = z->d, layer = layer_index(model, l);
    size_t H = z->H, G = z->G, hs = z->hs, q_dim = z->q_dim, kv_dim = z->kv_dim;
    kernels->linear_forward(s->q, s->xn, params->wq + layer * q_dim * d, N, d, q_dim);
    kernels->linear_forward(s->k, s->xn, params->wk + layer * kv_dim * d, N, d, kv_dim);
    kernels->linear_forward(s->v, s->xn, params->wv + layer * kv_dim * d, N, d, kv_dim);
    kernels->rope_forward(s->q, s->q, B, T, H, hs);
    kernels->rope_forward(s->k, s->k, B, T, G, hs);
    kernels->attention_forward(s->y, s->lse, s->q, s->k, s->v, B, T, H, G, hs);
    kernels->linear_forward(s->f, s->y, params->wo + layer * d * q_dim, N, q_dim, d);
}

// df: gradient of the sub-layer output; writes a->dxn, the gradient of its normed input xn
static void attention_sublayer_backward(Model* model, int l, const float* df) {
    const Kernels* kernels = model->kernels;
    const ModelDims* z = &model->dims;
    const SubLayer* s = &model->acts.sub[l];
    Activations* a = &model->acts;
    const ParameterTensors* params = &model->params;
    const ParameterTensors* g = &model->grads;
    size_t B = model->B, T = model->T, N = B * T, d = z->d, layer = layer_index(model, l);
    size_t H = z->H, G = z->G, hs = z->hs, q_dim = z->q_dim, kv_dim = z->kv_dim;
    kernels->zero(a->dy, N * q_dim);
    kernels->linear_backward(a->dy, g->wo + layer * d * q_dim, df, s->y,
                             params->wo + layer * d * q_dim, N, q_dim, d);
    kernels->zero(a->dq, N * q_dim);
    kernels->zero(a->dk, N * kv_dim);
    kernels->zero(a->dv, N * kv_dim);
    kernels->attention_backward(a->dq, a->dk, a->dv, a->dy, s->y, s->lse, s->q, s->k, s->v, B, T,
                                H, G, hs);
    kernels->zero(a->dq_pre, N * q_dim);
    kernels->zero(a->dk_pre, N * kv_dim);
    kernels->rope_backward(a->dq_pre, a->dq, B, T, H, hs);
    kernels->rope_backward(a->dk_pre, a->dk, B, T, G, hs);
    kernels->zero(a->dxn, N * d);
    kernels->linear_backward(a->dxn, g->wq + layer * q_dim * d, a->dq_pre, s->xn,
                       params->wq + layer * q_dim * d, N, d, q_dim);
    kernels->linear_backward(a->dxn, g->wk + layer * kv_dim * d, a->dk_pre, s->xn,
                       params->wk + layer * kv_dim * d, N, d, kv_dim);
    kernels->linear_backward(a->dxn, g->wv + layer * kv_dim * d, a->dv, s->xn,
                       params->wv + layer * kv_dim * d, N, d, kv_dim);
}

void mlp_sublayer_forward(const Model* model, SubLayer* s, int l, size_t N) {
    const Kernels* kernels = model->kernels;
    const ParameterTensors* params = &model->params;
    size_t d = model->dims.d, F = model->dims.F, layer = layer_index(model, l);
    kernels->linear_forward(s->gate, s->xn, params->wg + layer * F * d, N, d, F);
    kernels->linear_forward(s->up, s->xn, params->wu + layer * F * d, N, d, F);
    kernels->swiglu_forward(s->act, s->gate, s->up, N, F);
    kernels->linear_forward(s->f, s->act, params->wd + layer * d * F, N, F, d);
}

static void mlp_sublayer_backward(Model* model, int l, const float* df) {
    const Kernels* kernels = model->kernels;
    const SubLayer* s = &model->acts.sub[l];
    Activations* a = &model->acts;
    const ParameterTensors* params = &model->params;
    const ParameterTensors* g = &model->grads;
    size_t N = model->B * model->T, d = model->dims.d, F = model->dims.F, layer = layer_index(model, l);
    kernels->zero(a->dact, N * F);
    kernels->linear_backward(a->dact, g->wd + layer * d * F, df, s->act, params->wd + layer * d * F,
                       N, F, d);
    kernels->zero(a->dgate, N * F);
    kernels->zero(a->dup, N * F);
    kernels->swiglu_backward(a->dgate, a->dup, a->dact, s->gate, s->up, N, F);
    kernels->zero(a->dxn, N * d);
    kernels->linear_backward(a->dxn, g->wg + layer * F * d, a->dgate, s->xn,
                             params->wg + layer * F * d, N, d, F);
    kernels->linear_backward(a->dxn, g->wu + layer * F * d, a->dup, s->xn,
                             params->wu + layer * F * d, N, d, F);
}


DepthParams model_depth_params(const Model* model, const ParameterTensors* t, size_t l) {
    const ModelDims* z = &model->dims;
    DepthParams r = {NULL, NULL, NULL, NULL};
    l -= (size_t)model->sub_begin;  // its slice in the model's share (0 on the whole model)
    if (z->n_query_slices > 0) { r.query = t->res_query + l * z->d; }
    if (z->n_norm_slices > 0) { r.norm = t->res_norm + l * z->d; }
    if (z->n_qproj_slices > 0) { r.qproj = t->res_qproj + l * z->d * z->d; }
    if (z->n_logit_slices > 0) { r.mix = t->res_logits + l * z->n_res; }
    if (z->n_scalar_slices > 0) { r.mix = t->res_scalars + l * z->n_res; }
    return r;
}

// the depth attention's switches (layers.h) as the config sets them
static DepthSwitches depth_switches(const Model* model) {
    return (DepthSwitches){model->dims.depth_heads, model->config.depth_score,
                           model->config.mixing};
}

// the decoder's depth attention (inference.c): attnres_input_forward without the norm
void depth_forward_rows(const Model* model, Activations* a, size_t N, int l, float* out) {
    const float* src[model->dims.n_sub + 2];
    size_t n = gather_sources(a, &model->config, N, l, src, NULL);
    DepthParams params = model_depth_params(model, &model->params, (size_t)l);
    model->kernels->attnres_input_forward(NULL, NULL, out, a->sub[l].depth, src, params, NULL, n, N,
                                          model->dims.d, depth_switches(model));
}

// ---------------------------------------------------------------------------------------
// The input of sub-layer l: xn_l = rmsnorm(h_l), where h_l is the residual stream (none) or
// the depth attention over the sources (AttnRes). l = n_sub stands for the head's input:
// xf = rmsnorm(out), out = h_{2L} or DA_out.

typedef struct {
    float *h, *xn, *rstd;  // h_l (or out), xn_l = rmsnorm(h_l) (or xf), the saved rstd
    float *weight, *dweight;  // the norm's weight (its gain) and its gradient
} Norm;

static Norm sublayer_norm(Model* model, int l) {
    Activations* a = &model->acts;
    if (l == (int)model->dims.n_sub) {
        return (Norm){a->out, a->xf, a->rstd_f, model->params.final_norm, model->grads.final_norm};
    }
    SubLayer* s = &a->sub[l];
    size_t at = layer_index(model, l) * model->dims.d;
    if (l % 2 == 0) {
        return (Norm){s->h, s->xn, s->rstd, model->params.attn_norm + at,
                      model->grads.attn_norm + at};
    }
    return (Norm){s->h, s->xn, s->rstd, model->params.mlp_norm + at, model->grads.mlp_norm + at};
}

// mHC-lite's slices of sub-layer l in t (the model's params or grads)
static MhcParams mhc_params(const Model* model, const ParameterTensors* t, size_t l) {
    const ModelDims* z = &model->dims;
    size_t md = z->streams * z->d;
    l -= (size_t)model->sub_begin;  // its slice in the model's share (0 on the whole model)
    return (MhcParams){t->hc_norm + l * md, t->hc_proj + l * z->E * md, t->hc_bias + l * z->E,
                       t->hc_scale + l * 3};
}

void mhc_forward_rows(const Model* model, Activations* a, size_t N, int l) {
    const Kernels* kernels = model->kernels;
    size_t d = model->dims.d, streams = model->dims.streams;
    SubLayer* s = &a->sub[l];
    if (l == (int)model->dims.n_sub) {
        kernels->rmsnorm_forward(s->hc_z, s->hc_rstd, s->streams, model->params.final_norm,
                                 N * streams, d);
        kernels->mhc_reduce_forward(a->xf, s->hc_z, N, d, streams);
        return;
    }
    kernels->mhc_input_forward(s->h, s->hc_mix, s->hc_e, s->hc_z, s->hc_rstd, s->streams,
                               mhc_params(model, &model->params, (size_t)l), N, d, streams);
}

// Its backward: dstreams (N, m*d) += the gradient of the streams entering l from dxn (the
// head's: from a->dxf); a->dh and the dhc_ buffers are scratch. For l < 2L, a->dhc_mix holds
// the a_post and H gradients that mhc_output_backward wrote.
static void mhc_streams_input_backward(Model* model, int l, const float* dxn, float* dstreams) {
    const Kernels* kernels = model->kernels;
    Activations* a = &model->acts;
    size_t N = model->B * model->T, d = model->dims.d, streams = model->dims.streams;
    const SubLayer* s = &a->sub[l];
    Norm norm = sublayer_norm(model, l);
    if (l == (int)model->dims.n_sub) {
        kernels->zero(a->dhc_z, N * streams * d);
        kernels->mhc_reduce_backward(a->dhc_z, dxn, N, d, streams);
        kernels->rmsnorm_backward(dstreams, norm.dweight, a->dhc_z, s->streams, norm.weight,
                            s->hc_rstd, N * streams, d);
        return;
    }
    kernels->zero(a->dh, N * d);
    kernels->rmsnorm_backward(a->dh, norm.dweight, dxn, norm.h, norm.weight, norm.rstd, N, d);
    MhcParams params = mhc_params(model, &model->params, (size_t)l);
    MhcParams g = mhc_params(model, &model->grads, (size_t)l);
    kernels->mhc_input_backward(dstreams, g, a->dhc_mix, a->dhc_e, a->dhc_z, a->dh, s->streams,
                                s->hc_z, s->hc_rstd, s->hc_e, s->hc_mix, params, N, d, streams);
}

static void input_forward(Model* model, int l) {
    const Kernels* kernels = model->kernels;
    const ModelConfig* c = &model->config;
    Activations* a = &model->acts;
    size_t N = model->B * model->T, d = model->dims.d;
    Norm norm = sublayer_norm(model, l);
    if (model->dims.streams > 0) {  // mhc: h_l = u_l from the streams (the head: xf itself)
        mhc_forward_rows(model, a, N, l);
        if (l < (int)model->dims.n_sub) { kernels->rmsnorm_forward(norm.xn, norm.rstd, norm.h, norm.weight, N, d); }
        return;
    }
    if (model->dims.S == 0) {  // none: h_l is the residual stream
        kernels->rmsnorm_forward(norm.xn, norm.rstd, norm.h, norm.weight, N, d);
        return;
    }
    // AttnRes: h_l = DA_l(sources) by the operator the config picks (depth_variants.c), then
    // xn_l = rmsnorm(h_l)
    const float* src[model->dims.n_sub + 2];
    size_t n = gather_sources(a, c, N, l, src, NULL);
    DepthParams params = model_depth_params(model, &model->params, (size_t)l);
    kernels->attnres_input_forward(norm.xn, norm.rstd, norm.h, a->sub[l].depth, src, params,
                                   norm.weight, n, N, d, depth_switches(model));
}

// The backward of input_forward from dxn, the gradient of xn_l. none: dh holds the residual
// stream's gradient, and h_l's share adds into it. AttnRes: dh is scratch for h_l's gradient
// (overwritten), which the depth attention takes on into the sources' gradients.
static void input_backward(Model* model, int l, const float* dxn, float* dh) {
    const Kernels* kernels = model->kernels;
    const ModelConfig* c = &model->config;
    Activations* a = &model->acts;
    size_t N = model->B * model->T, d = model->dims.d;
    Norm norm = sublayer_norm(model, l);
    if (model->dims.S == 0) {
        kernels->rmsnorm_backward(dh, norm.dweight, dxn, norm.h, norm.weight, norm.rstd, N, d);
        return;
    }
    const float* src[model->dims.n_sub + 2];
    float* dsrc[model->dims.n_sub + 2];
    size_t n = gather_sources(a, c, N, l, src, dsrc);
    DepthParams params = model_depth_params(model, &model->params, (size_t)l);
    DepthParams g = model_depth_params(model, &model->grads, (size_t)l);
    DepthScratch scratch = {dh, a->dtoken_query, a->dlast_xn};
    kernels->attnres_input_backward(dsrc, g, norm.dweight, scratch, dxn, norm.h, norm.rstd,
                                    a->sub[l].depth, src, params, norm.weight, n, N, d,
                                    depth_switches(model));
}

// ---------------------------------------------------------------------------------------
// The whole model.

float model_forward(Model* model, const int* tokens, const int* targets, size_t B, size_t T) {
    return model_forward_counted(model, tokens, targets, crossentropy_count(targets, B * T), B, T);
}

float model_forward_counted(Model* model, const int* tokens, const int* targets, size_t n_targets,
                            size_t B, size_t T) {
    model_forward_losses(model, tokens, targets, n_targets, B, T);
    if (targets == NULL) {
        model->loss = -1.0f;
        return model->loss;
    }
    return model_set_loss(model, model->kernels->sum(model->acts.losses, B * T));
}

float model_set_loss(Model* model, double sum) {
    model->loss = model->n_targets > 0 ? (float)(sum / (double)model->n_targets) : 0.0f;
    return model->loss;
}

void model_forward_losses(Model* model, const int* tokens, const int* targets, size_t n_targets,
                          size_t B, size_t T) {
    model_set_batch(model, tokens, targets, n_targets, B, T);
    model_embedding_forward(model);
    model_sublayers_forward(model, 0, (int)model->dims.n_sub);
    model_head_forward(model);
}

void model_set_batch(Model* model, const int* tokens, const int* targets, size_t n_targets,
                     size_t B, size_t T) {
    if (B > model->max_B || T > model->max_T) {
        fprintf(stderr, "error: batch %zux%zu exceeds the model's buffers %zux%zu\n", B, T,
                model->max_B, model->max_T);
        exit(1);
    }
    model->B = B;
    model->T = T;
    model->tokens = tokens;
    model->targets = targets;
    model->n_targets = n_targets;
}

void model_embedding_forward(Model* model) {
    const Kernels* kernels = model->kernels;
    Activations* a = &model->acts;
    size_t N = model->B * model->T, d = model->dims.d;
    kernels->embedding_forward(a->x0, model->tokens, model->params.wte, N, d);
    if (model->dims.streams > 0) {  // mhc: every stream starts as x0
        kernels->mhc_expand_forward(a->sub[0].streams, a->x0, N, d, model->dims.streams);
    } else if (model->dims.S == 0) {
        kernels->copy(a->sub[0].h, a->x0, N * d);  // none: h_0 = x0
    }
}

void model_sublayers_forward(Model* model, int begin, int end) {
    size_t N = model->B * model->T;
    for (int l = begin; l < end; l++) {
        SubLayer* s = &model->acts.sub[l];
        input_forward(model, l);          // xn_l = rmsnorm(h_l); AttnRes: h_l = DA_l(sources)
        // f_l = f_l(xn_l): even l is an attention, odd l an MLP
        if (l % 2 == 0) { attention_sublayer_forward(model, s, l); }
        else { mlp_sublayer_forward(model, s, l, N); }
        residual_update(model, &model->acts, l, N);  // h_{l+1}, or partial[l]
    }
}

void model_head_forward(Model* model) {
    const Kernels* kernels = model->kernels;
    Activations* a = &model->acts;
    size_t N = model->B * model->T, d = model->dims.d, V = model->dims.V;
    input_forward(model, (int)model->dims.n_sub);  // xf = rmsnorm(out); AttnRes: out =
                                                   // DA_out(blocks); mhc: xf = sum_s rmsnorm(X_s)
    kernels->linear_forward(a->logits, a->xf, model->params.lm_head, N, d, V);
    // targets NULL: probabilities only (for decoding), every row counts as ignored
    kernels->crossentropy_forward(a->losses, a->probs, a->logits, model->targets, N, V);
}

const float* model_logits(const Model* model) { return model->acts.logits; }
const float* model_probs(const Model* model) { return model->acts.probs; }

void model_zero_grad(Model* model) { model->kernels->zero(model->grads_memory, model->num_params); }

void model_backward(Model* model) {
    if (model->targets == NULL) {
        fprintf(stderr, "error: model_backward needs a forward with targets\n");
        exit(1);
    }
    model_zero_carried(model);
    model_head_backward(model);
    const float* dinput = model_sublayers_backward(model, 0, (int)model->dims.n_sub);
    model_embedding_backward(model, dinput);
}

void model_zero_carried(Model* model) {
    Activations* a = &model->acts;
    size_t N = model->B * model->T, d = model->dims.d;
    if (model->dims.streams == 0 && model->dims.S > 0) {
        // db_1 .. db_n: consecutive slices of a->dpartial of this batch's N tokens (point_range's
        // slices are of the largest batch's tokens)
        int S = (int)model->dims.S, blocks = model->sub_end / S;
        for (int n = 1; n <= blocks; n++) {
            a->sub[n * S - 1].dpartial = a->dpartial + (size_t)(n - 1) * N * d;
        }
    }
    model_zero_carried_buffers(model, a->dx0);
}

void model_zero_carried_buffers(Model* model, float* dx0) {
    const Kernels* kernels = model->kernels;
    Activations* a = &model->acts;
    size_t N = model->B * model->T, d = model->dims.d;
    kernels->zero(dx0, N * d);
    if (model->dims.streams > 0) {
        kernels->zero(a->dstreams, N * model->dims.streams * d);
    } else if (model->dims.S > 0) {  // db_1 .. db_n at once
        kernels->zero(a->dpartial, (size_t)(model->sub_end / (int)model->dims.S) * N * d);
    }
}

// head: loss -> logits -> xf -> out, and out's gradient into the buffers that carry it: none,
// the residual stream's (a->dx0); mhc, the streams' (a->dstreams); AttnRes, the blocks' that
// DA_out reads
void model_head_backward(Model* model) {
    const Kernels* kernels = model->kernels;
    Activations* a = &model->acts;
    size_t N = model->B * model->T, d = model->dims.d, V = model->dims.V;
    size_t count = model->n_targets;
    int n_sub = (int)model->dims.n_sub;
    kernels->zero(a->dlogits, N * V);
    kernels->crossentropy_backward(a->dlogits, a->probs, model->targets,
                             count > 0 ? 1.0f / (float)count : 0.0f, N, V);
    kernels->zero(a->dxf, N * d);
    kernels->linear_backward(a->dxf, model->grads.lm_head, a->dlogits, a->xf,
                             model->params.lm_head, N, d, V);
    if (model->dims.streams > 0) {
        mhc_streams_input_backward(model, n_sub, a->dxf, a->dstreams);
    } else if (model->dims.S == 0) {
        input_backward(model, n_sub, a->dxf, a->dx0);  // out = h_{2L}
    } else {
        input_backward(model, n_sub, a->dxf, a->dh);
    }
}

// (sub-layer l is an attention for even l, an MLP for odd l)
const float* model_sublayers_backward(Model* model, int begin, int end) {
    const Kernels* kernels = model->kernels;
    Activations* a = &model->acts;
    size_t N = model->B * model->T, d = model->dims.d;
    int S = (int)model->dims.S;
    if (model->dims.streams > 0) {
        // mhc: dX holds the gradient of the streams after sub-layer l, dX_before that of the
        // streams entering it (both paths into them add there: the mixing and the input's);
        // then the two swap
        size_t nd_streams = N * model->dims.streams * d;
        float *dX = a->dstreams, *dX_before = a->dstreams_before;
        for (int l = end - 1; l >= begin; l--) {
            const SubLayer* s = &a->sub[l];
            kernels->zero(dX_before, nd_streams);
            kernels->zero(a->df, N * d);
            kernels->mhc_output_backward(dX_before, a->df, a->dhc_mix, dX, s->streams, s->f,
                                   s->hc_mix, N, d, model->dims.streams);
            if (l % 2 == 0) { attention_sublayer_backward(model, l, a->df); }
            else { mlp_sublayer_backward(model, l, a->df); }
            mhc_streams_input_backward(model, l, a->dxn, dX_before);
            float* t = dX; dX = dX_before; dX_before = t;
        }
        return dX;
    }
    if (S == 0) {
        // h_{l+1} = h_l + f_l(h_l): the residual stream's gradient flows straight through, and
        // each sub-layer adds its input's share. One buffer holds it: dh_{l+1} = df_l while
        // sub-layer l's backward reads it, dh_l once l's share is added; after sub-layer 0 it
        // is dh_0, the gradient of h_0 = x0, so the buffer is dx0's.
        float* dresidual = a->dx0;
        for (int l = end - 1; l >= begin; l--) {
            if (l % 2 == 0) { attention_sublayer_backward(model, l, dresidual); }
            else { mlp_sublayer_backward(model, l, dresidual); }
            input_backward(model, l, a->dxn, dresidual);
        }
        return dresidual;
    }
    // one gradient buffer a block, db_n (the comment above count_sources explains it)
    for (int l = end - 1; l >= begin; l--) {
        const float* dp = block_gradient(a, &model->config, 1 + l / S);  // d partial[l] = d f_l
        if (l % 2 == 0) { attention_sublayer_backward(model, l, dp); }
        else { mlp_sublayer_backward(model, l, dp); }
        input_backward(model, l, a->dxn, a->dh);
    }
    return NULL;
}

void model_embedding_backward(Model* model, const float* dinput) {
    const Kernels* kernels = model->kernels;
    Activations* a = &model->acts;
    size_t N = model->B * model->T, d = model->dims.d;
    if (model->dims.streams > 0) {  // after sub-layer 0 the streams are all x0
        kernels->mhc_expand_backward(a->dx0, dinput, N, d, model->dims.streams);
    }
    kernels->embedding_backward(model->grads.wte, a->dx0, model->tokens, N, d);
}

float model_grad_norm(const Model* model) {
    return (float)sqrt(sum_of_squares(model->grads_memory, model->num_params));
}

void model_update(Model* model, float lr, float beta1, float beta2, float eps,
                  float weight_decay, int t) {
    model_update_shard(model, 0, model->num_params, model->grads_memory, model->m_memory,
                       model->v_memory, lr, beta1, beta2, eps, weight_decay, t);
}

// The part [*first, *last) of [offset, end) of the flat buffer that lies in the shard [lo, hi);
// 0 when there is none
static int in_shard(size_t offset, size_t end, size_t lo, size_t hi, size_t* first,
                    size_t* last) {
    *first = offset > lo ? offset : lo;
    *last = end < hi ? end : hi;
    return *first < *last;
}

void model_update_shard(Model* model, size_t lo, size_t hi, const float* grads, float* m_shard,
                        float* v_shard, float lr, float beta1, float beta2, float eps,
                        float weight_decay, int t) {
    size_t offset = 0;
    for (int i = 0; i < N_PARAM_TENSORS;) {
        // one call for each run of neighbouring tensors that share their weight decay (7 in
        // all: AdamW goes element by element, so where the buffer is cut changes no bit)
        int decayed = PARAM_INFO[i].decayed;
        size_t end = offset;
        for (; i < N_PARAM_TENSORS && PARAM_INFO[i].decayed == decayed; i++) { end += model->param_sizes[i]; }
        size_t first, last;
        if (in_shard(offset, end, lo, hi, &first, &last)) {
            model->kernels->adamw_update(model->params_memory + first, grads + (first - lo),
                                         m_shard + (first - lo), v_shard + (first - lo),
                                         last - first, lr, beta1, beta2, eps,
                                         decayed ? weight_decay : 0.0f, t);
        }
        offset = end;
    }
}

int muon_matrix_shape(const ModelDims* dims, int tensor, size_t* rows, size_t* cols) {
    size_t shapes[][2] = {{dims->q_dim, dims->d}, {dims->kv_dim, dims->d},
                          {dims->kv_dim, dims->d}, {dims->d, dims->q_dim},
                          {dims->F, dims->d}, {dims->F, dims->d}, {dims->d, dims->F}};
    int tensors[] = {PARAM_wq, PARAM_wk, PARAM_wv, PARAM_wo, PARAM_wg, PARAM_wu, PARAM_wd};
    for (int k = 0; k < 7; k++) {
        if (tensors[k] == tensor) {
            *rows = shapes[k][0];
            *cols = shapes[k][1];
            return 1;
        }
    }
    return 0;
}

void model_update_shard_muon(Model* model, size_t lo, size_t hi, const float* grads, float* m_shard,
                             float* v_shard, float lr, float beta1, float beta2, float eps,
                             float weight_decay, int t, float muon_momentum) {
    size_t offset = 0;
    for (int i = 0; i < N_PARAM_TENSORS; i++) {
        size_t end = offset + model->param_sizes[i], rows, cols, first, last;
        if (muon_matrix_shape(&model->dims, i, &rows, &cols)) {
            size_t size = rows * cols, count = 0;  // the layers inside the shard
            first = end;
            for (size_t start = offset; start < end; start += size) {
                if (start + size <= lo || start >= hi) { continue; }  // another rank's matrix
                if (start < lo || start + size > hi) {
                    fprintf(stderr, "error: the shard [%zu, %zu) cuts Muon's matrix %s at [%zu, "
                            "%zu)\n", lo, hi, PARAM_INFO[i].name, start, start + size);
                    exit(EXIT_FAILURE);
                }
                if (count++ == 0) { first = start; }
            }
            if (count > 0) {
                model->kernels->muon_update(model->params_memory + first, grads + (first - lo),
                                        m_shard + (first - lo), count, rows, cols, lr,
                                        muon_momentum, weight_decay);
            }
        } else if (in_shard(offset, end, lo, hi, &first, &last)) {
            model->kernels->adamw_update(model->params_memory + first, grads + (first - lo),
                                         m_shard + (first - lo), v_shard + (first - lo),
                                         last - first, lr, beta1, beta2, eps,
                                         PARAM_INFO[i].decayed ? weight_decay : 0.0f, t);
        }
        offset = end;
    }
}

void model_muon_shard_bounds(const Model* model, int world, size_t* bounds) {
    size_t n = model->num_params, ranks = (size_t)world, base = n / ranks, extra = n % ranks;
    for (size_t r = 0; r <= ranks; r++) {
        size_t cut = r * base + (r < extra ? r : extra);  // the even split's
        size_t offset = 0, rows, cols;
        for (int i = 0; i < N_PARAM_TENSORS; i++) {
            size_t end = offset + model->param_sizes[i];
            if (cut > offset && cut < end && muon_matrix_shape(&model->dims, i, &rows, &cols)) {
                size_t first = offset + (cut - offset) / (rows * cols) * (rows * cols);
                size_t last = first + rows * cols;
                if (first != cut) { cut = cut - first <= last - cut ? first : last; }
            }
            offset = end;
        }
        bounds[r] = cut;
    }
}

const float* model_depth_alpha(const Model* model, int l, size_t* n_sources, size_t* heads,
                               size_t* tokens) {
    if (model->dims.S == 0 || l < 0 || l > (int)model->dims.n_sub) { return NULL; }
    *n_sources = model->acts.sub[l].n_sources;
    *heads = model->config.mixing ? 1 : model->dims.depth_heads;
    *tokens = model->config.mixing ? 1 : model->B * model->T;
    return model->acts.sub[l].depth.alpha;
}

const float* model_sublayer_input(const Model* model, int l) {
    if (l < 0 || l > (int)model->dims.n_sub) { return NULL; }
    if (l < (int)model->dims.n_sub) { return model->acts.sub[l].h; }
    return model->dims.streams > 0 ? model->acts.sub[l].streams : model->acts.out;
}

size_t model_sublayer_input_width(const Model* model, int l) {
    const ModelDims* z = &model->dims;
    return (l == (int)z->n_sub && z->streams > 0) ? z->streams * z->d : z->d;
}

const float* model_sublayer_output(const Model* model, int l) {
    if (l < 0 || l >= (int)model->dims.n_sub) { return NULL; }
    return model->acts.sub[l].f;
}

// ---------------------------------------------------------------------------------------
// The CPU kernel table: the src/ layers, and host-memory helpers.

static float* host_alloc_zeroed(size_t n) { return callocCheck(n, sizeof(float)); }
static void host_release(void* memory) { free(memory); }
// Zeroing and copying run on every thread in chunks of 64 KB: a step zeroes every gradient
// buffer (the backwards accumulate), and a memset on one thread would keep the other core
// waiting for a visible share of the step (docs/speed.md).
#define HOST_CHUNK ((size_t)16384)
static void host_zero(float* x, size_t n) {
    #pragma omp parallel for if (n > 4 * HOST_CHUNK)
    for (size_t i = 0; i < n; i += HOST_CHUNK) {
        memset(x + i, 0, (n - i < HOST_CHUNK ? n - i : HOST_CHUNK) * sizeof(float));
    }
}
static void host_copy(float* dst, const float* src, size_t n) {
    #pragma omp parallel for if (n > 4 * HOST_CHUNK)
    for (size_t i = 0; i < n; i += HOST_CHUNK) {
        memcpy(dst + i, src + i, (n - i < HOST_CHUNK ? n - i : HOST_CHUNK) * sizeof(float));
    }
}
static void host_add(float* out, const float* a, const float* b, size_t n) {
    #pragma omp parallel for
    for (size_t i = 0; i < n; i++) { out[i] = a[i] + b[i]; }
}
static double host_sum(const float* x, size_t n) {
    double sum = 0.0;
    for (size_t i = 0; i < n; i++) { sum += x[i]; }
    return sum;
}

const Kernels cpu_kernels = {
    .embedding_forward = embedding_forward,
    .embedding_backward = embedding_backward,
    .rmsnorm_forward = rmsnorm_forward,
    .rmsnorm_backward = rmsnorm_backward,
    .linear_forward = linear_forward,
    .linear_backward = linear_backward,
    .rope_forward = rope_forward,
    .rope_backward = rope_backward,
    .attention_forward = attention_forward,
    .attention_backward = attention_backward,
    .swiglu_forward = swiglu_forward,
    .swiglu_backward = swiglu_backward,
    .attnres_input_forward = attnres_input_forward,
    .attnres_input_backward = attnres_input_backward,
    .mhc_expand_forward = mhc_expand_forward,
    .mhc_expand_backward = mhc_expand_backward,
    .mhc_reduce_forward = mhc_reduce_forward,
    .mhc_reduce_backward = mhc_reduce_backward,
    .mhc_input_forward = mhc_input_forward,
    .mhc_input_backward = mhc_input_backward,
    .mhc_output_forward = mhc_output_forward,
    .mhc_output_backward = mhc_output_backward,
    .crossentropy_forward = crossentropy_forward,
    .crossentropy_backward = crossentropy_backward,
    .adamw_update = adamw_update,
    .muon_update = muon_update,
    .alloc_zeroed = host_alloc_zeroed,
    .release = host_release,
    .zero = host_zero,
    .copy = host_copy,
    .add = host_add,
    .sum = host_sum,
};
