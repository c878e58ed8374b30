// dataset.h — the training data of attnres.c: toy tasks and byte-level text.
//
// Tasks (reverse, copy, sort): an example is a prompt of `length` random symbols, a
// separator, then the answer (the prompt reversed, copied or sorted). Token 0 is the
// separator and symbols are 1..n_symbols, so vocab_size = n_symbols + 1. A sequence of x
// holds the first 2*length tokens of the example (T = 2*length); y[t] is the next token for
// the answer positions t = length .. 2*length-1 and -1 (ignored) elsewhere, so the loss is on
// the answer only. Training examples are a deterministic function of (seed, step, sequence);
// the held-out evaluation set is drawn from its own stream and never appears in training.
//
// Text: any file, bytes as tokens (vocab_size = 256); the first 90% is the training split,
// the last 10% the validation split; a training sequence is a random window of T+1 bytes.
#ifndef ATTNRES_DATASET_H
#define ATTNRES_DATASET_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum { TASK_REVERSE, TASK_COPY, TASK_SORT, TASK_TEXT } TaskKind;

typedef struct {
    TaskKind kind;
    int vocab_size;      // tokens are in [0, vocab_size)
    int seq_len;         // T: the length of every sequence of x and y
    int answer_start;    // first position of x whose target is an answer token (tasks: length)
    int answer_len;      // tasks: length; text: seq_len
    uint64_t seed;
    // tasks
    int length, n_symbols;
    size_t n_eval;       // examples in the held-out set
    int* eval_examples;  // (n_eval, 2*length+1): prompt, separator, answer
    uint64_t* eval_hashes; size_t hash_capacity;  // open-addressing set of eval examples
    // text
    unsigned char* text; size_t n_text, n_train;  // the whole file; bytes [0,n_train) train
} Dataset;

// Each returns 0 on success, or -1 after writing a one-line reason into err.
int dataset_init_task(Dataset* ds, const char* task_name, int length, int n_symbols,
                      size_t n_eval, uint64_t seed, char* err, size_t err_len);
// Text: the whole file in memory, a regular file of at most max_bytes (a larger one is
// refused, and so are a pipe, which could block forever, and a device such as the endless
// /dev/zero); ./train passes TEXT_MAX_BYTES.
#define TEXT_MAX_BYTES ((size_t)1 << 30)  // 1 GiB: enwik9's 10^9 bytes fit
int dataset_init_text(Dataset* ds, const char* path, int seq_len, size_t max_bytes,
                      uint64_t seed, char* err, size_t err_len);
void dataset_free(Dataset* ds);
// The bytes a dataset holds: a task's held-out set of n_eval examples with its hash set
// (what dataset_init_task will allocate, known before it does; 0 for a length or n_eval it
// refuses), or a text file's bytes.
size_t dataset_task_bytes(int length, size_t n_eval);
size_t dataset_bytes(const Dataset* ds);

// x, y are (B, seq_len). Deterministic in (seed, step): resuming at a step replays it.
void dataset_train_batch(const Dataset* ds, int* x, int* y, size_t B, uint64_t step);
// Number of evaluation sequences (tasks: n_eval; text: non-overlapping windows of the val split).
size_t dataset_eval_sequences(const Dataset* ds);
// Evaluation sequences [first, first+B) (wrapping round at the end), same layout as training.
void dataset_eval_batch(const Dataset* ds, int* x, int* y, size_t B, size_t first);

#ifdef __cplusplus
}
#endif
#endif
