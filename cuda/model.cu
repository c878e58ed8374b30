// model.cu — the whole model on the GPU (mirror of src/model.c).
//
// The orchestration is src/model.c's, unchanged: a ModelCuda is a Model built by
// model_build_on with cuda_kernels, the table of the cuda/*.cu layers and of device-memory
// helpers (cudaMalloc, cudaMemsetAsync, cudaMemcpyAsync, add_kernel). So model.c's
// model_forward, model_backward and model_update run every layer here on cuda_stream. What
// this file adds is what only the device needs: its memory, copying the inputs over, and
// moving parameters between the host and the device.
#include <math.h>
#include <string.h>

#include "common.cuh"
#include "layers.cuh"
#include "model.cuh"
#include "distributed.cuh"
#include "util.h"

// ---------------------------------------------------------------------------------------
// Device-memory helpers of the kernel table, on cuda_stream.

// out = a + b over n floats (out may be a); one thread per element
__global__ void add_kernel(float* out, const float* a, const float* b, size_t n) {
    size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx < n) out[idx] = a[idx] + b[idx];
}

static void add_cuda(float* out, const float* a, const float* b, size_t n) {
    const size_t threads = 256;
    launch_kernel(add_kernel, ceil_div(n, threads), threads, out, a, b, n);
}
static void zero_cuda(float* x, size_t n) {
    cuda_memset_async(x, 0, n * sizeof(float));
}
static void copy_cuda(float* dst, const float* src, size_t n) {
    cuda_memcpy_async(dst, src, n * sizeof(float), cudaMemcpyDeviceToDevice);
}
static float* alloc_zeroed_cuda(size_t n) {
    float* ptr = cuda_malloc_floats(n);
    zero_cuda(ptr, n);
    return ptr;
}
static void release_cuda(void* ptr) { cudaCheck(cudaFree(ptr)); }
// the sum of x (device) in double, in index order, on the host (synchronises)
static double sum_cuda(const float* x, size_t n) {
    float* host = (float*)mallocCheck(n * sizeof(float));
    cudaCheck(cudaMemcpyAsync(host, x, n * sizeof(float), cudaMemcpyDeviceToHost, cuda_stream));
    cudaCheck(cudaStreamSynchronize(cuda_stream));
    double sum = cpu_kernels.sum(host, n);
    free(host);
    return sum;
}

static const Kernels cuda_kernels = {
    .embedding_forward = embedding_forward_cuda,
    .embedding_backward = embedding_backward_cuda,
    .rmsnorm_forward = rmsnorm_forward_cuda,
    .rmsnorm_backward = rmsnorm_backward_cuda,
    .linear_forward = linear_forward_cuda,
    .linear_backward = linear_backward_cuda,
    .rope_forward = rope_forward_cuda,
    .rope_backward = rope_backward_cuda,
    .attention_forward = attention_forward_cuda,
    .attention_backward = attention_backward_cuda,
    .swiglu_forward = swiglu_forward_cuda,
    .swiglu_backward = swiglu_backward_cuda,
    .attnres_input_forward = attnres_input_forward_cuda,
    .attnres_input_backward = attnres_input_backward_cuda,
    .mhc_expand_forward = mhc_expand_forward_cuda,
    .mhc_expand_backward = mhc_expand_backward_cuda,
    .mhc_reduce_forward = mhc_reduce_forward_cuda,
    .mhc_reduce_backward = mhc_reduce_backward_cuda,
    .mhc_input_forward = mhc_input_forward_cuda,
    .mhc_input_backward = mhc_input_backward_cuda,
    .mhc_output_forward = mhc_output_forward_cuda,
    .mhc_output_backward = mhc_output_backward_cuda,
    .crossentropy_forward = crossentropy_forward_cuda,
    .crossentropy_backward = crossentropy_backward_cuda,
    .adamw_update = adamw_update_cuda,
    .muon_update = muon_update_cuda,
    .alloc_zeroed = alloc_zeroed_cuda,
    .release = release_cuda,
    .zero = zero_cuda,
    .copy = copy_cuda,
    .add = add_cuda,
    .sum = sum_cuda,
};

const char* cuda_device_problem(void) {
    int count = 0;
    cudaError_t error = cudaGetDeviceCount(&count);
    (void)cudaGetLastError();  // clear any error, so that it does not stick to later calls
    static char message[256];
    if (error == cudaSuccess && count > 0) return NULL;
    if (error == cudaSuccess || error == cudaErrorNoDevice) {
        return "no CUDA device found (./train_cuda needs an NVIDIA GPU; use ./train on the CPU)";
    }
    if (error == cudaErrorInsufficientDriver) {
        int driver = 0, runtime = 0;
        cudaDriverGetVersion(&driver);
        cudaRuntimeGetVersion(&runtime);
        if (driver == 0) {  // no driver library at all: a machine without an NVIDIA GPU
            return "no CUDA device found (./train_cuda needs an NVIDIA GPU; use ./train on the CPU)";
        }
        snprintf(message, sizeof(message), "the NVIDIA driver supports CUDA %d.%d, this build "
                 "needs %d.%d: update the driver (or build with an older CUDA toolkit)",
                 driver / 1000, driver % 1000 / 10, runtime / 1000, runtime % 1000 / 10);
        return message;
    }
    snprintf(message, sizeof(message), "CUDA cannot use the GPU: %s", cudaGetErrorString(error));
    return message;
}

void model_use_cublas_cuda(int on) { linear_use_cublas_cuda(on); }

// ---------------------------------------------------------------------------------------
// Building, and moving parameters between the host and the device.

void model_build_cuda(ModelCuda* m, const ModelConfig* c, size_t max_B, size_t max_T) {
    if (c->block_size > 0 && count_sources(c, 2 * c->n_layers) > DEPTH_ATTENTION_MAX_SOURCES) {
        fprintf(stderr, "error: the CUDA depth attention takes at most %d sources, this model "
                "has %zu (2L/S + 1); use fewer layers, a larger block size, or ./train\n",
                DEPTH_ATTENTION_MAX_SOURCES, count_sources(c, 2 * c->n_layers));
        exit(1);
    }
    model_build_on(&m->model, c, max_B, max_T, &cuda_kernels);
    // the most scratch one layer call of a training step borrows, reserved now: steps then
    // allocate nothing (common.cuh, cuda_workspace)
    const ModelDims* z = &m->model.dims;
    size_t N = max_B * max_T, parts = ceil_div(N, ROWS_PER_PART);
    size_t most_sources = z->S > 0 ? count_sources(c, (int)z->n_sub) : 0;
    size_t needs[] = {attention_workspace_floats_cuda(max_B, max_T, z->H),
                      depth_attention_workspace_floats_cuda(most_sources, N, z->d),
                      depth_variants_workspace_floats_cuda(most_sources, N, z->d, z->depth_heads),
                      parts * z->d * (z->streams > 0 ? z->streams : 1),         // rmsnorm (mhc: m*d wide)
                      z->streams > 0 ? mhc_workspace_floats_cuda(N, z->streams) : 0,
                      linear_workspace_floats_cuda(), 64};          // matmul, global norm
    size_t most = 0;
    for (size_t i = 0; i < sizeof(needs) / sizeof(needs[0]); i++) most = needs[i] > most ? needs[i] : most;
    cuda_workspace(most);
    rope_prepare_cuda(max_T, z->hs);
    m->graph = 0;
    m->step_graph = NULL;
    m->graph_B = m->graph_T = 0;
    m->step_tokens = m->step_targets = NULL;
    memset(m->update_graphs, 0, sizeof(m->update_graphs));
    m->tokens = (int*)cuda_malloc_checked(max_B * max_T * sizeof(int));
    m->targets = (int*)cuda_malloc_checked(max_B * max_T * sizeof(int));
    size_t readback_bytes = (N + NORM_PARTIALS) * sizeof(float);
    if (cudaMallocHost((void**)&m->readback, readback_bytes) != cudaSuccess) {
        fprintf(stderr, "error: could not allocate %zu bytes of page-locked host memory\n",
                readback_bytes);
        exit(EXIT_FAILURE);
    }
}

void model_free_cuda(ModelCuda* m) {
    cuda_graph_free(m->step_graph);
    for (int muon = 0; muon < 2; muon++)
        for (int clipped = 0; clipped < 2; clipped++) cuda_graph_free(m->update_graphs[muon][clipped]);
    model_free(&m->model);
    cudaCheck(cudaFree(m->tokens));
    cudaCheck(cudaFree(m->targets));
    cudaCheck(cudaFreeHost(m->readback));
    m->tokens = NULL;
    m->targets = NULL;
    m->readback = NULL;
}

static void check_same_config(const ModelConfig* a, const ModelConfig* b, const char* what) {
    if (memcmp(a, b, sizeof(ModelConfig)) != 0) {
        fprintf(stderr, "error: %s: the host and device models have different configs\n", what);
        exit(1);
    }
}

// parameters, m and v: the three flat buffers a checkpoint holds
// the parameters, and the moments where both sides hold them (data parallel: each process's
// GPU keeps only its shard's moments, distributed.cuh)
static void copy_state(const Model* to, const Model* from, cudaMemcpyKind kind) {
    size_t bytes = from->num_params * sizeof(float);
    cudaCheck(cudaMemcpy(to->params_memory, from->params_memory, bytes, kind));
    if (to->m_memory != NULL && from->m_memory != NULL) {
        cudaCheck(cudaMemcpy(to->m_memory, from->m_memory, bytes, kind));
        cudaCheck(cudaMemcpy(to->v_memory, from->v_memory, bytes, kind));
    }
}

void model_to_device_cuda(ModelCuda* m, const Model* host) {
    check_same_config(&m->model.config, &host->config, "model_to_device_cuda");
    copy_state(&m->model, host, cudaMemcpyHostToDevice);
}

void model_to_host_cuda(Model* host, const ModelCuda* m) {
    check_same_config(&host->config, &m->model.config, "model_to_host_cuda");
    copy_state(host, &m->model, cudaMemcpyDeviceToHost);
}

// ---------------------------------------------------------------------------------------
// The model's steps: model.c's, on the device copies of the inputs.

// copies the batch to the device (tokens, and targets unless NULL), asynchronously
static void upload_batch(ModelCuda* m, const int* tokens, const int* targets, size_t N) {
    cuda_memcpy_async(m->tokens, tokens, N * sizeof(int), cudaMemcpyHostToDevice);
    if (targets != NULL) cuda_memcpy_async(m->targets, targets, N * sizeof(int), cudaMemcpyHostToDevice);
}

float model_forward_cuda(ModelCuda* m, const int* tokens, const int* targets, size_t B, size_t T) {
    size_t N = B * T;
    if (B > m->model.max_B || T > m->model.max_T) {  // model_forward says so and exits
        return model_forward_counted(&m->model, NULL, NULL, 0, B, T);
    }
    upload_batch(m, tokens, targets, N);
    return model_forward_counted(&m->model, m->tokens, targets != NULL ? m->targets : NULL,
                                 crossentropy_count(targets, N), B, T);
}

// a training step's batch: targets required, B and T within the model's (else model_forward
// says so and exits)
static void check_step_batch(ModelCuda* m, const int* targets, size_t B, size_t T) {
    if (targets == NULL) {
        fprintf(stderr, "error: a training step needs targets\n");
        exit(EXIT_FAILURE);
    }
    if (B > m->model.max_B || T > m->model.max_T) model_forward_counted(&m->model, NULL, NULL, 0, B, T);
}

void model_forward_losses_cuda(ModelCuda* m, const int* tokens, const int* targets,
                               size_t n_targets, size_t B, size_t T) {
    check_step_batch(m, targets, B, T);
    upload_batch(m, tokens, targets, B * T);
    model_forward_losses(&m->model, m->tokens, m->targets, n_targets, B, T);
}

// The step's one read-back, in two halves. Queued: the squared sums' partials of `x` (n
// floats), then the positions' losses (N) and those partials copied into page-locked memory.
static void queue_read_back(ModelCuda* m, size_t N, const float* x, size_t n) {
    float* partial = cuda_workspace(NORM_PARTIALS);
    squared_sum_partials_cuda(partial, x, n);
    cuda_memcpy_async(m->readback, m->model.acts.losses, N * sizeof(float), cudaMemcpyDeviceToHost);
    cuda_memcpy_async(m->readback + N, partial, NORM_PARTIALS * sizeof(float),
                      cudaMemcpyDeviceToHost);
}
// Then one wait for both: returns the losses' sum (double, position order) and *sum_sq, x's
// squared sum.
static double wait_read_back(ModelCuda* m, size_t N, double* sum_sq) {
    cudaCheck(cudaStreamSynchronize(cuda_stream));
    *sum_sq = sum_of_partials(m->readback + N);
    return cpu_kernels.sum(m->readback, N);
}

void model_loss_and_shard_norm_cuda(ModelCuda* m, const Dist* d, float* grad_shard, size_t lo,
                                    size_t hi, double* loss_sum, double* shard_sum_sq) {
    size_t N = m->model.B * m->model.T;
    dist_reduce_scatter_cuda(d, grad_shard, m->model.grads_memory, m->model.num_params);
    queue_read_back(m, N, grad_shard, hi - lo);
    *loss_sum = wait_read_back(m, N, shard_sum_sq);
}

void model_forward_backward_cuda(ModelCuda* m, const int* tokens, const int* targets, size_t B,
                                 size_t T, float* loss, float* norm) {
    model_step_forward_cuda(m, tokens, targets, crossentropy_count(targets, B * T), B, T);
    model_zero_grad_cuda(m);
    model_step_backward_cuda(m);
    *loss = model_step_loss_and_norm_cuda(m, norm);
}

void model_forward_backward_shard_cuda(ModelCuda* m, const int* tokens, const int* targets,
                                       size_t n_targets, size_t B, size_t T, const Dist* d,
                                       float* grad_shard, size_t lo, size_t hi,
                                       double* loss_sum, double* shard_sum_sq) {
    model_forward_losses_cuda(m, tokens, targets, n_targets, B, T);
    model_zero_grad(&m->model);
    model_backward(&m->model);
    model_loss_and_shard_norm_cuda(m, d, grad_shard, lo, hi, loss_sum, shard_sum_sq);
}

// ---------------------------------------------------------------------------------------
// ./train_cuda's step: forward to the read-back, then clipping and the update, each queued
// as the calls above or replayed as a CUDA graph (docs/cuda.md, "The captured step"). The
// first graph spans three calls: model_step_forward_cuda begins its capture or walk,
// model_zero_grad_cuda's zeroing is captured or walked in turn, model_step_backward_cuda
// ends it and launches the graph.

void model_use_graph_cuda(ModelCuda* m, int on) { m->graph = on; }

void model_step_forward_cuda(ModelCuda* m, const int* tokens, const int* targets,
                             size_t n_targets, size_t B, size_t T) {
    if (!m->graph) {
        model_forward_losses_cuda(m, tokens, targets, n_targets, B, T);
        return;
    }
    check_step_batch(m, targets, B, T);
    if (m->step_graph != NULL && (B != m->graph_B || T != m->graph_T)) {  // captured anew
        cuda_graph_free(m->step_graph);
        m->step_graph = NULL;
    }
    m->graph_B = B;
    m->graph_T = T;
    m->step_tokens = tokens;
    m->step_targets = targets;
    cuda_graph_begin(&m->step_graph);
    model_forward_losses(&m->model, m->tokens, m->targets, n_targets, B, T);  // on the device copies
}

void model_step_backward_cuda(ModelCuda* m) {
    Model* model = &m->model;
    size_t N = model->B * model->T;
    model_backward(model);
    queue_read_back(m, N, model->grads_memory, model->num_params);
    if (!m->graph) return;
    cuda_graph_end(m->step_graph);
    // the batch copied in after the walk, so that the walk runs while the GPU finishes the
    // last step's update (the copy, from pageable memory, waits for it)
    upload_batch(m, m->step_tokens, m->step_targets, N);
    cuda_graph_launch(m->step_graph);
}

float model_step_loss_and_norm_cuda(ModelCuda* m, float* norm) {
    double sum_sq, sum = wait_read_back(m, m->model.B * m->model.T, &sum_sq);
    *norm = (float)sqrt(sum_sq);
    return model_set_loss(&m->model, sum);
}

// Muon's scratch for every matrix shape, so that a capture allocates nothing
static void reserve_muon(const Model* model) {
    size_t rows, cols;
    for (int i = 0; i < N_PARAM_TENSORS; i++)
        if (muon_matrix_shape(&model->dims, i, &rows, &cols)) muon_reserve_cuda(rows, cols);
}

void model_update_step_cuda(ModelCuda* m, const ModelUpdate* u) {
    Model* model = &m->model;
    size_t n_params = model->num_params;
    int clipped = u->max_norm > 0.0f && u->norm > u->max_norm;
    auto queue = [&] {
        if (clipped) clip_gradients_cuda(model->grads_memory, n_params, u->norm, u->max_norm);
        if (u->muon) {
            model_update_shard_muon(model, 0, n_params, model->grads_memory, model->m_memory,
                                    model->v_memory, u->lr, u->beta1, u->beta2, u->eps,
                                    u->weight_decay, u->t, u->muon_momentum);
        } else {
            model_update_shard(model, 0, n_params, model->grads_memory, model->m_memory,
                               model->v_memory, u->lr, u->beta1, u->beta2, u->eps,
                               u->weight_decay, u->t);
        }
    };
    if (!m->graph) {
        queue();
        return;
    }
    CudaGraph** graph = &m->update_graphs[u->muon != 0][clipped];
    if (*graph == NULL && u->muon) reserve_muon(model);
    cuda_graph_prepare(graph, queue);
    cuda_graph_launch(*graph);
}

void model_wait_cuda(void) { cudaCheck(cudaStreamSynchronize(cuda_stream)); }

const float* model_logits_cuda(const ModelCuda* m) { return model_logits(&m->model); }
const float* model_probs_cuda(const ModelCuda* m) { return model_probs(&m->model); }
void model_zero_grad_cuda(ModelCuda* m) { model_zero_grad(&m->model); }
void model_backward_cuda(ModelCuda* m) { model_backward(&m->model); }

float model_grad_norm_cuda(const ModelCuda* m) {
    return global_norm_cuda(m->model.grads_memory, m->model.num_params);
}

void model_clip_gradients_cuda(ModelCuda* m, float norm, float max_norm) {
    clip_gradients_cuda(m->model.grads_memory, m->model.num_params, norm, max_norm);
}

void model_update_cuda(ModelCuda* m, float lr, float beta1, float beta2, float eps,
                       float weight_decay, int t) {
    model_update(&m->model, lr, beta1, beta2, eps, weight_decay, t);
}
