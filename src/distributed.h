// distributed.h — data-parallel training over MPI: which process this is, and the collective
// operations the trainer needs (the gradients' reduce-scatter, the parameters' all-gather,
// sums, the moments gathered for a checkpoint).
//
// Built with -DATTNRES_MPI (make train-mpi: ./train_mpi, started by mpirun) these are MPI
// calls; built without (./train), there is one process and every function is the identity,
// so `make train` needs no MPI. The trainers (src/trainer.c, cuda/trainer.cu) are the same
// either way: the object a program links decides whether it runs one process or several.
//
// ZeRO stage 1: the flat parameter buffer (n floats) is cut into `world` contiguous shards,
// rank r owning [shard_lo, shard_hi). After the backward, each rank's gradients are summed
// across ranks and each rank receives only its shard of the sum (reduce-scatter); it keeps
// the AdamW moments of its shard alone, updates its shard of the parameters, and every rank
// then gathers the full parameters (all-gather).
#ifndef ATTNRES_DISTRIBUTED_H
#define ATTNRES_DISTRIBUTED_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    int rank;        // this process, 0 .. world-1; rank 0 prints, evaluates and saves
    int world;       // the number of processes
    int local_rank;  // its place among the processes of its machine (which GPU it takes)
    int local_size;  // how many processes share its machine
    // the shards' bounds when not the even split: rank r owns [shard_bounds[r],
    // shard_bounds[r+1]) (world + 1 entries; Muon's, model_muon_shard_bounds); NULL: even
    const size_t* shard_bounds;
    // 1 when MPI started the job (./train_mpi, ./train_cuda_mpi), even a job of one process;
    // 0 in the builds without MPI. Set by dist_init, so decided by the distributed.c linked.
    int mpi;
    // which processes the collectives below span: DIST_WORLD (every one), or, in a pipeline
    // (dist_split), the P stages of one replica or the D replicas of one stage
    int group;
} Dist;

enum { DIST_WORLD, DIST_PIPELINE, DIST_REPLICAS };

// Starts MPI (mpirun's processes) or, without it, one process of rank 0.
void dist_init(Dist* d, int* argc, char*** argv);
void dist_finalize(void);
// Ends every process of the job now, with exit status `status` (MPI_Abort; exit without MPI).
void dist_abort(int status);

// The shard [*lo, *hi) of n that `rank` owns: n/world each, the first n%world one more.
void dist_shard(size_t n, int rank, int world, size_t* lo, size_t* hi);
// The shard [*lo, *hi) of n that `rank` owns in d's job: d->shard_bounds', or dist_shard's.
// Every collective below cuts n this way.
void dist_shard_of(const Dist* d, size_t n, int rank, size_t* lo, size_t* hi);
// grads (n floats, this rank's) summed over the ranks; this rank's shard of the sum is
// written to shard (hi - lo floats). grads is left as it was.
void dist_reduce_scatter(const Dist* d, float* shard, const float* grads, size_t n);
// Every rank's shard of params [lo, hi) goes to every rank: params is then whole everywhere.
void dist_all_gather(const Dist* d, float* params, size_t n);
// Rank 0 receives every rank's shard (hi - lo floats) into full (n floats; NULL elsewhere).
void dist_gather(const Dist* d, float* full, const float* shard, size_t n);
// The sum over the ranks of d's group of x (in double).
double dist_sum(const Dist* d, double x);
// Rank 0's n bytes to every rank (the NCCL communicator's id, cuda/distributed.cu).
void dist_broadcast(const Dist* d, void* bytes, size_t n);
// 1 when every rank passed the same 64-bit value, else 0 and *first_other the lowest rank
// whose value differs from rank 0's.
int dist_same(const Dist* d, unsigned long long value, int* first_other);

// ---- pipeline parallelism (src/pipeline.c) ----
// The world as P stages x D replicas, rank = replica * P + stage: *stages gets this
// process's pipeline (its rank is its stage, of P), *replicas the processes that hold the
// same stage (its rank is its replica, of D), ZeRO-1's group there. world % P == 0.
void dist_split(const Dist* world, int P, Dist* stages, Dist* replicas);
// n bytes to rank `to` of d's group, with tag `tag`, without waiting: the bytes are copied
// first, so x may change at once; dist_wait_sends waits until every one sent has arrived.
void dist_send(const Dist* d, int to, int tag, const void* x, size_t n);
// n bytes from rank `from` of d's group, with tag `tag`, into x: waits until they come.
void dist_recv(const Dist* d, int from, int tag, void* x, size_t n);
void dist_wait_sends(void);

#ifdef __cplusplus
}
#endif
#endif
