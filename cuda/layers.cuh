// layers.cuh — every layer of attnres.c on the GPU, the mirror of src/layers.h.
//
// cuda/X.cu mirrors src/X.c: function F there is F_cuda here, with the same arguments in the
// same order, all tensors device pointers, sizes size_t. The contract is layers.h's:
// outputs first, row-major float32, N = B*T rows, y = x W^T, and every backward ACCUMULATES
// (+=) into the gradients it writes. Kernels run on cuda_stream (common.cuh), asynchronously,
// except where a comment says the call synchronises.
//
// Determinism: every output element, weight gradients included, has one owning thread that
// sums in a fixed order, so results repeat bit for bit from run to run (no float atomics).
#ifndef ATTNRES_LAYERS_CUH
#define ATTNRES_LAYERS_CUH

#include <stddef.h>

#include "layers.h"  // RMSNORM_EPS, ROPE_BASE

// ---- embedding.cu ------------------------------------------------------------------------
void embedding_forward_cuda(float* out, const int* tokens, const float* wte, size_t N, size_t C);
void embedding_backward_cuda(float* dwte, const float* dout, const int* tokens, size_t N, size_t C);

// ---- rmsnorm.cu --------------------------------------------------------------------------
void rmsnorm_forward_cuda(float* out, float* rstd, const float* inp, const float* weight,
                          size_t N, size_t C);
void rmsnorm_backward_cuda(float* dinp, float* dweight, const float* dout, const float* inp,
                           const float* weight, const float* rstd, size_t N, size_t C);

// ---- linear.cu ---------------------------------------------------------------------------
void linear_forward_cuda(float* out, const float* inp, const float* weight,
                         size_t N, size_t IN, size_t OUT);
void linear_backward_cuda(float* dinp, float* dweight, const float* dout, const float* inp,
                          const float* weight, size_t N, size_t IN, size_t OUT);
// out (N,M) += a (N,K) . b (K,M), b as it is (Newton–Schulz, muon.cu)
void matmul_add_cuda(float* out, const float* a, const float* b, size_t N, size_t K, size_t M);
// on = 1: every product above runs through cuBLAS SGEMM (float32) instead of our kernel, the
// reference to compare against (./train_cuda --cublas). Exits in builds without cuBLAS.
void linear_use_cublas_cuda(int on);
// The most floats of the workspace (common.cuh) one linear call borrows (split-K partials),
// for any shape; matmul_workspace_floats_cuda: what one product C (M,J) = A (M,K) . B (K,J)
// borrows.
size_t linear_workspace_floats_cuda(void);
size_t matmul_workspace_floats_cuda(size_t M, size_t J, size_t K);

// ---- rope.cu -----------------------------------------------------------------------------
void rope_forward_cuda(float* out, const float* inp, size_t B, size_t T, size_t n_heads,
                       size_t head_size);
void rope_forward_at_cuda(float* out, const float* inp, size_t position, size_t N, size_t n_heads,
                          size_t head_size);
void rope_backward_cuda(float* dinp, const float* dout, size_t B, size_t T, size_t n_heads,
                        size_t head_size);
// Builds the GPU's cos/sin table for positions < n_positions now (model_build_cuda calls it,
// so training steps upload nothing); the rope calls grow it themselves when they need more.
void rope_prepare_cuda(size_t n_positions, size_t head_size);

// ---- attention.cu ------------------------------------------------------------------------
// layers.h's attention: out (B,T,H*hs) and lse (B,H,T), no probabilities kept; the backward
// recomputes them. The naive version, one thread per query (then per key in the backward):
// what a reader learns first, and what the fast kernels are tested beside.
void attention_forward_naive_cuda(float* out, float* lse, const float* q, const float* k,
                                  const float* v, size_t B, size_t T, size_t H, size_t G,
                                  size_t hs);
void attention_backward_naive_cuda(float* dq, float* dk, float* dv, const float* dout,
                                   const float* out, const float* lse, const float* q,
                                   const float* k, const float* v, size_t B, size_t T, size_t H,
                                   size_t G, size_t hs);
// The flash-style kernels the model runs: a block per tile of 32 queries and a head.
void attention_forward_cuda(float* out, float* lse, const float* q, const float* k,
                            const float* v, size_t B, size_t T, size_t H, size_t G, size_t hs);
// Both backwards borrow attention_workspace_floats_cuda(B, T, H) floats of the workspace
// (common.cuh): one per query row (the sums D_t = dout_t . out_t).
void attention_backward_cuda(float* dq, float* dk, float* dv, const float* dout, const float* out,
                             const float* lse, const float* q, const float* k, const float* v,
                             size_t B, size_t T, size_t H, size_t G, size_t hs);
size_t attention_workspace_floats_cuda(size_t B, size_t T, size_t H);

// ---- swiglu.cu ---------------------------------------------------------------------------
void swiglu_forward_cuda(float* out, const float* gate, const float* up, size_t N, size_t F);
void swiglu_backward_cuda(float* dgate, float* dup, const float* dout, const float* gate,
                          const float* up, size_t N, size_t F);

// ---- depth_attention.cu ------------------------------------------------------------------
// sources and dsources are HOST arrays of n_sources DEVICE pointers; they travel to the
// kernels by value, so n_sources <= DEPTH_ATTENTION_MAX_SOURCES (2L+1 sources in `full` mode).
#define DEPTH_ATTENTION_MAX_SOURCES 64
// The naive version, one thread per row (layers.h's depth_attention_*_naive): what a reader
// meets first, and what dev/bench/bench_depth.cu times beside the kernels the model runs;
// the backward borrows N x n_sources floats of the workspace (common.cuh).
void depth_attention_forward_naive_cuda(float* h, float* alpha, float* key_rstd,
                                        const float* const* sources, const float* query,
                                        const float* norm_weight, size_t n_sources, size_t N,
                                        size_t C);
void depth_attention_backward_naive_cuda(float* const* dsources, float* dquery,
                                         float* dnorm_weight, const float* dh,
                                         const float* alpha, const float* key_rstd,
                                         const float* const* sources, const float* query,
                                         const float* norm_weight, size_t n_sources, size_t N,
                                         size_t C);
// The version the model runs.
void depth_attention_forward_cuda(float* h, float* alpha, float* key_rstd,
                                  const float* const* sources, const float* query,
                                  const float* norm_weight, size_t n_sources, size_t N, size_t C);
// Borrows the workspace (common.cuh) for its column partial sums.
void depth_attention_backward_cuda(float* const* dsources, float* dquery, float* dnorm_weight,
                                   const float* dh, const float* alpha, const float* key_rstd,
                                   const float* const* sources, const float* query,
                                   const float* norm_weight, size_t n_sources, size_t N, size_t C);
// The depth attention and the RMSNorm of its output (layers.h: weight is that norm's gain,
// dh_scratch overwritten), the norm fused into the kernels: one kernel forward, the rows
// kernel and the parts' sum backward; the backward borrows the workspace as the one above. (The macro tells dev/bench/bench_depth.cu, also built against older cuda/ files
// for a before/after, that these exist.)
#define HAS_DEPTH_ATTENTION_RMSNORM 1
void depth_attention_rmsnorm_forward_cuda(float* xn, float* rstd, float* h, DepthSaved saved,
                                          const float* const* sources, DepthParams params,
                                          const float* weight, size_t n_sources, size_t N,
                                          size_t C);
void depth_attention_rmsnorm_backward_cuda(float* const* dsources, DepthParams grads,
                                           float* dweight, float* dh_scratch, const float* dxn,
                                           const float* h, const float* rstd,
                                           const float* weight, DepthSaved saved,
                                           const float* const* sources, DepthParams params,
                                           size_t n_sources, size_t N, size_t C);
// The most floats of the workspace (common.cuh) one depth attention backward borrows.
size_t depth_attention_workspace_floats_cuda(size_t n_sources, size_t N, size_t C);

// ---- depth_variants.cu -------------------------------------------------------------------
// SPEC's variants, as layers.h's depth_variants.c functions: sources and dsources as for the
// depth attention above; token_query and dtoken_query (N,C), norm_weight and dnorm_weight (C)
// may be NULL (no per-token part of the query, no key norm); alpha and key_rstd (N,n_sources,heads).
void depth_attention_variant_forward_cuda(float* h, float* alpha, float* key_rstd,
                                          const float* const* sources, const float* query,
                                          const float* token_query, const float* norm_weight,
                                          size_t n_sources, size_t N, size_t C, size_t heads,
                                          int sigmoid);
void depth_attention_variant_backward_cuda(float* const* dsources, float* dquery,
                                           float* dtoken_query, float* dnorm_weight,
                                           const float* dh, const float* alpha,
                                           const float* key_rstd, const float* const* sources,
                                           const float* query, const float* token_query,
                                           const float* norm_weight, size_t n_sources, size_t N,
                                           size_t C, size_t heads, int sigmoid);
// The mixings: weights (n_sources, device) = softmax(coefficients) when normalise, else the
// coefficients, computed on the device; h (N,C) = sum_i weight_i V_i.
void depth_mixing_forward_cuda(float* h, float* weights, const float* const* sources,
                               const float* coefficients, size_t n_sources, size_t N, size_t C,
                               int normalise);
void depth_mixing_backward_cuda(float* const* dsources, float* dcoefficients, const float* dh,
                                const float* weights, const float* const* sources,
                                size_t n_sources, size_t N, size_t C, int normalise);
// The most floats of the workspace (common.cuh) one variant or mixing backward borrows.
size_t depth_variants_workspace_floats_cuda(size_t n_sources, size_t N, size_t C, size_t heads);
// The one call the model makes for an AttnRes sub-layer's input, as layers.h's
// attnres_input_forward and attnres_input_backward: every operator, the default, a variant
// or a mixing, runs fused with its norm (depth_variants.cu says which kernel each takes).
void attnres_input_forward_cuda(float* xn, float* rstd, float* h, DepthSaved saved,
                                const float* const* sources, DepthParams params,
                                const float* weight, size_t n_sources, size_t N, size_t C,
                                DepthSwitches switches);
void attnres_input_backward_cuda(float* const* dsources, DepthParams grads, float* dweight,
                                 DepthScratch scratch, const float* dxn, const float* h,
                                 const float* rstd, DepthSaved saved, const float* const* sources,
                                 DepthParams params, const float* weight, size_t n_sources,
                                 size_t N, size_t C, DepthSwitches switches);

// ---- mhc.cu ------------------------------------------------------------------------------
// mHC-lite, as layers.h's mhc.c functions: streams X (N, m*d), a row's coefficients (and
// their gradients) one vector of MHC_MIX_WIDTH(m) floats in mix (dmix). mhc_input_forward_cuda
// and its backward run rmsnorm.cu's and linear.cu's calls for the stream norm and the
// projection, so they borrow the workspace as those do (rmsnorm over N rows of m*d);
// mhc_input_backward_cuda also borrows mhc_workspace_floats_cuda(N, m) floats for the sums of
// dbeta and dsigma over the rows.
size_t mhc_workspace_floats_cuda(size_t N, size_t m);
void mhc_expand_forward_cuda(float* X, const float* x0, size_t N, size_t d, size_t m);
void mhc_expand_backward_cuda(float* dx0, const float* dX, size_t N, size_t d, size_t m);
void mhc_reduce_forward_cuda(float* out, const float* X, size_t N, size_t d, size_t m);
void mhc_reduce_backward_cuda(float* dX, const float* dout, size_t N, size_t d, size_t m);
void mhc_input_forward_cuda(float* u, float* mix, float* e, float* z, float* rstd,
                            const float* X, MhcParams params, size_t N, size_t d, size_t m);
void mhc_input_backward_cuda(float* dX, MhcParams grads, float* dmix, float* de, float* dz,
                             const float* du, const float* X, const float* z, const float* rstd,
                             const float* e, const float* mix, MhcParams params, size_t N,
                             size_t d, size_t m);
void mhc_output_forward_cuda(float* Xnext, const float* X, const float* f, const float* mix,
                             size_t N, size_t d, size_t m);
void mhc_output_backward_cuda(float* dX, float* df, float* dmix, const float* dXnext,
                              const float* X, const float* f, const float* mix, size_t N,
                              size_t d, size_t m);

// ---- crossentropy.cu ---------------------------------------------------------------------
// Counting the targets is the caller's, on the host (crossentropy_count): no copy, no sync.
void crossentropy_forward_cuda(float* losses, float* probs, const float* logits,
                               const int* targets, size_t N, size_t V);
void crossentropy_backward_cuda(float* dlogits, const float* probs, const int* targets,
                                float scale, size_t N, size_t V);

// ---- adamw.cu ----------------------------------------------------------------------------
void adamw_update_cuda(float* params, const float* grads, float* m, float* v, size_t n,
                       float lr, float beta1, float beta2, float eps, float weight_decay, int t);
// The global gradient norm sqrt(sum grads^2) over n floats, as model_grad_norm; it returns
// to the host, so it synchronises.
float global_norm_cuda(const float* grads, size_t n);
// The same in two halves, for a caller that reads the partial sums back with other numbers
// (model_forward_backward_cuda): NORM_PARTIALS partial sums of x^2 into partial (device),
// then, on the host copy of them, sqrt of their sum (in double, in order).
#define NORM_PARTIALS 64
void squared_sum_partials_cuda(float* partial, const float* x, size_t n);
float norm_from_partials(const float* host_partial);
// their sum (in double, in order): the squared norm of x
double sum_of_partials(const float* host_partial);
// Clipping as src/trainer.c does it: when norm > max_norm, grads *= max_norm / norm.
void clip_gradients_cuda(float* grads, size_t n, float norm, float max_norm);

// ---- muon.cu -----------------------------------------------------------------------------
void newton_schulz_cuda(float* X, float* work, size_t rows, size_t cols);
void muon_update_cuda(float* params, const float* grads, float* momentum, size_t count,
                      size_t rows, size_t cols, float lr, float mu, float weight_decay);
// The scratch a step on a (rows,cols) matrix needs, allocated now (it grows at the first step
// otherwise, which a captured step must not: cuda/model.cu reserves it before capturing)
void muon_reserve_cuda(size_t rows, size_t cols);

#endif
