// mhc.cu — mHC-lite on the GPU (mirror of src/mhc.c; SPEC.md "mHC-lite"): m streams X
// (N, m*d) per row, stream s of row n at X[(n*m + s)*d], mixed after every sub-layer by the
// doubly stochastic H_res = sum_r pi_r P_r over the R = m! permutations. Sub-layer l:
//   z = rmsnorm(X; c)  over all m*d values of a row;  e = z Phi^T  (E = 2m + R values)
//   a_pre = sigmoid(sigma[0] e_pre + beta_pre), pi = softmax(sigma[1] e_res + beta_res),
//   a_post = 2 sigmoid(sigma[2] e_post + beta_post), H_res = sum_r pi_r P_r
//   u = sum_s a_pre[s] X_s;  X'_t = sum_s H_res[s][t] X_s + a_post[t] f
// A row's coefficients are one vector `mix` of W = MHC_MIX_WIDTH(m) floats,
// [a_pre (m) | pi (R) | a_post (m) | H_res (m*m), H_res[s][t] at s*m + t], and their gradients a
// vector `dmix` of the same layout.
//
// The norm and the projection e = z Phi^T are rmsnorm.cu's and linear.cu's (the same calls
// as on the CPU). The rest is small per row: one block of MHC_BLOCK threads per row where a
// row needs sums over d (warps take the dot products) or shares its coefficients (shared
// memory), one thread per element elsewhere. The sums over streams and over permutations
// run in the CPU's order, so they differ from the CPU's only by expf and fused multiply-adds;
// the dot products over d are warp sums, another order; the sums over rows (dbias, dsigma)
// go in two fixed-order steps (parts of ROWS_PER_PART rows, then the parts), as the weight
// gradients of rmsnorm.cu do; and each dpi_r adds its m terms in increasing order
// (permutation_gradient), where the CPU adds them in double.
#include <math.h>

#include "common.cuh"
#include "layers.cuh"

#define MHC_BLOCK 128
// the widest coefficient vector: m = 4, R = 24
#define MHC_MAX_MIX_WIDTH \
    (2 * MHC_MAX_STREAMS + MHC_MAX_PERMUTATIONS + MHC_MAX_STREAMS * MHC_MAX_STREAMS)

// The permutation table (mhc_permutation_table's, perm[r*m + i] = perm_r[i]); it travels to
// the kernels by value, inside the launch parameters
struct Permutations {
    int perm[MHC_MAX_PERMUTATIONS * MHC_MAX_STREAMS];
};
static Permutations permutations(size_t m, size_t* R) {
    Permutations table = {};
    *R = mhc_permutation_table(table.perm, m);
    return table;
}

// which of sigma's three scales multiplies projected value k: 0 pre, 1 res, 2 post
__device__ __forceinline__ size_t scale_group(size_t k, size_t m, size_t R) {
    return k < m ? 0 : k < m + R ? 1 : 2;
}

// a . b over n floats by one warp, every lane gets the sum
__device__ __forceinline__ float warp_dot(const float* a, const float* b, size_t n) {
    float sum = 0.0f;
    for (size_t c = threadIdx.x % WARP_SIZE; c < n; c += WARP_SIZE) sum += a[c] * b[c];
    return warp_sum(sum);
}

// X (N, m*d): X_s = x0 for every s; one thread per element of X
__global__ void mhc_expand_forward_kernel(float* X, const float* x0, size_t N, size_t d,
                                          size_t m) {
    size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= N * m * d) return;
    X[idx] = x0[idx / (m * d) * d + idx % d];
}

// forward was: X_s = x0 for every s, so dx0 += sum_s dX_s (in order of s); one thread per
// element of x0
__global__ void mhc_expand_backward_kernel(float* dx0, const float* dX, size_t N, size_t d,
                                           size_t m) {
    size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= N * d) return;
    size_t n = idx / d, c = idx % d;
    float acc = dx0[idx];
    for (size_t s = 0; s < m; s++) acc += dX[(n * m + s) * d + c];
    dx0[idx] = acc;
}

// out (N, d) = sum_s X_s (in order of s); one thread per element of out
__global__ void mhc_reduce_forward_kernel(float* out, const float* X, size_t N, size_t d,
                                          size_t m) {
    size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= N * d) return;
    size_t n = idx / d, c = idx % d;
    float sum = 0.0f;
    for (size_t s = 0; s < m; s++) sum += X[(n * m + s) * d + c];
    out[idx] = sum;
}

// forward was: out = sum_s X_s, so dX_s += dout for every s; one thread per element of X
__global__ void mhc_reduce_backward_kernel(float* dX, const float* dout, size_t N, size_t d,
                                           size_t m) {
    size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= N * m * d) return;
    dX[idx] += dout[idx / (m * d) * d + idx % d];
}

// compare-exchange: a <= b after it
__device__ __forceinline__ void order_pair(float& a, float& b) {
    float low = fminf(a, b);
    b = fmaxf(a, b);
    a = low;
}

// dpi_r = sum_s dH_res[s][perm_r[s]], its m <= 4 terms added in increasing order (a sorting
// network on registers, the missing terms 0, which add exactly). Where every stream is the
// same (sub-layer 0: each is x0), dH_res[s][t] depends on t alone, every dpi_r sums the same m
// values and comes out the same to the bit, so the softmax's backward gives exactly 0 there,
// as the CPU's does (it sums in double).
__device__ __forceinline__ float permutation_gradient(const float* dH_res,
                                                      const Permutations& perms, size_t r,
                                                      size_t m) {
    const int* perm = perms.perm + r * m;
    float a = dH_res[(size_t)perm[0]], b = dH_res[m + (size_t)perm[1]];
    float c = m > 2 ? dH_res[2 * m + (size_t)perm[2]] : 0.0f;
    float d = m > 3 ? dH_res[3 * m + (size_t)perm[3]] : 0.0f;
    order_pair(a, b);
    order_pair(c, d);
    order_pair(a, c);
    order_pair(b, d);
    order_pair(b, c);
    return a + b + c + d;
}

// From e (N, E): a row's coefficients into mix (N, W), then u (N, d) = sum_s a_pre[s] X_s.
// One block per row; the row's coefficients are built in shared memory.
__global__ void mhc_input_forward_kernel(float* u, float* mix, const float* e, const float* X,
                                         const float* bias, const float* scale,
                                         Permutations perms, size_t d, size_t m, size_t R) {
    __shared__ float row[MHC_MAX_MIX_WIDTH];
    size_t n = blockIdx.x, E = 2 * m + R, W = E + m * m;
    const float* en = e + n * E;
    float* a_pre = row;
    float* pi = a_pre + m;
    float* H_res = pi + R + m;  // after a_post
    // 1. one thread per projected value k: logit = sigma e_k + beta_k, the gates sigmoid(logit)
    //    and 2 sigmoid(logit), the softmax's logits as they are (in pi until step 2)
    for (size_t k = threadIdx.x; k < E; k += blockDim.x) {
        float logit = scale[scale_group(k, m, R)] * en[k] + bias[k];
        float gate = 1.0f / (1.0f + expf(-logit));
        row[k] = k < m ? gate : k < m + R ? logit : 2.0f * gate;
    }
    __syncthreads();
    // 2. pi = softmax of the logits: every thread finds their max and the sum of the
    //    exponentials in order, then thread r writes pi_r (after every thread has read)
    float max_logit = -INFINITY, sum = 0.0f;
    for (size_t r = 0; r < R; r++) max_logit = pi[r] > max_logit ? pi[r] : max_logit;
    for (size_t r = 0; r < R; r++) sum += expf(pi[r] - max_logit);
    __syncthreads();
    for (size_t r = threadIdx.x; r < R; r += blockDim.x) pi[r] = expf(pi[r] - max_logit) / sum;
    __syncthreads();
    // 3. H_res[s][t] = the sum of the pi_r whose permutation maps s to t, in order of r; one
    //    thread per entry
    for (size_t i = threadIdx.x; i < m * m; i += blockDim.x) {
        size_t s = i / m, t = i % m;
        float h = 0.0f;
        for (size_t r = 0; r < R; r++) {
            if ((size_t)perms.perm[r * m + s] == t) h += pi[r];
        }
        H_res[i] = h;
    }
    __syncthreads();
    for (size_t k = threadIdx.x; k < W; k += blockDim.x) mix[n * W + k] = row[k];
    // 4. u = sum_s a_pre[s] X_s, one thread per column
    const float* x = X + n * m * d;
    for (size_t c = threadIdx.x; c < d; c += blockDim.x) {
        float sum_u = 0.0f;
        for (size_t s = 0; s < m; s++) sum_u += a_pre[s] * x[s * d + c];
        u[n * d + c] = sum_u;
    }
}

// forward was: u = sum_s a_pre[s] X_s, the coefficients from X through z and e. Per row:
//   value path:  dX_s += a_pre[s] du;  da_pre[s] = du . X_s
//   dpi_r = sum_s dH_res[s][perm_r[s]]  (dH_res, da_post: in dmix, from mhc_output_backward)
//   the pre-activations' gradients dlogit:
//     a_pre: da_pre a_pre (1 - a_pre);  pi: pi_r (dpi_r - sum_j pi_j dpi_j)
//                                           = pi_r sum_j pi_j (dpi_r - dpi_j);
//     a_post: da_post a_post (1 - a_post / 2)
//   logit_k = sigma_g e_k + beta_k: de_k = sigma_g dlogit_k, and the row's terms of dbeta
//   (dlogit_rows (N, E): dlogit itself) and of dsigma (scale_terms (N, 3): sum_{k in g}
//   dlogit_k e_k, k in order), which the caller sums over the rows
// One block per row: a warp per stream for da_pre, a thread per column of the streams, a
// thread per permutation, a thread per projected value, then a thread per scale g.
__global__ void mhc_input_backward_rows_kernel(float* dX, float* dmix, float* de,
                                               float* dlogit_rows, float* scale_terms, const float* du,
                                               const float* X, const float* mix, const float* e,
                                               const float* scale, Permutations perms, size_t d,
                                               size_t m, size_t R) {
    __shared__ float da_pre[MHC_MAX_STREAMS];
    __shared__ float dpi[MHC_MAX_PERMUTATIONS];
    __shared__ float dlogit_row[MHC_MAX_MIX_WIDTH];
    size_t n = blockIdx.x, E = 2 * m + R, W = E + m * m;
    unsigned int warp = threadIdx.x / WARP_SIZE, lane = threadIdx.x % WARP_SIZE;
    unsigned int n_warps = blockDim.x / WARP_SIZE;
    const float* x = X + n * m * d;
    const float* dun = du + n * d;
    const float* a_pre = mix + n * W;
    const float* pi = a_pre + m;
    const float* a_post = pi + R;
    float* dm = dmix + n * W;
    const float* da_post = dm + m + R;
    const float* dH_res = da_post + m;
    // 1. da_pre[s] = du . X_s, one warp per stream; dX_s += a_pre[s] du, one thread per column
    for (size_t s = warp; s < m; s += n_warps) {
        float dot = warp_dot(dun, x + s * d, d);
        if (lane == 0) da_pre[s] = dm[s] = dot;
    }
    float* dx = dX + n * m * d;
    for (size_t i = threadIdx.x; i < m * d; i += blockDim.x) dx[i] += a_pre[i / d] * dun[i % d];
    // 2. dpi_r = sum_s dH_res[s][perm_r[s]], one thread per permutation
    for (size_t r = threadIdx.x; r < R; r += blockDim.x) {
        dpi[r] = dm[m + r] = permutation_gradient(dH_res, perms, r, m);
    }
    __syncthreads();
    // 3. dlogit, one thread per projected value; the softmax's with the differences first,
    //    pi_r sum_j pi_j (dpi_r - dpi_j), as on the CPU: exactly 0 where every dpi_r is equal
    for (size_t k = threadIdx.x; k < E; k += blockDim.x) {
        float dlogit;
        if (k < m) {
            dlogit = da_pre[k] * a_pre[k] * (1.0f - a_pre[k]);
        } else if (k < m + R) {
            float centred = 0.0f;
            for (size_t j = 0; j < R; j++) centred += pi[j] * (dpi[k - m] - dpi[j]);
            dlogit = pi[k - m] * centred;
        } else {
            dlogit = da_post[k - m - R] * a_post[k - m - R] * (1.0f - 0.5f * a_post[k - m - R]);
        }
        dlogit_row[k] = dlogit_rows[n * E + k] = dlogit;
        de[n * E + k] = dlogit * scale[scale_group(k, m, R)];
    }
    __syncthreads();
    // 4. the row's terms of dsigma, one thread per scale g: sum_{k in g} dlogit_k e_k
    for (size_t g = threadIdx.x; g < 3; g += blockDim.x) {
        size_t first = g == 0 ? 0 : g == 1 ? m : m + R, end = g == 0 ? m : g == 1 ? m + R : E;
        float sum = 0.0f;
        for (size_t k = first; k < end; k++) sum += dlogit_row[k] * e[n * E + k];
        scale_terms[n * 3 + g] = sum;
    }
}

// Xnext_t = sum_s H_res[s][t] X_s + a_post[t] f (in order of s); one thread per element of Xnext
__global__ void mhc_output_forward_kernel(float* Xnext, const float* X, const float* f,
                                          const float* mix, size_t N, size_t d, size_t m,
                                          size_t R) {
    size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= N * m * d) return;
    size_t n = idx / (m * d), t = idx / d % m, c = idx % d, W = 2 * m + R + m * m;
    const float* a_post = mix + n * W + m + R;
    const float* H_res = a_post + m;
    const float* x = X + n * m * d;
    float sum = a_post[t] * f[n * d + c];
    for (size_t s = 0; s < m; s++) sum += H_res[s * m + t] * x[s * d + c];
    Xnext[idx] = sum;
}

// forward was: Xnext_t = sum_s H_res[s][t] X_s + a_post[t] f, so
//   da_post[t] = f . dXnext_t;  dH_res[s][t] = X_s . dXnext_t   (written into dmix)
//   df += sum_t a_post[t] dXnext_t;  dX_s += sum_t H_res[s][t] dXnext_t
// One block per row: a warp per dot product (m + m*m of them), then a thread per column.
__global__ void mhc_output_backward_kernel(float* dX, float* df, float* dmix, const float* dXnext,
                                           const float* X, const float* f, const float* mix,
                                           size_t d, size_t m, size_t R) {
    size_t n = blockIdx.x, W = 2 * m + R + m * m;
    unsigned int warp = threadIdx.x / WARP_SIZE, lane = threadIdx.x % WARP_SIZE;
    unsigned int n_warps = blockDim.x / WARP_SIZE;
    const float* a_post = mix + n * W + m + R;
    const float* H_res = a_post + m;
    float* da_post = dmix + n * W + m + R;  // then dH_res, at da_post + m
    const float* x = X + n * m * d;
    const float* fn = f + n * d;
    const float* dnext = dXnext + n * m * d;
    // 1. the dot products: j < m is da_post[j], j = m + s*m + t is dH_res[s][t]
    for (size_t j = warp; j < m + m * m; j += n_warps) {
        size_t t = j < m ? j : (j - m) % m;
        float dot = warp_dot(j < m ? fn : x + (j - m) / m * d, dnext + t * d, d);
        if (lane == 0) da_post[j] = dot;
    }
    // 2. df and dX, one thread per column (of f, then of the streams)
    for (size_t c = threadIdx.x; c < d; c += blockDim.x) {
        float sum = 0.0f;
        for (size_t t = 0; t < m; t++) sum += a_post[t] * dnext[t * d + c];
        df[n * d + c] += sum;
    }
    float* dx = dX + n * m * d;
    for (size_t i = threadIdx.x; i < m * d; i += blockDim.x) {
        size_t s = i / d, c = i % d;
        float sum = 0.0f;
        for (size_t t = 0; t < m; t++) sum += H_res[s * m + t] * dnext[t * d + c];
        dx[i] += sum;
    }
}

// ---- the layers.cuh functions --------------------------------------------------------------
static const size_t ELEMENT_BLOCK = 256;  // threads per block of the one-thread-per-element kernels

size_t mhc_workspace_floats_cuda(size_t N, size_t m) {
    size_t E = 2 * m + mhc_permutation_table(NULL, m);
    return (N + ceil_div(N, ROWS_PER_PART)) * (E + 3);
}

void mhc_expand_forward_cuda(float* X, const float* x0, size_t N, size_t d, size_t m) {
    launch_kernel(mhc_expand_forward_kernel, ceil_div(N * m * d, ELEMENT_BLOCK), ELEMENT_BLOCK,
                  X, x0, N, d, m);
}

void mhc_expand_backward_cuda(float* dx0, const float* dX, size_t N, size_t d, size_t m) {
    launch_kernel(mhc_expand_backward_kernel, ceil_div(N * d, ELEMENT_BLOCK), ELEMENT_BLOCK, dx0,
                  dX, N, d, m);
}

void mhc_reduce_forward_cuda(float* out, const float* X, size_t N, size_t d, size_t m) {
    launch_kernel(mhc_reduce_forward_kernel, ceil_div(N * d, ELEMENT_BLOCK), ELEMENT_BLOCK, out,
                  X, N, d, m);
}

void mhc_reduce_backward_cuda(float* dX, const float* dout, size_t N, size_t d, size_t m) {
    launch_kernel(mhc_reduce_backward_kernel, ceil_div(N * m * d, ELEMENT_BLOCK), ELEMENT_BLOCK,
                  dX, dout, N, d, m);
}

void mhc_input_forward_cuda(float* u, float* mix, float* e, float* z, float* rstd,
                            const float* X, MhcParams params, size_t N, size_t d, size_t m) {
    size_t R;
    Permutations perms = permutations(m, &R);
    rmsnorm_forward_cuda(z, rstd, X, params.norm, N, m * d);
    linear_forward_cuda(e, z, params.proj, N, m * d, 2 * m + R);
    launch_kernel(mhc_input_forward_kernel, (unsigned int)N, MHC_BLOCK, u, mix, e, X, params.bias,
                  params.scale, perms, d, m, R);
}

void mhc_input_backward_cuda(float* dX, MhcParams grads, float* dmix, float* de, float* dz,
                             const float* du, const float* X, const float* z, const float* rstd,
                             const float* e, const float* mix, MhcParams params, size_t N,
                             size_t d, size_t m) {
    size_t R;
    Permutations perms = permutations(m, &R);
    size_t E = 2 * m + R;
    // the workspace: the rows' dlogit (N, E) and dsigma terms (N, 3), then their sums over
    // parts of rows, (parts, E) and (parts, 3)
    size_t parts = ceil_div(N, ROWS_PER_PART);
    float* dlogit_rows = cuda_workspace(mhc_workspace_floats_cuda(N, m));
    float* scale_terms = dlogit_rows + N * E;
    float* bias_partial = scale_terms + N * 3;
    float* scale_partial = bias_partial + parts * E;
    launch_kernel(mhc_input_backward_rows_kernel, (unsigned int)N, MHC_BLOCK, dX, dmix, de,
                  dlogit_rows, scale_terms, du, X, mix, e, params.scale, perms, d, m, R);
    add_column_sums_cuda(grads.bias, bias_partial, dlogit_rows, N, E);
    add_column_sums_cuda(grads.scale, scale_partial, scale_terms, N, 3);
    cuda_memset_async(dz, 0, N * m * d * sizeof(float));
    linear_backward_cuda(dz, grads.proj, de, z, params.proj, N, m * d, E);
    rmsnorm_backward_cuda(dX, grads.norm, dz, X, params.norm, rstd, N, m * d);
}

void mhc_output_forward_cuda(float* Xnext, const float* X, const float* f, const float* mix,
                             size_t N, size_t d, size_t m) {
    size_t R = mhc_permutation_table(NULL, m);
    launch_kernel(mhc_output_forward_kernel, ceil_div(N * m * d, ELEMENT_BLOCK), ELEMENT_BLOCK,
                  Xnext, X, f, mix, N, d, m, R);
}

void mhc_output_backward_cuda(float* dX, float* df, float* dmix, const float* dXnext,
                              const float* X, const float* f, const float* mix, size_t N,
                              size_t d, size_t m) {
    size_t R = mhc_permutation_table(NULL, m);
    launch_kernel(mhc_output_backward_kernel, (unsigned int)N, MHC_BLOCK, dX, df, dmix, dXnext, X,
                  f, mix, d, m, R);
}
