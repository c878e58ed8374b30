// crossentropy.c — softmax over the vocabulary and cross-entropy with ignored targets.
#include <math.h>
#include "layers.h"

// logits, probs (N,V); losses (N); a target of -1 is ignored (loss 0, no gradient), and so
// is every row when targets is NULL (probabilities only).
// loss = logsumexp(logits) - logits[target], computed with the row max subtracted so that
// large logits cannot overflow.
void crossentropy_forward(float* losses, float* probs, const float* logits,
                          const int* targets, size_t N, size_t V) {
    #pragma omp parallel for
    for (size_t n = 0; n < N; n++) {
        const float* z = logits + n * V;
        float* prob = probs + n * V;
        float max_logit = -INFINITY;
        for (size_t i = 0; i < V; i++) { if (z[i] > max_logit) { max_logit = z[i]; } }
        float sum = 0.0f;
        for (size_t i = 0; i < V; i++) {
            prob[i] = expf(z[i] - max_logit);
            sum += prob[i];
        }
        for (size_t i = 0; i < V; i++) { prob[i] /= sum; }
        int target = targets != NULL ? targets[n] : -1;
        losses[n] = target < 0 ? 0.0f : logf(sum) + max_logit - z[target];
    }
}

size_t crossentropy_count(const int* targets, size_t N) {
    size_t count = 0;
    for (size_t n = 0; targets != NULL && n < N; n++) { count += targets[n] >= 0; }
    return count;
}

// forward was: loss = -log softmax(z)[target]  =>  dz = probs - onehot(target)
void crossentropy_backward(float* dlogits, const float* probs, const int* targets,
                           float scale, size_t N, size_t V) {
    #pragma omp parallel for
    for (size_t n = 0; n < N; n++) {
        int target = targets[n];
        if (target < 0) { continue; }
        const float* prob = probs + n * V;
        float* dz = dlogits + n * V;
        for (size_t i = 0; i < V; i++) {
            float indicator = (i == (size_t)target) ? 1.0f : 0.0f;
            dz[i] += scale * (prob[i] - indicator);
        }
    }
}
