// online_softmax.h — the online-softmax merge, shared by attention.c (one query's keys, a
// tile at a time) and two_phase.c (the depth attention's two phases).
//
// A softmax-weighted sum over some terms (scores s_i, values x_i of C floats) is kept as a
// part (o, m, l): m the largest score, l = sum_i e^{s_i - m}, o = sum_i e^{s_i - m} x_i; the
// weighted sum is o / l. Two parts over disjoint terms merge into the part of all of them:
//   M = max(m, m2),  o = e^{m-M} o + e^{m2-M} o2,  l = e^{m-M} l + e^{m2-M} l2,  m = M.
// Every exponent is <= 0, so no score, however large, overflows. The empty part is
// (0, -inf, 0): merged with a part whose m2 is finite it becomes that part exactly.
#ifndef ATTNRES_ONLINE_SOFTMAX_H
#define ATTNRES_ONLINE_SOFTMAX_H

#include <math.h>
#include <stddef.h>

// (o (C), *m, *l) = the merge of (o, *m, *l) with (o2, m2, l2)
static inline void online_softmax_merge(float* o, float* m, float* l, const float* o2, float m2,
                                        float l2, size_t C) {
    float merged = fmaxf(*m, m2);
    float scale1 = expf(*m - merged), scale2 = expf(m2 - merged);
    *l = scale1 * *l + scale2 * l2;
    for (size_t c = 0; c < C; c++) { o[c] = scale1 * o[c] + scale2 * o2[c]; }
    *m = merged;
}

#endif
