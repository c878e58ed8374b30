// trainer.h — where the training step runs: on the CPU (./train), on the GPU (./train_cuda),
// and with several processes (./train_mpi, ./train_cuda_mpi: data parallel, ZeRO-1).
//
// train.c's loop calls the step's parts in order, the same calls in every build, each doing
// what its name says:
//   trainer_forward -> trainer_zero_grad -> trainer_backward -> trainer_loss_and_norm ->
//   trainer_clip -> trainer_update
// With --microbatches M (the CPU builds), the forward and the backward run M times, each on
// B/M of the sequences, the gradients adding up (zeroed after the first forward only). With
// --pipeline P (./train_mpi), train.c calls src/pipeline.c's step (pipeline.h) instead, whose
// stages train their chunks with a Trainer each: a Trainer knows nothing of the pipeline.
// Two files implement this header, function for function: src/trainer.c on the CPU and
// cuda/trainer.cu on the GPU; a program links one of them (Makefile). One process or several
// is chosen when linking too, by the distributed layer (distributed.h): one process is a
// world of one.
// On the GPU the step runs on a device twin of the host Model (cuda/model.cuh), without
// waiting on the host until trainer_loss_and_norm reads back the loss and the norm. In one
// process (./train_cuda) the step runs as two CUDA graphs, replayed step after step
// (--no-graph: the same calls queued one by one): the first is captured (or walked, for the
// arguments that change) from trainer_forward to trainer_backward, which launches it; the
// second is clipping and the update, which trainer_clip sets up and trainer_update queues.
// Everything else (evaluation, decoding, diagnostics, checkpoints) is CPU code on the host
// Model, after trainer_to_host has copied the parameters and AdamW state there; so
// evaluation runs at CPU speed in every build.
#ifndef ATTNRES_TRAINER_H
#define ATTNRES_TRAINER_H

#include <stddef.h>
#include "distributed.h"
#include "model.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    Model* host;        // the Model in host memory: the one that trains in the CPU builds, the
                        // copy of the device twin's parameters in the GPU builds
    void* device;       // the GPU builds: the ModelCuda that trains; NULL in ./train
    Dist* dist;         // with Muon's shards, its shard_bounds are this trainer's
    // Data parallel: ZeRO-1, with several processes; and on the GPU whenever MPI started the
    // job (Dist's mpi), so that a run of one process there tests the NCCL path too. This rank
    // owns the shard [lo, hi) of the flat parameter buffer: the sum over the ranks of its
    // gradients (grad_shard) and its AdamW moments (m_shard, v_shard), on the device that
    // trains; the trained model's full moments are released (NULL), and so are the host's,
    // except on rank 0 while it writes a checkpoint.
    int sharded;
    size_t lo, hi;
    float *grad_shard, *m_shard, *v_shard;
    double comm_seconds;  // time spent in the collectives of the steps (waiting included)
    double loss_sum;      // the CPU: the step's sequences' losses so far, over its microbatches
    int optimizer;        // OPTIMIZER_ADAMW or OPTIMIZER_MUON (options.h)
    float muon_momentum;  // Muon's mu
    size_t* shard_bounds; // Muon with several ranks: the shards, cut between its matrices
    float clip_norm, clip_max_norm;  // ./train_cuda: trainer_clip's, for trainer_update
} Trainer;

// 1 in the GPU builds (./train_cuda, ./train_cuda_mpi), 0 in the CPU ones
int trainer_on_gpu(void);
// The GPU builds: this process's GPU (NCCL between the processes with MPI), --cublas, and
// whether ./train_cuda's step runs as CUDA graphs (graph: not --no-graph; never with
// --cublas, with ATTNRES_CUDA_SYNC set, or data parallel). 0, or -1 with one line in err
// when there is no GPU to train on. The CPU builds: 0.
int trainer_open_device(const Dist* dist, int cublas, int graph, char* err, size_t err_len);
void trainer_close_device(void);

// host holds the initial (or resumed) parameters and moments; B, T is this rank's batch;
// optimizer is OPTIMIZER_ADAMW or OPTIMIZER_MUON (options.h, with momentum muon_momentum).
// Sharded with Muon, dist's shards are set to model_muon_shard_bounds' (dist->shard_bounds).
void trainer_init(Trainer* t, Model* host, Dist* dist, size_t B, size_t T, int optimizer,
                  float muon_momentum);
void trainer_free(Trainer* t);
// The step. x, y (B,T) are this rank's sequences of the global batch (or of one microbatch of
// it), which has n_targets targets; trainer_loss_and_norm returns the global batch's loss
// and its gradient norm in *norm (over every microbatch and every rank: the gradients are
// summed first).
void trainer_forward(Trainer* t, const int* x, const int* y, size_t B, size_t T,
                     size_t n_targets);
void trainer_zero_grad(Trainer* t);
void trainer_backward(Trainer* t);
float trainer_loss_and_norm(Trainer* t, float* norm);
// the gradient scaled to norm max_norm when it is larger (max_norm 0: off); ./train_cuda
// queues the scaling with the update, as one CUDA graph, in trainer_update
void trainer_clip(Trainer* t, float norm, float max_norm);
// The optimiser's step adam_t (from 1): AdamW on every tensor, or Muon on the layers'
// matrices and AdamW on the rest; with several ranks, every rank then has the whole parameters
void trainer_update(Trainer* t, float lr, float beta1, float beta2, float eps,
                    float weight_decay, int adam_t);

// sharded, on every rank: the whole moments onto rank 0's host model, for a checkpoint
// (then trainer_drop_moments)
void trainer_gather_moments(Trainer* t);
void trainer_drop_moments(Trainer* t);
// the host Model gets the trained parameters and AdamW state (./train: it has them already)
void trainer_to_host(Trainer* t);
// the activations and raw gradients of the batch (x, y) on the host Model, for the
// diagnostics: the GPU builds redo the step's forward and backward there (logged steps only)
// (with several processes: rank 0 redoes the whole global batch, which x, y then are, on its
// host model: the shards' gradients are kept apart, in grad_shard)
void trainer_host_gradients(Trainer* t, const int* x, const int* y, size_t B, size_t T);

#ifdef __cplusplus
}
#endif
#endif
