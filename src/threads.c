// threads.c — OpenMP threads: how they wait for work, and how many there are (threads.h).
#define _POSIX_C_SOURCE 200809L  // setenv, clock_gettime
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>
#include "threads.h"

double now_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

// How OpenMP threads wait at the end of a parallel region. libgomp's default spins for a few
// milliseconds before sleeping, and a run slows down, or collapses, when other programs keep
// the cores busy. Sleeping at once (OMP_WAIT_POLICY=passive) costs a wake-up in every
// parallel region instead, slower than one thread on a quiet machine. A spin of 1000 rounds
// before sleeping keeps most of the speed of spinning on a quiet machine and most of the
// robustness of sleeping on a busy one (measurements: docs/speed.md). libgomp reads these
// variables when it loads, before main runs, so the program starts itself again with
// GOMP_SPINCOUNT set; if that fails, it runs on as it is.
void threads_wait_briefly(char** argv) {
    if (getenv("OMP_WAIT_POLICY") != NULL || getenv("GOMP_SPINCOUNT") != NULL) { return; }
    setenv("GOMP_SPINCOUNT", "1000", 1);
    execv("/proc/self/exe", argv);
}

void threads_describe_waiting(char* out, size_t len) {
    const char* policy = getenv("OMP_WAIT_POLICY");
    const char* spin = getenv("GOMP_SPINCOUNT");
    if (policy != NULL && spin != NULL) { snprintf(out, len, "%s waiting, spin %s", policy, spin); }
    else if (policy != NULL) { snprintf(out, len, "%s waiting", policy); }
    else if (spin != NULL) { snprintf(out, len, "spin %s, then sleep", spin); }
    else { snprintf(out, len, "libgomp's default waiting"); }
}

// Threads that take turns on a core wait for each other at every parallel region, and
// libgomp itself fails past some tens of thousands of threads: more than this many per core
// is refused.
#define MAX_THREADS_PER_CORE 8

int threads_set(int threads, const Dist* dist, char* err, size_t err_len) {
    int mine = omp_get_num_procs(), machine = (int)sysconf(_SC_NPROCESSORS_ONLN);
    if (machine < mine) { machine = mine; }
    if (threads > MAX_THREADS_PER_CORE * machine) {
        snprintf(err, err_len, "--threads %d is more than %d per core (%d cores here): at most %d",
                 threads, MAX_THREADS_PER_CORE, machine, MAX_THREADS_PER_CORE * machine);
        return -1;
    }
    if (threads > 0) { omp_set_num_threads(threads); }
    else if (dist->local_size > 1) {
        int share = machine / dist->local_size;
        omp_set_num_threads(share < 1 ? 1 : share > mine ? mine : share);
    }
    if (dist->local_size == 1 && threads > mine) {
        fprintf(stderr, "warning: --threads %d is more than the %d cores here: expect it to be "
                "slower, not faster\n", threads, mine);
    } else if (dist->local_size > 1 && dist->rank == 0 &&
               (threads > mine || threads * dist->local_size > machine)) {
        fprintf(stderr, "warning: --threads %d in each of %d processes is more than this "
                "machine's %d cores (or the %d each process may use): expect it to be slower, "
                "not faster\n", threads, dist->local_size, machine, mine);
    }
    return 0;
}
