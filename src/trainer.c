// trainer.c — the training step on the CPU or on the GPU, in one process or several (the
// interface and what runs where: trainer.h).
#define _POSIX_C_SOURCE 200809L  // clock_gettime
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "options.h"
#include "trainer.h"
#include "util.h"
#ifdef ATTNRES_CUDA
#include "distributed.cuh"
#include "model.cuh"
#define DEVICE(t) ((ModelCuda*)(t)->device)
#endif

// The GPU build with MPI always runs the sharded step (trainer.h)
#if defined(ATTNRES_CUDA) && defined(ATTNRES_MPI)
#define ALWAYS_SHARDED 1
#else
#define ALWAYS_SHARDED 0
#endif

// ./train_cuda (the GPU in one process) takes the step in cuda/model.cuh's two parts, each a
// CUDA graph unless --no-graph: trainer_forward, trainer_zero_grad and trainer_backward queue
// it up to the read-back (forward, zero grad, backward, the norm's partial sums),
// trainer_update clipping and the update
#ifdef ATTNRES_CUDA
#define STEP_IN_TWO_PARTS(t) (!(t)->sharded)
#else
#define STEP_IN_TWO_PARTS(t) 0
#endif

double now_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

#ifdef ATTNRES_CUDA
// The step as CUDA graphs (trainer_open_device): not with --no-graph, nor with --cublas
// (cuBLAS's calls are not launch_kernel's, which a captured step's walk follows), nor where
// ATTNRES_CUDA_SYNC asks to wait for each kernel, which a graph cannot
static int use_graph = 0;

int trainer_on_gpu(void) { return 1; }

int trainer_open_device(const Dist* dist, int cublas, int graph, char* err, size_t err_len) {
    const char* problem = cuda_device_problem();
    if (problem != NULL) {
        snprintf(err, err_len, "%s", problem);
        return -1;
    }
    dist_init_cuda(dist);  // this process's GPU, and NCCL between the processes (MPI build)
    if (cublas) { model_use_cublas_cuda(1); }
    const char* sync = getenv("ATTNRES_CUDA_SYNC");
    use_graph = graph && !cublas && (sync == NULL || sync[0] == '\0' || sync[0] == '0');
    return 0;
}

void trainer_close_device(void) { dist_finalize_cuda(); }
#else
int trainer_on_gpu(void) { return 0; }

int trainer_open_device(const Dist* dist, int cublas, int graph, char* err, size_t err_len) {
    (void)dist; (void)cublas; (void)graph; (void)err; (void)err_len;
    return 0;
}

void trainer_close_device(void) {}
#endif

// the model that trains: the host's, or its GPU twin
static Model* trained_model(Trainer* t) {
#ifdef ATTNRES_CUDA
    return &DEVICE(t)->model;
#else
    return t->host;
#endif
}

void trainer_init(Trainer* t, Model* host, Dist* dist, size_t B, size_t T, int optimizer,
                  float muon_momentum) {
    memset(t, 0, sizeof(*t));
    t->host = host;
    t->dist = dist;
    t->optimizer = optimizer;
    t->muon_momentum = muon_momentum;
    t->sharded = ALWAYS_SHARDED || dist->world > 1;
#ifdef ATTNRES_CUDA
    t->device = mallocCheck(sizeof(ModelCuda));
    model_build_cuda(DEVICE(t), &host->config, B, T);
    model_to_device_cuda(DEVICE(t), host);
    model_use_graph_cuda(DEVICE(t), STEP_IN_TWO_PARTS(t) && use_graph);
#else
    (void)B;
    (void)T;
#endif
    if (!t->sharded) { return; }
    if (optimizer == OPTIMIZER_MUON) {  // a matrix is orthogonalised whole, by one rank
        t->shard_bounds = mallocCheck(((size_t)dist->world + 1) * sizeof(size_t));
        model_muon_shard_bounds(host, dist->world, t->shard_bounds);
        dist->shard_bounds = t->shard_bounds;
    }
    dist_shard_of(dist, host->num_params, dist->rank, &t->lo, &t->hi);
    size_t count = t->hi - t->lo;
#ifdef ATTNRES_CUDA
    t->grad_shard = dist_shard_alloc_cuda(NULL, count);
    t->m_shard = dist_shard_alloc_cuda(host->m_memory + t->lo, count);
    t->v_shard = dist_shard_alloc_cuda(host->v_memory + t->lo, count);
#else
    t->grad_shard = mallocCheck(count * sizeof(float));
    t->m_shard = mallocCheck(count * sizeof(float));
    t->v_shard = mallocCheck(count * sizeof(float));
    memcpy(t->m_shard, host->m_memory + t->lo, count * sizeof(float));
    memcpy(t->v_shard, host->v_memory + t->lo, count * sizeof(float));
#endif
    Model* trained = trained_model(t);
    if (trained != host) {  // the GPU's full moments
        trained->kernels->release(trained->m_memory);
        trained->kernels->release(trained->v_memory);
        trained->m_memory = trained->v_memory = NULL;
    }
    host->kernels->release(host->m_memory);
    host->kernels->release(host->v_memory);
    host->m_memory = host->v_memory = NULL;
}

void trainer_free(Trainer* t) {
#ifdef ATTNRES_CUDA
    model_free_cuda(DEVICE(t));
    free(t->device);
    float* shards[3] = {t->grad_shard, t->m_shard, t->v_shard};
    for (int k = 0; k < 3; k++) {
        if (shards[k] != NULL) { dist_shard_free_cuda(shards[k]); }
    }
#else
    free(t->grad_shard);
    free(t->m_shard);
    free(t->v_shard);
#endif
    if (t->shard_bounds != NULL) { t->dist->shard_bounds = NULL; }
    free(t->shard_bounds);
}

// Sharded, each rank's loss is its rows' share of the global mean (their sum over the global
// count n_targets), so the gradients summed over the ranks are the global batch's.
void trainer_forward(Trainer* t, const int* x, const int* y, size_t B, size_t T,
                     size_t n_targets) {
#ifdef ATTNRES_CUDA
    if (STEP_IN_TWO_PARTS(t)) {
        model_step_forward_cuda(DEVICE(t), x, y, n_targets, B, T);
        return;
    }
    model_forward_rows_cuda(DEVICE(t), x, y, n_targets, B, T);  // queued: nothing read back
#else
    if (t->sharded) { model_forward_rows(t->host, x, y, n_targets, B, T); }
    else { model_forward_counted(t->host, x, y, n_targets, B, T); }
#endif
}

void trainer_zero_grad(Trainer* t) { model_zero_grad(trained_model(t)); }

void trainer_backward(Trainer* t) {
#ifdef ATTNRES_CUDA
    if (STEP_IN_TWO_PARTS(t)) {  // with the norm's partial sums; a CUDA graph is launched
        model_step_backward_cuda(DEVICE(t));
        return;
    }
#endif
    model_backward(trained_model(t));
}

float trainer_loss_and_norm(Trainer* t, float* norm) {
    Model* trained = trained_model(t);
    if (!t->sharded) {
#ifdef ATTNRES_CUDA
        return model_step_loss_and_norm_cuda(DEVICE(t), norm);  // one read-back for both
#else
        *norm = model_grad_norm(trained);
        return trained->loss;
#endif
    }
    double local_loss, sum_sq;
#ifdef ATTNRES_CUDA
    model_loss_and_shard_norm_cuda(DEVICE(t), t->dist, t->grad_shard, t->lo, t->hi, &local_loss,
                                   &sum_sq);
    double start = now_seconds();  // the reduce-scatter ran inside, on the GPU's stream
#else
    local_loss = trained->kernels->sum(trained->acts.losses, trained->B * trained->T);
    double start = now_seconds();
    dist_reduce_scatter(t->dist, t->grad_shard, trained->grads_memory, trained->num_params);
    sum_sq = sum_of_squares(t->grad_shard, t->hi - t->lo);
#endif
    double loss_sum = dist_sum(t->dist, local_loss);
    *norm = (float)sqrt(dist_sum(t->dist, sum_sq));
    t->comm_seconds += now_seconds() - start;
    return model_set_loss(trained, loss_sum);
}

// The gradient this rank updates from: its shard of the sum over the ranks, or (unsharded)
// the whole flat buffer [0, P)
static float* update_gradient(Trainer* t, size_t* lo, size_t* hi) {
    Model* trained = trained_model(t);
    *lo = t->sharded ? t->lo : 0;
    *hi = t->sharded ? t->hi : trained->num_params;
    return t->sharded ? t->grad_shard : trained->grads_memory;
}

void trainer_clip(Trainer* t, float norm, float max_norm) {
    if (STEP_IN_TWO_PARTS(t)) {  // clipped in trainer_update's part
        t->clip_norm = norm;
        t->clip_max_norm = max_norm;
        return;
    }
    if (!(max_norm > 0.0f && norm > max_norm)) { return; }
    size_t lo, hi;
    float* g = update_gradient(t, &lo, &hi);
#ifdef ATTNRES_CUDA
    dist_clip_shard_cuda(g, hi - lo, norm, max_norm);
#else
    float scale = max_norm / norm;
    for (size_t i = 0; i < hi - lo; i++) { g[i] *= scale; }
#endif
}

// ZeRO-1: this rank's shard, then every rank gathers the whole. Unsharded, the shard is the
// whole flat buffer, and model_update_shard over it is model_update.
void trainer_update(Trainer* t, float lr, float beta1, float beta2, float eps,
                    float weight_decay, int adam_t) {
#ifdef ATTNRES_CUDA
    if (STEP_IN_TWO_PARTS(t)) {
        ModelUpdate u = {t->clip_norm, t->clip_max_norm, t->optimizer == OPTIMIZER_MUON, lr,
                         beta1, beta2, eps, weight_decay, t->muon_momentum, adam_t};
        model_update_step_cuda(DEVICE(t), &u);
        return;
    }
#endif
    Model* trained = trained_model(t);
    size_t lo, hi;
    float* g = update_gradient(t, &lo, &hi);
    float* m = t->sharded ? t->m_shard : trained->m_memory;
    float* v = t->sharded ? t->v_shard : trained->v_memory;
    if (t->optimizer == OPTIMIZER_MUON) {
        model_update_shard_muon(trained, lo, hi, g, m, v, lr, beta1, beta2, eps, weight_decay,
                                adam_t, t->muon_momentum);
    } else {
        model_update_shard(trained, lo, hi, g, m, v, lr, beta1, beta2, eps, weight_decay, adam_t);
    }
    if (!t->sharded) { return; }
    double start = now_seconds();
#ifdef ATTNRES_CUDA
    dist_all_gather_cuda(t->dist, trained->params_memory, trained->num_params);
#else
    dist_all_gather(t->dist, trained->params_memory, trained->num_params);
#endif
    t->comm_seconds += now_seconds() - start;
}

void trainer_gather_moments(Trainer* t) {
    if (!t->sharded) { return; }
    Model* h = t->host;
    if (t->dist->rank == 0) {
        h->m_memory = mallocCheck(h->num_params * sizeof(float));
        h->v_memory = mallocCheck(h->num_params * sizeof(float));
    }
    float* shards[2] = {t->m_shard, t->v_shard};
    float* fulls[2] = {h->m_memory, h->v_memory};
    for (int k = 0; k < 2; k++) {
#ifdef ATTNRES_CUDA
        float* shard = mallocCheck((t->hi - t->lo) * sizeof(float));  // from the GPU first
        dist_shard_to_host_cuda(shard, shards[k], t->hi - t->lo);
        dist_gather(t->dist, fulls[k], shard, h->num_params);
        free(shard);
#else
        dist_gather(t->dist, fulls[k], shards[k], h->num_params);
#endif
    }
}

void trainer_drop_moments(Trainer* t) {
    if (!t->sharded) { return; }
    free(t->host->m_memory);
    free(t->host->v_memory);
    t->host->m_memory = t->host->v_memory = NULL;
}

void trainer_to_host(Trainer* t) {
#ifdef ATTNRES_CUDA
    model_to_host_cuda(t->host, DEVICE(t));
#else
    (void)t;
#endif
}

void trainer_host_gradients(Trainer* t, const int* x, const int* y, size_t B, size_t T) {
#ifdef ATTNRES_CUDA
    model_to_host_cuda(t->host, DEVICE(t));
#else
    if (t->dist->world == 1) { return; }  // the host model trained on this very batch
#endif
    model_forward(t->host, x, y, B, T);
    model_zero_grad(t->host);
    model_backward(t->host);
}
