// checkpoint.c — save and load checkpoints (format in checkpoint.h).
#define _POSIX_C_SOURCE 200809L  // stat, fileno, fsync, kill
#include <dirent.h>
#include <errno.h>
#include <signal.h>
#include <stdlib.h>
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include "checkpoint.h"
#include "dataset.h"  // TaskKind
#include "util.h"

enum { VARIANT_SLOTS = 128 };  // [128..133]: depth_score, key_norm_off, ..., mixing
enum { STREAMS_SLOT = 134 };   // mHC-lite's m (0: not mhc)

static void config_to_header(const ModelConfig* c, int* header) {
    header[2] = c->vocab_size; header[3] = c->d_model; header[4] = c->n_layers;
    header[5] = c->n_heads; header[6] = c->n_kv_heads; header[7] = c->ffn_hidden;
    header[8] = c->block_size;
    int variant[] = {c->depth_score, c->key_norm_off, c->depth_query, c->depth_heads,
                     c->depth_window, c->mixing};
    memcpy(header + VARIANT_SLOTS, variant, sizeof(variant));
    header[STREAMS_SLOT] = c->streams;
}

// versions 1 and 2 hold zeros there: the default model, which is all they could save
static void header_to_config(const int* header, ModelConfig* c) {
    c->vocab_size = header[2]; c->d_model = header[3]; c->n_layers = header[4];
    c->n_heads = header[5]; c->n_kv_heads = header[6]; c->ffn_hidden = header[7];
    c->block_size = header[8];
    int* variant[] = {&c->depth_score, &c->key_norm_off, &c->depth_query, &c->depth_heads,
                      &c->depth_window, &c->mixing};
    for (int i = 0; i < 6; i++) { *variant[i] = header[1] >= 3 ? header[VARIANT_SLOTS + i] : 0; }
    c->streams = header[1] >= 3 ? header[STREAMS_SLOT] : 0;
    // one head, and a window of all the sources (W >= 2L in full mode), as ./train stores them
    if (c->depth_heads == 1) { c->depth_heads = 0; }
    if (c->block_size == 1 && c->depth_window >= 2 * c->n_layers) { c->depth_window = 0; }
}

// The run record's slots in the header: ints as they are, 64-bit values as two slots (low,
// high), floats as their bits, the text file's name as bytes in [64..127].
enum { RUN_FLAG = 12, RUN_TASK = 13, RUN_LENGTH, RUN_SYMBOLS, RUN_SEQ_LEN, RUN_BATCH,
       RUN_STEPS, RUN_WARMUP, RUN_EVAL_EXAMPLES, RUN_SEED_LO, RUN_SEED_HI, RUN_TEXT_LO,
       RUN_TEXT_HI, RUN_LR, RUN_FINAL_LR_FRAC, RUN_WEIGHT_DECAY, RUN_GRAD_CLIP, RUN_BETA1,
       RUN_BETA2, RUN_ADAM_EPS, RUN_BEST_STEP, RUN_BEST_VAL, RUN_SCHEDULE, RUN_DECAY_FRAC,
       RUN_OPTIMIZER, RUN_MUON_MOMENTUM, RUN_MICROBATCHES, RUN_TEXT_NAME = 64 };

static int float_bits(float x) { int i; memcpy(&i, &x, sizeof(i)); return i; }
static float bits_float(int i) { float x; memcpy(&x, &i, sizeof(x)); return x; }

static void run_to_header(const RunRecord* r, int* h) {
    int ints[] = {r->task, r->length, r->symbols, r->seq_len, r->batch, r->steps, r->warmup,
                  r->eval_examples};
    memcpy(h + RUN_TASK, ints, sizeof(ints));
    h[RUN_SEED_LO] = (int)(r->seed & 0xffffffffu);
    h[RUN_SEED_HI] = (int)(r->seed >> 32);
    h[RUN_TEXT_LO] = (int)(r->text_bytes & 0xffffffffu);
    h[RUN_TEXT_HI] = (int)(r->text_bytes >> 32);
    float floats[] = {r->lr, r->final_lr_frac, r->weight_decay, r->grad_clip, r->beta1,
                      r->beta2, r->adam_eps};
    for (int i = 0; i < 7; i++) { h[RUN_LR + i] = float_bits(floats[i]); }
    h[RUN_BEST_STEP] = r->best_step;
    h[RUN_BEST_VAL] = float_bits(r->best_val_loss);
    h[RUN_SCHEDULE] = r->schedule;
    h[RUN_DECAY_FRAC] = float_bits(r->decay_frac);
    h[RUN_OPTIMIZER] = r->optimizer;
    h[RUN_MUON_MOMENTUM] = float_bits(r->muon_momentum);
    // M, or 0 for one (as files older than the slot hold): without the flag, the same bytes
    h[RUN_MICROBATCHES] = r->microbatches > 1 ? r->microbatches : 0;
    memcpy(h + RUN_TEXT_NAME, r->text_name, sizeof(r->text_name));
    h[RUN_FLAG] = 1;
}

static void header_to_run(const int* h, RunRecord* r) {
    int* ints[] = {&r->task, &r->length, &r->symbols, &r->seq_len, &r->batch, &r->steps,
                   &r->warmup, &r->eval_examples};
    for (int i = 0; i < 8; i++) { *ints[i] = h[RUN_TASK + i]; }
    r->seed = (unsigned long long)(unsigned)h[RUN_SEED_LO] | (unsigned long long)(unsigned)h[RUN_SEED_HI] << 32;
    r->text_bytes = (unsigned long long)(unsigned)h[RUN_TEXT_LO] | (unsigned long long)(unsigned)h[RUN_TEXT_HI] << 32;
    float* floats[] = {&r->lr, &r->final_lr_frac, &r->weight_decay, &r->grad_clip, &r->beta1,
                       &r->beta2, &r->adam_eps};
    for (int i = 0; i < 7; i++) { *floats[i] = bits_float(h[RUN_LR + i]); }
    r->best_step = h[RUN_BEST_STEP];
    r->best_val_loss = bits_float(h[RUN_BEST_VAL]);
    r->schedule = h[RUN_SCHEDULE];  // 0 (cosine) in files older than the slot
    r->decay_frac = bits_float(h[RUN_DECAY_FRAC]);
    r->optimizer = h[RUN_OPTIMIZER];  // 0 (adamw) in files older than the slot
    r->muon_momentum = bits_float(h[RUN_MUON_MOMENTUM]);
    r->microbatches = h[RUN_MICROBATCHES] == 0 ? 1 : h[RUN_MICROBATCHES];  // 0 in older files
    memcpy(r->text_name, h + RUN_TEXT_NAME, sizeof(r->text_name));
    r->text_name[sizeof(r->text_name) - 1] = '\0';
}

int checkpoint_has_magic(const char* path) {
    FILE* f = fopen(path, "rb");
    if (f == NULL) { return 0; }
    int magic = 0;
    int read = fread(&magic, sizeof(magic), 1, f) == 1;
    fclose(f);
    return read && magic == CHECKPOINT_MAGIC;
}

int checkpoint_temp_path(char* tmp, size_t len, const char* path) {
    int n = snprintf(tmp, len, "%s.tmp.%ld", path, (long)getpid());
    return n >= 0 && (size_t)n < len ? 0 : -1;
}

int checkpoint_remove_stale_temps(const char* path) {
    char folder[4096];
    const char* slash = strrchr(path, '/');
    const char* name = slash ? slash + 1 : path;
    if (slash == NULL) { snprintf(folder, sizeof(folder), "."); }
    else if (slash == path) { snprintf(folder, sizeof(folder), "/"); }
    else { snprintf(folder, sizeof(folder), "%.*s", (int)(slash - path), path); }
    char prefix[4200];
    snprintf(prefix, sizeof(prefix), "%s.tmp.", name);
    size_t n = strlen(prefix);
    DIR* d = opendir(folder);
    if (d == NULL) { return 0; }
    int removed = 0;
    for (struct dirent* e = readdir(d); e != NULL; e = readdir(d)) {
        const char* pid_text = e->d_name + n;
        size_t digits = strncmp(e->d_name, prefix, n) == 0 ? strspn(pid_text, "0123456789") : 0;
        if (digits == 0 || digits > 9 || pid_text[digits] != '\0') { continue; }
        long pid = strtol(pid_text, NULL, 10);
        // the writer is gone: no process has that id (kill with signal 0 sends nothing)
        if (pid <= 0 || pid == (long)getpid() || kill((pid_t)pid, 0) == 0 || errno != ESRCH) {
            continue;
        }
        char stale[8400];
        snprintf(stale, sizeof(stale), "%s/%s", folder, e->d_name);
        removed += unlink(stale) == 0;
    }
    closedir(d);
    return removed;
}

int write_file_atomically(const char* path, const char* what, const void* const* parts,
                          const size_t* sizes, int n, char* err, size_t err_len) {
    if (!replaceable_by_rename(path)) {
        snprintf(err, err_len, "cannot write %s %s: it exists and is not a regular file", what,
                 path);
        return -1;
    }
    char tmp[4096];
    if (checkpoint_temp_path(tmp, sizeof(tmp), path) != 0) {
        snprintf(err, err_len, "%s path is too long", what);
        return -1;
    }
    FILE* f = fopen(tmp, "wb");
    if (f == NULL) {
        snprintf(err, err_len, "cannot write %s %s: %s", what, tmp, strerror(errno));
        return -1;
    }
    int ok = 1;
    for (int i = 0; i < n; i++) { ok = ok && fwrite(parts[i], 1, sizes[i], f) == sizes[i]; }
    // on the disk before the rename: after a power cut PATH is then the old file or the new
    // one, whole (without fsync the rename may reach the disk before the data)
    ok = ok && fflush(f) == 0 && fsync(fileno(f)) == 0;
    ok = (fclose(f) == 0) && ok;
    if (!ok || rename(tmp, path) != 0) {
        snprintf(err, err_len, "cannot write %s %s: %s", what, path, strerror(errno));
        remove(tmp);
        return -1;
    }
    return 0;
}

int checkpoint_save(const Model* m, const RunRecord* run, const char* path, int step,
                    char* err, size_t err_len) {
    int header[256] = {0};
    header[0] = CHECKPOINT_MAGIC;
    header[1] = CHECKPOINT_VERSION;
    config_to_header(&m->config, header);
    header[9] = step;
    header[10] = (int)(m->num_params & 0xffffffffu);
    header[11] = (int)(m->num_params >> 32);
    if (run != NULL) { run_to_header(run, header); }
    size_t bytes = m->num_params * sizeof(float);
    const void* parts[] = {header, m->params_memory, m->m_memory, m->v_memory};
    const size_t sizes[] = {sizeof(header), bytes, bytes, bytes};
    return write_file_atomically(path, "checkpoint", parts, sizes, 4, err, err_len);
}

// Opens path and checks its header and size; on success *f is positioned after the header.
static int open_checked(const char* path, FILE** f, int* header, char* err, size_t err_len) {
    struct stat info;
    if (stat(path, &info) == 0 && S_ISDIR(info.st_mode)) {
        snprintf(err, err_len, "checkpoint %s is a directory, not a checkpoint file", path);
        return -1;
    }
    *f = fopen(path, "rb");
    if (*f == NULL) {
        snprintf(err, err_len, "cannot open checkpoint %s: %s", path, strerror(errno));
        return -1;
    }
    const char* problem = NULL;
    long file_size = -1;
    if (fseek(*f, 0, SEEK_END) == 0) { file_size = ftell(*f); }
    rewind(*f);
    if (file_size < 0 || fread(header, sizeof(int), 256, *f) != 256) {
        problem = "is truncated (no complete 256-int header)";
    } else if (header[0] != CHECKPOINT_MAGIC) {
        problem = "has the wrong magic number (not an attnres.c checkpoint)";
    } else if (header[1] < 1 || header[1] > CHECKPOINT_VERSION) {
        snprintf(err, err_len, "checkpoint %s has version %d, this build reads versions 1 to %d",
                 path, header[1], CHECKPOINT_VERSION);
        fclose(*f);
        return -1;
    } else {
        ModelConfig c;
        header_to_config(header, &c);
        char reason[256];
        size_t sizes[N_PARAM_TENSORS];
        if (model_config_check(&c, reason, sizeof(reason)) != 0) {
            snprintf(err, err_len, "checkpoint %s has an invalid config: %s", path, reason);
            fclose(*f);
            return -1;
        }
        size_t n_params = param_sizes(&c, sizes);
        size_t stored = (size_t)(unsigned)header[10] | ((size_t)(unsigned)header[11] << 32);
        size_t expected = 256 * sizeof(int) + 3 * n_params * sizeof(float);
        if (stored != n_params || header[9] < 0) {
            problem = "has a corrupt header (parameter count or step disagrees)";
        } else if ((size_t)file_size != expected) {
            snprintf(err, err_len, "checkpoint %s is %s: %ld bytes, expected %zu", path,
                     (size_t)file_size < expected ? "truncated" : "too long", file_size, expected);
            fclose(*f);
            return -1;
        }
    }
    if (problem != NULL) {
        snprintf(err, err_len, "checkpoint %s %s", path, problem);
        fclose(*f);
        return -1;
    }
    return 0;
}

int checkpoint_read_config(const char* path, ModelConfig* config, int* step,
                           char* err, size_t err_len) {
    FILE* f;
    int header[256];
    if (open_checked(path, &f, header, err, err_len) != 0) { return -1; }
    fclose(f);
    header_to_config(header, config);
    *step = header[9];
    return 0;
}

// A run record no run could have written, named in reason: a task or schedule that does not
// exist (its name would be read past TASK_NAMES), a decay fraction outside its schedule's
// values, a negative count, or a control character in the text file's name (an error message
// quoting it would not stay on one line). 0 if it is plausible.
static int run_record_problem(const RunRecord* r, char* reason, size_t len) {
    if (r->task < TASK_REVERSE || r->task > TASK_TEXT) {
        snprintf(reason, len, "task %d", r->task);
        return -1;
    }
    if (r->schedule != 0 && r->schedule != 1) {
        snprintf(reason, len, "schedule %d", r->schedule);
        return -1;
    }
    int wsd = r->schedule == 1;
    if (wsd ? !(r->decay_frac > 0.0f && r->decay_frac < 1.0f) : r->decay_frac != 0.0f) {
        snprintf(reason, len, "decay fraction %g with schedule %s", (double)r->decay_frac,
                 wsd ? "wsd" : "cosine");
        return -1;
    }
    if (r->optimizer != 0 && r->optimizer != 1) {
        snprintf(reason, len, "optimizer %d", r->optimizer);
        return -1;
    }
    int muon = r->optimizer == 1;
    if (muon ? !(r->muon_momentum >= 0.0f && r->muon_momentum < 1.0f) : r->muon_momentum != 0.0f) {
        snprintf(reason, len, "Muon momentum %g with optimizer %s", (double)r->muon_momentum,
                 muon ? "muon" : "adamw");
        return -1;
    }
    const char* names[] = {"length", "symbols", "seq_len", "batch", "microbatches", "steps",
                           "warmup", "eval_examples", "best_step"};
    const int values[] = {r->length, r->symbols, r->seq_len, r->batch, r->microbatches,
                          r->steps, r->warmup, r->eval_examples, r->best_step};
    for (int i = 0; i < 9; i++) {
        if (values[i] < 0) {
            snprintf(reason, len, "%s %d", names[i], values[i]);
            return -1;
        }
    }
    for (const char* c = r->text_name; *c != '\0'; c++) {
        if ((unsigned char)*c < 0x20 || *c == 0x7f) {
            snprintf(reason, len, "a control character in the text file's name");
            return -1;
        }
    }
    return 0;
}

int checkpoint_read_run(const char* path, RunRecord* run, int* recorded, char* err,
                        size_t err_len) {
    FILE* f;
    int header[256];
    if (open_checked(path, &f, header, err, err_len) != 0) { return -1; }
    fclose(f);
    memset(run, 0, sizeof(*run));
    *recorded = header[1] >= 2 && header[RUN_FLAG] == 1;
    if (*recorded) { header_to_run(header, run); }
    char reason[128];
    int corrupt = header[1] >= 2 && header[RUN_FLAG] != 0 && header[RUN_FLAG] != 1;
    if (corrupt) {
        snprintf(reason, sizeof(reason), "its flag is %d, not 0 or 1", header[RUN_FLAG]);
    } else if (*recorded) {
        corrupt = run_record_problem(run, reason, sizeof(reason)) != 0;
    }
    if (corrupt) {
        snprintf(err, err_len, "checkpoint %s has a corrupt run record (%s)", path, reason);
        return -1;
    }
    return 0;
}

// " mhc m=4" for an mHC-lite config, "" otherwise (for the config-mismatch message)
static const char* streams_note(const ModelConfig* c) {
    static const char* const notes[] = {"", "", " mhc m=2", " mhc m=3", " mhc m=4"};
    return c->streams >= 2 && c->streams <= 4 ? notes[c->streams] : "";
}

int checkpoint_load(Model* m, const char* path, int* step, char* err, size_t err_len) {
    FILE* f;
    int header[256];
    if (open_checked(path, &f, header, err, err_len) != 0) { return -1; }
    ModelConfig c;
    header_to_config(header, &c);
    if (memcmp(&c, &m->config, sizeof(c)) != 0) {
        char have[128], want[128];
        variant_describe(&c, have, sizeof(have));
        variant_describe(&m->config, want, sizeof(want));
        snprintf(err, err_len,
                 "checkpoint %s has config V=%d d=%d L=%d H=%d G=%d F=%d S=%d%s (%s), the flags "
                 "ask for V=%d d=%d L=%d H=%d G=%d F=%d S=%d%s (%s)", path, c.vocab_size,
                 c.d_model, c.n_layers, c.n_heads, c.n_kv_heads, c.ffn_hidden, c.block_size,
                 streams_note(&c), have, m->config.vocab_size, m->config.d_model,
                 m->config.n_layers, m->config.n_heads, m->config.n_kv_heads,
                 m->config.ffn_hidden, m->config.block_size, streams_note(&m->config), want);
        fclose(f);
        return -1;
    }
    // read everything first, so that a file refused below leaves m as it was
    size_t n_params = m->num_params;
    float* state = mallocCheck(3 * n_params * sizeof(float));  // parameters, m, v
    int ok = fread(state, sizeof(float), 3 * n_params, f) == 3 * n_params;
    fclose(f);
    if (!ok) {
        snprintf(err, err_len, "checkpoint %s could not be read completely", path);
        free(state);
        return -1;
    }
    // a NaN or Inf parameter would only train into more of them, and so would one in the
    // optimiser's moments (AdamW's m and v; Muon keeps its momentum in m) at the first update
    // of a resumed run: refuse either, naming the buffer and the tensor
    const char* buffers[] = {"parameters", "first moments", "second moments"};
    const float* tensor = state;
    for (int b = 0; b < 3; b++) {
        for (int i = 0; i < N_PARAM_TENSORS; i++) {
            for (size_t j = 0; j < m->param_sizes[i]; j++) {
                if (!isfinite(tensor[j])) {
                    snprintf(err, err_len, "checkpoint %s holds NaN/Inf %s (in %s): not loading "
                             "it", path, buffers[b], PARAM_INFO[i].name);
                    free(state);
                    return -1;
                }
            }
            tensor += m->param_sizes[i];
        }
    }
    memcpy(m->params_memory, state, n_params * sizeof(float));
    memcpy(m->m_memory, state + n_params, n_params * sizeof(float));
    memcpy(m->v_memory, state + 2 * n_params, n_params * sizeof(float));
    free(state);
    *step = header[9];
    return 0;
}
