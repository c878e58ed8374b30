// kernels.h — the layer functions the model runs, as one table, so that the model's
// orchestration (model.c) exists once and runs on the CPU or on the GPU.
//
// Each entry has exactly the signature of the layers.h function of the same name, and of its
// cuda/ mirror (layers.cuh, suffix _cuda): cpu_kernels (model.c) holds the src/ functions,
// cuda_kernels (cuda/model.cu) the CUDA ones. Every pointer a kernel receives lives in that
// table's memory (host or device). Besides the layers, four element-wise helpers on that
// memory stand in for memset, memcpy, an addition loop and a sum read back to the host.
#ifndef ATTNRES_KERNELS_H
#define ATTNRES_KERNELS_H

#include <stddef.h>

#include "layers.h"  // the structs some entries take (DepthParams, MhcParams, ...)

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    void (*embedding_forward)(float* out, const int* tokens, const float* wte, size_t N, size_t C);
    void (*embedding_backward)(float* dwte, const float* dout, const int* tokens, size_t N,
                               size_t C);
    void (*rmsnorm_forward)(float* out, float* rstd, const float* inp, const float* weight,
                            size_t N, size_t C);
    void (*rmsnorm_backward)(float* dinp, float* dweight, const float* dout, const float* inp,
                             const float* weight, const float* rstd, size_t N, size_t C);
    void (*linear_forward)(float* out, const float* inp, const float* weight, size_t N,
                           size_t IN, size_t OUT);
    void (*linear_backward)(float* dinp, float* dweight, const float* dout, const float* inp,
                            const float* weight, size_t N, size_t IN, size_t OUT);
    void (*rope_forward)(float* out, const float* inp, size_t B, size_t T, size_t n_heads,
                         size_t head_size);
    void (*rope_backward)(float* dinp, const float* dout, size_t B, size_t T, size_t n_heads,
                          size_t head_size);
    void (*attention_forward)(float* out, float* lse, const float* q, const float* k,
                              const float* v, size_t B, size_t T, size_t H, size_t G, size_t hs);
    void (*attention_backward)(float* dq, float* dk, float* dv, const float* dout,
                               const float* out, const float* lse, const float* q, const float* k,
                               const float* v, size_t B, size_t T, size_t H, size_t G, size_t hs);
    void (*swiglu_forward)(float* out, const float* gate, const float* up, size_t N, size_t F);
    void (*swiglu_backward)(float* dgate, float* dup, const float* dout, const float* gate,
                            const float* up, size_t N, size_t F);
    // AttnRes: the depth attention of any kind, then its RMSNorm (layers.h); sources and
    // dsources are host arrays of pointers into the table's memory
    void (*attnres_input_forward)(float* xn, float* rstd, float* h, DepthSaved saved,
                                  const float* const* sources, DepthParams params,
                                  const float* weight, size_t n_sources, size_t N, size_t C,
                                  DepthSwitches switches);
    void (*attnres_input_backward)(float* const* dsources, DepthParams grads, float* dweight,
                                   DepthScratch scratch, const float* dxn, const float* h,
                                   const float* rstd, DepthSaved saved,
                                   const float* const* sources, DepthParams params,
                                   const float* weight, size_t n_sources, size_t N, size_t C,
                                   DepthSwitches switches);
    // mHC-lite (layers.h, mhc.c): streams (N, m*d), a row's coefficients in mix
    void (*mhc_expand_forward)(float* X, const float* x0, size_t N, size_t d, size_t m);
    void (*mhc_expand_backward)(float* dx0, const float* dX, size_t N, size_t d, size_t m);
    void (*mhc_reduce_forward)(float* out, const float* X, size_t N, size_t d, size_t m);
    void (*mhc_reduce_backward)(float* dX, const float* dout, size_t N, size_t d, size_t m);
    void (*mhc_input_forward)(float* u, float* mix, float* e, float* z, float* rstd,
                              const float* X, MhcParams params, size_t N, size_t d, size_t m);
    void (*mhc_input_backward)(float* dX, MhcParams grads, float* dmix, float* de, float* dz,
                               const float* du, const float* X, const float* z,
                               const float* rstd, const float* e, const float* mix,
                               MhcParams params, size_t N, size_t d, size_t m);
    void (*mhc_output_forward)(float* Xnext, const float* X, const float* f, const float* mix,
                               size_t N, size_t d, size_t m);
    void (*mhc_output_backward)(float* dX, float* df, float* dmix, const float* dXnext,
                                const float* X, const float* f, const float* mix, size_t N,
                                size_t d, size_t m);
    void (*crossentropy_forward)(float* losses, float* probs, const float* logits,
                                 const int* targets, size_t N, size_t V);
    void (*crossentropy_backward)(float* dlogits, const float* probs, const int* targets,
                                  float scale, size_t N, size_t V);
    void (*adamw_update)(float* params, const float* grads, float* m, float* v, size_t n,
                         float lr, float beta1, float beta2, float eps, float weight_decay,
                         int t);
    void (*muon_update)(float* params, const float* grads, float* momentum, size_t count,
                        size_t rows, size_t cols, float lr, float mu, float weight_decay);
    // memory: n floats, zeroed (exits with a one-line error when there is not enough); free
    float* (*alloc_zeroed)(size_t n);
    void (*release)(void* memory);
    // element-wise helpers: x = 0; dst = src; out = a + b (out may be a); the sum of x in
    // double, returned to the host (in index order, so both tables give the same number)
    void (*zero)(float* x, size_t n);
    void (*copy)(float* dst, const float* src, size_t n);
    void (*add)(float* out, const float* a, const float* b, size_t n);
    double (*sum)(const float* x, size_t n);
} Kernels;

extern const Kernels cpu_kernels;  // src/ layers on host memory (model.c)

#ifdef __cplusplus
}
#endif
#endif
