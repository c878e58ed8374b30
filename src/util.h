// util.h — checked allocation and file I/O: report file and line, then exit (as llm.c).
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
#define mallocCheck(size) malloc_check(size, __FILE__, __LINE__)
#define callocCheck(count, size) calloc_check(count, size, __FILE__, __LINE__)

#endif
