// trainer.cu — the training step on the GPU, in one process (./train_cuda) or several
// (./train_cuda_mpi): the mirror of src/trainer.c, the same functions with the same names and
// in the same order, since train.c calls them alike and a program links one file or the other
// (Makefile). The step runs on a device twin of the host Model (cuda/model.cuh). One process
// or several is the distributed layer's, chosen when linking (src/distributed.c and
// cuda/distributed.cu built with MPI or without). Host code only: nvcc builds it for the GPU
// programs, and the emulator's build (tests/cuda_emu.h) as C++. The interface: trainer.h.
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "distributed.cuh"
#include "model.cuh"
#include "options.h"
#include "threads.h"
#include "trainer.h"
#include "util.h"

// The step as CUDA graphs (trainer_open_device): not with --no-graph, nor with --cublas
// (cuBLAS's calls are not launch_kernel's, which a captured step's walk follows), nor where
// ATTNRES_CUDA_SYNC asks to wait for each kernel, which a graph cannot
static int use_graph = 0;

// the device twin that trains
static ModelCuda* device(const Trainer* t) { return (ModelCuda*)t->device; }

int trainer_on_gpu(void) { return 1; }

int trainer_open_device(const Dist* dist, int cublas, int graph, char* err, size_t err_len) {
    const char* problem = cuda_device_problem();
    if (problem != NULL) {
        snprintf(err, err_len, "%s", problem);
        return -1;
    }
    dist_init_cuda(dist);  // this process's GPU, and NCCL between the processes (MPI build)
    if (cublas) model_use_cublas_cuda(1);
    const char* sync = getenv("ATTNRES_CUDA_SYNC");
    use_graph = graph && !cublas && (sync == NULL || sync[0] == '\0' || sync[0] == '0');
    return 0;
}

void trainer_close_device(void) { dist_finalize_cuda(); }

// The device twin trains. Sharded whenever MPI started the job, even with one process, so
// that a run of one tests the NCCL path too: this rank's shards of the summed gradients and
// of the moments are device arrays, and both models' full moments are released. In one
// process the step runs as CUDA graphs (unless use_graph is off).
void trainer_init(Trainer* t, Model* host, Dist* dist, size_t B, size_t T, int optimizer,
                  float muon_momentum) {
    memset(t, 0, sizeof(*t));
    t->host = host;
    t->dist = dist;
    t->optimizer = optimizer;
    t->muon_momentum = muon_momentum;
    t->sharded = dist->mpi || dist->world > 1;
    t->device = mallocCheck(sizeof(ModelCuda));
    model_build_cuda(device(t), &host->config, B, T);
    model_to_device_cuda(device(t), host);
    model_use_graph_cuda(device(t), !t->sharded && use_graph);
    if (!t->sharded) return;
    if (optimizer == OPTIMIZER_MUON) {  // a matrix is orthogonalised whole, by one rank
        t->shard_bounds = (size_t*)mallocCheck(((size_t)dist->world + 1) * sizeof(size_t));
        model_muon_shard_bounds(host, dist->world, t->shard_bounds);
        dist->shard_bounds = t->shard_bounds;
    }
    dist_shard_of(dist, host->num_params, dist->rank, &t->lo, &t->hi);
    size_t count = t->hi - t->lo;
    t->grad_shard = dist_shard_alloc_cuda(NULL, count);
    t->m_shard = dist_shard_alloc_cuda(host->m_memory + t->lo, count);
    t->v_shard = dist_shard_alloc_cuda(host->v_memory + t->lo, count);
    Model* trained = &device(t)->model;
    Model* both[2] = {trained, host};
    for (int k = 0; k < 2; k++) {
        both[k]->kernels->release(both[k]->m_memory);
        both[k]->kernels->release(both[k]->v_memory);
        both[k]->m_memory = both[k]->v_memory = NULL;
    }
}

void trainer_free(Trainer* t) {
    model_free_cuda(device(t));
    free(t->device);
    float* shards[3] = {t->grad_shard, t->m_shard, t->v_shard};
    for (int k = 0; k < 3; k++) {
        if (shards[k] != NULL) dist_shard_free_cuda(shards[k]);
    }
    if (t->shard_bounds != NULL) t->dist->shard_bounds = NULL;
    free(t->shard_bounds);
}

// Queued, nothing read back. Sharded, each rank's loss is its sequences' share of the global mean
// (as src/trainer.c). In one process, the step's first part: with CUDA graphs the capture (the
// first step) or the walk of the step graph begins here, and the batch is copied in just
// before trainer_backward launches it.
void trainer_forward(Trainer* t, const int* x, const int* y, size_t B, size_t T,
                     size_t n_targets) {
    if (t->sharded) model_forward_losses_cuda(device(t), x, y, n_targets, B, T);
    else model_step_forward_cuda(device(t), x, y, n_targets, B, T);
}

void trainer_zero_grad(Trainer* t) { model_zero_grad_cuda(device(t)); }

// In one process the gradient norm's partial sums and the read-back's copies are queued too,
// and the step graph's capture or walk ends and the graph is launched; sharded they follow
// the reduce-scatter (trainer_loss_and_norm)
void trainer_backward(Trainer* t) {
    if (t->sharded) model_backward_cuda(device(t));
    else model_step_backward_cuda(device(t));
}

// ONE read-back of the loss and the norm. Sharded: the reduce-scatter runs first on the GPU's
// stream, then the loss and the squared norm are added over the ranks
float trainer_loss_and_norm(Trainer* t, float* norm) {
    if (!t->sharded) return model_step_loss_and_norm_cuda(device(t), norm);
    double local_loss, sum_sq;
    model_loss_and_shard_norm_cuda(device(t), t->dist, t->grad_shard, t->lo, t->hi, &local_loss,
                                   &sum_sq);
    double start = now_seconds();  // the reduce-scatter ran inside, on the GPU's stream
    double loss_sum = dist_sum(t->dist, local_loss);
    *norm = (float)sqrt(dist_sum(t->dist, sum_sq));
    t->comm_seconds += now_seconds() - start;
    return model_set_loss(&device(t)->model, loss_sum);
}

// In one process the clipping is queued by trainer_update, in the update's CUDA graph
void trainer_clip(Trainer* t, float norm, float max_norm) {
    if (!t->sharded) {
        t->clip_norm = norm;
        t->clip_max_norm = max_norm;
        return;
    }
    if (!(max_norm > 0.0f && norm > max_norm)) return;
    dist_clip_shard_cuda(t->grad_shard, t->hi - t->lo, norm, max_norm);
}

// In one process, clipping and the update (model_update_step_cuda); sharded, ZeRO-1: this
// rank's shard, then every rank gathers the whole
void trainer_update(Trainer* t, float lr, float beta1, float beta2, float eps,
                    float weight_decay, int adam_t) {
    if (!t->sharded) {
        ModelUpdate u = {t->clip_norm, t->clip_max_norm, t->optimizer == OPTIMIZER_MUON, lr,
                         beta1, beta2, eps, weight_decay, t->muon_momentum, adam_t};
        model_update_step_cuda(device(t), &u);
        return;
    }
    Model* trained = &device(t)->model;
    if (t->optimizer == OPTIMIZER_MUON) {
        model_update_shard_muon(trained, t->lo, t->hi, t->grad_shard, t->m_shard, t->v_shard, lr,
                                beta1, beta2, eps, weight_decay, adam_t, t->muon_momentum);
    } else {
        model_update_shard(trained, t->lo, t->hi, t->grad_shard, t->m_shard, t->v_shard, lr,
                           beta1, beta2, eps, weight_decay, adam_t);
    }
    double start = now_seconds();
    dist_all_gather_cuda(t->dist, trained->params_memory, trained->num_params);
    t->comm_seconds += now_seconds() - start;
}

// each shard comes from the GPU first
void trainer_gather_moments(Trainer* t) {
    if (!t->sharded) return;
    Model* h = t->host;
    if (t->dist->rank == 0) {
        h->m_memory = (float*)mallocCheck(h->num_params * sizeof(float));
        h->v_memory = (float*)mallocCheck(h->num_params * sizeof(float));
    }
    float* shards[2] = {t->m_shard, t->v_shard};
    float* fulls[2] = {h->m_memory, h->v_memory};
    float* shard = (float*)mallocCheck((t->hi - t->lo) * sizeof(float));
    for (int k = 0; k < 2; k++) {
        dist_shard_to_host_cuda(shard, shards[k], t->hi - t->lo);
        dist_gather(t->dist, fulls[k], shard, h->num_params);
    }
    free(shard);
}

void trainer_drop_moments(Trainer* t) {
    if (!t->sharded) return;
    free(t->host->m_memory);
    free(t->host->v_memory);
    t->host->m_memory = t->host->v_memory = NULL;
}

void trainer_to_host(Trainer* t) { model_to_host_cuda(t->host, device(t)); }

// The parameters copied back, then the step's forward and backward redone on the host model
// (with several processes on rank 0, over the global batch)
void trainer_host_gradients(Trainer* t, const int* x, const int* y, size_t B, size_t T) {
    model_to_host_cuda(t->host, device(t));
    model_forward(t->host, x, y, B, T);
    model_zero_grad(t->host);
    model_backward(t->host);
}
