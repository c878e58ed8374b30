// checkpoint.c — save and load checkpoints (format in checkpoint.h).
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include "checkpoint.h"
#include "util.h"

static void config_to_header(const ModelConfig* c, int* header) {
    header[2] = c->vocab_size; header[3] = c->d_model; header[4] = c->n_layers;
    header[5] = c->n_heads; header[6] = c->n_kv_heads; header[7] = c->ffn_hidden;
    header[8] = c->block_size;
}

static void header_to_config(const int* header, ModelConfig* c) {
    c->vocab_size = header[2]; c->d_model = header[3]; c->n_layers = header[4];
    c->n_heads = header[5]; c->n_kv_heads = header[6]; c->ffn_hidden = header[7];
    c->block_size = header[8];
}

int checkpoint_save(const Model* m, const char* path, int step, char* err, size_t err_len) {
    char tmp[4096];
    if (snprintf(tmp, sizeof(tmp), "%s.tmp", path) >= (int)sizeof(tmp)) {
        snprintf(err, err_len, "checkpoint path is too long");
        return -1;
    }
    FILE* f = fopen(tmp, "wb");
    if (f == NULL) {
        snprintf(err, err_len, "cannot write checkpoint %s: %s", tmp, strerror(errno));
        return -1;
    }
    int header[256] = {0};
    header[0] = CHECKPOINT_MAGIC;
    header[1] = CHECKPOINT_VERSION;
    config_to_header(&m->config, header);
    header[9] = step;
    header[10] = (int)(m->num_params & 0xffffffffu);
    header[11] = (int)(m->num_params >> 32);
    size_t P = m->num_params;
    int ok = fwrite(header, sizeof(int), 256, f) == 256 &&
             fwrite(m->params_memory, sizeof(float), P, f) == P &&
             fwrite(m->m_memory, sizeof(float), P, f) == P &&
             fwrite(m->v_memory, sizeof(float), P, f) == P;
    ok = (fclose(f) == 0) && ok;
    if (!ok || rename(tmp, path) != 0) {
        snprintf(err, err_len, "cannot write checkpoint %s: %s", path, strerror(errno));
        remove(tmp);
        return -1;
    }
    return 0;
}

// Opens path and checks its header and size; on success *f is positioned after the header.
static int open_checked(const char* path, FILE** f, int* header, char* err, size_t err_len) {
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
    } else if (header[1] != CHECKPOINT_VERSION) {
        snprintf(err, err_len, "checkpoint %s has version %d, this build reads version %d",
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
        size_t P = param_sizes(&c, sizes);
        size_t stored = (size_t)(unsigned)header[10] | ((size_t)(unsigned)header[11] << 32);
        size_t expected = 256 * sizeof(int) + 3 * P * sizeof(float);
        if (stored != P || header[9] < 0) {
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

int checkpoint_load(Model* m, const char* path, int* step, char* err, size_t err_len) {
    FILE* f;
    int header[256];
    if (open_checked(path, &f, header, err, err_len) != 0) { return -1; }
    ModelConfig c;
    header_to_config(header, &c);
    if (memcmp(&c, &m->config, sizeof(c)) != 0) {
        snprintf(err, err_len,
                 "checkpoint %s has config V=%d d=%d L=%d H=%d G=%d F=%d S=%d, the flags ask for "
                 "V=%d d=%d L=%d H=%d G=%d F=%d S=%d", path, c.vocab_size, c.d_model, c.n_layers,
                 c.n_heads, c.n_kv_heads, c.ffn_hidden, c.block_size, m->config.vocab_size,
                 m->config.d_model, m->config.n_layers, m->config.n_heads, m->config.n_kv_heads,
                 m->config.ffn_hidden, m->config.block_size);
        fclose(f);
        return -1;
    }
    size_t P = m->num_params;
    int ok = fread(m->params_memory, sizeof(float), P, f) == P &&
             fread(m->m_memory, sizeof(float), P, f) == P &&
             fread(m->v_memory, sizeof(float), P, f) == P;
    fclose(f);
    if (!ok) {
        snprintf(err, err_len, "checkpoint %s could not be read completely", path);
        return -1;
    }
    *step = header[9];
    return 0;
}
