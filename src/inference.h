// inference.h — decoding with caches: one new position per step, for B sequences in
// lockstep, with the two-phase depth attention of SPEC.md ("Two-phase inference").
//
// What is cached, and why:
//   - Attention (KV cache): every layer keeps k (after RoPE) and v of every position decoded
//     so far, (B, max_T, G*hs) each, so a step computes q, k, v for its new position only and
//     attends over the cache.
//   - Depth (AttnRes): depth attention mixes the sub-layer outputs of ONE position; it never
//     reads another position's blocks. So no block of an earlier position is ever needed
//     again, and "the depth sources cached per position" are those of the position being
//     decoded: while a step walks the sub-layers it keeps, in the decoder's own activation
//     buffers (Decoder.acts: the model's layout, point_activations, for one position of
//     B sequences), b_0 = x0 and the partial sum after every
//     sub-layer, whose last one in each block is that block's b_n: b_0, the completed blocks
//     and the running partial sum of the current block are what each depth attention
//     reads. The next step overwrites them. Everything from earlier positions that a step
//     needs reaches it through the KV cache.
// Variants (SPEC "Variants"): each decodes with the same caches. Sigmoid scores, the key norm
// off and K heads keep the two phases, per head; static and DenseFormer mixing too, with their
// coefficients in place of scores. With a depth window (full mode, so S = 1 and no partial
// sum), phase 1 of a sub-layer is its attention over gather_sources' windowed list.
// The input-dependent query (--depth-query input) is the exception. The query of sub-layer l
// is w_l + U_l rmsnorm(V_last), and V_last of a sub-layer that is not first in its block is
// the block's partial sum, which exists only once the sub-layers before it have run: phase 1
// cannot score that query. What it could share without the query, each block's key rstd, is
// one square root per block and sequence against the 2 d multiply-adds per block that need the
// query, so with this variant every depth attention runs at its sub-layer's own turn by the
// sequential definition (depth_attention_variant_forward over gather_sources' list), as
// model_forward does.
// mHC-lite (--mode mhc) needs no depth cache either: the m streams of the position being
// decoded flow through the sub-layers in the decoder's activation buffers as the hidden state
// does; the KV cache alone carries the earlier positions.
// The result equals model_forward over the whole sequence to float rounding (tested).
#ifndef ATTNRES_INFERENCE_H
#define ATTNRES_INFERENCE_H

#include <stddef.h>
#include <stdint.h>
#include "model.h"

#ifdef __cplusplus
extern "C" {
#endif

// ---- two_phase.c -------------------------------------------------------------------------
// The depth attention of one block of S sub-layers, in two phases (paper, Algorithm 1).
// Scores are those of depth_attention_forward: s = w . rmsnorm(V; g) = (w * g) . V * r,
// r = (mean(V^2) + eps)^(-1/2), so the S queries of a block share the rstd r of a source.
//
// Phase 1: the S pseudo-queries of block n against its completed blocks b_0 .. b_{n-1}
// (n_block_sources = n of them, blocks[i] (N,C)), at once: per query j and row, the max
// score m, the sum of exponentials l = sum_i e^{s_i - m} and the un-normalised sum
// o = sum_i e^{s_i - m} b_i.
// queries and norm_weights (S,C) are rows l of res_query and res_norm; o (S,N,C);
// max and sumexp (S,N).
void depth_attention_phase1(float* o, float* max, float* sumexp, const float* const* blocks,
                            const float* queries, const float* norm_weights, size_t n_block_sources,
                            size_t S, size_t N, size_t C);
// Phase 2 for one sub-layer of the block: out (N,C) = DA over the completed blocks and the
// partial sum `partial` (N,C). Its own attention over the partial sum alone has o2 = partial,
// m2 = s_p, l2 = 1; it merges with phase 1's (o1, m1, l1) by the online-softmax rule,
// m = max(m1, m2):
//   out = (e^{m1-m} o1 + e^{m2-m} o2) / (e^{m1-m} l1 + e^{m2-m} l2).
// The first sub-layer of a block has no partial sum: partial = NULL gives out = o1 / l1.
void depth_attention_phase2(float* out, const float* o1, const float* max1,
                            const float* sumexp1, const float* partial, const float* query,
                            const float* norm_weight, size_t N, size_t C);

// The variants (SPEC "Variants"; depth_variants.c is their sequential definition).
// Attention with `heads` groups of C/heads channels, each with its own scores; norm_weights
// NULL: the key norm off (r = 1, no gain); sigmoid: alpha_i = sigmoid(s_i), no normaliser.
// Phase 1 as above, per head: max and sumexp are (S,N,heads). With sigmoid there is nothing to
// normalise: o1 = sum_i sigmoid(s_i) b_i, and phase 1 writes m1 = 0, l1 = 1.
void depth_attention_variant_phase1(float* o, float* max, float* sumexp,
                                    const float* const* blocks, const float* queries,
                                    const float* norm_weights, size_t n_block_sources, size_t S,
                                    size_t N, size_t C, size_t heads, int sigmoid);
// Phase 2 per head: softmax merges the partial's score s_p as above; sigmoid adds its term,
// out = o1 + sigmoid(s_p) partial. partial NULL: out = o1 / l1. max1, sumexp1 (N,heads).
void depth_attention_variant_phase2(float* out, const float* o1, const float* max1,
                                    const float* sumexp1, const float* partial,
                                    const float* query, const float* norm_weight, size_t N,
                                    size_t C, size_t heads, int sigmoid);
// The mixings: one weight per source, the same for every row, from the coefficient row of
// the sub-layer (res_logits or res_scalars; S rows `stride` floats apart, the first
// n_block_sources entries of row j weigh the blocks). normalise (static mixing, softmax over
// the logits c): per query max m1 = max_i c_i and sumexp l1 = sum_i e^{c_i - m1} over the
// blocks, (S) each, and o1 = sum_i e^{c_i - m1} b_i (S,N,C). Dense (DenseFormer scalars
// beta): o1 = sum_i beta_i b_i, with m1 = 0 and l1 = 1.
void depth_mixing_phase1(float* o, float* max, float* sumexp, const float* const* blocks,
                         const float* coefficients, size_t stride, size_t n_block_sources, size_t S,
                         size_t N, size_t C, int normalise);
// Phase 2 with the partial's coefficient (its logit c_p, or beta_p): static merges c_p by the
// online-softmax rule (o2 = partial, m2 = c_p, l2 = 1); dense adds out = o1 + beta_p partial.
// partial NULL: out = o1 / l1. max1, sumexp1 are phase 1's for this query.
void depth_mixing_phase2(float* out, const float* o1, float max1, float sumexp1,
                         const float* partial, float coefficient, size_t N, size_t C,
                         int normalise);

// ---- inference.c -------------------------------------------------------------------------
typedef struct {
    Model* model;          // parameters are read from here at every step (not copied); a
                           // prefill runs on its activation buffers, overwriting them
    size_t max_B, max_T;   // at most max_B sequences of at most max_T positions each
    size_t B;              // the sequences being decoded (decoder_reset), B <= max_B
    size_t T;              // positions decoded so far (the next step's position)
    float* k_cache;        // (L, B, max_T, G*hs) keys after RoPE
    float* v_cache;        // (L, B, max_T, G*hs) values
    Activations acts;      // the current position, in the model's layout (point_activations)
    float* acts_memory;    // one position of max_B sequences (no backward); logits: acts.logits
    float* phase_o;        // (S, B, d) phase 1: un-normalised sums of the block's S queries
    float* phase_max;      // (S, B, K) phase 1: max scores per head ((S) with --mixing)
    float* phase_sumexp;   // (S, B, K) phase 1: sums of exponentials, likewise
    int* window_tokens;    // (max_B, max_T) the positions a prefill feeds
} Decoder;

// Allocates caches and buffers for up to max_B sequences of up to max_T positions (build
// it once and decode many batches with it: fresh memory costs a page fault per 4 KB);
// starts empty, with B = max_B. The model's own buffers must hold max_B sequences, and as many
// positions as the longest prefill (model_build): a prefill runs model_forward on them; with
// max_T positions, decoder_generate prefills the prompt, and past max_T every window of max_T.
// decoder_floats: the floats it allocates.
void decoder_build(Decoder* dec, Model* model, size_t max_B, size_t max_T);
size_t decoder_floats(const ModelConfig* c, size_t max_B, size_t max_T);
void decoder_free(Decoder* dec);
// Forgets every position and decodes B <= max_B sequences from now on: the next step is
// position 0.
void decoder_reset(Decoder* dec, size_t B);
// Appends position dec->T with tokens (B), one per sequence, and writes its logits (B,V).
void decoder_step(Decoder* dec, const int* tokens, float* logits);
// Resets and feeds positions 0 .. n-1 of the dec->B sequences tokens (B, n), 1 <= n <= max_T,
// in one model_forward over them (matmuls over all B x n positions at once, where n steps
// would multiply one position per sequence at a time): the caches then hold their k and v, as n
// steps would leave them (to float rounding), and logits (B,V) are those of position n-1.
void decoder_prefill(Decoder* dec, const int* tokens, size_t n, float* logits);
// Called with the B tokens just drawn, one per sequence, as soon as they are drawn (./train
// --sample prints a text model's bytes as they come).
typedef void (*TokenCallback)(void* context, const int* tokens, size_t B);
// Resets to B sequences, feeds prompt (B, n_prompt) (n_prompt >= 1) by a prefill, then draws
// n_new tokens per sequence with sample_token, each fed back as the next input by a step,
// into out (B, n_new); on_token (NULL: none) sees each position's draws. The model sees at
// most max_T positions (build the decoder with the trained T as max_T): past it the context
// slides, each new token read from the window of the last max_T tokens, encoded afresh
// (positions 0 .. max_T-1, as in training) by a prefill of the window.
void decoder_generate(Decoder* dec, size_t B, const int* prompt, size_t n_prompt, int* out,
                      size_t n_new, float temperature, int top_k, uint64_t* rng,
                      TokenCallback on_token, void* context);

// A token drawn from softmax(logits / temperature) restricted to the top_k largest logits
// (top_k 0 or >= V: all of them). temperature 0 or top_k 1: the argmax (first on ties),
// without touching rng (which may then be NULL). rng is a splitmix64 state (rng.h),
// advanced once per draw.
int sample_token(const float* logits, size_t V, float temperature, int top_k, uint64_t* rng);

#ifdef __cplusplus
}
#endif
#endif
