// model.h — the attnres.c model: config, parameters in canonical order, activations, and
// the forward/backward orchestration for the three residual modes (see SPEC.md).
#ifndef ATTNRES_MODEL_H
#define ATTNRES_MODEL_H

#include <stddef.h>
#include <stdint.h>

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
} ModelConfig;

// Returns 0 if the config is valid, else -1 with a one-line reason in err.
int model_config_check(const ModelConfig* c, char* err, size_t err_len);

// The parameter tensors in SPEC's canonical order: pointers into one flat buffer.
#define N_PARAM_TENSORS 14
typedef struct {
    float* wte;         // (V, d)
    float* attn_norm;   // (L, d)
    float* wq;          // (L, H*hs, d)
    float* wk;          // (L, G*hs, d)
    float* wv;          // (L, G*hs, d)
    float* wo;          // (L, d, H*hs)
    float* mlp_norm;    // (L, d)
    float* wg;          // (L, F, d)
    float* wu;          // (L, F, d)
    float* wd;          // (L, d, F)
    float* res_query;   // (2L+1, d) pseudo-queries w_l, row 2L = w_out (size 0 in none)
    float* res_norm;    // (2L+1, d) key-norm gains g_l, row 2L = g_out (size 0 in none)
    float* final_norm;  // (d)
    float* lm_head;     // (V, d)
} ParameterTensors;

extern const char* const PARAM_NAMES[N_PARAM_TENSORS];
// Fills sizes (elements per tensor, canonical order); returns the total.
size_t param_sizes(const ModelConfig* c, size_t sizes[N_PARAM_TENSORS]);
// Weight decay applies to the matrices only, never to gains or pseudo-queries.
int param_is_matrix(int tensor_index);
// Points the 14 tensors of t into a flat buffer of param_sizes(), in canonical order.
void point_tensors(ParameterTensors* t, float* memory, const size_t* sizes);
// Number of depth-attention sources of sub-layer l (l = 2L: the output aggregation); S >= 1.
size_t count_sources(const ModelConfig* c, int l);

typedef struct Activations Activations;

typedef struct {
    ModelConfig config;
    size_t param_sizes[N_PARAM_TENSORS];
    size_t num_params;
    float* params_memory;  ParameterTensors params;   // flat buffers, canonical order
    float* grads_memory;   ParameterTensors grads;
    float* m_memory;       // AdamW first moment
    float* v_memory;       // AdamW second moment
    Activations* acts;     // sized for (max_B, max_T)
    size_t max_B, max_T;
    size_t B, T;           // shape of the last forward
    const int* tokens;     // inputs of the last forward
    const int* targets;    // of the last forward (NULL: no loss)
    float loss;            // mean loss of the last forward, -1 without targets
    float* sublayer_rms;   // NULL (default) or (2L): model_forward writes the RMS of each
                           // sub-layer's output f_l here (diagnostics.h)
} Model;

// Allocates every buffer (params zeroed); the caller then inits or loads params.
void model_build(Model* m, const ModelConfig* c, size_t max_B, size_t max_T);
void model_free(Model* m);
// SPEC init: matrices N(0, 0.02) (wo, wd: 0.02/sqrt(2L)), gains 1, pseudo-queries 0.
void model_init_params(Model* m, uint64_t seed);

// Forward on tokens (B,T) with B <= max_B, T <= max_T. targets (B,T) may be NULL; else the
// mean cross-entropy over targets != -1 is returned (and kept in m->loss).
float model_forward(Model* m, const int* tokens, const int* targets, size_t B, size_t T);
// (B,T,V) logits and probabilities of the last forward.
const float* model_logits(const Model* m);
const float* model_probs(const Model* m);
void model_zero_grad(Model* m);
// Backward of the last forward's mean loss; accumulates into m->grads.
void model_backward(Model* m);
// Global L2 norm of all gradients.
float model_grad_norm(const Model* m);
// One AdamW step on every tensor; t counts from 1.
void model_update(Model* m, float lr, float beta1, float beta2, float eps,
                  float weight_decay, int t);

// Depth-attention diagnostics: alpha (B*T, n_sources) of sub-layer l (l = 2L: the output
// aggregation) from the last forward, and its number of sources. NULL in none mode.
const float* model_depth_alpha(const Model* m, int l, size_t* n_sources);
// The hidden state (B*T, d) fed to sub-layer l in the last forward; l = 2L: the final
// hidden state `out` (before the final rmsnorm).
const float* model_sublayer_input(const Model* m, int l);

#ifdef __cplusplus
}
#endif
#endif
