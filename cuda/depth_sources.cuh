// depth_sources.cuh — how the depth attentions (depth_attention.cu, depth_variants.cu) hand
// their sources to the kernels: the host arrays of device pointers that the layers receive
// are copied into these structs, which travel to the kernels by value, inside the launch
// parameters (so at most DEPTH_ATTENTION_MAX_SOURCES of them).
#ifndef ATTNRES_DEPTH_SOURCES_CUH
#define ATTNRES_DEPTH_SOURCES_CUH

#include "common.cuh"
#include "layers.cuh"

struct SourceList {
    const float* source[DEPTH_ATTENTION_MAX_SOURCES];
};
struct GradList {
    float* source[DEPTH_ATTENTION_MAX_SOURCES];
};

inline void check_source_count(size_t n_sources) {
    if (n_sources < 1 || n_sources > DEPTH_ATTENTION_MAX_SOURCES) {
        fprintf(stderr, "depth attention: %zu sources, not 1 to %d\n", n_sources,
                DEPTH_ATTENTION_MAX_SOURCES);
        exit(EXIT_FAILURE);
    }
}

inline SourceList source_list(const float* const* sources, size_t n_sources) {
    check_source_count(n_sources);
    SourceList list = {};
    for (size_t i = 0; i < n_sources; i++) list.source[i] = sources[i];
    return list;
}

inline GradList grad_list(float* const* dsources, size_t n_sources) {
    check_source_count(n_sources);
    GradList list = {};
    for (size_t i = 0; i < n_sources; i++) list.source[i] = dsources[i];
    return list;
}

// A thread that reads (or updates) one element of every source takes the sources
// SOURCE_CHUNK at a time: it issues the chunk's loads together and only then uses them. One
// source after another would wait out a memory latency per source (17 in a row in `full`
// mode), and where it also writes the sources' gradients the compiler cannot start the next
// source's read before this source's write: for all it knows, they are the same address.
#define SOURCE_CHUNK 8

// v[j] = list.source[first + j][index] for the sources first .. first + SOURCE_CHUNK - 1 that
// exist; the list is the sources (SourceList) or their gradients (GradList, where the kernel
// may read a chunk before writing it: see distinct_grads)
template <typename List>
__device__ __forceinline__ void load_chunk(float v[SOURCE_CHUNK], const List& list, size_t first,
                                           size_t n_sources, size_t index) {
#pragma unroll
    for (int j = 0; j < SOURCE_CHUNK; j++)
        if (first + j < n_sources) v[j] = list.source[first + j][index];
}

// 1 when every source has its own gradient tensor (as in the model): a thread may then read
// a chunk's gradients before it writes any. 0 when one tensor is passed as two sources (the
// CPU layers allow it, its gradient summing both uses, and the tests check it): the kernels
// then read each gradient after the write before it.
inline int distinct_grads(float* const* dsources, size_t n_sources) {
    for (size_t i = 0; i < n_sources; i++)
        for (size_t j = 0; j < i; j++)
            if (dsources[i] == dsources[j]) return 0;
    return 1;
}

// SPEC's one-head variants, which depth_attention.cu's kernels run beside the default
// operator (depth_variants.cu's layers call them; the key norm off is norm_weight NULL).
// KernelSwitches{} is the default operator. (No padding between or after the fields: a
// captured graph compares a launch's argument bytes with the last, padding included.)
struct KernelSwitches {
    const float* query_rows;  // (N,C) the query's row part u_n: q = w + u_n (--depth-query
                              // input), or NULL
    float* dquery_rows;       // (N,C) its gradient, += (the backward, with query_rows)
    const float* weights;     // (n_sources) the mixings: one weight per source for every row
                              // in place of the scores, or NULL
    float* dcoefficients;     // (n_sources) the mixings' coefficients' gradient, += (backward)
    int sigmoid;              // alpha_i = sigmoid(s_i), no normaliser (--depth-score sigmoid)
    int normalise;            // the weights are softmax(coefficients) (static mixing), else
                              // the coefficients themselves (DenseFormer)
};
static_assert(sizeof(KernelSwitches) == 4 * sizeof(float*) + 2 * sizeof(int),
              "KernelSwitches has no padding");

// depth_attention_rmsnorm_forward_cuda and _backward_cuda (layers.cuh) with the switches: xn
// NULL (forward) or dxn NULL (backward, dout then read as given) for the depth attention
// alone; dquery and dnorm_weight NULL where there is no such parameter
void depth_attention_switched_forward_cuda(float* xn, float* rstd, float* out, float* alpha,
                                           float* key_rstd, const float* const* sources,
                                           const float* query, const float* norm_weight,
                                           const float* weight, KernelSwitches sw,
                                           size_t n_sources, size_t N, size_t C);
void depth_attention_switched_backward_cuda(float* const* dsources, float* dquery,
                                            float* dnorm_weight, float* dweight, float* dout,
                                            const float* dxn, const float* out,
                                            const float* rstd, const float* weight,
                                            const float* alpha, const float* key_rstd,
                                            const float* const* sources, const float* query,
                                            const float* norm_weight, KernelSwitches sw,
                                            size_t n_sources, size_t N, size_t C);

// depth_variants.cu's gradient of the mixings' coefficients from the parts of dweight that
// depth_attention_switched_backward_cuda's rows kernel wrote (parts, n_sources): dweight_i =
// the sum of weight_parts[p][i], then dcoefficients += softmax's backward of it (normalise)
// or dweight itself
void depth_mixing_coefficients_cuda(float* dcoefficients, const float* weight_parts,
                                    const float* weights, size_t parts, size_t n_sources,
                                    int normalise);

// depth_attention.cu's sums of the parts of the parameters' gradients that a backward wrote
// (parts, C) each, in fixed orders (the default's blocks of rows; the many-head kernels' rows):
// dquery += g * sum acc_parts (g = norm_weight, 1 when NULL; dquery NULL: none);
// dnorm_weight (when not NULL) += the sum of gain_parts, or query * sum acc_parts when
// gain_parts is NULL; dweight += the sum of dweight_parts when that is not NULL
void depth_attention_parts_sum_cuda(float* dquery, float* dnorm_weight, float* dweight,
                                    const float* acc_parts, const float* gain_parts,
                                    const float* dweight_parts, const float* query,
                                    const float* norm_weight, size_t parts, size_t C);

#endif
