// adamw.c — one AdamW step with PyTorch semantics (decoupled weight decay).
#include <math.h>
#include "layers.h"

// m = b1 m + (1-b1) g ; v = b2 v + (1-b2) g^2 ; mhat = m/(1-b1^t) ; vhat = v/(1-b2^t)
// param -= lr * (mhat / (sqrt(vhat) + eps) + weight_decay * param)     (t counts from 1)
void adamw_update(float* params, const float* grads, float* m, float* v, size_t n,
                  float lr, float beta1, float beta2, float eps, float weight_decay, int t) {
    float correction1 = 1.0f - powf(beta1, (float)t);
    float correction2 = 1.0f - powf(beta2, (float)t);
    #pragma omp parallel for
    for (size_t i = 0; i < n; i++) {
        float g = grads[i];
        m[i] = beta1 * m[i] + (1.0f - beta1) * g;
        v[i] = beta2 * v[i] + (1.0f - beta2) * g * g;
        float m_hat = m[i] / correction1;
        float v_hat = v[i] / correction2;
        params[i] -= lr * (m_hat / (sqrtf(v_hat) + eps) + weight_decay * params[i]);
    }
}
