// distributed.c — the MPI calls of data-parallel training (see distributed.h). Each function
// is one MPI collective, or the identity in a build without MPI (one process).
#include "distributed.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#ifdef ATTNRES_MPI
#include <mpi.h>
#endif
#include "util.h"

void dist_shard(size_t n, int rank, int world, size_t* lo, size_t* hi) {
    size_t r = (size_t)rank, w = (size_t)world, base = n / w, extra = n % w;
    *lo = r * base + (r < extra ? r : extra);
    *hi = *lo + base + (r < extra ? 1 : 0);
}

void dist_shard_of(const Dist* d, size_t n, int rank, size_t* lo, size_t* hi) {
    if (d->shard_bounds == NULL) {
        dist_shard(n, rank, d->world, lo, hi);
    } else {
        *lo = d->shard_bounds[rank];
        *hi = d->shard_bounds[rank + 1];
    }
}

#ifdef ATTNRES_MPI

// Every MPI call is checked; a failure ends the job with one line naming the call.
static void mpi_check(int status, const char* call) {
    if (status == MPI_SUCCESS) { return; }
    char text[MPI_MAX_ERROR_STRING];
    int length = 0;
    MPI_Error_string(status, text, &length);
    fprintf(stderr, "error: %s failed: %s\n", call, text);
    MPI_Abort(MPI_COMM_WORLD, 1);
}

// The communicators of the groups (Dist's group): the world, and a pipeline's two (dist_split)
static MPI_Comm groups[3];

static MPI_Comm comm_of(const Dist* d) { return d->group == DIST_WORLD ? MPI_COMM_WORLD : groups[d->group]; }

void dist_init(Dist* d, int* argc, char*** argv) {
    mpi_check(MPI_Init(argc, argv), "MPI_Init");
    // errors come back as codes, checked by mpi_check, rather than MPI's own abort
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    MPI_Comm_rank(MPI_COMM_WORLD, &d->rank);
    MPI_Comm_size(MPI_COMM_WORLD, &d->world);
    d->mpi = 1;
    MPI_Comm machine;  // the processes that share this one's memory: its machine
    mpi_check(MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, d->rank, MPI_INFO_NULL,
                                  &machine), "MPI_Comm_split_type");
    MPI_Comm_rank(machine, &d->local_rank);
    MPI_Comm_size(machine, &d->local_size);
    MPI_Comm_free(&machine);
}

void dist_finalize(void) { MPI_Finalize(); }

void dist_abort(int status) {
    fflush(stdout);
    fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, status);
    exit(status);  // not reached
}

// counts[r] and displacements[r] of the shards, as MPI's int arguments
static void shard_counts(const Dist* d, size_t n, int* counts, int* displacements) {
    for (int r = 0; r < d->world; r++) {
        size_t lo, hi;
        dist_shard_of(d, n, r, &lo, &hi);
        if (hi > 2147483647u) {
            fprintf(stderr, "error: %zu parameters are too many for MPI's int counts\n", n);
            MPI_Abort(MPI_COMM_WORLD, 1);
        }
        counts[r] = (int)(hi - lo);
        displacements[r] = (int)lo;
    }
}

void dist_reduce_scatter(const Dist* d, float* shard, const float* grads, size_t n) {
    int* counts = mallocCheck(2 * (size_t)d->world * sizeof(int));
    shard_counts(d, n, counts, counts + d->world);
    mpi_check(MPI_Reduce_scatter(grads, shard, counts, MPI_FLOAT, MPI_SUM, comm_of(d)),
              "MPI_Reduce_scatter (the gradients)");
    free(counts);
}

void dist_all_gather(const Dist* d, float* params, size_t n) {
    int* counts = mallocCheck(2 * (size_t)d->world * sizeof(int));
    shard_counts(d, n, counts, counts + d->world);
    mpi_check(MPI_Allgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, params, counts,
                             counts + d->world, MPI_FLOAT, comm_of(d)),
              "MPI_Allgatherv (the parameters)");
    free(counts);
}

void dist_gather(const Dist* d, float* full, const float* shard, size_t n) {
    int* counts = mallocCheck(2 * (size_t)d->world * sizeof(int));
    shard_counts(d, n, counts, counts + d->world);
    mpi_check(MPI_Gatherv(shard, counts[d->rank], MPI_FLOAT, full, counts, counts + d->world,
                          MPI_FLOAT, 0, comm_of(d)),
              "MPI_Gatherv (the AdamW moments)");
    free(counts);
}

double dist_sum(const Dist* d, double x) {
    double sum = 0.0;
    mpi_check(MPI_Allreduce(&x, &sum, 1, MPI_DOUBLE, MPI_SUM, comm_of(d)), "MPI_Allreduce");
    return sum;
}

void dist_broadcast(const Dist* d, void* bytes, size_t n) {
    mpi_check(MPI_Bcast(bytes, (int)n, MPI_BYTE, 0, comm_of(d)), "MPI_Bcast");
}

int dist_same(const Dist* d, unsigned long long value, int* first_other) {
    unsigned long long* all = mallocCheck((size_t)d->world * sizeof(*all));
    mpi_check(MPI_Allgather(&value, 1, MPI_UNSIGNED_LONG_LONG, all, 1, MPI_UNSIGNED_LONG_LONG,
                            comm_of(d)),
              "MPI_Allgather");
    int same = 1;
    for (int r = 1; r < d->world && same; r++) {
        if (all[r] != all[0]) {
            same = 0;
            *first_other = r;
        }
    }
    free(all);
    return same;
}

void dist_split(const Dist* world, int P, Dist* stages, Dist* replicas) {
    int stage = world->rank % P, replica = world->rank / P;
    mpi_check(MPI_Comm_split(MPI_COMM_WORLD, replica, stage, &groups[DIST_PIPELINE]),
              "MPI_Comm_split (the pipeline)");
    mpi_check(MPI_Comm_split(MPI_COMM_WORLD, stage, replica, &groups[DIST_REPLICAS]),
              "MPI_Comm_split (the replicas)");
    *stages = *world;
    stages->group = DIST_PIPELINE;
    stages->rank = stage;
    stages->world = P;
    *replicas = *world;
    replicas->group = DIST_REPLICAS;
    replicas->rank = replica;
    replicas->world = world->world / P;
}

// The sends not yet known to have arrived, each with its copy of the floats
static MPI_Request* sends;
static void** send_copies;
static size_t n_sends, max_sends;

void dist_send(const Dist* d, int to, int tag, const void* x, size_t n) {
    if (n > 2147483647u) {
        fprintf(stderr, "error: a message of %zu bytes is too long for MPI's int counts\n", n);
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    if (n_sends == max_sends) {
        max_sends = max_sends ? 2 * max_sends : 64;
        sends = realloc(sends, max_sends * sizeof(*sends));
        send_copies = realloc(send_copies, max_sends * sizeof(*send_copies));
        if (sends == NULL || send_copies == NULL) {
            fprintf(stderr, "error: out of memory for %zu messages in flight\n", max_sends);
            MPI_Abort(MPI_COMM_WORLD, 1);
        }
    }
    void* copy = mallocCheck(n + 1);
    memcpy(copy, x, n);
    send_copies[n_sends] = copy;
    mpi_check(MPI_Isend(copy, (int)n, MPI_BYTE, to, tag, comm_of(d), &sends[n_sends]),
              "MPI_Isend");
    n_sends++;
}

void dist_recv(const Dist* d, int from, int tag, void* x, size_t n) {
    mpi_check(MPI_Recv(x, (int)n, MPI_BYTE, from, tag, comm_of(d), MPI_STATUS_IGNORE),
              "MPI_Recv");
}

void dist_wait_sends(void) {
    if (n_sends > 0) {
        mpi_check(MPI_Waitall((int)n_sends, sends, MPI_STATUSES_IGNORE), "MPI_Waitall");
    }
    for (size_t i = 0; i < n_sends; i++) { free(send_copies[i]); }
    n_sends = 0;
}

#else  // one process: every collective is the identity

void dist_init(Dist* d, int* argc, char*** argv) {
    (void)argc;
    (void)argv;
    d->rank = 0;
    d->world = 1;
    d->local_rank = 0;
    d->local_size = 1;
    d->mpi = 0;
}

void dist_finalize(void) {}

void dist_abort(int status) { exit(status); }

void dist_reduce_scatter(const Dist* d, float* shard, const float* grads, size_t n) {
    (void)d;
    memcpy(shard, grads, n * sizeof(float));
}

void dist_all_gather(const Dist* d, float* params, size_t n) {
    (void)d;
    (void)params;
    (void)n;
}

void dist_gather(const Dist* d, float* full, const float* shard, size_t n) {
    (void)d;
    memcpy(full, shard, n * sizeof(float));
}

double dist_sum(const Dist* d, double x) {
    (void)d;
    return x;
}

void dist_broadcast(const Dist* d, void* bytes, size_t n) {
    (void)d;
    (void)bytes;
    (void)n;
}

int dist_same(const Dist* d, unsigned long long value, int* first_other) {
    (void)d;
    (void)value;
    (void)first_other;
    return 1;
}

// One process has no pipeline: train.c refuses --pipeline without MPI, so these never move data
void dist_split(const Dist* world, int P, Dist* stages, Dist* replicas) {
    (void)P;
    *stages = *world;
    *replicas = *world;
}

void dist_send(const Dist* d, int to, int tag, const void* x, size_t n) {
    (void)d; (void)to; (void)tag; (void)x; (void)n;
    fprintf(stderr, "error: dist_send needs MPI (./train_mpi)\n");
    exit(1);
}

void dist_recv(const Dist* d, int from, int tag, void* x, size_t n) {
    (void)d; (void)from; (void)tag; (void)x; (void)n;
    fprintf(stderr, "error: dist_recv needs MPI (./train_mpi)\n");
    exit(1);
}

void dist_wait_sends(void) {}

#endif
