// model.h — the attnres.c model: config, its sizes, the parameter table in canonical order,
// the activations' size table, and the forward/backward orchestration for the three residual
// modes (see SPEC.md). The orchestration (model.c) runs on the CPU (model_build) or on the GPU
// (cuda/model.cu builds the same Model with device buffers and the CUDA kernels).
#ifndef ATTNRES_MODEL_H
#define ATTNRES_MODEL_H

#include <stddef.h>
#include <stdint.h>
#include "kernels.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    int vocab_size;   // V
    int d_model;      // d
    int n_layers;     // L transformer layers = 2L sub-layers (attention, MLP)
    int n_heads;      // H query heads
    int n_kv_heads;   // G key/value heads, H % G == 0
    int ffn_hidden;   // F SwiGLU hidden width
    int block_size;   // S: 0 = none (PreNorm), 1 = full AttnRes, >= 2 block AttnRes
    // SPEC's variants of the depth attention ("Variants"); 0 everywhere is the default model.
    // The values are those of the state file's header slots [13] .. [18].
    int depth_score;   // 0 softmax, 1 sigmoid (--depth-score)
    int key_norm_off;  // 1: keys are the raw sources, no res_norm (--key-norm off)
    int depth_query;   // 0 pseudo-query w, 1 input-dependent w + U rmsnorm(V_last) (--depth-query)
    int depth_heads;   // K heads over d/K channels each; 0 or 1: one head (--depth-heads)
    int depth_window;  // full only: x0 and the W most recent outputs; 0: all (--depth-window)
    int mixing;        // 0 attention, 1 static softmax(res_logits), 2 DenseFormer res_scalars (--mixing)
    int streams;       // mHC-lite's m streams, 2 .. 4 (--mode mhc --streams m); 0: not mhc.
                       // Mode mhc is block_size == 0 with streams >= 2 (state-file slot [19])
} ModelConfig;

// Returns 0 if the config is valid, else -1 with a one-line reason in err.
int model_config_check(const ModelConfig* c, char* err, size_t err_len);
// The variant switches alone (part of model_config_check): values, modes, combinations.
int variant_check(const ModelConfig* c, char* err, size_t err_len);
// 1 when the depth attention is a variant of depth_variants.c (sigmoid, no key norm,
// input-dependent query, K >= 2 heads), 0 for the default operator or a mixing.
int depth_variant(const ModelConfig* c);
// The variant's switches as flags ("--depth-score sigmoid --depth-heads 4"), or "no variant"
void variant_describe(const ModelConfig* c, char* out, size_t len);

// Every size derived from a config, computed once (SPEC's letters; hs = d/H).
typedef struct {
    size_t V, d, L, H, G, hs, F;
    size_t q_dim;     // H*hs: width of the queries and of the heads' concatenation
    size_t kv_dim;    // G*hs: width of the keys and of the values
    size_t n_sub;     // 2L sub-layers; depth attention l = 2L is the output aggregation
    size_t S;         // block size: 0 none, 1 full, >= 2 block
    size_t n_blocks;  // 2L/S completed blocks at the end (0 in none mode)
    size_t n_res;     // depth attentions: 2L+1 in AttnRes, 0 in none
    size_t depth_heads;  // depth-attention heads (1 without --depth-heads)
    // slices (0 or n_res, one per depth attention) of each residual tensor, as the variant
    // has them
    size_t n_query_slices, n_norm_slices, n_qproj_slices, n_logit_slices, n_scalar_slices;
    // mHC-lite: streams m (0 in the other modes), R = m! permutations, E = 2m + R projected
    // values a row, n_mix = MHC_MIX_WIDTH(m) coefficients a row (layers.h), n_hc_slices = 2L
    // slices of each hc_ tensor (0 in the other modes)
    size_t streams, R, E, n_mix, n_hc_slices;
} ModelDims;
ModelDims model_dims(const ModelConfig* c);

// ---- parameters ------------------------------------------------------------------------
// The parameter tensors in SPEC's canonical order, one line each: name, size in floats (the
// product of its shape, in ModelDims `dims`), init, whether AdamW decays it (SPEC: the
// matrices, never gains or pseudo-queries), and how a pipeline splits it between its chunks
// (ParamSplit). Adding a tensor is adding a line.
typedef enum {
    INIT_NORMAL, INIT_NORMAL_OUT, INIT_ONE, INIT_ZERO, INIT_HC_BIAS, INIT_HC_SCALE
} ParamInit;
//  INIT_NORMAL: N(0, 0.02); INIT_NORMAL_OUT: N(0, 0.02/sqrt(2L)) (the projections that
//  write into the residual stream); INIT_ONE: gains; INIT_ZERO: pseudo-queries;
//  INIT_HC_BIAS: mHC-lite's biases (model_init_params: sub-layer l reads and writes mostly
//  stream l mod m, H starts near the identity); INIT_HC_SCALE: 0.01. Only the two normal
//  inits draw from the random stream.
typedef enum { SPLIT_FIRST, SPLIT_LAYER, SPLIT_SUB, SPLIT_DEPTH, SPLIT_LAST } ParamSplit;
//  A chunk of sub-layers [begin, end) (a pipeline stage's, src/pipeline.c; the whole model is
//  [0, 2L)) holds: SPLIT_FIRST the whole tensor if it holds sub-layer 0 (the embedding),
//  SPLIT_LAST if it holds the head (end = 2L); SPLIT_LAYER slices begin/2 .. end/2 of the L
//  layers'; SPLIT_SUB slices begin .. end of 2L; SPLIT_DEPTH slices begin .. end of the 2L+1 depth
//  attentions', with slice 2L (the output aggregation) on the head's chunk.
#define PARAMETER_TENSORS(X)                                                    \
    /* name        size (floats)                             init            decay split */ \
    X(wte,         dims.V * dims.d,                          INIT_NORMAL,    1, SPLIT_FIRST) \
    X(attn_norm,   dims.L * dims.d,                          INIT_ONE,       0, SPLIT_LAYER) \
    X(wq,          dims.L * dims.q_dim * dims.d,             INIT_NORMAL,    1, SPLIT_LAYER) \
    X(wk,          dims.L * dims.kv_dim * dims.d,            INIT_NORMAL,    1, SPLIT_LAYER) \
    X(wv,          dims.L * dims.kv_dim * dims.d,            INIT_NORMAL,    1, SPLIT_LAYER) \
    X(wo,          dims.L * dims.d * dims.q_dim,             INIT_NORMAL_OUT, 1, SPLIT_LAYER) \
    X(mlp_norm,    dims.L * dims.d,                          INIT_ONE,       0, SPLIT_LAYER) \
    X(wg,          dims.L * dims.F * dims.d,                 INIT_NORMAL,    1, SPLIT_LAYER) \
    X(wu,          dims.L * dims.F * dims.d,                 INIT_NORMAL,    1, SPLIT_LAYER) \
    X(wd,          dims.L * dims.d * dims.F,                 INIT_NORMAL_OUT, 1, SPLIT_LAYER) \
    X(hc_norm,     dims.n_hc_slices * dims.streams * dims.d, INIT_ONE,       0, SPLIT_SUB  ) \
    X(hc_proj,     dims.n_hc_slices * dims.E * dims.streams * dims.d, INIT_ZERO, 0, SPLIT_SUB ) \
    X(hc_bias,     dims.n_hc_slices * dims.E,                INIT_HC_BIAS,   0, SPLIT_SUB  ) \
    X(hc_scale,    dims.n_hc_slices * 3,                     INIT_HC_SCALE,  0, SPLIT_SUB  ) \
    X(res_logits,  dims.n_logit_slices * dims.n_res,         INIT_ZERO,      0, SPLIT_DEPTH) \
    X(res_scalars, dims.n_scalar_slices * dims.n_res,        INIT_ONE,       0, SPLIT_DEPTH) \
    X(res_query,   dims.n_query_slices * dims.d,             INIT_ZERO,      0, SPLIT_DEPTH) \
    X(res_norm,    dims.n_norm_slices * dims.d,              INIT_ONE,       0, SPLIT_DEPTH) \
    X(res_qproj,   dims.n_qproj_slices * dims.d * dims.d,    INIT_ZERO,      0, SPLIT_DEPTH) \
    X(final_norm,  dims.d,                                   INIT_ONE,       0, SPLIT_LAST ) \
    X(lm_head,     dims.V * dims.d,                          INIT_NORMAL,    1, SPLIT_LAST )

// PARAM_wte, PARAM_attn_norm, ...: a tensor's index in the canonical order
#define PARAM_ENUM_ENTRY(name, size, init, decay, split) PARAM_##name,
typedef enum { PARAMETER_TENSORS(PARAM_ENUM_ENTRY) N_PARAM_TENSORS } ParamIndex;
#undef PARAM_ENUM_ENTRY

// Pointers into one flat buffer, in canonical order:
//   wte (V,d), attn_norm (L,d), wq (L,H*hs,d), wk and wv (L,G*hs,d), wo (L,d,H*hs),
//   mlp_norm (L,d), wg and wu (L,F,d), wd (L,d,F), res_query and res_norm (2L+1,d) with row
//   2L for the output aggregation (absent in none), final_norm (d), lm_head (V,d).
//   The variants (SPEC "Variants"): res_logits or res_scalars (2L+1,2L+1) replace res_query
//   and res_norm with --mixing; --key-norm off drops res_norm; --depth-query input adds
//   res_qproj (2L+1,d,d). mHC-lite (--mode mhc) has hc_norm (2L, m*d) (the gains c_l),
//   hc_proj (2L, E, m*d) (Phi_l), hc_bias (2L, E) (beta_l: pre, res, post) and hc_scale
//   (2L, 3) (sigma_l) after wd instead of any res_ tensor. An absent tensor has size 0.
#define PARAM_FIELD(name, size, init, decay, split) float* name;
typedef struct { PARAMETER_TENSORS(PARAM_FIELD) } ParameterTensors;
#undef PARAM_FIELD

typedef struct {
    const char* name;
    ParamInit init;
    int decayed;
    ParamSplit split;
} ParamInfo;
extern const ParamInfo PARAM_INFO[N_PARAM_TENSORS];

// Fills sizes (elements per tensor, canonical order); returns the total.
size_t param_sizes(const ModelConfig* c, size_t sizes[N_PARAM_TENSORS]);
// Points the tensors of t into a flat buffer of param_sizes(), in canonical order.
void point_tensors(ParameterTensors* t, float* memory, const size_t* sizes);
// The share of each tensor that the chunk of sub-layers [begin, end) holds (ParamSplit):
// sizes[i] floats from offsets[i] of the whole model's flat buffer; returns their total.
// Over [0, 2L) it is param_sizes, each offset the tensor's start.
size_t param_share(const ModelConfig* c, int begin, int end, size_t offsets[N_PARAM_TENSORS],
                   size_t sizes[N_PARAM_TENSORS]);

// ---- the residual bookkeeping (one copy, for the model and the decoder) ----------------
// Number of depth-attention sources of sub-layer l (l = 2L: the output aggregation); S >= 1.
size_t count_sources(const ModelConfig* c, int l);

// ---- activations -----------------------------------------------------------------------
// What the backward needs from the forward, per sub-layer, plus scratch. N = B*T rows.
typedef struct {
    float* h;         // (N,d) sub-layer input (residual stream, or depth-attention output)
    float* xn;        // (N,d) rmsnorm(h)
    float* rstd;      // (N)
    float* f;         // (N,d) the sub-layer's output f_l(h)
    float* q;         // (N,H*hs) after RoPE              [attention]
    float* k;         // (N,G*hs) after RoPE              [attention]
    float* v;         // (N,G*hs)                         [attention]
    float* lse;       // (B,H,T) log-sum-exp of the scores [attention]
    float* y;         // (N,H*hs) heads concatenated      [attention]
    float* gate;      // (N,F) xn Wg^T                     [MLP]
    float* up;        // (N,F) xn Wu^T                     [MLP]
    float* act;       // (N,F) silu(gate) * up             [MLP]
    float* partial;   // (N,d) partial block sum after l (f's buffer when l starts a block) [AttnRes]
    float* dpartial;  // (N,d) when l ends block n: db_n, the gradient of b_n = partial[l] (a
                      // slice of Activations' dpartial; model.c: block_gradient)  [AttnRes]
    DepthSaved depth; // what the depth attention saves (layers.h): alpha and key_rstd
                      // (N,n_sources,K), with --depth-query input last_xn, last_rstd and
                      // token_query                                        [AttnRes]
    // mHC-lite: h is u = sum_s a_pre[s] X_s. Slot 2L holds the streams after the last
    // sub-layer, hc_z = rmsnorm(X_s; final_norm) stream by stream and hc_rstd (N*m)
    float* streams;   // (N,m*d) the streams X_l entering sub-layer l       [mhc]
    float* hc_z;      // (N,m*d) rmsnorm(X_l; c_l)                          [mhc]
    float* hc_rstd;   // (N)                                                [mhc]
    float* hc_e;      // (N,E) z Phi_l^T                                    [mhc]
    float* hc_mix;    // (N,n_mix) a_pre, pi, a_post, H_res (layers.h)          [mhc]
    size_t n_sources;
} SubLayer;

typedef struct {
    SubLayer* sub;    // host array: 2L sub-layers, then slot 2L: the output aggregation
    float* x0;        // (N,d) embeddings
    float* out;       // (N,d) final hidden state
    float* xf;        // (N,d) rmsnorm(out; final_norm)
    float* rstd_f;    // (N)
    float* logits;    // (N,V)
    float* probs;     // (N,V)
    float* losses;    // (N)
    // backward scratch (absent when built without it)
    float *dlogits, *dxf, *dh, *dxn, *dx0;
    float* df;        // (N,d) a sub-layer's output gradient, from the streams'      [mhc]
    float *dq, *dk, *dv, *dq_pre, *dk_pre, *dy, *dgate, *dup, *dact;
    float* dpartial;  // (2L/S, N, d) db_1 .. db_{2L/S}: the partial sums' gradients, one a
                      // block (model.c: block_gradient)                                  [AttnRes]
    float *dtoken_query, *dlast_xn;  // (N,d) each       [--depth-query input]
    // mhc: the streams' gradients (two buffers, the streams after and before a sub-layer),
    // dhc_z (N,m*d), dhc_e (N,E) and dhc_mix (N,n_mix) scratch
    float *dstreams, *dstreams_before, *dhc_z, *dhc_e, *dhc_mix;
} Activations;

// The size table: points every buffer of a (NULL: only counts) into one block of memory
// sized for B x T and returns the floats it takes. Each buffer starts a multiple of 64 bytes
// into the block (64-byte aligned where the block is: cudaMalloc's). a->sub must
// hold 2L+1 entries. backward = 0 leaves the backward scratch out (decoding).
size_t point_activations(Activations* a, const ModelConfig* c, size_t B, size_t T,
                         int backward, float* memory);
// The same for a pipeline's chunk of sub-layers [begin, end): the buffers its sub-layers
// use, with the embedding's if begin = 0 and the head's if end = 2L, and the boundary's:
// none, h_end (the stream it passes on); mhc, the streams entering `end`; AttnRes, b_0 = x0
// and the blocks before `begin` (a->sub[n*S-1].partial, n*S <= begin) with their gradients.
size_t point_chunk_activations(Activations* a, const ModelConfig* c, size_t B, size_t T,
                               int begin, int end, float* memory);

// ---- the model -------------------------------------------------------------------------
typedef struct {
    ModelConfig config;
    ModelDims dims;
    const Kernels* kernels;  // cpu_kernels, or the CUDA table (every buffer then on the GPU)
    // The sub-layers [sub_begin, sub_end) this Model holds: [0, 2L), the whole model, except
    // for a pipeline's chunk (model_build_chunk), which holds its share of each tensor alone
    // (param_share: param_sizes and param_offsets, where each share sits in the whole model's
    // flat buffer), the embedding when sub_begin = 0 and the head when sub_end = 2L
    int sub_begin, sub_end;
    size_t param_sizes[N_PARAM_TENSORS];
    size_t param_offsets[N_PARAM_TENSORS];
    size_t num_params;
    float* params_memory;  ParameterTensors params;   // flat buffers, canonical order
    float* grads_memory;   ParameterTensors grads;
    float* m_memory;       // AdamW first moment
    float* v_memory;       // AdamW second moment
    Activations acts;      // sized for (max_B, max_T)
    float* acts_memory;    // the one block acts points into
    size_t max_B, max_T;
    size_t B, T;           // shape of the last forward
    const int* tokens;     // inputs of the last forward
    const int* targets;    // its targets (NULL: none, no loss)
    size_t n_targets;      // targets != -1 in the last forward
    float loss;            // mean loss of the last forward, -1 without targets
} Model;

// Allocates every buffer (params zeroed) with the CPU kernels; the caller then inits or loads
// params. model_build_on does it for any kernel table (cuda/model.cu: on the GPU).
void model_build(Model* model, const ModelConfig* c, size_t max_B, size_t max_T);
void model_build_on(Model* model, const ModelConfig* c, size_t max_B, size_t max_T,
                    const Kernels* K);
// A pipeline's chunk on the CPU: the sub-layers [begin, end) (even, whole blocks), their
// parameters, gradients and AdamW moments alone (param_share), and no activations: the
// pipeline points model->acts at one microbatch's buffers (point_chunk_activations) at a time.
void model_build_chunk(Model* model, const ModelConfig* c, int begin, int end);
void model_free(Model* model);
// SPEC init (PARAMETER_TENSORS' init column) from one random stream, in canonical order.
void model_init_params(Model* model, uint64_t seed);

// Forward on tokens (B,T) with B <= max_B, T <= max_T. targets (B,T) may be NULL; else the
// mean cross-entropy over targets != -1 is returned (and kept in m->loss). Host arrays, for
// the CPU model.
float model_forward(Model* model, const int* tokens, const int* targets, size_t B, size_t T);
// The same with the inputs already in the model's memory (device memory for the CUDA model)
// and n_targets, the number of targets != -1, counted by the caller (crossentropy_count on
// the host copy), so that nothing is read back from the device for it.
float model_forward_counted(Model* model, const int* tokens, const int* targets, size_t n_targets,
                            size_t B, size_t T);
// model_forward_counted in two halves, for a caller that reads the positions' losses back
// later, together with other numbers (./train_cuda's step: with the gradient's norm, once):
// model_forward_losses leaves every position's loss in m->acts.losses (nothing is read back),
// and model_set_loss(m, sum) sets and returns m->loss from their sum (in double, in position
// order).
void model_forward_losses(Model* model, const int* tokens, const int* targets, size_t n_targets,
                          size_t B, size_t T);
float model_set_loss(Model* model, double sum);
// model_forward_losses in its parts, which a pipeline's chunk (src/pipeline.c) calls for its
// range alone, in this order: model_set_batch (checks and keeps the batch), the embedding
// (x0, and h_0 or the streams), the sub-layers [begin, end), the head (the output's input,
// logits, positions' losses).
void model_set_batch(Model* model, const int* tokens, const int* targets, size_t n_targets,
                     size_t B, size_t T);
void model_embedding_forward(Model* model);
void model_sublayers_forward(Model* model, int begin, int end);
void model_head_forward(Model* model);
// (B,T,V) logits and probabilities of the last forward.
const float* model_logits(const Model* model);
const float* model_probs(const Model* model);
void model_zero_grad(Model* model);
// Backward of the last forward's mean loss; accumulates into m->grads.
void model_backward(Model* model);
// model_backward in its parts. The gradients that travel from sub-layer to sub-layer (the
// carried ones: none, the residual stream's in a->dx0; mhc, the streams' in a->dstreams;
// AttnRes, x0's and each block's, a->dx0 and the blocks' dpartial) add up in buffers that
// model_zero_carried zeroes first (the blocks': this batch's N tokens' share of a->dpartial, one
// call); the head's backward adds the output's share;
// model_sublayers_backward runs l = end-1 .. begin and returns the buffer that then holds the
// gradient of the range's input (none: h_begin's, in a->dx0; mhc: the streams entering
// begin; AttnRes: NULL, the blocks' gradients are in their buffers); the embedding's backward
// takes that (from sub-layer 0) into wte's gradient.
void model_zero_carried(Model* model);
// model_zero_carried's zeroing alone, the blocks' gradients left where they point: a pipeline's
// chunk (src/pipeline.c), whose slot holds its microbatch's sequences and whose cached blocks'
// gradients point into another chunk's slot, zeroes its own buffers; dx0 is the one that holds
// x0's gradient there (AttnRes: the slot's own, where a->dx0 may point elsewhere)
void model_zero_carried_buffers(Model* model, float* dx0);
void model_head_backward(Model* model);
const float* model_sublayers_backward(Model* model, int begin, int end);
void model_embedding_backward(Model* model, const float* dinput);
// Global L2 norm of all gradients (CPU model).
float model_grad_norm(const Model* model);
// One AdamW step on every tensor; t counts from 1.
void model_update(Model* model, float lr, float beta1, float beta2, float eps,
                  float weight_decay, int t);
// AdamW on the shard [lo, hi) of the flat parameter buffer alone (ZeRO-1, distributed.h):
// grads, m_shard and v_shard hold hi - lo floats (the shard's summed gradients and its
// moments); each tensor's part of the shard gets that tensor's weight decay. Over [0, n) with
// the model's own buffers it is model_update.
void model_update_shard(Model* model, size_t lo, size_t hi, const float* grads, float* m_shard,
                        float* v_shard, float lr, float beta1, float beta2, float eps,
                        float weight_decay, int t);
// Muon (SPEC "Optimisers and schedules") on the shard [lo, hi): every per-layer matrix of
// wq, wk, wv, wo, wg, wu, wd (muon_matrix_shape) by muon_update with momentum muon_momentum,
// its momentum buffer m_shard at the matrix's place (v_shard stays untouched there); every
// other tensor by AdamW as model_update_shard does. Each Muon matrix must lie wholly inside
// or outside the shard (model_muon_shard_bounds); one cut is an error that exits.
void model_update_shard_muon(Model* model, size_t lo, size_t hi, const float* grads, float* m_shard,
                             float* v_shard, float lr, float beta1, float beta2, float eps,
                             float weight_decay, int t, float muon_momentum);
// 1 when parameter tensor `tensor` (ParamIndex) is one Muon updates, with the shape
// (rows, cols) of one layer's slice; else 0.
int muon_matrix_shape(const ModelDims* dims, int tensor, size_t* rows, size_t* cols);
// The shards of `world` ranks for Muon: rank r owns [bounds[r], bounds[r+1]) (world + 1
// entries), the even split of dist_shard with each cut that falls inside a Muon matrix moved
// to that matrix's nearer end, so that every matrix is orthogonalised whole by one rank.
void model_muon_shard_bounds(const Model* model, int world, size_t* bounds);

// What the last forward left, for diagnostics (CPU model): the depth-attention weights of
// sub-layer l (l = 2L: the output aggregation; NULL in none mode), (tokens, n_sources, heads)
// with entry (n, i, k) at (n * n_sources + i) * heads + k: position n, source i in
// gather_sources' order (with a window: x0, then the W most recent outputs), head k. tokens is
// B*T, or 1 with --mixing (one weight per source, the same at every position); heads is K
// (1 with --mixing). Sigmoid and DenseFormer weights are not normalised.
// The input h_l (B*T, d) fed to sub-layer l (l = 2L: the final hidden state `out`, before
// the final rmsnorm; in mhc mode the m streams after the last sub-layer, (B*T, m*d), which
// the head normalises one by one); model_sublayer_input_width: its floats a token (d, or m*d
// at l = 2L in mhc). The output f_l (B*T, d) of sub-layer l < 2L.
const float* model_depth_alpha(const Model* model, int l, size_t* n_sources, size_t* heads,
                               size_t* tokens);
const float* model_sublayer_input(const Model* model, int l);
size_t model_sublayer_input_width(const Model* model, int l);
const float* model_sublayer_output(const Model* model, int l);

// ---- the pieces the cached decoder (inference.c) shares with the forward ----------------
// The sources of sub-layer l (l = 2L: output aggregation) in a, N rows, into src, and, when
// dsrc is not NULL, the gradient buffers they add into; returns their number (count_sources).
// model.c explains block mode there, with a worked table for L = 2, S = 2.
size_t gather_sources(const Activations* a, const ModelConfig* c, size_t N, int l,
                      const float** src, float** dsrc);
// After sub-layer l has written s->f: none mode: h_{l+1} = h_l + f_l (out after the last);
// AttnRes: partial[l] = f_l if l starts its block, else partial[l-1] + f_l.
void residual_update(const Model* model, Activations* a, int l, size_t N);
// s->f = MLP(s->xn) of sub-layer l (odd), s->xn = rmsnorm(s->h) already there; N rows.
void mlp_sublayer_forward(const Model* model, SubLayer* s, int l, size_t N);
// The residual tensors' rows of depth attention l in t (the model's params or grads): the
// query w_l, the key norm's gain g_l, U_l, the mixing coefficients (layers.h's DepthParams);
// NULL where the variant has no such tensor.
DepthParams model_depth_params(const Model* model, const ParameterTensors* t, size_t l);
// out (N,d) = the depth attention of sub-layer l (l = 2L: output aggregation) over its sources
// in a, N rows, by the sequential definition: attnres_input_forward (depth_variants.c)
// without the norm, for the operator the config picks; saves what it needs in a->sub[l].
void depth_forward_rows(const Model* model, Activations* a, size_t N, int l, float* out);
// mHC-lite (mhc.c) on the streams in a, N rows: for l < 2L, the input u_l of sub-layer l into
// a->sub[l].h (before its own norm) from a->sub[l].streams, saving the coefficients there;
// for l = 2L, the head's input a->xf = sum_s rmsnorm(X_s; final_norm).
void mhc_forward_rows(const Model* model, Activations* a, size_t N, int l);

#ifdef __cplusplus
}
#endif
#endif
