// util.h — checked allocation (report file and line, then exit, as llm.c) and the shared
// arithmetic helpers: a dot product and an exponential that vectorises.
#ifndef ATTNRES_UTIL_H
#define ATTNRES_UTIL_H

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

// Room for an error line: two paths of PATH_MAX (4096) and the reason, so that a long path
// never cuts the message off before it says what is wrong.
#define ERROR_MAX 10240

static inline void* malloc_check(size_t size, const char* file, int line) {
    void* ptr = malloc(size ? size : 1);
    if (ptr == NULL) {
        fprintf(stderr, "error: out of memory allocating %zu bytes at %s:%d\n", size, file, line);
        exit(1);
    }
    return ptr;
}
static inline void* calloc_check(size_t count, size_t size, const char* file, int line) {
    void* ptr = calloc(count ? count : 1, size ? size : 1);
    if (ptr == NULL) {
        fprintf(stderr, "error: out of memory allocating %zu x %zu bytes at %s:%d\n",
                count, size, file, line);
        exit(1);
    }
    return ptr;
}
// The sixteen partial sums of dot and sum_of, added in one fixed order.
static inline float sum_partials(float acc[16]) {
    for (size_t j = 0; j < 8; j++) { acc[j] += acc[j + 8]; }
    return ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
}

// a . b over n floats. Sixteen independent partial sums let the compiler use one 16-wide
// vector register without -ffast-math (a plain `s += a[i] * b[i]` loop must stay scalar,
// since C fixes its summation order); the order here is fixed too, so results are
// reproducible. Why 16 and not 8: with 8, gcc 12 (-O3 -march=native, AVX-512) shuffles the
// partial sums between half registers, several times slower (docs/speed.md). Below 16
// floats the lanes are skipped (they would stay 0 and fold to +0: the same sum): a 16-head
// depth attention at d = 64 dots 4 channels at a time, where folding 16 lanes would cost
// more than the products.
static inline float dot(const float* a, const float* b, size_t n) {
    float sum = 0.0f;
    size_t i = 0;
    if (n >= 16) {
        float acc[16] = {0.0f};
        for (; i + 16 <= n; i += 16) {
            for (size_t j = 0; j < 16; j++) { acc[j] += a[i + j] * b[i + j]; }
        }
        sum = sum_partials(acc);
    }
    for (; i < n; i++) { sum += a[i] * b[i]; }
    return sum;
}

// x[0] + ... + x[n-1] in sixteen partial sums, for the reason dot gives (a plain loop stays
// scalar); the order is fixed, so the result is too.
static inline float sum_of(const float* x, size_t n) {
    float sum = 0.0f;
    size_t i = 0;
    if (n >= 16) {  // (as in dot)
        float acc[16] = {0.0f};
        for (; i + 16 <= n; i += 16) {
            for (size_t j = 0; j < 16; j++) { acc[j] += x[i + j]; }
        }
        sum = sum_partials(acc);
    }
    for (; i < n; i++) { sum += x[i]; }
    return sum;
}

// The largest of x[0..n), n >= 1 (-inf for n = 0), in sixteen lanes. gcc does not vectorise
// a maximum without -ffast-math (not even these lanes: they compile to 16 scalar vmaxss), but
// sixteen independent comparisons run side by side where one running maximum waits on each
// one before, which shows in the attention forward. The same value in any order; a NaN is
// skipped, as a plain `if (x > m) m = x` skips it.
static inline float max_of(const float* x, size_t n) {
    float lane[16];
    for (size_t j = 0; j < 16; j++) { lane[j] = -INFINITY; }
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        for (size_t j = 0; j < 16; j++) { lane[j] = x[i + j] > lane[j] ? x[i + j] : lane[j]; }
    }
    for (; i < n; i++) { lane[0] = x[i] > lane[0] ? x[i] : lane[0]; }
    float m = lane[0];
    for (size_t j = 1; j < 16; j++) { m = lane[j] > m ? lane[j] : m; }
    return m;
}

// e^x from + - * and bit moves only, so that a loop calling it vectorises (libm's expf is a
// call, which keeps a loop scalar; glibc's vector expf needs -ffast-math, ruled out here).
// The classic method (Cephes' expf): write x = n ln2 + r with n = round(x / ln2), so that
// |r| <= ln2 / 2; e^r is a degree-7 polynomial there (1 + r + r^2 poly(r), poly fitted to
// e^r's series), and e^x = e^r 2^n, 2^n written straight into a float's exponent bits. ln2
// is split in two (0.693359375 has 9 significant bits, so n * it is exact for |n| <= 150,
// and a small correction): r keeps its low bits. 2^n is applied as 2^(n/2) 2^(n - n/2), both
// normal floats, so results down to the smallest subnormal (x = -103.97) and up to FLT_MAX
// (x = 88.72) come out right; past those, 0 and +inf. NaN stays NaN. Against glibc's expf
// on every float in [-105, 90]: at most 1 ulp apart (a test samples it). SwiGLU's gate and
// the attention softmax call it, in loops that then vectorise. With AVX2 (no mask
// registers) gcc vectorises such a loop only under -fno-trapping-math (the Makefile's): the
// clamps and the final select must compute both sides, which it otherwise avoids in case
// one raises a floating-point exception.
static inline float expf_vectorizable(float x) {
    const float hi = 88.72283935546875f, lo = -103.97208404541015625f;
    float xc = x > hi ? hi : x < lo ? lo : x;  // NaN passes through
    // round(x / ln2): adding 1.5 * 2^23 leaves no bits below 1, so the float add rounds
    float n = (xc * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
    n = n == n ? n : 0.0f;  // NaN: r below stays NaN, and no NaN is converted to int
    float r = (xc - n * 0.693359375f) - n * -2.12194440e-4f;  // x - n ln2
    float poly = 1.9875691500e-4f;
    poly = poly * r + 1.3981999507e-3f;
    poly = poly * r + 8.3334519073e-3f;
    poly = poly * r + 4.1665795894e-2f;
    poly = poly * r + 1.6666665459e-1f;
    poly = poly * r + 5.0000001201e-1f;
    float exp_r = (poly * r) * r + r + 1.0f;
    int32_t n_int = (int32_t)n, n_half = n_int / 2;
    uint32_t bits1 = (uint32_t)(n_half + 127) << 23, bits2 = (uint32_t)(n_int - n_half + 127) << 23;
    float scale1, scale2;  // 2^(n/2) and 2^(n - n/2)
    memcpy(&scale1, &bits1, sizeof(float));
    memcpy(&scale2, &bits2, sizeof(float));
    float y = exp_r * scale1 * scale2;
    return x > hi ? INFINITY : x < lo ? 0.0f : y;
}

// 1 if a file may be renamed over path: nothing is there, or a regular file. A rename
// replaces whatever path names, so the writers that rename (checkpoints, check_state --out,
// a resumed run's CSV) refuse a directory, a device such as /dev/null, a pipe or a socket
// there rather than replace it (as root, /dev/null for every program on the machine).
static inline int replaceable_by_rename(const char* path) {
    struct stat info;
    return stat(path, &info) != 0 || S_ISREG(info.st_mode);
}

#define mallocCheck(size) malloc_check(size, __FILE__, __LINE__)
#define callocCheck(count, size) calloc_check(count, size, __FILE__, __LINE__)

// Scratch floats kept between calls and grown (contents dropped) when a call needs more: a
// fresh malloc each call page-faults, which costs as much as the work (linear.c's packed
// panels, muon.c's Newton–Schulz). Not for concurrent calls.
typedef struct {
    float* data;
    size_t count;
} Scratch;

static inline float* scratch_floats(Scratch* s, size_t count) {
    if (count > s->count) {
        free(s->data);
        s->data = (float*)mallocCheck(count * sizeof(float));
        s->count = count;
    }
    return s->data;
}

// Sum of x[i]^2 in double (the global gradient norm's sum), in an order fixed whatever the
// thread count: chunks of 65,536 floats, each summed in eight partial sums (vector lanes: a
// single running sum would take one addition's latency per element, 10 ms for the bench
// model's 6 M gradients), then the chunks' sums in index order.
static inline double sum_of_squares(const float* x, size_t n) {
    const size_t chunk = (size_t)1 << 16;
    size_t n_chunks = (n + chunk - 1) / chunk;
    double* partial = (double*)mallocCheck((n_chunks + 1) * sizeof(double));  // (+1: n may be 0)
#ifdef _OPENMP  // (nvcc reads this header too, without OpenMP)
    #pragma omp parallel for schedule(static)
#endif
    for (size_t c = 0; c < n_chunks; c++) {
        size_t i = c * chunk, end = n - i < chunk ? n : i + chunk;
        double acc[8] = {0.0};
        for (; i + 8 <= end; i += 8) {
            for (size_t j = 0; j < 8; j++) { acc[j] += (double)x[i + j] * (double)x[i + j]; }
        }
        double sum = 0.0;
        for (size_t j = 0; j < 8; j++) { sum += acc[j]; }
        for (; i < end; i++) { sum += (double)x[i] * (double)x[i]; }
        partial[c] = sum;
    }
    double sum = 0.0;
    for (size_t c = 0; c < n_chunks; c++) { sum += partial[c]; }
    free(partial);
    return sum;
}

#endif
