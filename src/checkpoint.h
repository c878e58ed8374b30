// checkpoint.h — model checkpoints: a 256-int header, then parameters, then AdamW state.
//
// Format (little-endian, documented in docs/training.md, "Checkpoints"):
//   int32[256] header: [0] magic 20261124, [1] version 3, [2] V, [3] d, [4] L, [5] H,
//                      [6] G, [7] F, [8] S (0 none, 1 full, >= 2 block), [9] completed
//                      steps, [10..11] number of parameters n_params (low, high 32 bits),
//                      [12] 1 if the run that wrote it is recorded in [13..127] (RunRecord,
//                      laid out in checkpoint.c; [34] the schedule, 0 cosine or 1 wsd, and
//                      [35] wsd's decay fraction as float bits, 0 for cosine; [36] the
//                      optimiser, 0 adamw or 1 muon, and [37] Muon's momentum as float
//                      bits, 0 for adamw; [38] --microbatches M, 0 for 1), [128..133] the
//                      depth-attention variant (ModelConfig's depth_score .. mixing, the
//                      values of a state file's [13..18]), [134] mHC-lite's streams m (0:
//                      not mhc, the state file's [19]); rest 0
//   float32[n_params] each: the parameters (canonical order), AdamW m, AdamW v
// Version 1 files (no run record) and 2 (no variant: the default model) still load; files
// written before [34..38] were used hold zeros there, which read as cosine, adamw and M = 1:
// no new version. Files are written to PATH.tmp.<pid> (the process's own: two runs saving to
// one PATH never write into the same file), synced to the disk and renamed over PATH, so
// neither a crash, a power cut nor a second run leaves a torn file. A file whose parameters or moments hold NaN or
// Inf is refused at load.
#ifndef ATTNRES_CHECKPOINT_H
#define ATTNRES_CHECKPOINT_H

#include <stddef.h>
#include "model.h"

#ifdef __cplusplus
extern "C" {
#endif

#define CHECKPOINT_MAGIC 20261124
#define CHECKPOINT_VERSION 3

// What a checkpoint records of the run that wrote it, so that --resume can refuse other
// settings and --sample can start from the training's.
typedef struct {
    int task;                      // TaskKind (dataset.h)
    int length, symbols;           // tasks
    int seq_len, batch, steps, warmup, eval_examples;
    unsigned long long seed;
    float lr, final_lr_frac, weight_decay, grad_clip, beta1, beta2, adam_eps;
    int schedule;                  // 0 cosine, 1 wsd (options.h's SCHEDULE_*)
    float decay_frac;              // wsd's --decay-frac; 0 for cosine
    int optimizer;                 // 0 adamw, 1 muon (options.h's OPTIMIZER_*)
    float muon_momentum;           // muon's --muon-momentum; 0 for adamw
    int microbatches;              // --microbatches M (1 in files older than the slot)
    char text_name[256];           // text: the file's name, without its folders ...
    unsigned long long text_bytes; // ... and its size
    int best_step;                 // the best validation loss so far and its step (0: none)
    float best_val_loss;
} RunRecord;

// 1 if the file at path begins with CHECKPOINT_MAGIC (a checkpoint, whole or not), else 0
int checkpoint_has_magic(const char* path);
// The temporary file checkpoint_save writes before the rename: PATH.tmp.<this process's
// id>. 0, or -1 if it does not fit in len bytes.
int checkpoint_temp_path(char* tmp, size_t len, const char* path);
// Removes the temporary files PATH.tmp.<pid> that a process killed during a save left
// behind: those whose process no longer exists (another run's live save is left alone).
// Returns how many it removed.
int checkpoint_remove_stale_temps(const char* path);
// Writes the n buffers parts[i] (sizes[i] bytes each) one after the other to PATH.tmp.<pid>
// (checkpoint_temp_path), syncs it to the disk and renames it over path, so that path holds
// the old file or the new one, whole; a path that exists and is no regular file (a directory,
// a device, a pipe) is refused. `what` names the file in err ("checkpoint").
// 0, or -1 with one line in err.
int write_file_atomically(const char* path, const char* what, const void* const* parts,
                          const size_t* sizes, int n, char* err, size_t err_len);
// Each returns 0 on success, or -1 after writing a one-line reason into err.
// run (may be NULL: none recorded) is stored in the header.
int checkpoint_save(const Model* m, const RunRecord* run, const char* path, int step,
                    char* err, size_t err_len);
// Reads the header only: the config and step stored in the file (checks magic, version, size).
int checkpoint_read_config(const char* path, ModelConfig* config, int* step,
                           char* err, size_t err_len);
// Reads the run record; *recorded is 0 for a file that has none (version 1). A record no run
// could have written (a task out of range, a negative count) is refused as corrupt.
int checkpoint_read_run(const char* path, RunRecord* run, int* recorded, char* err,
                        size_t err_len);
// Loads parameters and optimiser state into m, whose config must equal the file's.
int checkpoint_load(Model* m, const char* path, int* step, char* err, size_t err_len);

#ifdef __cplusplus
}
#endif
#endif
