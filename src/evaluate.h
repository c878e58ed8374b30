// evaluate.h — the held-out metrics of a training run: the validation loss, the next-token
// accuracy and, for the tasks, whole answers right under greedy decoding.
#ifndef ATTNRES_EVALUATE_H
#define ATTNRES_EVALUATE_H

#include "dataset.h"
#include "diagnostics.h"
#include "inference.h"
#include "model.h"
#include "options.h"

typedef struct {
    float val_loss;
    float accuracy;     // next-token accuracy on the scored positions (teacher forcing), %
    float exact_match;  // tasks: whole answers right under greedy decoding, %; text: -1
} EvalResult;

// The first min(--eval-examples, the held-out sequences) sequences, in batches of m->max_B
// (the training batch's B sequences); x, y, work hold (max_B, T) ints each. dec (built for
// max_B sequences) decodes the tasks' answers. The validation loss is the mean of every scored
// token's loss, summed in double in the sequences' order: the same bits whatever the batch.
EvalResult evaluate(Model* m, Decoder* dec, const Dataset* ds, const Options* o, int* x, int* y,
                    int* work);
// The sequences whose depth-attention weights the diagnostics and the final heatmap average
#define EVAL_ALPHA_SEQUENCES 64
// Depth-attention weights averaged over the tokens of the first min(EVAL_ALPHA_SEQUENCES,
// --eval-examples, the held-out sequences) sequences, in batches of m->max_B, into dg
void measure_eval_alpha(Model* m, const Dataset* ds, const Options* o, int* x, int* y,
                        Diagnostics* dg);

#endif
