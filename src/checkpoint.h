// checkpoint.h — model checkpoints: a 256-int header, then parameters, then AdamW state.
//
// Format (little-endian, documented in README.md):
//   int32[256] header: [0] magic 20261124, [1] version 1, [2] V, [3] d, [4] L, [5] H,
//                      [6] G, [7] F, [8] S (0 none, 1 full, >= 2 block), [9] completed
//                      steps, [10..11] number of parameters P (low, high 32 bits); rest 0
//   float32[P] parameters, canonical order; float32[P] AdamW m; float32[P] AdamW v
// Files are written to PATH.tmp and renamed over PATH, so a crash never leaves a torn file.
#ifndef ATTNRES_CHECKPOINT_H
#define ATTNRES_CHECKPOINT_H

#include <stddef.h>
#include "model.h"

#ifdef __cplusplus
extern "C" {
#endif

#define CHECKPOINT_MAGIC 20261124
#define CHECKPOINT_VERSION 1

// Each returns 0 on success, or -1 after writing a one-line reason into err.
int checkpoint_save(const Model* m, const char* path, int step, char* err, size_t err_len);
// Reads the header only: the config and step stored in the file (checks magic, version, size).
int checkpoint_read_config(const char* path, ModelConfig* config, int* step,
                           char* err, size_t err_len);
// Loads parameters and optimiser state into m, whose config must equal the file's.
int checkpoint_load(Model* m, const char* path, int* step, char* err, size_t err_len);

#ifdef __cplusplus
}
#endif
#endif
