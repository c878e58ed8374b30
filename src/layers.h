// layers.h — every layer of attnres.c, forward and backward side by side.
//
// One flat C file per layer in src/ holds the pair. Conventions (as in llm.c):
//   - arguments: outputs first (a forward's include what it saves for the backward, a
//     backward's are the gradients and scratch it writes), then the incoming gradient
//     (dout), then the inputs, weights and saved values, in no fixed order among them
//     (rmsnorm_backward takes rstd last, attention_backward out and lse before q, k and v), then sizes;
//   - where that would be more than a dozen, the arguments that belong together travel as one
//     named struct (the depth attention's parameters, saved values and switches; mHC-lite's
//     parameters), passed by value; switches come after the sizes;
//   - all tensors are float32, row-major; a *row* is always a row of such a matrix: of an
//     activation (N,C) one position (N = B*T rows), of a weight [OUT, IN] one output's
//     weights, of a residual tensor (n_res, d) one depth attention's vector. One of the B
//     entries of a batch (the tokens (B,T)) is a *sequence*, never a row;
//   - a linear map with weight W of shape [OUT, IN] computes y = x W^T (no biases);
//   - backward functions ACCUMULATE (+=) into every gradient they write, so a tensor that
//     feeds several consumers (AttnRes sends each source to many sub-layers, as value and
//     as key) gets the sum of all its gradients; buffers are zeroed once per step;
//   - results do not depend on the OpenMP thread count: a sum over rows (a weight's
//     gradient) is either owned whole by one thread, which adds the rows in order, or summed
//     in fixed tiles of rows whose partial sums are then added in tile order.
#ifndef ATTNRES_LAYERS_H
#define ATTNRES_LAYERS_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

#define RMSNORM_EPS 1e-6f
#define ROPE_BASE 10000.0

// ---- embedding.c -------------------------------------------------------------------------
// out (N,C) = wte[tokens], tokens (N) in [0,V)
void embedding_forward(float* out, const int* tokens, const float* wte, size_t N, size_t C);
// dwte (V,C) += scatter of dout (N,C) by token
void embedding_backward(float* dwte, const float* dout, const int* tokens, size_t N, size_t C);

// ---- rmsnorm.c ---------------------------------------------------------------------------
// out = weight * x * rstd, rstd = 1/sqrt(mean(x^2) + eps) per row; inp, out (N,C), rstd (N)
void rmsnorm_forward(float* out, float* rstd, const float* inp, const float* weight,
                     size_t N, size_t C);
void rmsnorm_backward(float* dinp, float* dweight, const float* dout, const float* inp,
                      const float* weight, const float* rstd, size_t N, size_t C);

// ---- linear.c ----------------------------------------------------------------------------
// out (N,OUT) = inp (N,IN) . weight^T, weight (OUT,IN). Overwrites out.
void linear_forward(float* out, const float* inp, const float* weight,
                    size_t N, size_t IN, size_t OUT);
// dinp (N,IN) += dout . weight; dweight (OUT,IN) += dout^T . inp
void linear_backward(float* dinp, float* dweight, const float* dout, const float* inp,
                     const float* weight, size_t N, size_t IN, size_t OUT);
// The same two functions as three plain loops (no tiles, no threads): the algorithm, and the
// reference the fast ones are tested against; results are bit-identical.
void linear_forward_naive(float* out, const float* inp, const float* weight,
                          size_t N, size_t IN, size_t OUT);
void linear_backward_naive(float* dinp, float* dweight, const float* dout, const float* inp,
                           const float* weight, size_t N, size_t IN, size_t OUT);
// out (N,M) += a (N,K) . b (K,M), b as it is (not transposed): Muon's Newton–Schulz (muon.c)
void matmul_add(float* out, const float* a, const float* b, size_t N, size_t K, size_t M);

// ---- rope.c ------------------------------------------------------------------------------
// Rotary position embedding on (B,T,n_heads*head_size): position t = row index within T;
// pair j = dims (2j,2j+1) of each head turns by theta = t * 10000^(-2j/head_size).
// out may equal inp (in place).
void rope_forward(float* out, const float* inp, size_t B, size_t T, size_t n_heads,
                  size_t head_size);
// The same rotation for decoding: N rows (n_heads*head_size), all at position `position`.
void rope_forward_at(float* out, const float* inp, size_t position, size_t N, size_t n_heads,
                     size_t head_size);
// dinp += R^T dout (the rotation's transpose: turn back by -theta)
void rope_backward(float* dinp, const float* dout, size_t B, size_t T, size_t n_heads,
                   size_t head_size);
// cos and sin of every (t, j), t < T, j < head_size/2, each (T, head_size/2): the angles in
// double, rounded once. Every rotation above uses it, and so does the GPU (cuda/rope.cu).
void rope_table(float* cos_table, float* sin_table, size_t T, size_t head_size);

// ---- attention.c -------------------------------------------------------------------------
// Causal grouped-query attention. q (B,T,H*hs), k and v (B,T,G*hs), out (B,T,H*hs),
// lse (B,H,T) saves each query row's log-sum-exp of its scaled scores, max + log sum e^{s - max}
// (all the backward needs beside out: no (B,H,T,T) probabilities are kept).
// Query head h reads key/value head h / (H/G). Scores q.k / sqrt(hs) over t' <= t.
void attention_forward(float* out, float* lse, const float* q, const float* k, const float* v,
                       size_t B, size_t T, size_t H, size_t G, size_t hs);
// One query as plain loops, the definition: q (hs) over n_keys keys/values whose rows are
// kv_stride floats apart; writes att_row (n_keys), the probabilities, and out (hs).
void attention_query(float* out, float* att_row, const float* q, const float* k, const float* v,
                     size_t n_keys, size_t kv_stride, size_t hs);
// The same query with an online softmax over tiles of keys, the same bits as its row of
// attention_forward; writes out (hs) and *lse. The KV-cache decoder runs it.
void attention_query_online(float* out, float* lse, const float* q, const float* k,
                            const float* v, size_t n_keys, size_t kv_stride, size_t hs);
// dq, dk, dv += the gradients, from dout and the forward's out and lse (B,H,T)
void attention_backward(float* dq, float* dk, float* dv, const float* dout, const float* out,
                        const float* lse, const float* q, const float* k, const float* v,
                        size_t B, size_t T, size_t H, size_t G, size_t hs);

// ---- swiglu.c ----------------------------------------------------------------------------
// The gate of the SwiGLU MLP: out = silu(gate) * up, silu(a) = a * sigmoid(a); all (N,F).
void swiglu_forward(float* out, const float* gate, const float* up, size_t N, size_t F);
void swiglu_backward(float* dgate, float* dup, const float* dout, const float* gate,
                     const float* up, size_t N, size_t F);

// ---- the depth attention's arguments, by what they are ------------------------------------
// The model's call for an AttnRes sub-layer's input (attnres_input_forward below) and the
// fused forms take the depth attention's parameters, what its forward saves and its switches
// as these structs. A field the config does not have is NULL (0 for a switch).
// The parameters of one depth attention: its slices of the residual tensors (model.h,
// model_depth_params). The same struct holds their gradients.
typedef struct {
    float* query;  // (C) the pseudo-query w (res_query)
    float* norm;   // (C) the key norm's gain g (res_norm); NULL with --key-norm off
    float* qproj;  // (C,C) U, the query's input part (res_qproj, --depth-query input)
    float* mix;    // (n_sources) the mixing coefficients (res_logits or res_scalars, --mixing)
} DepthParams;
// What the forward saves for the backward (alpha is also what model_depth_alpha returns).
typedef struct {
    float* alpha;       // (N,n_sources,heads) the weights; a mixing: its n_sources weights
    float* key_rstd;    // (N,n_sources,heads) the key norm's r_i
    float* last_xn;     // (N,C) rmsnorm(V_last), no gain          (--depth-query input)
    float* last_rstd;   // (N) that norm's rstd                    (--depth-query input)
    float* token_query; // (N,C) last_xn U^T, the query's per-token part (--depth-query input)
} DepthSaved;
// SPEC's switches that are not a parameter's presence (those are: norm NULL is --key-norm
// off, qproj not NULL is --depth-query input). heads 1 and the rest 0: the default operator.
typedef struct {
    size_t heads;  // K heads of C/K channels each, their own scores (--depth-heads)
    int sigmoid;   // 1: alpha_i = sigmoid(s_i), no normaliser (--depth-score sigmoid)
    int mixing;    // 0 attention, 1 static softmax(mix), 2 DenseFormer's mix (--mixing)
} DepthSwitches;
// The backward's scratch, overwritten.
typedef struct {
    float* dh;           // (N,C) h's gradient
    float* dtoken_query; // (N,C) token_query's gradient (--depth-query input)
    float* dlast_xn;     // (N,C) last_xn's gradient (--depth-query input)
} DepthScratch;

// ---- depth_attention.c -------------------------------------------------------------------
// The AttnRes operator: softmax attention over n_sources depth sources, per row.
// sources[i] points at a (N,C) tensor V_i; query w (C), the pseudo-query, and norm_weight g
// (C), the key norm's gain:
//   k_i = rmsnorm(V_i; g), s_i = w . k_i, alpha = softmax_i(s), h = sum_i alpha_i V_i.
// Saves alpha (N,n_sources) and key_rstd (N,n_sources) for the backward.
void depth_attention_forward(float* h, float* alpha, float* key_rstd,
                             const float* const* sources, const float* query,
                             const float* norm_weight, size_t n_sources, size_t N, size_t C);
// The key norm's r = (mean(v^2) + eps)^(-1/2) of one source row v (C); the two-phase
// decoder (two_phase.c) scores with it, so both paths compute identical scores.
float depth_attention_rstd(const float* v, size_t C);
// dsources[i] (N,C) += value path + key path; dquery (C) and dnorm_weight (C) +=.
void depth_attention_backward(float* const* dsources, float* dquery, float* dnorm_weight,
                              const float* dh, const float* alpha, const float* key_rstd,
                              const float* const* sources, const float* query,
                              const float* norm_weight, size_t n_sources, size_t N, size_t C);
// The same two functions row by row (no tiles, no threads): the algorithm, and the reference
// the tiled ones are tested against; every result is bit-identical except dquery and
// dnorm_weight, whose sums over the rows go in another order.
void depth_attention_forward_naive(float* h, float* alpha, float* key_rstd,
                                   const float* const* sources, const float* query,
                                   const float* norm_weight, size_t n_sources, size_t N,
                                   size_t C);
void depth_attention_backward_naive(float* const* dsources, float* dquery, float* dnorm_weight,
                                    const float* dh, const float* alpha, const float* key_rstd,
                                    const float* const* sources, const float* query,
                                    const float* norm_weight, size_t n_sources, size_t N,
                                    size_t C);
// The depth attention and the RMSNorm that always reads its output (every AttnRes sub-layer
// norms its input, and the output's depth attention feeds the final norm), as one call:
// h = depth_attention(sources), then xn = rmsnorm(h; weight) with rstd (N) saved; weight
// (C) is that norm's gain (the sub-layer's attn_norm or mlp_norm, or final_norm), NULL for
// none. The query and the key norm's gain are params.query and params.norm; alpha and
// key_rstd are saved in saved.alpha and saved.key_rstd (the other fields unused). Here the
// two functions above, in turn; cuda/ runs both in one kernel, the row still on chip.
void depth_attention_rmsnorm_forward(float* xn, float* rstd, float* h, DepthSaved saved,
                                     const float* const* sources, DepthParams params,
                                     const float* weight, size_t n_sources, size_t N, size_t C);
// Its backward from dxn: dh_scratch (N,C) is overwritten with h's gradient (rmsnorm's
// input gradient; the caller's scratch, not an incoming gradient), dweight (C) +=, then
// depth_attention_backward from dh_scratch (dsources, grads.query and grads.norm +=).
void depth_attention_rmsnorm_backward(float* const* dsources, DepthParams grads, float* dweight,
                                      float* dh_scratch, const float* dxn, const float* h,
                                      const float* rstd, const float* weight, DepthSaved saved,
                                      const float* const* sources, DepthParams params,
                                      size_t n_sources, size_t N, size_t C);

// ---- depth_variants.c --------------------------------------------------------------------
// SPEC's variants of the depth attention. The attention with every switch: `heads` groups of
// C/heads channels (1: one head), each with its own scores; sigmoid (1) or softmax (0)
// weights; norm_weight NULL turns the key norm off (r = 1, no gain); token_query (N,C), when
// not NULL, adds a per-token part to the query w (C): q_n = w + token_query[n].
// alpha and key_rstd are (N, n_sources, heads). heads = 1, softmax, a norm weight and no
// token_query compute what depth_attention_forward does.
void depth_attention_variant_forward(float* h, float* alpha, float* key_rstd,
                                     const float* const* sources, const float* query,
                                     const float* token_query, const float* norm_weight,
                                     size_t n_sources, size_t N, size_t C, size_t heads,
                                     int sigmoid);
// dsources[i] (N,C), dquery (C), dtoken_query (N,C; NULL when token_query is) and dnorm_weight
// (C; NULL when norm_weight is) +=.
void depth_attention_variant_backward(float* const* dsources, float* dquery, float* dtoken_query,
                                      float* dnorm_weight, const float* dh, const float* alpha,
                                      const float* key_rstd, const float* const* sources,
                                      const float* query, const float* token_query,
                                      const float* norm_weight, size_t n_sources, size_t N,
                                      size_t C, size_t heads, int sigmoid);
// The mixings: h (N,C) = sum_i weight_i V_i with one weight per source for every row:
// weights (n_sources) = softmax(coefficients) when normalise (static mixing), else the
// coefficients (DenseFormer). Backward: dsources (N,C) and dcoefficients (n_sources) +=.
void depth_mixing_forward(float* h, float* weights, const float* const* sources,
                          const float* coefficients, size_t n_sources, size_t N, size_t C,
                          int normalise);
void depth_mixing_backward(float* const* dsources, float* dcoefficients, const float* dh,
                           const float* weights, const float* const* sources, size_t n_sources,
                           size_t N, size_t C, int normalise);
// The one call the model makes for an AttnRes sub-layer's input (model.c: input_forward):
// h (N,C) = the depth attention over the sources by the operator the switches pick, then
// xn (N,C) = rmsnorm(h; weight) with rstd (N) saved (xn NULL: h alone, no norm):
//   mixing 1 (static, normalised) or 2 (dense): depth_mixing_forward with params.mix,
//     saved.alpha holding its n_sources weights;
//   heads 1, softmax, a norm weight, no query projection: the default operator and its norm
//     in one call (depth_attention_rmsnorm_forward); without the norm (xn NULL: the
//     decoder's), the variant below with every switch off, which is the default operator bit
//     for bit;
//   else depth_attention_variant_forward; with params.qproj U (C,C) (--depth-query input) the
//     query's per-token part first: saved.last_xn (N,C) = rmsnorm(sources[n-1]) without a gain,
//     saved.last_rstd (N), saved.token_query (N,C) = last_xn U^T.
// A saved buffer the config does not use is NULL (DepthSaved's comments).
void attnres_input_forward(float* xn, float* rstd, float* h, DepthSaved saved,
                           const float* const* sources, DepthParams params, const float* weight,
                           size_t n_sources, size_t N, size_t C, DepthSwitches switches);
// Its backward from dxn: dsources, grads (the fields params has) and dweight +=; scratch's
// buffers are overwritten.
void attnres_input_backward(float* const* dsources, DepthParams grads, float* dweight,
                            DepthScratch scratch, const float* dxn, const float* h,
                            const float* rstd, DepthSaved saved, const float* const* sources,
                            DepthParams params, const float* weight, size_t n_sources, size_t N,
                            size_t C, DepthSwitches switches);

// ---- mhc.c -------------------------------------------------------------------------------
// mHC-lite (SPEC "mHC-lite"): m streams X (N, m*d) per row, stream s of row n at
// X[(n*m + s)*d]; mhc.c's header gives the formulas. R = m! permutations, E = 2m + R
// projected values per row; a row's coefficients (and their gradients) are one vector of
// MHC_MIX_WIDTH(m) floats: [a_pre (m) | pi (R) | a_post (m) | H_res (m*m)], H_res[s][t] at
// s*m + t (H_res: SPEC's H, the mixing matrix).
#define MHC_MAX_STREAMS 4
#define MHC_MAX_PERMUTATIONS 24
#define MHC_MIX_WIDTH(m) (2 * (m) + mhc_permutation_table(NULL, (m)) + (m) * (m))
// perms (R, m): the permutations of (0 .. m-1) in lexicographic order, perms[r*m + i] =
// perm_r[i] (row 0 the identity); returns R = m! (perms NULL: only counts). m <= 4.
size_t mhc_permutation_table(int* perms, size_t m);
// every stream X_s (N, m*d) = x0 (N, d); backward: dx0 += sum_s dX_s
void mhc_expand_forward(float* X, const float* x0, size_t N, size_t d, size_t m);
void mhc_expand_backward(float* dx0, const float* dX, size_t N, size_t d, size_t m);
// out (N, d) = sum_s X_s; backward: dX_s += dout for every s
void mhc_reduce_forward(float* out, const float* X, size_t N, size_t d, size_t m);
void mhc_reduce_backward(float* dX, const float* dout, size_t N, size_t d, size_t m);
// A sub-layer's parameters (its slices of hc_norm, hc_proj, hc_bias and hc_scale, model.h); the
// same struct holds their gradients.
typedef struct {
    float* norm;   // (m*d) the gain c of the streams' norm
    float* proj;   // (E, m*d) Phi
    float* bias;   // (E) beta: pre (m), res (R), post (m)
    float* scale;  // (3) sigma: pre, res, post
} MhcParams;
// A sub-layer's input from the streams: z = rmsnorm(X; params.norm) over m*d, e = z Phi^T,
// the coefficients with the bias and scale, u (N, d) = sum_s a_pre[s] X_s.
// Saves z (N, m*d), rstd (N), e (N, E) and mix (N, MHC_MIX_WIDTH(m)).
void mhc_input_forward(float* u, float* mix, float* e, float* z, float* rstd, const float* X,
                       MhcParams params, size_t N, size_t d, size_t m);
// Its backward from du (N, d), with dmix's a_post and H_res parts from mhc_output_backward:
// dmix's a_pre and pi parts are written; de (N, E) and dz (N, m*d) are scratch (overwritten);
// dX and every gradient in grads +=.
void mhc_input_backward(float* dX, MhcParams grads, float* dmix, float* de, float* dz,
                        const float* du, const float* X, const float* z, const float* rstd,
                        const float* e, const float* mix, MhcParams params, size_t N, size_t d,
                        size_t m);
// The streams after the sub-layer: Xnext_t = sum_s H_res[s][t] X_s + a_post[t] f, f (N, d).
void mhc_output_forward(float* Xnext, const float* X, const float* f, const float* mix,
                        size_t N, size_t d, size_t m);
// Its backward from dXnext: dX and df +=; dmix's a_post and H_res parts are written.
void mhc_output_backward(float* dX, float* df, float* dmix, const float* dXnext, const float* X,
                         const float* f, const float* mix, size_t N, size_t d, size_t m);

// ---- crossentropy.c ----------------------------------------------------------------------
// Softmax + cross-entropy per row. logits, probs (N,V); losses (N); targets (N), -1 = ignored
// (its loss is 0); targets NULL ignores every row (probabilities only).
void crossentropy_forward(float* losses, float* probs, const float* logits,
                          const int* targets, size_t N, size_t V);
// The rows whose target is not -1 (0 for NULL): what a mean loss divides by. Host arrays
// only, also for the CUDA model, which counts its targets before they go to the device.
size_t crossentropy_count(const int* targets, size_t N);
// dlogits += scale * (probs - onehot(target)) on rows whose target is not -1;
// for a mean loss, scale = 1 / (number of counted rows).
void crossentropy_backward(float* dlogits, const float* probs, const int* targets,
                           float scale, size_t N, size_t V);

// ---- adamw.c -----------------------------------------------------------------------------
// One AdamW step (PyTorch semantics) on n parameters; t counts from 1.
void adamw_update(float* params, const float* grads, float* m, float* v, size_t n,
                  float lr, float beta1, float beta2, float eps, float weight_decay, int t);

// ---- muon.c ------------------------------------------------------------------------------
#define NEWTON_SCHULZ_STEPS 5
// X (rows,cols), rows <= cols, orthogonalised in place by five quintic Newton–Schulz steps
// (every singular value into about [0.68, 1.13]); work holds 3 rows^2 + rows*cols floats.
void newton_schulz(float* X, float* work, size_t rows, size_t cols);
// One Muon step (SPEC "Optimisers and schedules") on each of `count` matrices (rows,cols)
// stored one after another in params, with their gradients and momentum buffers: Nesterov
// momentum mu, Newton–Schulz, scale 0.2 sqrt(max(rows,cols)), decoupled weight decay.
void muon_update(float* params, const float* grads, float* momentum, size_t count, size_t rows,
                 size_t cols, float lr, float mu, float weight_decay);

#ifdef __cplusplus
}
#endif
#endif
