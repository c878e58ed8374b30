// model.cu — forward and backward of the whole model on the GPU (mirror of src/model.c).
//
// The same orchestration as model.c, call for call: every layer is its cuda/*.cu twin, every
// buffer is device memory, memset/memcpy are their stream-ordered CUDA versions and the
// element-wise loops are add_cuda. Read the two files side by side. As there:
//   none : h_0 = x0, h_{l+1} = h_l + f_l(h_l), out = h_{2L}
//   block: sources are the completed blocks b_0 = x0, b_1, ... and the partial sum p of the
//          current block; h_l = DA_l(b_0..b_{n-1}[, p]); out = DA_out(b_0..b_N)
//   full : block with S = 1 (every sub-layer output is its own block)
// Block bookkeeping: partial[l] is the running sum of the outputs of the sub-layers of l's
// block up to and including l, so block k >= 1 is partial[k*S - 1], and the partial sum that
// sub-layer l sees (when it is not first in its block) is partial[l-1].
#include <math.h>
#include <string.h>

#include "common.cuh"
#include "layers.cuh"
#include "model.cuh"
#include "util.h"

// The activations of one sub-layer, as model.c's SubLayer: every pointer is device memory.
typedef struct {
    float* h;         // (N,d) input of the sub-layer
    float* xn;        // (N,d) rmsnorm(h)
    float* rstd;      // (N)
    float* q;         // (N,H*hs) after RoPE                [attention]
    float* k;         // (N,G*hs) after RoPE                [attention]
    float* v;         // (N,G*hs)                           [attention]
    float* att;       // (B,H,T,T) softmax probabilities    [attention]
    float* y;         // (N,H*hs) heads concatenated        [attention]
    float* gate;      // (N,F) xn Wg^T                       [MLP]
    float* up;        // (N,F) xn Wu^T                       [MLP]
    float* act;       // (N,F) silu(gate) * up               [MLP]
    float* partial;   // (N,d) partial block sum after l    [AttnRes]
    float* alpha;     // (N,n_sources) depth-attention weights    [AttnRes]
    float* key_rstd;  // (N,n_sources)                            [AttnRes]
    size_t n_sources;
} SubLayerCuda;

struct ActivationsCuda {
    SubLayerCuda* sub;  // host array: 2L sub-layers, then slot 2L: the output aggregation
    float* x0;          // (N,d) embeddings
    float* out;         // (N,d) final hidden state
    float* xf;          // (N,d) rmsnorm(out; final_norm)
    float* rstd_f;      // (N)
    float* logits;      // (N,V)
    float* probs;       // (N,V)
    float* losses;      // (N)
    float* f;           // (N,d) scratch: the output of the current sub-layer
    // backward scratch
    float *dlogits, *dxf, *dout, *dh, *dxn, *dx0;
    float *dq, *dk, *dv, *dq_pre, *dk_pre, *dy, *dgate, *dup, *dact;
    float* dpartial;    // (2L, N, d) gradients of partial[l]  [AttnRes]
};

static int n_sub(const ModelCuda* m) { return 2 * m->config.n_layers; }
static int is_attnres(const ModelCuda* m) { return m->config.block_size > 0; }

// ---------------------------------------------------------------------------------------
// The element-wise pieces of model.c's loops and memsets, on cuda_stream.

// out = a + b over n floats (out may be a); one thread per element
__global__ void add_kernel(float* out, const float* a, const float* b, size_t n) {
    size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx < n) out[idx] = a[idx] + b[idx];
}

static void add_cuda(float* out, const float* a, const float* b, size_t n) {
    const size_t block_size = 256;
    launch_kernel(add_kernel, ceil_div(n, block_size), block_size, out, a, b, n);
}
static void zero_cuda(float* x, size_t n) {
    cudaCheck(cudaMemsetAsync(x, 0, n * sizeof(float), cuda_stream));
}
static void copy_cuda(float* dst, const float* src, size_t n) {
    cudaCheck(cudaMemcpyAsync(dst, src, n * sizeof(float), cudaMemcpyDeviceToDevice, cuda_stream));
}
static float* device_floats(size_t n) {
    float* p;
    cudaCheck(cudaMalloc(&p, (n > 0 ? n : 1) * sizeof(float)));
    return p;
}

int cuda_device_count(void) {
    int count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess) {
        (void)cudaGetLastError();  // clear the error, so that it does not stick to later calls
        return 0;
    }
    return count;
}

// ---------------------------------------------------------------------------------------
// Building: the same tensors and bookkeeping as model.c.

// The sources of sub-layer l (l = 2L: output aggregation) and their gradient buffers:
// blocks b_0 .. b_{n-1} (b_0 = x0, b_k = partial[k*S-1]), then partial[l-1] if l is not
// first in its block. Host arrays of device pointers, as depth_attention_*_cuda take them.
static size_t gather_sources(const ModelCuda* m, int l, const float** src, float** dsrc) {
    const ActivationsCuda* a = m->acts;
    int S = m->config.block_size;
    size_t N = m->B * m->T, d = m->config.d_model;
    int n_blocks = (l == n_sub(m)) ? n_sub(m) / S + 1 : 1 + l / S;
    size_t count = 0;
    for (int k = 0; k < n_blocks; k++, count++) {
        src[count] = k == 0 ? a->x0 : a->sub[k * S - 1].partial;
        dsrc[count] = k == 0 ? a->dx0 : a->dpartial + (size_t)(k * S - 1) * N * d;
    }
    if (l < n_sub(m) && l % S > 0) {
        src[count] = a->sub[l - 1].partial;
        dsrc[count] = a->dpartial + (size_t)(l - 1) * N * d;
        count++;
    }
    return count;
}

void model_build_cuda(ModelCuda* m, const ModelConfig* c, size_t max_B, size_t max_T) {
    if (c->block_size > 0 && count_sources(c, 2 * c->n_layers) > DEPTH_ATTENTION_MAX_SOURCES) {
        fprintf(stderr, "error: the CUDA depth attention takes at most %d sources, this model "
                "has %zu (2L/S + 1); use fewer layers, a larger block size, or ./train\n",
                DEPTH_ATTENTION_MAX_SOURCES, count_sources(c, 2 * c->n_layers));
        exit(1);
    }
    memset(m, 0, sizeof(*m));
    m->config = *c;
    m->num_params = param_sizes(c, m->param_sizes);
    float** flat[] = {&m->params_memory, &m->grads_memory, &m->m_memory, &m->v_memory};
    for (int i = 0; i < 4; i++) {
        *flat[i] = device_floats(m->num_params);
        zero_cuda(*flat[i], m->num_params);
    }
    point_tensors(&m->params, m->params_memory, m->param_sizes);
    point_tensors(&m->grads, m->grads_memory, m->param_sizes);
    m->max_B = max_B;
    m->max_T = max_T;
    cudaCheck(cudaMalloc(&m->tokens, max_B * max_T * sizeof(int)));
    cudaCheck(cudaMalloc(&m->targets, max_B * max_T * sizeof(int)));

    size_t N = max_B * max_T, V = c->vocab_size, d = c->d_model, F = c->ffn_hidden;
    size_t H = c->n_heads, hs = d / H, q_dim = H * hs, kv_dim = c->n_kv_heads * hs;
    int L2 = 2 * c->n_layers;
    ActivationsCuda* a = (ActivationsCuda*)callocCheck(1, sizeof(ActivationsCuda));
    m->acts = a;
    a->sub = (SubLayerCuda*)callocCheck((size_t)L2 + 1, sizeof(SubLayerCuda));
    for (int l = 0; l <= L2; l++) {
        SubLayerCuda* s = &a->sub[l];
        if (l < L2) {
            s->h = device_floats(N * d);
            s->xn = device_floats(N * d);
            s->rstd = device_floats(N);
            if (l % 2 == 0) {
                s->q = device_floats(N * q_dim);
                s->k = device_floats(N * kv_dim);
                s->v = device_floats(N * kv_dim);
                s->att = device_floats(max_B * H * max_T * max_T);
                s->y = device_floats(N * q_dim);
            } else {
                s->gate = device_floats(N * F);
                s->up = device_floats(N * F);
                s->act = device_floats(N * F);
            }
        }
        if (c->block_size > 0) {
            if (l < L2) { s->partial = device_floats(N * d); }
            s->n_sources = count_sources(c, l);
            s->alpha = device_floats(N * s->n_sources);
            s->key_rstd = device_floats(N * s->n_sources);
        }
    }
    size_t big = q_dim > F ? q_dim : F;
    float** bufs[] = {&a->x0, &a->out, &a->xf, &a->f, &a->dxf, &a->dout, &a->dh, &a->dxn,
                      &a->dx0};
    for (size_t i = 0; i < sizeof(bufs) / sizeof(bufs[0]); i++) { *bufs[i] = device_floats(N * d); }
    a->rstd_f = device_floats(N);
    a->losses = device_floats(N);
    a->logits = device_floats(N * V);
    a->probs = device_floats(N * V);
    a->dlogits = device_floats(N * V);
    a->dq = device_floats(N * q_dim);
    a->dq_pre = device_floats(N * q_dim);
    a->dy = device_floats(N * big);
    a->dk = device_floats(N * kv_dim);
    a->dk_pre = device_floats(N * kv_dim);
    a->dv = device_floats(N * kv_dim);
    a->dgate = device_floats(N * F);
    a->dup = device_floats(N * F);
    a->dact = device_floats(N * F);
    if (c->block_size > 0) { a->dpartial = device_floats((size_t)L2 * N * d); }
}

void model_free_cuda(ModelCuda* m) {
    ActivationsCuda* a = m->acts;
    if (a != NULL) {
        for (int l = 0; l <= n_sub(m); l++) {
            SubLayerCuda* s = &a->sub[l];
            float* p[] = {s->h, s->xn, s->rstd, s->q, s->k, s->v, s->att, s->y, s->gate, s->up,
                          s->act, s->partial, s->alpha, s->key_rstd};
            for (size_t i = 0; i < sizeof(p) / sizeof(p[0]); i++) { cudaCheck(cudaFree(p[i])); }
        }
        free(a->sub);
        float* p[] = {a->x0, a->out, a->xf, a->rstd_f, a->logits, a->probs, a->losses, a->f,
                      a->dlogits, a->dxf, a->dout, a->dh, a->dxn, a->dx0, a->dq, a->dk, a->dv,
                      a->dq_pre, a->dk_pre, a->dy, a->dgate, a->dup, a->dact, a->dpartial};
        for (size_t i = 0; i < sizeof(p) / sizeof(p[0]); i++) { cudaCheck(cudaFree(p[i])); }
        free(a);
    }
    float* flat[] = {m->params_memory, m->grads_memory, m->m_memory, m->v_memory};
    for (int i = 0; i < 4; i++) { cudaCheck(cudaFree(flat[i])); }
    cudaCheck(cudaFree(m->tokens));
    cudaCheck(cudaFree(m->targets));
    memset(m, 0, sizeof(*m));
}

static void check_same_config(const ModelConfig* a, const ModelConfig* b, const char* what) {
    if (memcmp(a, b, sizeof(ModelConfig)) != 0) {
        fprintf(stderr, "error: %s: the host and device models have different configs\n", what);
        exit(1);
    }
}

void model_to_device_cuda(ModelCuda* m, const Model* host) {
    check_same_config(&m->config, &host->config, "model_to_device_cuda");
    size_t bytes = m->num_params * sizeof(float);
    cudaCheck(cudaMemcpy(m->params_memory, host->params_memory, bytes, cudaMemcpyHostToDevice));
    cudaCheck(cudaMemcpy(m->m_memory, host->m_memory, bytes, cudaMemcpyHostToDevice));
    cudaCheck(cudaMemcpy(m->v_memory, host->v_memory, bytes, cudaMemcpyHostToDevice));
}

void model_to_host_cuda(Model* host, const ModelCuda* m) {
    check_same_config(&host->config, &m->config, "model_to_host_cuda");
    size_t bytes = m->num_params * sizeof(float);
    cudaCheck(cudaMemcpy(host->params_memory, m->params_memory, bytes, cudaMemcpyDeviceToHost));
    cudaCheck(cudaMemcpy(host->m_memory, m->m_memory, bytes, cudaMemcpyDeviceToHost));
    cudaCheck(cudaMemcpy(host->v_memory, m->v_memory, bytes, cudaMemcpyDeviceToHost));
}

// ---------------------------------------------------------------------------------------
// The sub-layers, forward and backward. Layer index = l / 2.

static void attention_sublayer_forward(ModelCuda* m, int l, float* f_out) {
    const ModelConfig* c = &m->config;
    SubLayerCuda* s = &m->acts->sub[l];
    size_t B = m->B, T = m->T, N = B * T, d = c->d_model, layer = l / 2;
    size_t H = c->n_heads, G = c->n_kv_heads, hs = d / H, q_dim = H * hs, kv_dim = G * hs;
    const ParameterTensors* p = &m->params;
    rmsnorm_forward_cuda(s->xn, s->rstd, s->h, p->attn_norm + layer * d, N, d);
    linear_forward_cuda(s->q, s->xn, p->wq + layer * q_dim * d, N, d, q_dim);
    linear_forward_cuda(s->k, s->xn, p->wk + layer * kv_dim * d, N, d, kv_dim);
    linear_forward_cuda(s->v, s->xn, p->wv + layer * kv_dim * d, N, d, kv_dim);
    rope_forward_cuda(s->q, s->q, B, T, H, hs);
    rope_forward_cuda(s->k, s->k, B, T, G, hs);
    attention_forward_cuda(s->y, s->att, s->q, s->k, s->v, B, T, H, G, hs);
    linear_forward_cuda(f_out, s->y, p->wo + layer * d * q_dim, N, q_dim, d);
}

// df: gradient of the sub-layer output; accumulates into dh (the input's gradient)
static void attention_sublayer_backward(ModelCuda* m, int l, const float* df, float* dh) {
    const ModelConfig* c = &m->config;
    SubLayerCuda* s = &m->acts->sub[l];
    ActivationsCuda* a = m->acts;
    size_t B = m->B, T = m->T, N = B * T, d = c->d_model, layer = l / 2;
    size_t H = c->n_heads, G = c->n_kv_heads, hs = d / H, q_dim = H * hs, kv_dim = G * hs;
    const ParameterTensors* p = &m->params;
    const ParameterTensors* g = &m->grads;
    zero_cuda(a->dy, N * q_dim);
    linear_backward_cuda(a->dy, g->wo + layer * d * q_dim, df, s->y, p->wo + layer * d * q_dim,
                         N, q_dim, d);
    zero_cuda(a->dq, N * q_dim);
    zero_cuda(a->dk, N * kv_dim);
    zero_cuda(a->dv, N * kv_dim);
    attention_backward_cuda(a->dq, a->dk, a->dv, a->dy, s->att, s->q, s->k, s->v,
                            B, T, H, G, hs);
    zero_cuda(a->dq_pre, N * q_dim);
    zero_cuda(a->dk_pre, N * kv_dim);
    rope_backward_cuda(a->dq_pre, a->dq, B, T, H, hs);
    rope_backward_cuda(a->dk_pre, a->dk, B, T, G, hs);
    zero_cuda(a->dxn, N * d);
    linear_backward_cuda(a->dxn, g->wq + layer * q_dim * d, a->dq_pre, s->xn,
                         p->wq + layer * q_dim * d, N, d, q_dim);
    linear_backward_cuda(a->dxn, g->wk + layer * kv_dim * d, a->dk_pre, s->xn,
                         p->wk + layer * kv_dim * d, N, d, kv_dim);
    linear_backward_cuda(a->dxn, g->wv + layer * kv_dim * d, a->dv, s->xn,
                         p->wv + layer * kv_dim * d, N, d, kv_dim);
    rmsnorm_backward_cuda(dh, g->attn_norm + layer * d, a->dxn, s->h, p->attn_norm + layer * d,
                          s->rstd, N, d);
}

static void mlp_sublayer_forward(ModelCuda* m, int l, float* f_out) {
    const ModelConfig* c = &m->config;
    SubLayerCuda* s = &m->acts->sub[l];
    size_t N = m->B * m->T, d = c->d_model, F = c->ffn_hidden, layer = l / 2;
    const ParameterTensors* p = &m->params;
    rmsnorm_forward_cuda(s->xn, s->rstd, s->h, p->mlp_norm + layer * d, N, d);
    linear_forward_cuda(s->gate, s->xn, p->wg + layer * F * d, N, d, F);
    linear_forward_cuda(s->up, s->xn, p->wu + layer * F * d, N, d, F);
    swiglu_forward_cuda(s->act, s->gate, s->up, N, F);
    linear_forward_cuda(f_out, s->act, p->wd + layer * d * F, N, F, d);
}

static void mlp_sublayer_backward(ModelCuda* m, int l, const float* df, float* dh) {
    const ModelConfig* c = &m->config;
    SubLayerCuda* s = &m->acts->sub[l];
    ActivationsCuda* a = m->acts;
    size_t N = m->B * m->T, d = c->d_model, F = c->ffn_hidden, layer = l / 2;
    const ParameterTensors* p = &m->params;
    const ParameterTensors* g = &m->grads;
    zero_cuda(a->dact, N * F);
    linear_backward_cuda(a->dact, g->wd + layer * d * F, df, s->act, p->wd + layer * d * F,
                         N, F, d);
    zero_cuda(a->dgate, N * F);
    zero_cuda(a->dup, N * F);
    swiglu_backward_cuda(a->dgate, a->dup, a->dact, s->gate, s->up, N, F);
    zero_cuda(a->dxn, N * d);
    linear_backward_cuda(a->dxn, g->wg + layer * F * d, a->dgate, s->xn, p->wg + layer * F * d,
                         N, d, F);
    linear_backward_cuda(a->dxn, g->wu + layer * F * d, a->dup, s->xn, p->wu + layer * F * d,
                         N, d, F);
    rmsnorm_backward_cuda(dh, g->mlp_norm + layer * d, a->dxn, s->h, p->mlp_norm + layer * d,
                          s->rstd, N, d);
}

static void sublayer_forward(ModelCuda* m, int l, float* f_out) {
    if (l % 2 == 0) { attention_sublayer_forward(m, l, f_out); }
    else { mlp_sublayer_forward(m, l, f_out); }
}

static void sublayer_backward(ModelCuda* m, int l, const float* df, float* dh) {
    if (l % 2 == 0) { attention_sublayer_backward(m, l, df, dh); }
    else { mlp_sublayer_backward(m, l, df, dh); }
}

// depth attention of sub-layer l (l = 2L: output aggregation) into out
static void depth_forward(ModelCuda* m, int l, float* out) {
    const float* src[DEPTH_ATTENTION_MAX_SOURCES];
    float* dsrc[DEPTH_ATTENTION_MAX_SOURCES];
    size_t n = gather_sources(m, l, src, dsrc);
    SubLayerCuda* s = &m->acts->sub[l];
    size_t d = m->config.d_model;
    depth_attention_forward_cuda(out, s->alpha, s->key_rstd, src, m->params.res_query + l * d,
                                 m->params.res_norm + l * d, n, m->B * m->T, d);
}

static void depth_backward(ModelCuda* m, int l, const float* dout) {
    const float* src[DEPTH_ATTENTION_MAX_SOURCES];
    float* dsrc[DEPTH_ATTENTION_MAX_SOURCES];
    size_t n = gather_sources(m, l, src, dsrc);
    SubLayerCuda* s = &m->acts->sub[l];
    size_t d = m->config.d_model;
    depth_attention_backward_cuda(dsrc, m->grads.res_query + l * d, m->grads.res_norm + l * d,
                                  dout, s->alpha, s->key_rstd, src, m->params.res_query + l * d,
                                  m->params.res_norm + l * d, n, m->B * m->T, d);
}

float model_forward_cuda(ModelCuda* m, const int* tokens, const int* targets, size_t B, size_t T) {
    if (B > m->max_B || T > m->max_T) {
        fprintf(stderr, "error: batch %zux%zu exceeds the model's buffers %zux%zu\n", B, T,
                m->max_B, m->max_T);
        exit(1);
    }
    const ModelConfig* c = &m->config;
    ActivationsCuda* a = m->acts;
    m->B = B;
    m->T = T;
    size_t N = B * T, d = c->d_model, V = c->vocab_size;
    int L2 = n_sub(m), S = c->block_size;
    // the inputs go to the device; without targets every row counts as ignored (-1 = 0xFF..)
    cudaCheck(cudaMemcpyAsync(m->tokens, tokens, N * sizeof(int), cudaMemcpyHostToDevice,
                              cuda_stream));
    m->has_targets = targets != NULL;
    if (targets != NULL) {
        cudaCheck(cudaMemcpyAsync(m->targets, targets, N * sizeof(int), cudaMemcpyHostToDevice,
                                  cuda_stream));
    } else {
        cudaCheck(cudaMemsetAsync(m->targets, 0xFF, N * sizeof(int), cuda_stream));
    }
    embedding_forward_cuda(a->x0, m->tokens, m->params.wte, N, d);

    if (!is_attnres(m)) {
        // standard PreNorm residual stream: h_{l+1} = h_l + f_l(h_l)
        copy_cuda(a->sub[0].h, a->x0, N * d);
        for (int l = 0; l < L2; l++) {
            sublayer_forward(m, l, a->f);
            float* next = (l + 1 < L2) ? a->sub[l + 1].h : a->out;
            add_cuda(next, a->sub[l].h, a->f, N * d);
        }
    } else {
        for (int l = 0; l < L2; l++) {
            SubLayerCuda* s = &a->sub[l];
            depth_forward(m, l, s->h);
            sublayer_forward(m, l, a->f);
            // partial block sum: p = f_l if l starts its block, else p_{l-1} + f_l
            if (l % S == 0) {
                copy_cuda(s->partial, a->f, N * d);
            } else {
                add_cuda(s->partial, a->sub[l - 1].partial, a->f, N * d);
            }
        }
        depth_forward(m, L2, a->out);
    }

    rmsnorm_forward_cuda(a->xf, a->rstd_f, a->out, m->params.final_norm, N, d);
    linear_forward_cuda(a->logits, a->xf, m->params.lm_head, N, d, V);
    // synchronises: counting the targets reads them on the host
    m->n_counted = crossentropy_forward_cuda(a->losses, a->probs, a->logits, m->targets, N, V);
    if (targets == NULL) {
        m->loss = -1.0f;
        return m->loss;
    }
    float* losses = (float*)mallocCheck(N * sizeof(float));
    cudaCheck(cudaMemcpy(losses, a->losses, N * sizeof(float), cudaMemcpyDeviceToHost));
    double sum = 0.0;
    for (size_t i = 0; i < N; i++) { sum += losses[i]; }
    free(losses);
    m->loss = m->n_counted > 0 ? (float)(sum / (double)m->n_counted) : 0.0f;
    return m->loss;
}

const float* model_logits_cuda(const ModelCuda* m) { return m->acts->logits; }
const float* model_probs_cuda(const ModelCuda* m) { return m->acts->probs; }

void model_zero_grad_cuda(ModelCuda* m) {
    zero_cuda(m->grads_memory, m->num_params);
}

void model_backward_cuda(ModelCuda* m) {
    if (!m->has_targets) {
        fprintf(stderr, "error: model_backward_cuda needs a forward with targets\n");
        exit(1);
    }
    const ModelConfig* c = &m->config;
    ActivationsCuda* a = m->acts;
    size_t N = m->B * m->T, d = c->d_model, V = c->vocab_size;
    int L2 = n_sub(m), S = c->block_size;
    size_t count = m->n_counted;  // counted by the forward

    // head: loss -> logits -> xf -> out
    zero_cuda(a->dlogits, N * V);
    crossentropy_backward_cuda(a->dlogits, a->probs, m->targets,
                               count > 0 ? 1.0f / (float)count : 0.0f, N, V);
    zero_cuda(a->dxf, N * d);
    linear_backward_cuda(a->dxf, m->grads.lm_head, a->dlogits, a->xf, m->params.lm_head, N, d, V);
    zero_cuda(a->dout, N * d);
    rmsnorm_backward_cuda(a->dout, m->grads.final_norm, a->dxf, a->out, m->params.final_norm,
                          a->rstd_f, N, d);

    zero_cuda(a->dx0, N * d);
    if (!is_attnres(m)) {
        // h_{l+1} = h_l + f_l(h_l): the residual gradient flows straight through, and each
        // sub-layer adds its input gradient to it. dx0 carries the running gradient.
        copy_cuda(a->dx0, a->dout, N * d);
        for (int l = L2 - 1; l >= 0; l--) {
            copy_cuda(a->dh, a->dx0, N * d);  // df_l = dh_{l+1}
            sublayer_backward(m, l, a->dh, a->dx0);
        }
    } else {
        zero_cuda(a->dpartial, (size_t)L2 * N * d);
        depth_backward(m, L2, a->dout);
        for (int l = L2 - 1; l >= 0; l--) {
            // every consumer of partial[l] comes later, so its gradient is complete here.
            // partial[l] = partial[l-1] + f_l (or f_l when l starts its block)
            const float* dp = a->dpartial + (size_t)l * N * d;
            if (l % S != 0) {
                float* dprev = a->dpartial + (size_t)(l - 1) * N * d;
                add_cuda(dprev, dprev, dp, N * d);
            }
            zero_cuda(a->dh, N * d);
            sublayer_backward(m, l, dp, a->dh);
            depth_backward(m, l, a->dh);
        }
    }
    embedding_backward_cuda(m->grads.wte, a->dx0, m->tokens, N, d);
}

float model_grad_norm_cuda(const ModelCuda* m) {
    return global_norm_cuda(m->grads_memory, m->num_params);
}

void model_clip_gradients_cuda(ModelCuda* m, float norm, float max_norm) {
    clip_gradients_cuda(m->grads_memory, m->num_params, norm, max_norm);
}

void model_update_cuda(ModelCuda* m, float lr, float beta1, float beta2, float eps,
                       float weight_decay, int t) {
    size_t offset = 0;
    for (int i = 0; i < N_PARAM_TENSORS; i++) {
        size_t n = m->param_sizes[i];
        if (n > 0) {  // res_query and res_norm are empty in none mode: no launch of 0 blocks
            adamw_update_cuda(m->params_memory + offset, m->grads_memory + offset,
                              m->m_memory + offset, m->v_memory + offset, n, lr, beta1, beta2,
                              eps, param_is_matrix(i) ? weight_decay : 0.0f, t);
        }
        offset += n;
    }
}
