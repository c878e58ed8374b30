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

// The depth attention's structs of layers.h (DepthSaved, DepthParams, DepthSwitches) travel to
// the kernels by value too. A captured graph compares a launch's argument bytes with the
// last, padding included (common.cuh), so they have none.
static_assert(sizeof(DepthSaved) == 5 * sizeof(float*), "DepthSaved has no padding");
static_assert(sizeof(DepthParams) == 4 * sizeof(float*), "DepthParams has no padding");
static_assert(sizeof(DepthSwitches) == sizeof(size_t) + 2 * sizeof(int),
              "DepthSwitches has no padding");

#endif
