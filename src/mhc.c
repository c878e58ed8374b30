// mhc.c — mHC-lite (SPEC.md "mHC-lite"): the residual stream widened into m streams, mixed
// after every sub-layer by a doubly stochastic m x m matrix H_res (SPEC's H, the mHC paper's
// H^res; H alone is the query heads' count) built exactly as a convex combination of the m!
// permutation matrices (no Sinkhorn iterations).
//
// Per row (position) n the state is m streams X_0 .. X_{m-1}, each (d), stored side by side:
// X is (N, m*d) with stream s of row n at X[n*m*d + s*d]. Sub-layer l:
//   z = rmsnorm(X; c)                    over all m*d values of the row, gain c (m*d)
//   e = z Phi^T                          Phi (E, m*d), E = 2m + R, R = m!
//   a_pre  = sigmoid(sigma[0] e_pre + beta_pre)         (m)
//   pi     = softmax(sigma[1] e_res + beta_res)         (R)
//   a_post = 2 sigmoid(sigma[2] e_post + beta_post)     (m)
//   H_res = sum_r pi_r P_r,  P_r[i][j] = 1 iff perm_r[i] = j  (m x m)
//   u = sum_s a_pre[s] X_s               the sub-layer's input (it norms u itself)
//   X'_t = sum_s H_res[s][t] X_s + a_post[t] f,  f = f_l(u)
// e is split in that order: e_pre = e[0 .. m-1], e_res = e[m .. m+R-1], e_post = the last m.
// The coefficients of a row are kept in one vector `mix` (MHC_MIX_WIDTH(m) floats):
//   [a_pre (m) | pi (R) | a_post (m) | H_res (m*m), H_res[s][t] at s*m + t]
// and their gradients in a vector `dmix` of the same layout.
// Before the first sub-layer every stream is x0 (mhc_expand_forward); after the last, the
// head reads sum_s rmsnorm(X_s; g_final): rmsnorm_forward over N*m rows of d, then
// mhc_reduce_forward.
#include <math.h>
#include <stdlib.h>
#include "layers.h"
#include "util.h"

size_t mhc_permutation_table(int* perms, size_t m) {
    size_t R = 1;
    for (size_t i = 2; i <= m; i++) { R *= i; }
    if (perms == NULL) { return R; }
    int perm[MHC_MAX_STREAMS];
    for (size_t i = 0; i < m; i++) { perm[i] = (int)i; }
    for (size_t r = 0; r < R; r++) {
        for (size_t i = 0; i < m; i++) { perms[r * m + i] = perm[i]; }
        // the next permutation in lexicographic order: the longest decreasing suffix starts
        // after position i; swap perm[i] with the smallest larger entry of the suffix, then
        // reverse the suffix
        size_t i = m - 1;
        while (i > 0 && perm[i - 1] > perm[i]) { i--; }
        if (i == 0) { break; }
        size_t j = m - 1;
        while (perm[j] < perm[i - 1]) { j--; }
        int t = perm[i - 1]; perm[i - 1] = perm[j]; perm[j] = t;
        for (size_t a = i, b = m - 1; a < b; a++, b--) { t = perm[a]; perm[a] = perm[b]; perm[b] = t; }
    }
    return R;
}

static float sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }

// X (N, m*d): every stream X_s = x0 (N, d)
void mhc_expand_forward(float* X, const float* x0, size_t N, size_t d, size_t m) {
    #pragma omp parallel for
    for (size_t n = 0; n < N; n++) {
        for (size_t s = 0; s < m; s++) {
            for (size_t c = 0; c < d; c++) { X[(n * m + s) * d + c] = x0[n * d + c]; }
        }
    }
}

// forward was: X_s = x0 for every s, so dx0 += sum_s dX_s
void mhc_expand_backward(float* dx0, const float* dX, size_t N, size_t d, size_t m) {
    #pragma omp parallel for
    for (size_t n = 0; n < N; n++) {
        for (size_t s = 0; s < m; s++) {
            for (size_t c = 0; c < d; c++) { dx0[n * d + c] += dX[(n * m + s) * d + c]; }
        }
    }
}

// out (N, d) = sum_s X_s, X (N, m*d)
void mhc_reduce_forward(float* out, const float* X, size_t N, size_t d, size_t m) {
    #pragma omp parallel for
    for (size_t n = 0; n < N; n++) {
        float* o = out + n * d;  // stream by stream, c contiguous
        for (size_t c = 0; c < d; c++) { o[c] = X[n * m * d + c]; }
        for (size_t s = 1; s < m; s++) {
            for (size_t c = 0; c < d; c++) { o[c] += X[(n * m + s) * d + c]; }
        }
    }
}

// forward was: out = sum_s X_s, so dX_s += dout for every s
void mhc_reduce_backward(float* dX, const float* dout, size_t N, size_t d, size_t m) {
    #pragma omp parallel for
    for (size_t n = 0; n < N; n++) {
        for (size_t s = 0; s < m; s++) {
            for (size_t c = 0; c < d; c++) { dX[(n * m + s) * d + c] += dout[n * d + c]; }
        }
    }
}

// u (N, d) and the row's coefficients from the streams X (N, m*d). Saves z (N, m*d) and
// rstd (N) of the stream norm, e (N, E) and mix (N, MHC_MIX_WIDTH(m)) for the backward.
// params: norm c (m*d), proj Phi (E, m*d), bias beta (E), scale sigma (3).
void mhc_input_forward(float* u, float* mix, float* e, float* z, float* rstd, const float* X,
                       MhcParams params, size_t N, size_t d, size_t m) {
    int perms[MHC_MAX_PERMUTATIONS * MHC_MAX_STREAMS];
    size_t R = mhc_permutation_table(perms, m), E = 2 * m + R, W = MHC_MIX_WIDTH(m);
    const float* bias = params.bias;
    const float* scale = params.scale;
    rmsnorm_forward(z, rstd, X, params.norm, N, m * d);
    linear_forward(e, z, params.proj, N, m * d, E);
    #pragma omp parallel for
    for (size_t n = 0; n < N; n++) {
        const float* en = e + n * E;
        float* a_pre = mix + n * W;
        float* pi = a_pre + m;
        float* a_post = pi + R;
        float* H_res = a_post + m;
        for (size_t s = 0; s < m; s++) { a_pre[s] = sigmoid(scale[0] * en[s] + bias[s]); }
        float max_logit = -INFINITY, sum = 0.0f;
        for (size_t r = 0; r < R; r++) {
            pi[r] = scale[1] * en[m + r] + bias[m + r];
            if (pi[r] > max_logit) { max_logit = pi[r]; }
        }
        for (size_t r = 0; r < R; r++) {
            pi[r] = expf(pi[r] - max_logit);
            sum += pi[r];
        }
        for (size_t r = 0; r < R; r++) { pi[r] /= sum; }
        for (size_t t = 0; t < m; t++) {
            a_post[t] = 2.0f * sigmoid(scale[2] * en[m + R + t] + bias[m + R + t]);
        }
        for (size_t i = 0; i < m * m; i++) { H_res[i] = 0.0f; }
        // H_res = sum_r pi_r P_r: P_r has its 1s at (i, perm_r[i])
        for (size_t r = 0; r < R; r++) {
            for (size_t i = 0; i < m; i++) { H_res[i * m + (size_t)perms[r * m + i]] += pi[r]; }
        }
        const float* x = X + n * m * d;
        float* un = u + n * d;  // stream by stream, so that the loop over c runs contiguously
        for (size_t c = 0; c < d; c++) { un[c] = a_pre[0] * x[c]; }
        for (size_t s = 1; s < m; s++) {
            for (size_t c = 0; c < d; c++) { un[c] += a_pre[s] * x[s * d + c]; }
        }
    }
}

// forward was: u = sum_s a_pre[s] X_s, with the coefficients from X through z and e (above).
// Every stream receives gradient twice: as a value summed into u, and through the norm that
// computes the coefficients.
//   value path:  dX_s += a_pre[s] du;  da_pre[s] = du . X_s
//   dH_res and da_post come in dmix (mhc_output_backward wrote them);
//   H_res = sum_r pi_r P_r:     dpi_r = sum_{s,t} P_r[s][t] dH_res[s][t]
//                                     = sum_s dH_res[s][perm_r[s]]
//   a_pre = sigmoid(logit):       dlogit = da_pre a_pre (1 - a_pre)
//   pi = softmax(q):              dq_r = pi_r (dpi_r - sum_j pi_j dpi_j)
//                                      = pi_r sum_j pi_j (dpi_r - dpi_j)   (sum_j pi_j = 1)
//   a_post = 2 sigmoid(logit):    dlogit = da_post a_post (1 - a_post / 2)
//   logit_k = sigma_g e_k + beta_k:
//                                 dbeta_k += dlogit_k; dsigma_g += sum_k dlogit_k e_k;
//                                 de_k = sigma_g dlogit_k
//   e = z Phi^T:                  dz = de Phi; dPhi += de^T z   (linear_backward)
//   z = rmsnorm(X; c):            dX, dc += (rmsnorm_backward)
// (g is the group of k: 0 pre, 1 res, 2 post.) The softmax's line takes the differences first,
// in double: at the first sub-layer every stream is x0, so every dpi_r is the same sum of
// the same dH_res values (in another order: in double, exactly), and dq is exactly 0, where the
// first form would leave the rounding of dpi (a few 1e-9) in the identity's bias gradient.
// dmix's a_pre and pi parts are written here;
// de (N, E) and dz (N, m*d) are scratch, overwritten. dX and grads' norm (dc), proj (dPhi),
// bias (dbeta) and scale (dsigma) +=.
void mhc_input_backward(float* dX, MhcParams grads, float* dmix, float* de, float* dz,
                        const float* du, const float* X, const float* z, const float* rstd,
                        const float* e, const float* mix, MhcParams params, size_t N, size_t d,
                        size_t m) {
    int perms[MHC_MAX_PERMUTATIONS * MHC_MAX_STREAMS];
    size_t R = mhc_permutation_table(perms, m), E = 2 * m + R, W = MHC_MIX_WIDTH(m);
    #pragma omp parallel for
    for (size_t n = 0; n < N; n++) {
        const float* x = X + n * m * d;
        const float* dun = du + n * d;
        const float* a_pre = mix + n * W;
        const float* pi = a_pre + m;
        const float* a_post = pi + R;
        float* da_pre = dmix + n * W;
        float* dpi = da_pre + m;
        const float* da_post = dpi + R;
        const float* dH_res = da_post + m;
        float* dlogit = de + n * E;  // the gradients of the pre-activations (logits), here
        float* dx = dX + n * m * d;
        for (size_t s = 0; s < m; s++) {
            da_pre[s] = dot(dun, x + s * d, d);
            for (size_t c = 0; c < d; c++) { dx[s * d + c] += a_pre[s] * dun[c]; }
        }
        double dpi_sum[MHC_MAX_PERMUTATIONS];  // dpi in double
        for (size_t r = 0; r < R; r++) {
            double sum = 0.0;
            for (size_t s = 0; s < m; s++) { sum += dH_res[s * m + (size_t)perms[r * m + s]]; }
            dpi_sum[r] = sum;
            dpi[r] = (float)sum;
        }
        for (size_t s = 0; s < m; s++) { dlogit[s] = da_pre[s] * a_pre[s] * (1.0f - a_pre[s]); }
        for (size_t r = 0; r < R; r++) {
            double centred = 0.0;  // sum_j pi_j (dpi_r - dpi_j)
            for (size_t j = 0; j < R; j++) { centred += pi[j] * (dpi_sum[r] - dpi_sum[j]); }
            dlogit[m + r] = (float)(pi[r] * centred);
        }
        for (size_t t = 0; t < m; t++) {
            dlogit[m + R + t] = da_post[t] * a_post[t] * (1.0f - 0.5f * a_post[t]);
        }
    }
    // dbeta and dsigma: sums over the rows, in row order (deterministic)
    for (size_t n = 0; n < N; n++) {
        const float* dlogit = de + n * E;
        const float* en = e + n * E;
        for (size_t k = 0; k < E; k++) {
            grads.bias[k] += dlogit[k];
            grads.scale[k < m ? 0 : k < m + R ? 1 : 2] += dlogit[k] * en[k];
        }
    }
    #pragma omp parallel for
    for (size_t n = 0; n < N; n++) {
        float* dlogit = de + n * E;
        for (size_t k = 0; k < E; k++) { dlogit[k] *= params.scale[k < m ? 0 : k < m + R ? 1 : 2]; }
    }
    size_t n_dz = N * m * d;
    #pragma omp parallel for
    for (size_t i = 0; i < n_dz; i++) { dz[i] = 0.0f; }
    linear_backward(dz, grads.proj, de, z, params.proj, N, m * d, E);
    rmsnorm_backward(dX, grads.norm, dz, X, params.norm, rstd, N, m * d);
}

// Xnext (N, m*d): X'_t = sum_s H_res[s][t] X_s + a_post[t] f, from the streams X (N, m*d), the
// sub-layer's output f (N, d) and the coefficients mix that mhc_input_forward saved.
void mhc_output_forward(float* Xnext, const float* X, const float* f, const float* mix,
                        size_t N, size_t d, size_t m) {
    size_t R = mhc_permutation_table(NULL, m), W = MHC_MIX_WIDTH(m);
    #pragma omp parallel for
    for (size_t n = 0; n < N; n++) {
        const float* a_post = mix + n * W + m + R;
        const float* H_res = a_post + m;
        const float* x = X + n * m * d;
        const float* fn = f + n * d;
        for (size_t t = 0; t < m; t++) {  // stream by stream: the loops over c run contiguously
            float* out = Xnext + (n * m + t) * d;
            for (size_t c = 0; c < d; c++) { out[c] = a_post[t] * fn[c]; }
            for (size_t s = 0; s < m; s++) {
                for (size_t c = 0; c < d; c++) { out[c] += H_res[s * m + t] * x[s * d + c]; }
            }
        }
    }
}

// forward was: X'_t = sum_s H_res[s][t] X_s + a_post[t] f, so
//   dX_s += sum_t H_res[s][t] dX'_t;  df += sum_t a_post[t] dX'_t
//   dH_res[s][t] = X_s . dX'_t;       da_post[t] = f . dX'_t
// dX and df +=; dmix's a_post and H_res parts are written (mhc_input_backward reads them).
void mhc_output_backward(float* dX, float* df, float* dmix, const float* dXnext, const float* X,
                         const float* f, const float* mix, size_t N, size_t d, size_t m) {
    size_t R = mhc_permutation_table(NULL, m), W = MHC_MIX_WIDTH(m);
    #pragma omp parallel for
    for (size_t n = 0; n < N; n++) {
        const float* a_post = mix + n * W + m + R;
        const float* H_res = a_post + m;
        float* da_post = dmix + n * W + m + R;
        float* dH_res = da_post + m;
        const float* x = X + n * m * d;
        const float* fn = f + n * d;
        const float* dnext = dXnext + n * m * d;
        float* dx = dX + n * m * d;
        float* dfn = df + n * d;
        for (size_t t = 0; t < m; t++) {
            da_post[t] = dot(fn, dnext + t * d, d);
            for (size_t s = 0; s < m; s++) { dH_res[s * m + t] = dot(x + s * d, dnext + t * d, d); }
        }
        for (size_t t = 0; t < m; t++) {  // term by term into the gradients, c contiguous
            for (size_t c = 0; c < d; c++) { dfn[c] += a_post[t] * dnext[t * d + c]; }
            for (size_t s = 0; s < m; s++) {
                float mixing = H_res[s * m + t];
                for (size_t c = 0; c < d; c++) { dx[s * d + c] += mixing * dnext[t * d + c]; }
            }
        }
    }
}
