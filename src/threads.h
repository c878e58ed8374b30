// threads.h — OpenMP threads: how they wait for work, and how many there are; and the clock
// a run is timed by.
#ifndef ATTNRES_THREADS_H
#define ATTNRES_THREADS_H

#include <stddef.h>
#include "distributed.h"

#ifdef __cplusplus
extern "C" {
#endif

// Call first in main: unless the user chose how threads wait (OMP_WAIT_POLICY or
// GOMP_SPINCOUNT), starts the program again with a short spin before sleeping (threads.c
// says why).
void threads_wait_briefly(char** argv);
// how the threads wait, for the run's header: the policy the user set, or the spin
void threads_describe_waiting(char* out, size_t len);
// OpenMP threads: `threads`, or (0) all the cores (with several processes on this machine,
// this one's share of them, within the cores mpirun lets it use). A warning on stderr when
// that is more than the cores there are; -1 and one line in err past MAX_THREADS_PER_CORE
// times the machine's cores.
int threads_set(int threads, const Dist* dist, char* err, size_t err_len);
// seconds on a monotonic clock: what train.c's steps and the trainer's collectives are timed by
double now_seconds(void);

#ifdef __cplusplus
}
#endif
#endif
