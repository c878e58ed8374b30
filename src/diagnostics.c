// diagnostics.c — magnitudes, gradient norms and depth-attention weights across depth, as
// CSV files and a text heatmap (see diagnostics.h). Read-only on the model.
#define _POSIX_C_SOURCE 200809L  // mkdir
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include "diagnostics.h"
#include "util.h"

void diagnostics_init(Diagnostics* dg, const ModelConfig* c) {
    memset(dg, 0, sizeof(*dg));
    dg->config = *c;
    dg->n_sub = 2 * c->n_layers;
    dg->n_cols = c->block_size > 0 ? dg->n_sub / c->block_size + 1 : 0;
    dg->depth_heads = (int)model_dims(c).depth_heads;
    dg->input_rms = callocCheck((size_t)dg->n_sub + 1, sizeof(float));
    dg->output_rms = callocCheck((size_t)dg->n_sub, sizeof(float));
    dg->grad_norm = callocCheck((size_t)dg->n_sub + 2, sizeof(float));
    dg->res_grad_norm = callocCheck((size_t)dg->n_sub + 2, sizeof(float));
    dg->streams = c->streams;
    if (dg->streams > 0) {
        size_t m = (size_t)dg->streams;
        dg->hc_pre = callocCheck((size_t)dg->n_sub * m, sizeof(float));
        dg->hc_post = callocCheck((size_t)dg->n_sub * m, sizeof(float));
        dg->hc_h = callocCheck((size_t)dg->n_sub * m * m, sizeof(float));
    }
    if (dg->n_cols > 0) {
        size_t cells = (size_t)(dg->n_sub + 1) * dg->n_cols;
        dg->alpha = callocCheck(cells, sizeof(float));
        if (dg->depth_heads > 1) {
            dg->head_alpha = callocCheck((size_t)dg->depth_heads * cells, sizeof(float));
        }
    }
}

void diagnostics_free(Diagnostics* dg) {
    FILE* files[] = {dg->train_csv, dg->eval_csv, dg->layers_csv, dg->alpha_csv, dg->mhc_csv};
    for (int i = 0; i < 5; i++) { if (files[i] != NULL) { fclose(files[i]); } }
    free(dg->dir);
    free(dg->input_rms);
    free(dg->output_rms);
    free(dg->grad_norm);
    free(dg->res_grad_norm);
    free(dg->alpha);
    free(dg->head_alpha);
    free(dg->hc_pre);
    free(dg->hc_post);
    free(dg->hc_h);
    free(dg->sums);
    free(dg->seen);
    memset(dg, 0, sizeof(*dg));
}

// mkdir -p
static int make_dirs(const char* dir) {
    char path[4096];
    if (snprintf(path, sizeof(path), "%s", dir) >= (int)sizeof(path)) { return -1; }
    for (char* at = path + 1; ; at++) {
        if (*at == '/' || *at == '\0') {
            char end = *at;
            *at = '\0';
            if (mkdir(path, 0755) != 0 && errno != EEXIST) { return -1; }
            if (end == '\0') { return 0; }
            *at = end;
        }
    }
}

// Keeps the header and the lines of dir/name whose step (the first column) is at most
// last_step: a resumed run replays the steps after its checkpoint, whose lines an interrupted
// run may have written already. Rewritten through name.tmp and a rename. 0, or -1.
static int drop_lines_after(const char* path, int last_step) {
    if (!replaceable_by_rename(path)) { return 0; }  // a device or a pipe: no lines to keep
    FILE* in = fopen(path, "r");
    if (in == NULL) { return errno == ENOENT ? 0 : -1; }
    char tmp[4200], line[8192];
    snprintf(tmp, sizeof(tmp), "%s.tmp", path);
    FILE* out = fopen(tmp, "w");
    if (out == NULL) { fclose(in); return -1; }
    for (int n = 0; fgets(line, sizeof(line), in) != NULL; n++) {
        if (n == 0 || atoi(line) <= last_step) { fputs(line, out); }
    }
    fclose(in);
    if (fclose(out) != 0) { return -1; }
    return rename(tmp, path);
}

// 0 when what was written to f so far is in the file, -1 (errno says why) when some of it
// is not: a full disk fails the flush, and a line lost on the way leaves f's error flag
static int flush_csv(FILE* f) { return fflush(f) == 0 && !ferror(f) ? 0 : -1; }

// opens dir/name for writing (resume_step >= 0: keep what is there up to that step) and
// writes the header if the file is empty; NULL (errno says why) if any of it fails
static FILE* open_csv(const char* dir, const char* name, const char* header, int resume_step) {
    char path[4096];
    snprintf(path, sizeof(path), "%s/%s", dir, name);
    if (resume_step >= 0 && drop_lines_after(path, resume_step) != 0) { return NULL; }
    FILE* f = fopen(path, resume_step >= 0 ? "a" : "w");
    if (f == NULL) { return NULL; }
    if (ftell(f) == 0) { fprintf(f, "%s\n", header); }
    if (flush_csv(f) != 0) {
        int why = errno;
        fclose(f);
        errno = why;
        return NULL;
    }
    return f;
}

// A line that did not reach dir/name: -1, with "cannot write dir/name: reason" in dg->error
static int write_failed(Diagnostics* dg, const char* name) {
    snprintf(dg->error, sizeof(dg->error), "cannot write %s/%s: %s", dg->dir, name,
             strerror(errno));
    return -1;
}

int diagnostics_open(Diagnostics* dg, const char* dir, int resume_step, const char* command,
                     char* err, size_t err_len) {
    if (make_dirs(dir) != 0) {
        snprintf(err, err_len, "cannot create the diagnostics directory %s: %s", dir,
                 strerror(errno));
        return -1;
    }
    // alpha.csv: with K >= 2 depth heads, one column per head after the mean
    size_t alpha_len = 64 + 16 * (size_t)dg->depth_heads;
    char* alpha_header = mallocCheck(alpha_len);
    size_t used = (size_t)snprintf(alpha_header, alpha_len,
                                   "step,row,row_name,source,source_name,alpha");
    for (int k = 0; k < dg->depth_heads && dg->depth_heads > 1; k++) {
        used += (size_t)snprintf(alpha_header + used, alpha_len - used, ",alpha_h%d", k);
    }
    // mhc.csv (mhc mode only): a column h_t per stream t after a_pre and a_post
    char mhc_header[128];
    used = (size_t)snprintf(mhc_header, sizeof(mhc_header),
                            "step,row,row_name,stream,a_pre,a_post");
    for (int t = 0; t < dg->streams; t++) {
        used += (size_t)snprintf(mhc_header + used, sizeof(mhc_header) - used, ",h_%d", t);
    }
    const char* names[] = DIAGNOSTICS_FILES;
    const char* headers[] = {
        "key,value",
        "step,train_loss,lr,grad_norm,ms_per_step",
        "step,val_loss,accuracy,exact_match",
        "step,index,name,input_rms,output_rms,grad_norm,res_grad_norm",
        alpha_header,
        mhc_header};
    int n_files = dg->streams > 0 ? 6 : 5;
    FILE* files[6] = {NULL};
    for (int i = 0; i < n_files; i++) {
        files[i] = open_csv(dir, names[i], headers[i], i > 0 ? resume_step : -1);
        if (files[i] == NULL) {
            snprintf(err, err_len, "cannot write %s/%s: %s", dir, names[i], strerror(errno));
            for (int j = 0; j < i; j++) { fclose(files[j]); }
            free(alpha_header);
            return -1;
        }
    }
    free(alpha_header);
    const ModelConfig* c = &dg->config;
    const char* mode = c->streams > 0 ? "mhc" : c->block_size == 0 ? "none"
                     : c->block_size == 1 ? "full" : "block";
    const char* mixings[] = {"attention", "static", "dense"};
    fprintf(files[0], "mode,%s\nblock_size,%d\nd_model,%d\nn_layers,%d\nn_heads,%d\n"
            "n_kv_heads,%d\nffn_hidden,%d\nvocab_size,%d\n", mode, c->block_size, c->d_model,
            c->n_layers, c->n_heads, c->n_kv_heads, c->ffn_hidden, c->vocab_size);
    fprintf(files[0], "depth_score,%s\nkey_norm,%s\ndepth_query,%s\ndepth_heads,%d\n"
            "depth_window,%d\nmixing,%s\n", c->depth_score ? "sigmoid" : "softmax",
            c->key_norm_off ? "off" : "on", c->depth_query ? "input" : "static", dg->depth_heads,
            c->depth_window, mixings[c->mixing]);
    if (dg->streams > 0) { fprintf(files[0], "streams,%d\n", dg->streams); }
    fprintf(files[0], "command,%s\n", command != NULL ? command : "");
    int meta_failed = flush_csv(files[0]) != 0, why = errno;  // meta.csv is whole, or no run
    if (fclose(files[0]) != 0 && !meta_failed) {
        meta_failed = 1;
        why = errno;
    }
    if (meta_failed) {
        snprintf(err, err_len, "cannot write %s/meta.csv: %s", dir, strerror(why));
        for (int j = 1; j < n_files; j++) { fclose(files[j]); }
        return -1;
    }
    dg->dir = strdup(dir);
    dg->train_csv = files[1];
    dg->eval_csv = files[2];
    dg->layers_csv = files[3];
    dg->alpha_csv = files[4];
    dg->mhc_csv = files[5];
    return 0;
}

static double sum_squares(const float* x, size_t n) {
    double sum = 0.0;
    #pragma omp parallel for reduction(+:sum)
    for (size_t i = 0; i < n; i++) { sum += (double)x[i] * x[i]; }
    return sum;
}

float tensor_rms(const float* x, size_t n) {
    return n > 0 ? (float)sqrt(sum_squares(x, n) / (double)n) : 0.0f;
}

void diagnostics_measure_layers(Diagnostics* dg, const Model* m) {
    const ModelDims* z = &m->dims;
    size_t N = m->B * m->T, d = z->d, V = z->V, F = z->F, q_dim = z->q_dim, kv_dim = z->kv_dim;
    int L2 = dg->n_sub;
    for (int l = 0; l <= L2; l++) {
        dg->input_rms[l] = tensor_rms(model_sublayer_input(m, l), N * model_sublayer_input_width(m, l));
        if (l < L2) { dg->output_rms[l] = tensor_rms(model_sublayer_output(m, l), N * d); }
    }

    const ParameterTensors* g = &m->grads;
    dg->grad_norm[0] = (float)sqrt(sum_squares(g->wte, V * d));
    for (int l = 0; l < L2; l++) {
        size_t layer = (size_t)l / 2;
        double sum;
        if (l % 2 == 0) {
            sum = sum_squares(g->attn_norm + layer * d, d)
                + sum_squares(g->wq + layer * q_dim * d, q_dim * d)
                + sum_squares(g->wk + layer * kv_dim * d, kv_dim * d)
                + sum_squares(g->wv + layer * kv_dim * d, kv_dim * d)
                + sum_squares(g->wo + layer * d * q_dim, d * q_dim);
        } else {
            sum = sum_squares(g->mlp_norm + layer * d, d)
                + sum_squares(g->wg + layer * F * d, F * d)
                + sum_squares(g->wu + layer * F * d, F * d)
                + sum_squares(g->wd + layer * d * F, d * F);
        }
        dg->grad_norm[1 + l] = (float)sqrt(sum);
    }
    dg->grad_norm[L2 + 1] = (float)sqrt(sum_squares(g->final_norm, d)
                                        + sum_squares(g->lm_head, V * d));
    dg->res_grad_norm[0] = 0.0f;  // the embedding has no depth attention
    for (size_t l = 0; l <= (size_t)L2; l++) {  // slice l of each residual tensor there is
        double sum = 0.0;
        if (z->n_query_slices > 0) { sum += sum_squares(g->res_query + l * d, d); }
        if (z->n_norm_slices > 0) { sum += sum_squares(g->res_norm + l * d, d); }
        if (z->n_qproj_slices > 0) { sum += sum_squares(g->res_qproj + l * d * d, d * d); }
        if (z->n_logit_slices > 0) { sum += sum_squares(g->res_logits + l * z->n_res, z->n_res); }
        if (z->n_scalar_slices > 0) { sum += sum_squares(g->res_scalars + l * z->n_res, z->n_res); }
        if (l < z->n_hc_slices) {  // mhc: sub-layer l's stream mixing
            size_t md = z->streams * d;
            sum += sum_squares(g->hc_norm + l * md, md)
                 + sum_squares(g->hc_proj + l * z->E * md, z->E * md)
                 + sum_squares(g->hc_bias + l * z->E, z->E)
                 + sum_squares(g->hc_scale + l * 3, 3);
        }
        dg->res_grad_norm[1 + l] = (float)sqrt(sum);
    }
}

// The column of source i of row l's n sources (gather_sources' order). In full mode row l's
// list is x0, f_0 .. f_{l-1} (l+1 sources); a window keeps x0 and the last n-1 of them, so
// source i >= 1 is f_{l-n+i}, in column l+1-n+i. In block mode, i itself.
static int source_column(const Diagnostics* dg, int l, size_t n, size_t i) {
    if (i == 0 || dg->config.block_size != 1) { return (int)i; }
    return (int)((size_t)l + 1 - n + i);
}

// hc_pre, hc_post, hc_h: the means over the tokens of the forwards between _begin and _end
// of each sub-layer's coefficients (its rows of hc_mix: a_pre, pi, a_post, H_res; layers.h)
// The means are kept as running sums in double, added token by token in the order the
// batches come: the means over the tokens of several forwards are the same bits as over one
// forward holding them all.
void diagnostics_alpha_begin(Diagnostics* dg) {
    size_t m = (size_t)dg->streams, cells = (size_t)(dg->n_sub + 1) * dg->n_cols;
    size_t count = dg->streams > 0 ? (size_t)dg->n_sub * m * (m + 2) : cells * (size_t)dg->depth_heads;
    free(dg->sums);
    free(dg->seen);
    dg->sums = callocCheck(count + 1, sizeof(double));
    dg->seen = callocCheck(cells + 1, 1);
    dg->tokens = 0;
}

// mhc: sums laid out as pre (2L, m), post (2L, m), then h (2L, m, m)
static void add_mhc(Diagnostics* dg, const Model* model) {
    size_t m = (size_t)dg->streams, rows = model->B * model->T, width = model->dims.n_mix;
    size_t R = model->dims.R, n_sub = (size_t)dg->n_sub;
    double *pre = dg->sums, *post = pre + n_sub * m, *h = post + n_sub * m;
    for (size_t l = 0; l < n_sub; l++) {
        const float* mix = model->acts.sub[l].hc_mix;
        for (size_t s = 0; s < m; s++) {
            for (size_t n = 0; n < rows; n++) {
                pre[l * m + s] += mix[n * width + s];
                post[l * m + s] += mix[n * width + m + R + s];
            }
        }
        for (size_t i = 0; i < m * m; i++) {
            for (size_t n = 0; n < rows; n++) { h[l * m * m + i] += mix[n * width + 2 * m + R + i]; }
        }
    }
}

// alpha: sums (K, 2L+1, n_cols), each head's weights summed over the tokens. Static mixing's
// weights are the same for every token: its single row is counted once, from the first batch.
static void add_alpha(Diagnostics* dg, const Model* m) {
    size_t cells = (size_t)(dg->n_sub + 1) * dg->n_cols;
    for (int l = 0; l <= dg->n_sub; l++) {
        size_t n = 0, heads = 1, rows = 1;
        // entry (t, i, k) at (t * n + i) * heads + k; rows = 1 with --mixing
        const float* alpha = model_depth_alpha(m, l, &n, &heads, &rows);
        if (dg->config.mixing != 0 && dg->tokens > 0) { continue; }
        for (size_t i = 0; i < n; i++) {
            size_t cell = (size_t)l * dg->n_cols + (size_t)source_column(dg, l, n, i);
            dg->seen[cell] = 1;
            for (size_t k = 0; k < heads; k++) {
                double* sum = &dg->sums[k * cells + cell];
                for (size_t t = 0; t < rows; t++) { *sum += alpha[(t * n + i) * heads + k]; }
            }
        }
    }
}

void diagnostics_alpha_add(Diagnostics* dg, const Model* m) {
    if (dg->streams > 0) { add_mhc(dg, m); }
    if (dg->alpha != NULL) { add_alpha(dg, m); }
    dg->tokens += dg->config.mixing != 0 && dg->alpha != NULL ? (dg->tokens == 0) : m->B * m->T;
}

void diagnostics_alpha_end(Diagnostics* dg) {
    double tokens = (double)dg->tokens;
    if (dg->streams > 0) {
        size_t m = (size_t)dg->streams, n_sub = (size_t)dg->n_sub;
        const double *pre = dg->sums, *post = pre + n_sub * m, *h = post + n_sub * m;
        for (size_t i = 0; i < n_sub * m; i++) {
            dg->hc_pre[i] = (float)(pre[i] / tokens);
            dg->hc_post[i] = (float)(post[i] / tokens);
        }
        for (size_t i = 0; i < n_sub * m * m; i++) { dg->hc_h[i] = (float)(h[i] / tokens); }
    }
    if (dg->alpha == NULL) { return; }
    size_t cells = (size_t)(dg->n_sub + 1) * dg->n_cols, heads = (size_t)dg->depth_heads;
    for (size_t i = 0; i < cells; i++) { dg->alpha[i] = NAN; }
    for (size_t i = 0; i < cells * heads && dg->head_alpha != NULL; i++) { dg->head_alpha[i] = NAN; }
    for (size_t cell = 0; cell < cells; cell++) {
        if (!dg->seen[cell]) { continue; }
        double all_heads = 0.0;
        for (size_t k = 0; k < heads; k++) {
            double sum = dg->sums[k * cells + cell];
            if (dg->head_alpha != NULL) { dg->head_alpha[k * cells + cell] = (float)(sum / tokens); }
            all_heads += sum;
        }
        dg->alpha[cell] = (float)(all_heads / (tokens * (double)heads));
    }
}

void diagnostics_measure_alpha(Diagnostics* dg, const Model* m) {
    diagnostics_alpha_begin(dg);
    diagnostics_alpha_add(dg, m);
    diagnostics_alpha_end(dg);
}

void diagnostics_row_name(const Diagnostics* dg, int row, char* name, size_t len) {
    if (row < 0) { snprintf(name, len, "emb"); }
    else if (row >= dg->n_sub) { snprintf(name, len, "out"); }
    else { snprintf(name, len, "L%d.%s", row / 2, row % 2 == 0 ? "attn" : "mlp"); }
}

void diagnostics_source_name(const Diagnostics* dg, int col, char* name, size_t len) {
    if (col == 0) { snprintf(name, len, "emb"); }
    else if (dg->config.block_size == 1) {
        snprintf(name, len, "%c%d", col % 2 == 1 ? 'a' : 'm', (col - 1) / 2);
    }
    else { snprintf(name, len, "b%d", col); }
}

int diagnostics_write_train(Diagnostics* dg, int step, float loss, float lr, float grad_norm,
                            float ms_per_step) {
    if (dg->train_csv == NULL) { return 0; }
    fprintf(dg->train_csv, "%d,%.6g,%.6g,%.6g,%.4g\n", step, (double)loss, (double)lr,
            (double)grad_norm, (double)ms_per_step);
    return flush_csv(dg->train_csv) == 0 ? 0 : write_failed(dg, "train.csv");
}

int diagnostics_write_eval(Diagnostics* dg, int step, float val_loss, float accuracy,
                           float exact_match) {
    if (dg->eval_csv == NULL) { return 0; }
    fprintf(dg->eval_csv, "%d,%.6g,%.4f,", step, (double)val_loss, (double)accuracy);
    if (exact_match >= 0.0f) { fprintf(dg->eval_csv, "%.4f", (double)exact_match); }
    fprintf(dg->eval_csv, "\n");
    return flush_csv(dg->eval_csv) == 0 ? 0 : write_failed(dg, "eval.csv");
}

int diagnostics_write_layers(Diagnostics* dg, int step) {
    FILE* f = dg->layers_csv;
    if (f == NULL) { return 0; }
    int attnres = dg->config.block_size > 0, mhc = dg->streams > 0;
    char name[32];
    fprintf(f, "%d,-1,emb,,,%.6g,\n", step, (double)dg->grad_norm[0]);
    for (int l = 0; l < dg->n_sub; l++) {
        diagnostics_row_name(dg, l, name, sizeof(name));
        fprintf(f, "%d,%d,%s,%.6g,%.6g,%.6g,", step, l, name, (double)dg->input_rms[l],
                (double)dg->output_rms[l], (double)dg->grad_norm[1 + l]);
        if (attnres || mhc) { fprintf(f, "%.6g", (double)dg->res_grad_norm[1 + l]); }
        fprintf(f, "\n");
    }
    fprintf(f, "%d,%d,out,%.6g,,%.6g,", step, dg->n_sub, (double)dg->input_rms[dg->n_sub],
            (double)dg->grad_norm[dg->n_sub + 1]);
    if (attnres) { fprintf(f, "%.6g", (double)dg->res_grad_norm[dg->n_sub + 1]); }
    fprintf(f, "\n");
    return flush_csv(f) == 0 ? 0 : write_failed(dg, "layers.csv");
}

// mhc.csv's lines: one per sub-layer and stream s, its a_pre, a_post and row s of H
static int write_mhc(Diagnostics* dg, int step) {
    size_t m = (size_t)dg->streams;
    char row_name[32];
    for (int l = 0; l < dg->n_sub; l++) {
        diagnostics_row_name(dg, l, row_name, sizeof(row_name));
        for (size_t s = 0; s < m; s++) {
            fprintf(dg->mhc_csv, "%d,%d,%s,%zu,%.5f,%.5f", step, l, row_name, s,
                    (double)dg->hc_pre[l * m + s], (double)dg->hc_post[l * m + s]);
            for (size_t t = 0; t < m; t++) {
                fprintf(dg->mhc_csv, ",%.5f", (double)dg->hc_h[(l * m + s) * m + t]);
            }
            fprintf(dg->mhc_csv, "\n");
        }
    }
    return flush_csv(dg->mhc_csv) == 0 ? 0 : write_failed(dg, "mhc.csv");
}

int diagnostics_write_alpha(Diagnostics* dg, int step) {
    if (dg->mhc_csv != NULL) { return write_mhc(dg, step); }
    if (dg->alpha_csv == NULL || dg->alpha == NULL) { return 0; }
    char row_name[32], source_name[32];
    for (int l = 0; l <= dg->n_sub; l++) {
        diagnostics_row_name(dg, l, row_name, sizeof(row_name));
        for (int i = 0; i < dg->n_cols; i++) {
            float a = dg->alpha[(size_t)l * dg->n_cols + i];
            if (isnan(a)) { continue; }
            diagnostics_source_name(dg, i, source_name, sizeof(source_name));
            fprintf(dg->alpha_csv, "%d,%d,%s,%d,%s,%.5f", step, l, row_name, i, source_name,
                    (double)a);
            for (int k = 0; k < dg->depth_heads && dg->head_alpha != NULL; k++) {
                size_t cell = ((size_t)k * (dg->n_sub + 1) + l) * dg->n_cols + i;
                fprintf(dg->alpha_csv, ",%.5f", (double)dg->head_alpha[cell]);
            }
            fprintf(dg->alpha_csv, "\n");
        }
    }
    return flush_csv(dg->alpha_csv) == 0 ? 0 : write_failed(dg, "alpha.csv");
}

// What the cells are, for this variant: the title's parenthesis
static void heatmap_title(const Diagnostics* dg, FILE* out) {
    const ModelConfig* c = &dg->config;
    char heads[48] = "";
    if (dg->depth_heads > 1) {
        snprintf(heads, sizeof(heads), " and the %d heads", dg->depth_heads);
    }
    if (c->mixing == 1) {
        fprintf(out, "depth mixing (%% of each row, the same for every token)");
    } else if (c->mixing == 2) {
        fprintf(out, "DenseFormer depth mixing (β × 100, the same for every token)");
    } else if (c->depth_score == 1) {
        fprintf(out, "depth attention (sigmoid weights in %%, mean over tokens%s)", heads);
    } else {
        fprintf(out, "depth attention (%% of each row, mean over tokens%s)", heads);
    }
    fprintf(out, ": the input of each sub-layer (rows)\nis this mix of the sources (columns)\n");
}

// The legend's lines for the variant, after the shades and the columns' names
static void heatmap_variant_notes(const Diagnostics* dg, FILE* out) {
    const ModelConfig* c = &dg->config;
    const char* indent = "         ";
    if (c->depth_score == 1) {
        fprintf(out, "%ssigmoid scores: each weight is sigmoid(s_i) on its own, not normalised: "
                     "rows do not sum to 100 %%\n", indent);
    }
    if (c->mixing == 1) {
        fprintf(out, "%sstatic mixing: row l is softmax(res_logits row l), learned, not "
                     "input-dependent\n", indent);
    }
    if (c->mixing == 2) {
        fprintf(out, "%sDenseFormer: h = sum_i β_i V_i, not normalised: rows do not sum to "
                     "100 %%, a weight may be negative\n%s(100: β = 1, PreNorm's plain sum)\n",
                indent, indent);
    }
    if (dg->depth_heads > 1) {
        fprintf(out, "%s%d heads of %d channels: each cell is the mean over the heads; each "
                     "head's own weights are\n%sin alpha.csv (alpha_h<k>, with --diagnostics DIR) "
                     "and make plots' heatmap_h<k>.png\n", indent, dg->depth_heads,
                c->d_model / dg->depth_heads, indent);
    }
    if (c->depth_window > 0) {
        fprintf(out, "%s--depth-window %d: a row reads emb and its %d most recent outputs only "
                     "(· elsewhere)\n", indent, c->depth_window, c->depth_window);
    }
}

// A cell is two shade characters and the weight in %: "▓▓ 52"; "    ·" where no source.
// (A DenseFormer weight below -99 % or above 999 % takes more than its 3 digits.)
void diagnostics_print_heatmap(const Diagnostics* dg, FILE* out) {
    if (dg->alpha == NULL) { return; }
    static const char* const shades[] = {" ", "░", "▒", "▓", "█"};
    static const int bounds[] = {5, 20, 40, 70};  // shade k: percent >= bounds[k-1]
    char name[32];
    heatmap_title(dg, out);
    fprintf(out, "%-8s", "");
    for (int i = 0; i < dg->n_cols; i++) {
        diagnostics_source_name(dg, i, name, sizeof(name));
        fprintf(out, " %5s", name);
    }
    fprintf(out, "\n");
    for (int l = 0; l <= dg->n_sub; l++) {
        diagnostics_row_name(dg, l, name, sizeof(name));
        fprintf(out, "%-8s", name);
        for (int i = 0; i < dg->n_cols; i++) {
            float a = dg->alpha[(size_t)l * dg->n_cols + i];
            if (isnan(a)) { fprintf(out, "     ·"); continue; }
            int percent = (int)lrintf(100.0f * a), k = 0;
            while (k < 4 && percent >= bounds[k]) { k++; }
            fprintf(out, " %s%s%3d", shades[k], shades[k], percent);
        }
        fprintf(out, "\n");
    }
    fprintf(out, "%-8s ' ' < 5%%  ░ < 20%%  ▒ < 40%%  ▓ < 70%%  █ >= 70%%\n%-8s ", "", "");
    if (dg->config.block_size == 1) {
        fprintf(out, "a<i>, m<i>: the output of layer i's attention, MLP\n");
    } else {
        fprintf(out, "b<n>: block n of %d sub-layers (its partial sum, in rows inside it)\n",
                dg->config.block_size);
    }
    heatmap_variant_notes(dg, out);
}
