// evaluate.c — the held-out metrics of a training run (evaluate.h).
#include <stdlib.h>
#include <string.h>
#include "evaluate.h"
#include "util.h"

static size_t argmax(const float* x, size_t n) {
    size_t best = 0;
    for (size_t i = 1; i < n; i++) { if (x[i] > x[best]) { best = i; } }
    return best;
}

// Greedy decoding of the answers of evaluation sequences x (sequences, T): the prompt and
// separator are given, each answer token is the argmax given everything before it, fed back
// as the next input. All sequences decode in lockstep with the cached decoder (inference.h):
// the prompt by one prefill, then one position per step.
// Returns the number of sequences whose whole answer equals the target in y.
static size_t greedy_exact_matches(Decoder* dec, const Dataset* ds, const int* x, const int* y,
                                   size_t sequences, int* work) {
    size_t T = (size_t)ds->seq_len, start = (size_t)ds->answer_start;
    size_t n_prompt = start + 1, n_answer = (size_t)ds->answer_len;  // prompt + separator
    for (size_t s = 0; s < sequences; s++) {
        memcpy(work + s * n_prompt, x + s * T, n_prompt * sizeof(int));
    }
    int* answer = mallocCheck(sequences * n_answer * sizeof(int));
    decoder_generate(dec, sequences, work, n_prompt, answer, n_answer, 0.0f, 0, NULL,  // greedy
                     NULL, NULL);
    size_t matches = 0;
    for (size_t s = 0; s < sequences; s++) {
        int ok = 1;
        for (size_t i = 0; i < n_answer; i++) { ok &= answer[s * n_answer + i] == y[s * T + start + i]; }
        matches += (size_t)ok;
    }
    free(answer);
    return matches;
}

EvalResult evaluate(Model* m, Decoder* dec, const Dataset* ds, const Options* o, int* x,
                           int* y, int* work) {
    size_t T = (size_t)ds->seq_len, V = (size_t)ds->vocab_size;
    size_t sequences = dataset_eval_sequences(ds);
    if (sequences > (size_t)o->eval_examples) { sequences = (size_t)o->eval_examples; }
    double loss_sum = 0.0;
    size_t scored = 0, correct = 0, matches = 0;
    for (size_t first = 0; first < sequences; first += m->max_B) {
        size_t b = sequences - first < m->max_B ? sequences - first : m->max_B;
        dataset_eval_batch(ds, x, y, b, first);
        model_forward(m, x, y, b, T);
        const float* probs = model_probs(m);
        const float* losses = m->acts.losses;
        for (size_t i = 0; i < b * T; i++) {
            if (y[i] < 0) { continue; }
            scored++;
            loss_sum += (double)losses[i];
            correct += argmax(probs + i * V, V) == (size_t)y[i];
        }
        if (ds->kind != TASK_TEXT) { matches += greedy_exact_matches(dec, ds, x, y, b, work); }
    }
    EvalResult r;
    r.val_loss = (float)(loss_sum / (double)scored);
    r.accuracy = 100.0f * (float)correct / (float)scored;
    r.exact_match = ds->kind == TASK_TEXT ? -1.0f : 100.0f * (float)matches / (float)sequences;
    return r;
}

void measure_eval_alpha(Model* m, const Dataset* ds, const Options* o, int* x, int* y,
                               Diagnostics* dg) {
    size_t sequences = dataset_eval_sequences(ds);
    if (sequences > (size_t)o->eval_examples) { sequences = (size_t)o->eval_examples; }
    if (sequences > EVAL_ALPHA_SEQUENCES) { sequences = EVAL_ALPHA_SEQUENCES; }
    diagnostics_alpha_begin(dg);
    for (size_t first = 0; first < sequences; first += m->max_B) {
        size_t b = sequences - first < m->max_B ? sequences - first : m->max_B;
        dataset_eval_batch(ds, x, y, b, first);
        model_forward(m, x, y, b, (size_t)ds->seq_len);
        diagnostics_alpha_add(dg, m);
    }
    diagnostics_alpha_end(dg);
}

