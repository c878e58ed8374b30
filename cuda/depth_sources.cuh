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

#endif
