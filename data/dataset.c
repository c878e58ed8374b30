// dataset.c — the toy tasks (reverse, copy, sort) and byte-level text of dataset.h.
//
// Randomness is splitmix64: training sequence `sequence` of step `step` draws from a stream
// seeded by hash(seed, step, sequence), so a batch is the same whatever B is split into
// (threads, resume). The held-out set draws from its own stream (seed ^ EVAL_STREAM). Its
// prompts go into an open-addressing set of 64-bit prompt hashes, and a training draw whose
// prompt hash is in that set is redrawn: equal prompts have equal hashes, so training and
// eval are disjoint (a hash collision can only reject a few extra training prompts, never
// admit an eval one).
#define _POSIX_C_SOURCE 200809L  // stat()
#include "dataset.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "rng.h"

#define MAX_LENGTH 4096
#define MAX_SYMBOLS 65535
#define EVAL_STREAM 0xE7A1C0DE5EEDF00Dull

// ----------------------------------------------------------------------------
// randomness and hashing

// the stream of training sequence `sequence` of step `step`
static uint64_t sequence_stream(uint64_t seed, uint64_t step, uint64_t sequence) {
    return rng_mix64(rng_mix64(rng_mix64(seed + RNG_GOLDEN) ^ step) ^ sequence);
}

// hash of a prompt; never 0, which marks an empty slot of the set
static uint64_t prompt_hash(const int* prompt, int length) {
    uint64_t h = RNG_GOLDEN;
    for (int i = 0; i < length; i++) { h = rng_mix64(h + (uint64_t)prompt[i]); }
    return h ? h : 1;
}

static int eval_set_contains(const Dataset* ds, uint64_t h) {
    size_t mask = ds->hash_capacity - 1;
    for (size_t i = h & mask; ds->eval_hashes[i]; i = (i + 1) & mask) {
        if (ds->eval_hashes[i] == h) { return 1; }
    }
    return 0;
}

static void eval_set_insert(Dataset* ds, uint64_t h) {
    size_t mask = ds->hash_capacity - 1;
    size_t i = h & mask;
    while (ds->eval_hashes[i]) { i = (i + 1) & mask; }
    ds->eval_hashes[i] = h;
}

static int fail(char* err, size_t err_len, const char* fmt, ...) {
    if (err && err_len) {
        va_list args;
        va_start(args, fmt);
        vsnprintf(err, err_len, fmt, args);
        va_end(args);
    }
    return -1;
}

// ----------------------------------------------------------------------------
// tasks

static int compare_ints(const void* a, const void* b) {
    int x = *(const int*)a, y = *(const int*)b;
    return (x > y) - (x < y);
}

// prompt is (length,) of symbols in 1..n_symbols; answer is (length,)
static void write_answer(TaskKind kind, const int* prompt, int length, int* answer) {
    if (kind == TASK_REVERSE) {
        for (int i = 0; i < length; i++) { answer[i] = prompt[length - 1 - i]; }
    } else {
        memcpy(answer, prompt, (size_t)length * sizeof(int));
        if (kind == TASK_SORT) { qsort(answer, (size_t)length, sizeof(int), compare_ints); }
    }
}

// draws prompts from the stream until one is not in the eval set; returns its hash
static uint64_t draw_fresh_prompt(const Dataset* ds, uint64_t* stream, int* prompt) {
    for (;;) {
        for (int i = 0; i < ds->length; i++) {
            prompt[i] = 1 + (int)(rng_next(stream) % (uint64_t)ds->n_symbols);
        }
        uint64_t h = prompt_hash(prompt, ds->length);
        if (!eval_set_contains(ds, h)) { return h; }
    }
}

// whether n_symbols^length >= need, without overflow
static int prompt_space_holds(int n_symbols, int length, size_t need) {
    size_t space = 1;
    for (int i = 0; i < length && space < need; i++) {
        if (space > need / (size_t)n_symbols) { return 1; }
        space *= (size_t)n_symbols;
    }
    return space >= need;
}

// the eval set's hash set: a power of two, at least twice n_eval (load <= 1/2)
static size_t hash_capacity_for(size_t n_eval) {
    size_t capacity = 1;
    while (capacity < 2 * n_eval) { capacity *= 2; }
    return capacity;
}

size_t dataset_task_bytes(int length, size_t n_eval) {
    if (length < 1 || length > MAX_LENGTH) { return 0; }  // dataset_init_task says why
    size_t example_len = 2 * (size_t)length + 1;
    if (n_eval > SIZE_MAX / 4 / example_len / sizeof(int)) { return 0; }  // too many to count
    return n_eval * example_len * sizeof(int) + hash_capacity_for(n_eval) * sizeof(uint64_t);
}

size_t dataset_bytes(const Dataset* ds) {
    return ds->kind == TASK_TEXT ? ds->n_text : dataset_task_bytes(ds->length, ds->n_eval);
}

int dataset_init_task(Dataset* ds, const char* task_name, int length, int n_symbols,
                      size_t n_eval, uint64_t seed, char* err, size_t err_len) {
    memset(ds, 0, sizeof(*ds));
    const char* name = task_name ? task_name : "(null)";
    TaskKind kind;
    if (strcmp(name, "reverse") == 0) { kind = TASK_REVERSE; }
    else if (strcmp(name, "copy") == 0) { kind = TASK_COPY; }
    else if (strcmp(name, "sort") == 0) { kind = TASK_SORT; }
    else {
        return fail(err, err_len, "unknown task '%s': valid tasks are reverse, copy, sort",
                    name);
    }
    if (length < 1 || length > MAX_LENGTH) {
        return fail(err, err_len, "task '%s': length %d must be in [1, %d]",
                    name, length, MAX_LENGTH);
    }
    if (n_symbols < 2 || n_symbols > MAX_SYMBOLS) {
        return fail(err, err_len, "task '%s': n_symbols %d must be in [2, %d]",
                    name, n_symbols, MAX_SYMBOLS);
    }
    size_t example_len = 2 * (size_t)length + 1;
    if (n_eval < 1 || dataset_task_bytes(length, n_eval) == 0) {
        return fail(err, err_len, "task '%s': n_eval %zu must be positive and fit in memory",
                    name, n_eval);
    }
    if (!prompt_space_holds(n_symbols, length, 2 * n_eval)) {
        return fail(err, err_len, "task '%s': prompt space too small: n_symbols^length = "
                    "%d^%d must be at least 2*n_eval = %zu to hold the eval set and leave "
                    "room for training", name, n_symbols, length, 2 * n_eval);
    }

    ds->kind = kind;
    ds->vocab_size = n_symbols + 1;
    ds->seq_len = 2 * length;
    ds->answer_start = length;
    ds->answer_len = length;
    ds->seed = seed;
    ds->length = length;
    ds->n_symbols = n_symbols;
    ds->n_eval = n_eval;
    ds->hash_capacity = hash_capacity_for(n_eval);
    ds->eval_examples = malloc(n_eval * example_len * sizeof(int));
    ds->eval_hashes = calloc(ds->hash_capacity, sizeof(uint64_t));
    if (!ds->eval_examples || !ds->eval_hashes) {
        dataset_free(ds);
        return fail(err, err_len, "task '%s': out of memory for %zu eval examples",
                    name, n_eval);
    }
    // each draw redraws prompts already in the set, so the eval examples are distinct
    uint64_t stream = rng_mix64(seed ^ EVAL_STREAM);
    for (size_t e = 0; e < n_eval; e++) {
        int* example = ds->eval_examples + e * example_len;
        eval_set_insert(ds, draw_fresh_prompt(ds, &stream, example));
        example[length] = 0;
        write_answer(kind, example, length, example + length + 1);
    }
    return 0;
}

// x, y are (seq_len,): x = example[0..2L), y[t] = example[t+1] for t >= L, else -1,
// where example = prompt (L), separator 0, answer (L). The answer is written into y first.
static void task_train_sequence(const Dataset* ds, int* x, int* y, uint64_t stream) {
    int length = ds->length;
    draw_fresh_prompt(ds, &stream, x);
    write_answer(ds->kind, x, length, y + length);
    x[length] = 0;
    for (int t = 0; t + 1 < length; t++) { x[length + 1 + t] = y[length + t]; }
    for (int t = 0; t < length; t++) { y[t] = -1; }
}

static void task_eval_sequence(const Dataset* ds, int* x, int* y, size_t e) {
    int length = ds->length;
    const int* example = ds->eval_examples + e * (2 * (size_t)length + 1);
    for (int t = 0; t < 2 * length; t++) {
        x[t] = example[t];
        y[t] = t >= length ? example[t + 1] : -1;
    }
}

// ----------------------------------------------------------------------------
// text

int dataset_init_text(Dataset* ds, const char* path, int seq_len, size_t max_bytes,
                      uint64_t seed, char* err, size_t err_len) {
    memset(ds, 0, sizeof(*ds));
    if (seq_len < 1) {
        return fail(err, err_len, "text '%s': seq_len %d must be positive", path, seq_len);
    }
    struct stat st;
    if (stat(path, &st) != 0) {
        return fail(err, err_len, "text '%s': cannot open: %s", path, strerror(errno));
    }
    if (S_ISDIR(st.st_mode)) {
        return fail(err, err_len, "text '%s': is a directory, not a file", path);
    }
    // a pipe with no writer would block the open forever, and a device such as /dev/zero
    // never ends: only a regular file is read
    if (!S_ISREG(st.st_mode)) {
        return fail(err, err_len, "text '%s': is not a regular file (a device, pipe or socket)",
                    path);
    }
    if (st.st_size > 0 && (uintmax_t)st.st_size > max_bytes) {
        return fail(err, err_len, "text '%s': %jd bytes, more than the %zu --task text reads",
                    path, (intmax_t)st.st_size, max_bytes);
    }
    FILE* f = fopen(path, "rb");
    if (!f) {
        return fail(err, err_len, "text '%s': cannot open: %s", path, strerror(errno));
    }
    // read in doubling chunks, so a file whose size changes (or that stat says is empty, as
    // /proc's files do) reads correctly too; one byte more than max_bytes tells a file that
    // has grown too large
    size_t capacity = st.st_size > 0 ? (size_t)st.st_size + 1 : 4096, n = 0;
    unsigned char* text = NULL;
    for (;;) {
        if (capacity > max_bytes + 1) { capacity = max_bytes + 1; }
        unsigned char* bigger = realloc(text, capacity);
        if (!bigger) {
            free(text);
            fclose(f);
            return fail(err, err_len, "text '%s': out of memory reading it", path);
        }
        text = bigger;
        n += fread(text + n, 1, capacity - n, f);
        if (n < capacity || n > max_bytes) { break; }
        capacity *= 2;
    }
    if (n > max_bytes) {
        free(text);
        fclose(f);
        return fail(err, err_len, "text '%s': more than the %zu bytes --task text reads", path,
                    max_bytes);
    }
    int read_error = ferror(f);
    fclose(f);
    if (read_error) {
        free(text);
        return fail(err, err_len, "text '%s': read error: %s", path, strerror(errno));
    }
    if (n == 0) {
        free(text);
        return fail(err, err_len, "text '%s': file is empty", path);
    }
    // the validation split is the last n/10 bytes; it needs seq_len+1 bytes, so the file
    // needs 10*(seq_len+1), which leaves the train split 9*(seq_len+1)
    size_t window = (size_t)seq_len + 1;
    if (n / 10 < window) {
        free(text);
        return fail(err, err_len, "text '%s': too short: %zu bytes; seq_len %d needs at "
                    "least %zu so that the 10%% validation split holds seq_len+1 bytes",
                    path, n, seq_len, 10 * window);
    }
    ds->kind = TASK_TEXT;
    ds->vocab_size = 256;
    ds->seq_len = seq_len;
    ds->answer_start = 0;
    ds->answer_len = seq_len;
    ds->seed = seed;
    ds->text = text;
    ds->n_text = n;
    ds->n_train = n - n / 10;
    return 0;
}

// x, y are (T,): x = text[start, start+T), y = text[start+1, start+T+1)
static void text_sequence(const Dataset* ds, int* x, int* y, size_t start) {
    const unsigned char* window = ds->text + start;
    for (int t = 0; t < ds->seq_len; t++) {
        x[t] = window[t];
        y[t] = window[t + 1];
    }
}

// ----------------------------------------------------------------------------
// batches

void dataset_train_batch(const Dataset* ds, int* x, int* y, size_t B, uint64_t step) {
    size_t T = (size_t)ds->seq_len;
    for (size_t b = 0; b < B; b++) {
        uint64_t stream = sequence_stream(ds->seed, step, b);
        if (ds->kind == TASK_TEXT) {
            size_t n_starts = ds->n_train - T;  // windows of T+1 bytes inside the train split
            text_sequence(ds, x + b * T, y + b * T, (size_t)(rng_next(&stream) % n_starts));
        } else {
            task_train_sequence(ds, x + b * T, y + b * T, stream);
        }
    }
}

// text: sequence i is the window starting at n_train + i*T, so the x sequences tile the val
// split and so do the y sequences (each val byte after the first is a target exactly once)
size_t dataset_eval_sequences(const Dataset* ds) {
    if (ds->kind == TASK_TEXT) {
        return (ds->n_text - ds->n_train - 1) / (size_t)ds->seq_len;
    }
    return ds->n_eval;
}

void dataset_eval_batch(const Dataset* ds, int* x, int* y, size_t B, size_t first) {
    size_t T = (size_t)ds->seq_len, n_sequences = dataset_eval_sequences(ds);
    for (size_t b = 0; b < B; b++) {
        size_t i = (first + b) % n_sequences;
        if (ds->kind == TASK_TEXT) {
            text_sequence(ds, x + b * T, y + b * T, ds->n_train + i * T);
        } else {
            task_eval_sequence(ds, x + b * T, y + b * T, i);
        }
    }
}

void dataset_free(Dataset* ds) {
    free(ds->eval_examples);
    free(ds->eval_hashes);
    free(ds->text);
    memset(ds, 0, sizeof(*ds));
}
