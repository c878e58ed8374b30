// trainer.c — the training step on the CPU, in one process (./train) or several (./train_mpi).
// cuda/trainer.cu is its mirror on the GPU: the same functions, with the same names and in the
// same order, since train.c calls them alike and a program links one file or the other
// (Makefile). One process or several is the distributed layer's, chosen when linking
// (src/distributed.c built with MPI or without): a single process is a world of one. The
// interface and what runs where: trainer.h.
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "options.h"
#include "threads.h"
#include "trainer.h"
#include "util.h"

int trainer_on_gpu(void) { return 0; }

int trainer_open_device(const Dist* dist, int cublas, int graph, char* err, size_t err_len) {
    (void)dist; (void)cublas; (void)graph; (void)err; (void)err_len;
    return 0;
}

void trainer_close_device(void) {}

// The host model trains; with several processes, this rank's shards of the summed gradients
// and of the moments are host arrays, and the host's full moments are released
void trainer_init(Trainer* t, Model* host, Dist* dist, size_t B, size_t T, int optimizer,
                  float muon_momentum) {
    memset(t, 0, sizeof(*t));
    t->host = host;
    t->dist = dist;
    t->optimizer = optimizer;
    t->muon_momentum = muon_momentum;
    t->sharded = dist->world > 1;
    (void)B;  // the host model's buffers already hold this batch
    (void)T;
    if (!t->sharded) { return; }
    if (optimizer == OPTIMIZER_MUON) {  // a matrix is orthogonalised whole, by one rank
        t->shard_bounds = mallocCheck(((size_t)dist->world + 1) * sizeof(size_t));
        model_muon_shard_bounds(host, dist->world, t->shard_bounds);
        dist->shard_bounds = t->shard_bounds;
    }
    dist_shard_of(dist, host->num_params, dist->rank, &t->lo, &t->hi);
    size_t count = t->hi - t->lo;
    t->grad_shard = mallocCheck(count * sizeof(float));
    t->m_shard = mallocCheck(count * sizeof(float));
    t->v_shard = mallocCheck(count * sizeof(float));
    memcpy(t->m_shard, host->m_memory + t->lo, count * sizeof(float));
    memcpy(t->v_shard, host->v_memory + t->lo, count * sizeof(float));
    host->kernels->release(host->m_memory);
    host->kernels->release(host->v_memory);
    host->m_memory = host->v_memory = NULL;
}

void trainer_free(Trainer* t) {
    free(t->grad_shard);
    free(t->m_shard);
    free(t->v_shard);
    if (t->shard_bounds != NULL) { t->dist->shard_bounds = NULL; }
    free(t->shard_bounds);
}

// The model's forward in its parts (model_forward_losses'), the whole range of sub-layers. The
// sequences' loss is their share of the global mean (their sum over the global count
// n_targets), so the gradients summed over the microbatches and the ranks are the global
// batch's; the sequences' losses add into loss_sum, in double, for trainer_loss_and_norm.
void trainer_forward(Trainer* t, const int* x, const int* y, size_t B, size_t T,
                     size_t n_targets) {
    Model* model = t->host;
    model_set_batch(model, x, y, n_targets, B, T);
    model_embedding_forward(model);
    model_sublayers_forward(model, 0, (int)model->dims.n_sub);
    model_head_forward(model);
    t->loss_sum += model->kernels->sum(model->acts.losses, B * T);
}

void trainer_zero_grad(Trainer* t) { model_zero_grad(t->host); }

// The model's backward in its parts (model_backward's), the whole range of sub-layers
void trainer_backward(Trainer* t) {
    Model* model = t->host;
    model_zero_carried(model);
    model_head_backward(model);
    const float* dinput = model_sublayers_backward(model, 0, (int)model->dims.n_sub);
    model_embedding_backward(model, dinput);
}

// Sharded: the gradients summed over the ranks (reduce-scatter: this rank's shard of the sum),
// the loss and the squared norm added over the ranks
float trainer_loss_and_norm(Trainer* t, float* norm) {
    Model* host = t->host;
    double local_loss = t->loss_sum;
    t->loss_sum = 0.0;  // for the next step's forwards
    if (!t->sharded) {
        *norm = model_grad_norm(host);
        return model_set_loss(host, local_loss);
    }
    double start = now_seconds();
    dist_reduce_scatter(t->dist, t->grad_shard, host->grads_memory, host->num_params);
    double sum_sq = sum_of_squares(t->grad_shard, t->hi - t->lo);
    double loss_sum = dist_sum(t->dist, local_loss);
    *norm = (float)sqrt(dist_sum(t->dist, sum_sq));
    t->comm_seconds += now_seconds() - start;
    return model_set_loss(host, loss_sum);
}

// The gradient this rank updates from: its shard of the sum over the ranks, or (unsharded)
// the whole flat buffer [0, num_params)
static float* update_gradient(Trainer* t, size_t* lo, size_t* hi) {
    *lo = t->sharded ? t->lo : 0;
    *hi = t->sharded ? t->hi : t->host->num_params;
    return t->sharded ? t->grad_shard : t->host->grads_memory;
}

void trainer_clip(Trainer* t, float norm, float max_norm) {
    if (!(max_norm > 0.0f && norm > max_norm)) { return; }
    size_t lo, hi;
    float* g = update_gradient(t, &lo, &hi);
    float scale = max_norm / norm;
    for (size_t i = 0; i < hi - lo; i++) { g[i] *= scale; }
}

// ZeRO-1: this rank's shard, then every rank gathers the whole. Unsharded, the shard is the
// whole flat buffer, and model_update_shard over it is model_update.
void trainer_update(Trainer* t, float lr, float beta1, float beta2, float eps,
                    float weight_decay, int adam_t) {
    Model* host = t->host;
    size_t lo, hi;
    float* g = update_gradient(t, &lo, &hi);
    float* m = t->sharded ? t->m_shard : host->m_memory;
    float* v = t->sharded ? t->v_shard : host->v_memory;
    if (t->optimizer == OPTIMIZER_MUON) {
        model_update_shard_muon(host, lo, hi, g, m, v, lr, beta1, beta2, eps, weight_decay,
                                adam_t, t->muon_momentum);
    } else {
        model_update_shard(host, lo, hi, g, m, v, lr, beta1, beta2, eps, weight_decay, adam_t);
    }
    if (!t->sharded) { return; }
    double start = now_seconds();
    dist_all_gather(t->dist, host->params_memory, host->num_params);
    t->comm_seconds += now_seconds() - start;
}

void trainer_gather_moments(Trainer* t) {
    if (!t->sharded) { return; }
    Model* h = t->host;
    if (t->dist->rank == 0) {
        h->m_memory = mallocCheck(h->num_params * sizeof(float));
        h->v_memory = mallocCheck(h->num_params * sizeof(float));
    }
    dist_gather(t->dist, h->m_memory, t->m_shard, h->num_params);
    dist_gather(t->dist, h->v_memory, t->v_shard, h->num_params);
}

void trainer_drop_moments(Trainer* t) {
    if (!t->sharded) { return; }
    free(t->host->m_memory);
    free(t->host->v_memory);
    t->host->m_memory = t->host->v_memory = NULL;
}

// the host model is the one that trains: it has them already
void trainer_to_host(Trainer* t) { (void)t; }

// With several processes, rank 0's host model trained on its own sequences only: it redoes the
// global batch; one process trained on this very batch
void trainer_host_gradients(Trainer* t, const int* x, const int* y, size_t B, size_t T) {
    if (t->dist->world == 1) { return; }
    model_forward(t->host, x, y, B, T);
    model_zero_grad(t->host);
    model_backward(t->host);
}
