// diagnostics.h — what happens across depth while training: the measurements behind the
// PreNorm-dilution story (SPEC.md, seeds/004 and 000) and the depth-attention heatmap.
//
// Measured from the model's buffers after a forward (and backward), never changing them:
//   - input_rms[l]: RMS of the hidden state h_l fed to sub-layer l; [2L] is the final hidden
//     state `out`. In none mode it grows with depth (h is a sum); AttnRes keeps it bounded.
//   - output_rms[l]: RMS of the sub-layer output f_l (model_sublayer_output).
//   - grad_norm: L2 norm of the gradient of each group of weights, in depth order:
//     [0] embedding (wte); [1+l] sub-layer l's own weights (attention of layer l/2:
//     attn_norm, wq, wk, wv, wo; MLP: mlp_norm, wg, wu, wd); [2L+1] head (final_norm,
//     lm_head). res_grad_norm[1+l] is that of the depth attention before sub-layer l (slice l
//     of each residual tensor the variant has: res_query, res_norm, res_qproj, res_logits or
//     res_scalars), [2L+1] of the output aggregation (slice 2L); 0 elsewhere and in none mode
//     (res_grad_norm[0] is 0: the embedding has no depth attention). In mhc mode
//     res_grad_norm[1+l] is that of sub-layer l's stream mixing (slice l of hc_norm, hc_proj,
//     hc_bias, hc_scale), [2L+1] is 0 (the streams are summed, nothing learned). The squares of
//     both arrays add up to the global norm squared.
//   - alpha: the depth-attention weights the last forward used, averaged over its tokens,
//     (2L+1, n_cols): row l is sub-layer l (row 2L the output aggregation), column i its
//     source i. Sources are numbered by block (b_0 = embedding; in block mode a sub-layer
//     that is not first in its block sees its block's partial sum in that block's column;
//     in full mode column i >= 1 is the output of sub-layer i-1, also with --depth-window,
//     whose rows have x0 and their W most recent outputs only). NAN where a row has no such
//     source. The variants (SPEC "Variants"): with K >= 2 heads alpha is the mean over the
//     heads and head_alpha holds each head's matrix; with --mixing the weights are the same
//     at every token (softmax of res_logits, or DenseFormer's res_scalars); sigmoid and
//     DenseFormer weights are not normalised: their rows do not sum to 1.
//   - mHC-lite's coefficients (--mode mhc, m streams; SPEC "mHC-lite"), each the mean over the
//     tokens of the last forward, per sub-layer l: hc_pre (2L, m) the read weights a_pre (the
//     sub-layer's input is sum_s a_pre[s] X_s, each in (0, 1)), hc_post (2L, m) the write
//     weights a_post (stream t gets a_post[t] f, each in (0, 2)) and hc_h (2L, m, m) the
//     mixing matrix H, H[s][t] at (l*m + s)*m + t (stream t after the sub-layer takes
//     H[s][t] of stream s before it): doubly stochastic, every row and column sums to 1.
//
// With a directory, each record appends CSV lines there (files described in
// diagnostics_open). Off by default in train.c (--diagnostics DIR): no cost when off.
#ifndef ATTNRES_DIAGNOSTICS_H
#define ATTNRES_DIAGNOSTICS_H

#include <stdio.h>
#include "model.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    ModelConfig config;
    int n_sub;            // 2L
    int n_cols;           // depth-attention source columns, 2L/S + 1 (0 in none mode)
    int depth_heads;      // K depth-attention heads (1 without --depth-heads K >= 2)
    float* input_rms;     // (2L+1)
    float* output_rms;    // (2L)
    float* grad_norm;     // (2L+2)
    float* res_grad_norm; // (2L+2)
    float* alpha;         // (2L+1, n_cols), the mean over heads; NULL in none mode
    float* head_alpha;    // (K, 2L+1, n_cols) each head's matrix; NULL for one head
    int streams;          // mHC-lite's m (0: not mhc mode)
    float* hc_pre;        // (2L, m) mean read weights a_pre; NULL outside mhc mode
    float* hc_post;       // (2L, m) mean write weights a_post; NULL outside mhc mode
    float* hc_h;          // (2L, m, m) mean mixing matrices H; NULL outside mhc mode
    double* sums;         // the running sums behind those means (diagnostics_alpha_add)
    unsigned char* seen;  // (2L+1, n_cols): 1 where a source of that row was summed
    size_t tokens;        // the tokens summed (a mixing, static or DenseFormer: 1, its one row)
    FILE *train_csv, *eval_csv, *layers_csv, *alpha_csv;  // NULL without a directory
    FILE* mhc_csv;        // NULL without a directory, and outside mhc mode
    char* dir;            // that directory (NULL without one)
    char error[4400];     // why the last diagnostics_write_* failed
} Diagnostics;

// the files a diagnostics directory holds (mhc.csv in mhc mode only)
#define DIAGNOSTICS_FILES {"meta.csv", "train.csv", "eval.csv", "layers.csv", "alpha.csv", "mhc.csv"}

void diagnostics_init(Diagnostics* dg, const ModelConfig* c);
void diagnostics_free(Diagnostics* dg);  // closes the CSV files

// Creates dir (and parents) and opens its CSV files, headers first:
//   meta.csv    key,value: mode (none, full, block, mhc), block_size, d_model, n_layers,
//               n_heads, n_kv_heads, ffn_hidden, vocab_size, the variant (depth_score
//               softmax|sigmoid, key_norm on|off, depth_query static|input, depth_heads K,
//               depth_window W (0: all), mixing attention|static|dense), in mhc mode
//               streams m, command
//   train.csv   step,train_loss,lr,grad_norm,ms_per_step            (each log step)
//   eval.csv    step,val_loss,accuracy,exact_match                  (each eval; % units;
//               exact_match empty for text)
//   layers.csv  step,index,name,input_rms,output_rms,grad_norm,res_grad_norm   (each log
//               step; index -1 "emb", 0..2L-1 "L<i>.attn"/"L<i>.mlp", 2L "out"; empty
//               where a value does not apply)
//   alpha.csv   step,row,row_name,source,source_name,alpha           (each eval, AttnRes;
//               with K >= 2 depth heads, alpha is the mean over the heads and the columns
//               alpha_h0 .. alpha_h<K-1> follow, one per head: a reader of the first six
//               columns reads every run alike). One line per source a row has: source is
//               the column of diagnostics_source_name, also for a window's sources
//   mhc.csv     step,row,row_name,stream,a_pre,a_post,h_0,...,h_<m-1>   (each eval, mhc mode
//               only): one line per sub-layer (row 0..2L-1, "L<i>.attn"/"L<i>.mlp") and
//               stream s (0..m-1), each value the mean over the first 64 eval sequences'
//               tokens: a_pre = the weight of stream s in the sub-layer's input, a_post =
//               the weight of the sub-layer's output added to stream s, h_t = H[s][t], the
//               share of stream s that flows into stream t (each line's h_ sum to 1, and so
//               does each column h_t over a row's m lines)
// resume_step >= 0 (resuming from that step): keep the existing lines up to that step and
// drop later ones (an interrupted run may have logged past its last checkpoint); -1: start
// the files afresh. Returns 0, or -1 with a reason in err.
int diagnostics_open(Diagnostics* dg, const char* dir, int resume_step, const char* command,
                     char* err, size_t err_len);
// sqrt(mean(x^2)) over n values
float tensor_rms(const float* x, size_t n);
// input_rms, output_rms and both gradient-norm arrays, from the last forward and backward of m
void diagnostics_measure_layers(Diagnostics* dg, const Model* m);
// alpha (and head_alpha) averaged over the B*T tokens of the last forward (nothing in none
// mode): the weights each variant used, in their sources' columns; in mhc mode hc_pre,
// hc_post and hc_h, the coefficients' means over those tokens instead
void diagnostics_measure_alpha(Diagnostics* dg, const Model* m);
// The same means over the tokens of several forwards (an evaluation in batches): begin, add
// after each forward, end. Summed in double token by token, in the batches' order, so that
// they are the same bits as one forward of all those sequences would give.
void diagnostics_alpha_begin(Diagnostics* dg);
void diagnostics_alpha_add(Diagnostics* dg, const Model* m);
void diagnostics_alpha_end(Diagnostics* dg);

// Row and column names: "L0.attn", "L0.mlp", ..., "out"; "emb", then "b1", "b2", ... (block)
// or "a0", "m0", "a1", ... (full: the output of layer i's attention / MLP).
void diagnostics_row_name(const Diagnostics* dg, int row, char* name, size_t len);
void diagnostics_source_name(const Diagnostics* dg, int col, char* name, size_t len);

// The CSV lines (no-ops without a directory), each flushed to its file. exact_match < 0: not
// applicable. 0, or -1 when a line did not reach the file (a full disk): then dg->error
// says "cannot write DIR/NAME.csv: reason", and the file may have lost lines.
int diagnostics_write_train(Diagnostics* dg, int step, float loss, float lr, float grad_norm,
                            float ms_per_step);
int diagnostics_write_eval(Diagnostics* dg, int step, float val_loss, float accuracy,
                           float exact_match);
int diagnostics_write_layers(Diagnostics* dg, int step);  // what measure_layers found
// what measure_alpha found: alpha.csv's lines, or mhc.csv's in mhc mode
int diagnostics_write_alpha(Diagnostics* dg, int step);

// The alpha matrix as text: one row per sub-layer, shaded cells " ░▒▓█" and the weight in %.
// The title and legend name the variant's weights: with K >= 2 heads the matrix is the mean
// over the heads (each head's in alpha.csv and make plots' heatmap_h<k>.png); sigmoid and
// DenseFormer rows do not sum to 100 %; mixing weights are the same for every token.
void diagnostics_print_heatmap(const Diagnostics* dg, FILE* out);

#ifdef __cplusplus
}
#endif
#endif
