// util.h — checked allocation (report file and line, then exit, as llm.c) and the one
// shared arithmetic helper, a dot product.
#ifndef ATTNRES_UTIL_H
#define ATTNRES_UTIL_H

#include <stdio.h>
#include <stdlib.h>

static inline void* malloc_check(size_t size, const char* file, int line) {
    void* p = malloc(size ? size : 1);
    if (p == NULL) {
        fprintf(stderr, "error: out of memory allocating %zu bytes at %s:%d\n", size, file, line);
        exit(1);
    }
    return p;
}
static inline void* calloc_check(size_t count, size_t size, const char* file, int line) {
    void* p = calloc(count ? count : 1, size ? size : 1);
    if (p == NULL) {
        fprintf(stderr, "error: out of memory allocating %zu x %zu bytes at %s:%d\n",
                count, size, file, line);
        exit(1);
    }
    return p;
}
// a . b over n floats. Sixteen independent partial sums let the compiler use one 16-wide
// vector register without -ffast-math (a plain `s += a[i] * b[i]` loop must stay scalar,
// since C fixes its summation order); the order here is fixed too, so results are
// reproducible. Why 16 and not 8: with 8, gcc 12 (-O3 -march=native, AVX-512) shuffles the
// partial sums between half registers, and a 256-float dot took 80-100 ns against 13 ns
// with 16 (2-core AMD EPYC, in cache); the depth attention's full-mode step fell from 44 to
// 20 ms.
static inline float dot(const float* a, const float* b, size_t n) {
    float acc[16] = {0.0f};
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        for (size_t j = 0; j < 16; j++) { acc[j] += a[i + j] * b[i + j]; }
    }
    for (size_t j = 0; j < 8; j++) { acc[j] += acc[j + 8]; }
    float sum = ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
    for (; i < n; i++) { sum += a[i] * b[i]; }
    return sum;
}

// sum of x[i]^2 in double, in index order (the global gradient norm's sum)
static inline double sum_of_squares(const float* x, size_t n) {
    double sum = 0.0;
    for (size_t i = 0; i < n; i++) { sum += (double)x[i] * (double)x[i]; }
    return sum;
}

#define mallocCheck(size) malloc_check(size, __FILE__, __LINE__)
#define callocCheck(count, size) calloc_check(count, size, __FILE__, __LINE__)

#endif
