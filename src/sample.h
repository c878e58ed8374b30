// sample.h — ./train --sample: generate from a checkpoint with the cached decoder
// (inference.h).
#ifndef ATTNRES_SAMPLE_H
#define ATTNRES_SAMPLE_H

#include <stddef.h>
#include "dataset.h"
#include "inference.h"
#include "options.h"

// Prints what the checkpoint o->checkpoint generates after the prompt the flags give
// (sample.c says which). 0, or -1 with one line in err.
int sample_main(const Options* o, char* err, size_t err_len);
// Training on text: what the model writes now, greedy, after the first bytes of the
// validation text (x, y: scratch for one sequence; dec: built for at least one sequence)
void sample_print_text(Decoder* dec, const Dataset* ds, int* x, int* y);

#endif
