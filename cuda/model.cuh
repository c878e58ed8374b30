// model.cuh — the whole model on the GPU, the mirror of src/model.h.
//
// The GPU model is a Model (model.h) built on the device: the same config, parameter table,
// activation size table and orchestration (src/model.c), with every buffer in device memory
// and the CUDA kernels in its kernel table. model_X_cuda mirrors model_X, same arguments in
// the same order; host arrays (tokens, targets) stay host arrays and are copied over. Plain
// C, as src/model.h; cuda/model.cu implements it, cuda/trainer.cu trains with it. Everything
// runs on cuda_stream (common.cuh); the calls that return a number to the host synchronise.
#ifndef ATTNRES_MODEL_CUH
#define ATTNRES_MODEL_CUH

#include <stddef.h>
#include "distributed.h"
#include "model.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct CudaGraph CudaGraph;  // work captured once, replayed (cuda/common.cuh)

typedef struct {
    Model model;      // every buffer on the device; model.kernels is the CUDA kernel table
    int* tokens;      // device (max_B*max_T): the last forward's tokens
    int* targets;     // device: its targets
    float* readback;  // page-locked host memory (max_B*max_T + NORM_PARTIALS): what a
                      // training step reads back, in one go (model_forward_backward_cuda)
    // The step as CUDA graphs (model_use_graph_cuda), each captured at its first use:
    int graph;                       // 1: the step's calls below capture or walk, then replay
    CudaGraph* step_graph;           // forward, zero grad, backward, the read-back's copies,
    size_t graph_B, graph_T;         // for batches of this shape
    const int *step_tokens, *step_targets;  // its batch (host), copied in before the launch
    CudaGraph* update_graphs[2][2];  // clipping or not, then the update: [Muon][clipped]
} ModelCuda;

// NULL when there is a CUDA device to train on, else one line saying what is missing: no
// device (or no NVIDIA driver at all), a driver older than this build's CUDA, another error.
const char* cuda_device_problem(void);
// Every matmul through cuBLAS SGEMM (float32) instead of cuda/linear.cu's: --cublas.
void model_use_cublas_cuda(int on);

// Allocates every device buffer (params, grads and AdamW state zeroed). Exits with a one-line
// error when an AttnRes model needs more depth-attention sources than the kernel takes
// (DEPTH_ATTENTION_MAX_SOURCES: full mode up to L = 31).
void model_build_cuda(ModelCuda* m, const ModelConfig* c, size_t max_B, size_t max_T);
void model_free_cuda(ModelCuda* m);
// Parameters and AdamW state (m, v) between a host Model and its device twin (same config).
void model_to_device_cuda(ModelCuda* m, const Model* host);
void model_to_host_cuda(Model* host, const ModelCuda* m);

// As model_forward: tokens and targets (B,T) are host arrays; targets may be NULL.
float model_forward_cuda(ModelCuda* m, const int* tokens, const int* targets, size_t B, size_t T);
// (B,T,V) logits and probabilities of the last forward, in device memory.
const float* model_logits_cuda(const ModelCuda* m);
const float* model_probs_cuda(const ModelCuda* m);
void model_zero_grad_cuda(ModelCuda* m);
void model_backward_cuda(ModelCuda* m);
float model_grad_norm_cuda(const ModelCuda* m);
// ./train_cuda's training step (one process), the GPU never waiting on the host until the
// read-back, in train.c's calls: model_step_forward_cuda uploads the batch (host arrays,
// targets required; n_targets: the targets of the batch whose mean loss is taken) and queues
// the forward; model_zero_grad_cuda queues the zeroing; model_step_backward_cuda queues the
// backward, the gradient norm's partial sums and the copies of the read-back;
// model_step_loss_and_norm_cuda waits for them, ONE read-back, and returns the loss and the
// gradient norm in *norm; model_update_step_cuda queues clipping and the update. With
// model_use_graph_cuda(m, 1) each of the two queued parts is a CUDA graph, captured at its
// first use and replayed after: the same kernels, in the same order, with the same
// arguments, so the same results bit for bit (docs/cuda.md, "The captured step"). The step
// graph's capture (or walk) begins in model_step_forward_cuda and ends in
// model_step_backward_cuda, which then uploads the batch and launches it. A graph keeps the
// addresses of the shared scratch (cuda_workspace), which a model built later and larger
// would move: build every model before the first step of any.
void model_use_graph_cuda(ModelCuda* m, int on);
void model_step_forward_cuda(ModelCuda* m, const int* tokens, const int* targets,
                             size_t n_targets, size_t B, size_t T);
void model_step_backward_cuda(ModelCuda* m);
float model_step_loss_and_norm_cuda(ModelCuda* m, float* norm);
// The update after the read-back: the gradient clipped to max_norm when its norm is larger
// (max_norm 0: never), then the optimiser's step t (from 1): AdamW on every tensor, or with
// muon, Muon on the layers' matrices (momentum muon_momentum) and AdamW on the rest
typedef struct {
    float norm, max_norm;
    int muon;
    float lr, beta1, beta2, eps, weight_decay, muon_momentum;
    int t;
} ModelUpdate;
void model_update_step_cuda(ModelCuda* m, const ModelUpdate* u);
// The step of one process of several (data parallel, ZeRO-1; never captured):
// model_forward_losses_cuda uploads the batch and queues the forward (n_targets: every
// process's targets); model_zero_grad_cuda and model_backward_cuda follow it; then ONE
// read-back: the gradients summed over the processes with this one's shard [lo, hi) of the
// sum in grad_shard (device, distributed.cuh), its sequences' loss sum and the shard's squared
// sum, for the caller to add over the processes (model_loss_and_shard_norm_cuda).
void model_forward_losses_cuda(ModelCuda* m, const int* tokens, const int* targets,
                               size_t n_targets, size_t B, size_t T);
void model_loss_and_shard_norm_cuda(ModelCuda* m, const Dist* d, float* grad_shard, size_t lo,
                                    size_t hi, double* loss_sum, double* shard_sum_sq);
// A training step's forward, zero_grad, backward and gradient norm with ONE read-back: the
// GPU runs them without waiting on the host, then the positions' losses and the norm's partial
// sums come back together. *loss and *norm equal what model_forward_cuda and
// model_grad_norm_cuda return, bit for bit. The step's calls above, from
// model_step_forward_cuda to model_step_loss_and_norm_cuda, in one (a CUDA graph with
// model_use_graph_cuda), for bench_cuda and the tests.
void model_forward_backward_cuda(ModelCuda* m, const int* tokens, const int* targets, size_t B,
                                 size_t T, float* loss, float* norm);
// The same for one process of several (data parallel, ZeRO-1): forward and backward on this
// process's sequences, whose loss is their share of the global batch's mean (n_targets: the
// global batch's targets); the gradients summed over the processes, this one's shard
// [lo, hi) of the sum into grad_shard (device, distributed.cuh); then one read-back: the
// sequences' loss sum (*loss_sum) and the shard's squared sum (*shard_sum_sq), for the caller to
// add over the processes.
void model_forward_backward_shard_cuda(ModelCuda* m, const int* tokens, const int* targets,
                                       size_t n_targets, size_t B, size_t T, const Dist* d,
                                       float* grad_shard, size_t lo, size_t hi,
                                       double* loss_sum, double* shard_sum_sq);
// Waits until everything queued on the GPU has run (for timing).
void model_wait_cuda(void);
// Clipping as src/trainer.c does it on the host: when norm > max_norm, grads *= max_norm / norm.
void model_clip_gradients_cuda(ModelCuda* m, float norm, float max_norm);
void model_update_cuda(ModelCuda* m, float lr, float beta1, float beta2, float eps,
                       float weight_decay, int t);

#ifdef __cplusplus
}
#endif
#endif
