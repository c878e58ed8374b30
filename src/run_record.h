// run_record.h — the checks a training run makes before it trains: that a checkpoint it
// resumes comes from this very run (its RunRecord, checkpoint.h), and that the run fits in
// memory. The paths it writes are checked by outputs.h.
#ifndef ATTNRES_RUN_RECORD_H
#define ATTNRES_RUN_RECORD_H

#include <stddef.h>
#include "checkpoint.h"
#include "dataset.h"
#include "distributed.h"
#include "options.h"

// What a checkpoint records of this run: the settings that make it this run
RunRecord run_record_of(const Options* o, const Dataset* ds, int best_step, float best_val_loss);
// --resume: reads the record of checkpoint `path` into *was (*recorded 0: a version 1 file,
// which records none) and compares it with this run's, `now`: the same task, data, batch,
// schedule, optimiser and seed, or the resumed losses would not continue the interrupted
// ones. 0, or -1 with one line in err naming the first flag that differs.
int run_record_check_resume(const char* path, const RunRecord* now, RunRecord* was,
                            int* recorded, char* err, size_t err_len);
// MemAvailable of /proc/meminfo in bytes: what can be allocated without swapping; 0 if unknown
size_t available_memory(void);
// What a run will allocate, before it does: parameters, gradients and AdamW state (4 floats
// per parameter; with several processes the moments and summed gradients of this process's
// shard alone), the activations of B x T tokens (the training batch, which the evaluation's
// batches share: the size table of model.h, point_activations), rank 0's evaluation decoder
// (decoder_sequences of them), the batch buffers, and the data (data_bytes, allocated before).
// Into *bytes, and the activations alone into *activation_bytes; -1 with one line in err
// when the whole is more than the memory available: the run would swap for minutes (or be
// killed) rather than train.
int run_memory_check(const ModelConfig* c, size_t B, size_t T, size_t decoder_sequences,
                     const Dist* dist, size_t data_bytes, size_t* bytes,
                     size_t* activation_bytes, char* err, size_t err_len);

#endif
