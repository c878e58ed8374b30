// check_state.c — parity with the PyTorch reference (dev/reference.py).
//
// ./check_state FILE [--out OUT]
// Loads a reference state file (format: README.md, "Parity with PyTorch"), runs the C forward
// and backward on its parameters and batch, and prints for the logits, the loss and every
// parameter gradient the max absolute and the max relative difference, where
//   relative = max_i |c_i - r_i| / max_i |r_i|   (the error measured against the tensor's scale;
//                                                  a tensor whose reference is all zero must be
//                                                  matched exactly)
// then replays the file's K AdamW steps on the same batch and compares each loss.
// Exit status: 0 all within tolerance, 1 some difference too large, 2 a bad file or flag.
// --out OUT writes what the C code computed in the same format (header, parameters and batch
// copied from FILE).
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "layers.h"
#include "model.h"
#include "util.h"

#define STATE_MAGIC 20261125
#define STATE_VERSION 1

// Tolerances on the relative difference (see README.md for why these numbers).
#define TOL_LOGITS 1e-5
#define TOL_LOSS 1e-5
#define TOL_GRADS 1e-5
#define TOL_ADAMW_LOSSES 1e-5

typedef struct {
    int header[256];
    float hyper[64];
    size_t B, T, V, K, num_params;
    float* params;
    int* x;
    int* y;
    float* logits;
    float loss;
    float* grads;
    float* losses;  // (K)
} StateFile;

static void bad_file(const char* path, const char* problem) {
    fprintf(stderr, "error: state file %s: %s\n", path, problem);
    exit(2);
}

static void read_exact(FILE* f, void* dst, size_t size, size_t count, const char* path) {
    if (fread(dst, size, count, f) != count) { bad_file(path, "truncated"); }
}

static ModelConfig state_config(const StateFile* s) {
    const int* h = s->header;
    return (ModelConfig){h[4], h[5], h[6], h[7], h[8], h[9], h[10]};
}

static void load_state(StateFile* s, const char* path) {
    FILE* f = fopen(path, "rb");
    if (f == NULL) {
        fprintf(stderr, "error: cannot open state file %s: %s\n", path, strerror(errno));
        exit(2);
    }
    long file_size = -1;
    if (fseek(f, 0, SEEK_END) == 0) { file_size = ftell(f); }
    rewind(f);
    if (file_size < 1024) { bad_file(path, "truncated (no complete 256-int header)"); }
    read_exact(f, s->header, sizeof(int), 256, path);
    int* h = s->header;
    if (h[0] != STATE_MAGIC) { bad_file(path, "wrong magic number (not a reference state file)"); }
    if (h[1] != STATE_VERSION) {
        char msg[128];
        snprintf(msg, sizeof(msg), "version %d, this build reads version %d", h[1], STATE_VERSION);
        bad_file(path, msg);
    }
    if (h[2] <= 0 || h[3] <= 0 || h[12] < 0) { bad_file(path, "invalid shape: B, T must be positive, K >= 0"); }
    ModelConfig c = state_config(s);
    char reason[256], msg[400];
    if (model_config_check(&c, reason, sizeof(reason)) != 0) {
        snprintf(msg, sizeof(msg), "invalid shape: %s", reason);
        bad_file(path, msg);
    }
    size_t sizes[N_PARAM_TENSORS];
    s->B = (size_t)h[2]; s->T = (size_t)h[3]; s->V = (size_t)h[4]; s->K = (size_t)h[12];
    s->num_params = param_sizes(&c, sizes);
    size_t P = s->num_params, BT = s->B * s->T;
    size_t expected = 1024 + 256 + 4 * (P + 2 * BT + BT * s->V + 1 + P + s->K);
    if ((size_t)file_size != expected) {
        snprintf(msg, sizeof(msg), "size %ld bytes does not match its header (expected %zu)",
                 file_size, expected);
        bad_file(path, msg);
    }
    read_exact(f, s->hyper, sizeof(float), 64, path);
    if (s->hyper[0] != RMSNORM_EPS || s->hyper[1] != (float)ROPE_BASE) {
        bad_file(path, "RMSNorm eps or RoPE base differ from this build's (1e-6, 10000)");
    }
    s->params = mallocCheck(P * sizeof(float));
    s->x = mallocCheck(BT * sizeof(int));
    s->y = mallocCheck(BT * sizeof(int));
    s->logits = mallocCheck(BT * s->V * sizeof(float));
    s->grads = mallocCheck(P * sizeof(float));
    s->losses = mallocCheck((s->K + 1) * sizeof(float));
    read_exact(f, s->params, sizeof(float), P, path);
    read_exact(f, s->x, sizeof(int), BT, path);
    read_exact(f, s->y, sizeof(int), BT, path);
    read_exact(f, s->logits, sizeof(float), BT * s->V, path);
    read_exact(f, &s->loss, sizeof(float), 1, path);
    read_exact(f, s->grads, sizeof(float), P, path);
    read_exact(f, s->losses, sizeof(float), s->K, path);
    fclose(f);
    for (size_t i = 0; i < BT; i++) {
        if (s->x[i] < 0 || (size_t)s->x[i] >= s->V) { bad_file(path, "a token in x is outside [0, V)"); }
        if (s->y[i] < -1 || s->y[i] >= (int)s->V) { bad_file(path, "a target in y is outside [-1, V)"); }
    }
}

static void write_state(const StateFile* s, const char* path) {
    char tmp[4096];
    snprintf(tmp, sizeof(tmp), "%s.tmp", path);
    FILE* f = fopen(tmp, "wb");
    if (f == NULL) {
        fprintf(stderr, "error: cannot write %s: %s\n", tmp, strerror(errno));
        exit(2);
    }
    size_t P = s->num_params, BT = s->B * s->T;
    int ok = fwrite(s->header, sizeof(int), 256, f) == 256 &&
             fwrite(s->hyper, sizeof(float), 64, f) == 64 &&
             fwrite(s->params, sizeof(float), P, f) == P &&
             fwrite(s->x, sizeof(int), BT, f) == BT && fwrite(s->y, sizeof(int), BT, f) == BT &&
             fwrite(s->logits, sizeof(float), BT * s->V, f) == BT * s->V &&
             fwrite(&s->loss, sizeof(float), 1, f) == 1 &&
             fwrite(s->grads, sizeof(float), P, f) == P &&
             fwrite(s->losses, sizeof(float), s->K, f) == s->K;
    ok = (fclose(f) == 0) && ok;
    if (!ok || rename(tmp, path) != 0) {
        fprintf(stderr, "error: cannot write %s: %s\n", path, strerror(errno));
        exit(2);
    }
}

// Prints one comparison line; returns 1 if within tolerance.
static int compare(const char* name, const float* c, const float* r, size_t n, double tol) {
    double max_abs = 0.0, max_ref = 0.0;
    for (size_t i = 0; i < n; i++) {
        double diff = fabs((double)c[i] - (double)r[i]);
        if (!(diff <= max_abs)) { max_abs = diff; }  // also catches NaN
        if (fabs((double)r[i]) > max_ref) { max_ref = fabs((double)r[i]); }
    }
    double rel = max_ref > 0.0 ? max_abs / max_ref : (max_abs > 0.0 ? INFINITY : 0.0);
    int ok = rel <= tol;
    printf("  %-12s n=%-7zu max_abs %.3e  max_rel %.3e  (tol %.0e)  %s\n", name, n, max_abs, rel,
           tol, ok ? "ok" : "FAIL");
    return ok;
}

int main(int argc, char** argv) {
    const char* path = NULL;
    const char* out_path = NULL;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--out") == 0) {
            if (i + 1 >= argc) { fprintf(stderr, "error: --out needs a path\n"); return 2; }
            out_path = argv[++i];
        } else if (argv[i][0] == '-' || path != NULL) {
            fprintf(stderr, "error: unexpected argument '%s' (usage: ./check_state FILE [--out OUT])\n",
                    argv[i]);
            return 2;
        } else {
            path = argv[i];
        }
    }
    if (path == NULL) { fprintf(stderr, "error: usage: ./check_state FILE [--out OUT]\n"); return 2; }

    StateFile ref;
    load_state(&ref, path);
    ModelConfig c = state_config(&ref);
    Model m;
    model_build(&m, &c, ref.B, ref.T);
    memcpy(m.params_memory, ref.params, m.num_params * sizeof(float));
    printf("%s: B=%zu T=%zu V=%zu d=%d L=%d H=%d G=%d F=%d S=%d K=%zu\n", path, ref.B, ref.T, ref.V,
           c.d_model, c.n_layers, c.n_heads, c.n_kv_heads, c.ffn_hidden, c.block_size, ref.K);

    // forward and backward on the file's parameters and batch
    StateFile ours = ref;
    ours.logits = mallocCheck(ref.B * ref.T * ref.V * sizeof(float));
    ours.grads = mallocCheck(m.num_params * sizeof(float));
    ours.losses = mallocCheck((ref.K + 1) * sizeof(float));
    ours.loss = model_forward(&m, ref.x, ref.y, ref.B, ref.T);
    memcpy(ours.logits, model_logits(&m), ref.B * ref.T * ref.V * sizeof(float));
    model_zero_grad(&m);
    model_backward(&m);
    memcpy(ours.grads, m.grads_memory, m.num_params * sizeof(float));

    int ok = compare("logits", ours.logits, ref.logits, ref.B * ref.T * ref.V, TOL_LOGITS);
    ok &= compare("loss", &ours.loss, &ref.loss, 1, TOL_LOSS);
    size_t offset = 0;
    for (int i = 0; i < N_PARAM_TENSORS; i++) {
        if (m.param_sizes[i] == 0) { continue; }
        char name[32];
        snprintf(name, sizeof(name), "d%s", PARAM_INFO[i].name);
        ok &= compare(name, ours.grads + offset, ref.grads + offset, m.param_sizes[i], TOL_GRADS);
        offset += m.param_sizes[i];
    }

    // replay K AdamW steps on the same batch, each loss taken before its update
    const float* hp = ref.hyper;
    for (size_t k = 0; k < ref.K; k++) {
        ours.losses[k] = model_forward(&m, ref.x, ref.y, ref.B, ref.T);
        model_zero_grad(&m);
        model_backward(&m);
        model_update(&m, hp[2], hp[3], hp[4], hp[5], hp[6], (int)k + 1);
    }
    if (ref.K > 0) { ok &= compare("adamw_losses", ours.losses, ref.losses, ref.K, TOL_ADAMW_LOSSES); }

    if (out_path != NULL) { write_state(&ours, out_path); }
    printf("%s\n", ok ? "PASS" : "FAIL");
    model_free(&m);
    return ok ? 0 : 1;
}
