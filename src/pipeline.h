// pipeline.h — pipeline parallelism over MPI (./train_mpi --pipeline P [--virtual V]): the
// model cut into C = P*V chunks of whole layers (and whole blocks), chunk c on stage c mod P,
// each stage running its chunks' forwards and backwards for M microbatches in the 1F1B order
// (interleaved when V > 1), and AttnRes's blocks carried between the stages with the paper's
// cross-stage caching (Attention Residuals, §4.1, eqs. 14-15). docs/pipeline.md explains it;
// src/pipeline.c reads top to bottom: the schedule, what travels, a microbatch's buffers,
// the forward and the backward of one chunk, the step, the optimiser, the accounting.
#ifndef ATTNRES_PIPELINE_H
#define ATTNRES_PIPELINE_H

#include <stddef.h>
#include "distributed.h"
#include "model.h"

#ifdef __cplusplus
extern "C" {
#endif

// One entry of a stage's schedule: the forward ('F') or backward ('B') of its chunk v
// (the model's chunk c = v*P + stage) on microbatch `micro`, in activation slot `slot`
typedef struct {
    char kind;
    int v, micro, slot;
} PipelineOp;

// Stage `stage`'s 2*M*V operations, in order, into ops (Megatron's 1F1B: warm-up forwards,
// one forward and one backward in turn, then the cool-down backwards; interleaved over the
// V chunks when V > 1); returns their number. Each op's slot is the lowest free one of its
// chunk, and slots[v] (when not NULL) the number chunk v needs: its microbatches in flight.
int pipeline_schedule(int P, int V, int M, int stage, PipelineOp* ops, int* slots);

// The schedule played on every stage at once, a forward taking 1 unit and a backward 2,
// each waiting for what it receives: the time the step takes (in units), the bubble (the
// idle share of P stages x that time), and -1 if the stages would wait on each other for
// ever. The formula's bubble is (P-1)/(V*M + P-1).
double pipeline_simulate(int P, int V, int M, double* bubble);

// What travels into chunk c (c >= 1) per token of a microbatch, in floats: the residual stream (d,
// none), the m streams (m*d, mhc) or the blocks b_0 .. b_{c*N_p} (d each, AttnRes; with the
// cache, the stage already holds those up to its previous chunk's output, and only the
// (P-1)*N_p new ones travel, once c >= P). The gradients travel back in the same sizes.
size_t pipeline_floats_into(const ModelConfig* config, int P, int V, int c, int cache);

// One line in err when the pipeline cannot cut this model or run this schedule, else 0
int pipeline_check(const ModelConfig* config, int P, int V, int M, int world, char* err,
                   size_t err_len);

// One forward or backward as it ran (--pipeline-trace): chunk is the model's c
typedef struct {
    double start, end;  // seconds since the run's start
    int step, stage, chunk, micro;
    char kind;
} PipelineEvent;

typedef struct Pipeline Pipeline;

// This process's stage of the pipeline: its V chunks' parameters (copied from `whole`, which
// every process builds and loads alike) and AdamW moments, activation slots for microbatches
// of `sequences` x T tokens, and the groups of world (dist_split). optimizer: OPTIMIZER_ADAMW
// or _MUON.
// Each chunk trains with a Trainer of its own (trainer.h); train.c calls pipeline_step,
// pipeline_loss_and_norm, pipeline_clip and pipeline_update in place of the trainer's step.
Pipeline* pipeline_create(const Model* whole, const Dist* world, int P, int V, int M,
                          int cache, size_t sequences, size_t T, int optimizer, float muon_momentum);
void pipeline_free(Pipeline* p);
// One step's forwards and backwards over this replica's M microbatches (x, y: M*sequences x T),
// of a global batch with n_targets targets: the gradients of this stage's chunks
void pipeline_step(Pipeline* p, const int* x, const int* y, size_t n_targets);
// The global batch's loss and gradient norm, as one process (or data parallel without the
// pipeline) sums them, bit for bit
float pipeline_loss_and_norm(Pipeline* p, Model* whole, float* norm);
void pipeline_clip(Pipeline* p, float norm, float max_norm);
void pipeline_update(Pipeline* p, float lr, float beta1, float beta2, float eps,
                     float weight_decay, int adam_t);
// Rank 0's whole model gets every stage's parameters and AdamW moments (every rank calls it)
void pipeline_gather(Pipeline* p, Model* whole);
// Rank 0 prints each stage's bytes a step, naive and cached, its memory, and the bubble
void pipeline_report(Pipeline* p, size_t whole_bytes, int steps);
// Rank 0 writes every stage's forwards and backwards (PipelineEvent) to a CSV file, through
// PATH.tmp.<pid> and a rename (outputs.c checked the path before step 1): 0, or -1 with one
// line in err
#define PIPELINE_TRACE_HEADER "step,stage,chunk,microbatch,kind,start_ms,end_ms"
int pipeline_write_trace(Pipeline* p, const char* path, char* err, size_t err_len);
// What this stage allocates: its chunks' parameters in floats (pipeline_param_floats), and
// everything in bytes (pipeline_memory_bytes)
size_t pipeline_param_floats(const Pipeline* p);
size_t pipeline_memory_bytes(const Pipeline* p);

#ifdef __cplusplus
}
#endif
#endif
