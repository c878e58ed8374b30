// muon.c — one Muon step on one matrix (SPEC "Optimisers and schedules"; Liu et al. 2025):
// the momentum's Nesterov direction, orthogonalised by Newton–Schulz, scaled to AdamW's
// update size. Every product runs through linear.c's tiled matmul.
//
// Why: Muon replaces the update's singular values by (about) 1, so every direction of the
// matrix moves by the same amount (docs/optimisers.md). An SVD would do it exactly; five
// steps of the odd quintic phi(x) = a x + b x^3 + c x^5, applied to the matrix as
// X <- a X + (b X X^T + c (X X^T)^2) X, do it approximately with matmuls alone: each step
// maps every singular value s of X to phi(s), and with X scaled to Frobenius norm 1 (so every
// s <= 1) five steps bring every s not too close to 0 into about [0.68, 1.13].
#include <math.h>
#include <string.h>
#include "layers.h"
#include "util.h"

#define NS_A 3.4445f
#define NS_B (-4.7750f)
#define NS_C 2.0315f

// X and the iteration's work, kept between calls and grown as needed (util.h), one per
// thread: muon_update orthogonalises several matrices at once
static _Thread_local Scratch scratch;

// X (rows,cols), rows <= cols, orthogonalised in place: five times
//   Y = X X^T; Z = b Y + c Y Y; X = a X + Z X
// work holds 3 rows^2 + rows*cols floats (Y, c Y, Z, and the next X).
void newton_schulz(float* X, float* work, size_t rows, size_t cols) {
    size_t n = rows * cols, r2 = rows * rows;
    float *Y = work, *cY = Y + r2, *Z = cY + r2, *next = Z + r2;
    float* current = X;  // X and next take turns
    for (int step = 0; step < NEWTON_SCHULZ_STEPS; step++) {
        linear_forward(Y, current, current, rows, cols, rows);  // Y (rows,rows) = X X^T
        for (size_t i = 0; i < r2; i++) {
            cY[i] = NS_C * Y[i];
            Z[i] = NS_B * Y[i];
        }
        matmul_add(Z, Y, cY, rows, rows, rows);                 // Z = b Y + Y (c Y)
        for (size_t i = 0; i < n; i++) next[i] = NS_A * current[i];
        matmul_add(next, Z, current, rows, rows, cols);         // next = a X + Z X
        float* previous = current;
        current = next;
        next = previous;
    }
    if (current != X) { memcpy(X, current, n * sizeof(float)); }
}

// W (rows,cols) with gradient G and momentum buffer M; A = rows, B = cols:
//   M = mu M + G; N = G + mu M (Nesterov, with the new M); X = N / (|N|_F + 1e-7);
//   X^T when A > B, so that the iteration runs on the short side; Newton–Schulz; back;
//   W -= lr (weight_decay W + 0.2 sqrt(max(A,B)) X)
static void muon_matrix(float* params, const float* grads, float* momentum, size_t rows,
                        size_t cols, float lr, float mu, float weight_decay) {
    size_t n = rows * cols, short_side = rows < cols ? rows : cols;
    size_t long_side = rows < cols ? cols : rows;
    int transposed = rows > cols;
    float* X = scratch_floats(&scratch, 2 * n + 3 * short_side * short_side);
    float* work = X + n;
    double sum_sq = 0.0;  // in index order: the same bits for any thread count
    for (size_t i = 0; i < rows; i++)
        for (size_t j = 0; j < cols; j++) {
            size_t idx = i * cols + j;
            float g = grads[idx];
            momentum[idx] = mu * momentum[idx] + g;
            float nesterov = g + mu * momentum[idx];
            X[transposed ? j * rows + i : idx] = nesterov;
            sum_sq += (double)nesterov * nesterov;
        }
    float denominator = (float)sqrt(sum_sq) + 1e-7f;
    for (size_t i = 0; i < n; i++) X[i] /= denominator;
    newton_schulz(X, work, short_side, long_side);
    float scale = 0.2f * sqrtf((float)long_side);
    for (size_t i = 0; i < rows; i++)
        for (size_t j = 0; j < cols; j++) {
            size_t idx = i * cols + j;
            float x = X[transposed ? j * rows + i : idx];
            params[idx] -= lr * (weight_decay * params[idx] + scale * x);
        }
}

// count matrices (rows,cols) one after another (a tensor's layers): each thread takes whole
// matrices, its matmuls on one thread (a nested parallel region runs on the thread that
// opens it), so that no product waits at a barrier for the other core; one matrix alone
// gets every thread in its products. The bits are the same either way: every matmul output
// is one chain of sums in a fixed order (linear.c).
void muon_update(float* params, const float* grads, float* momentum, size_t count, size_t rows,
                 size_t cols, float lr, float mu, float weight_decay) {
    size_t n = rows * cols;
    #pragma omp parallel for schedule(dynamic, 1) if (count > 1)
    for (size_t k = 0; k < count; k++) {
        muon_matrix(params + k * n, grads + k * n, momentum + k * n, rows, cols, lr, mu,
                    weight_decay);
    }
}
