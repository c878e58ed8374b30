// distributed.cuh — data-parallel training on GPUs (mirror of src/distributed.h): the
// gradients' reduce-scatter and the parameters' all-gather of ZeRO-1 through NCCL, on
// cuda_stream, between one process per GPU that mpirun started. Plain C, for cuda/trainer.cu.
//
// Built with -DATTNRES_MPI (build/train_cuda_mpi, make train-mpi where nvcc is) these are
// NCCL calls; without (./train_cuda, the emulator) there is one process and each is a copy.
// NCCL's own reduce-scatter and all-gather need equal shards; distributed.h's shards differ
// by one float, so each shard is one ncclReduce to its owner, or one ncclBroadcast from it,
// all in one NCCL group: the same bytes move as in a reduce-scatter or an all-gather.
#ifndef ATTNRES_DISTRIBUTED_CUH
#define ATTNRES_DISTRIBUTED_CUH

#include <stddef.h>
#include "distributed.h"

#ifdef __cplusplus
extern "C" {
#endif

// This process's GPU (the local rank's, among the machine's GPUs), then the communicator:
// rank 0 makes its id, MPI carries it to the others. Call before any device allocation.
void dist_init_cuda(const Dist* d);
void dist_finalize_cuda(void);
// As dist_reduce_scatter / dist_all_gather, on device buffers.
void dist_reduce_scatter_cuda(const Dist* d, float* shard, const float* grads, size_t n);
void dist_all_gather_cuda(const Dist* d, float* params, size_t n);
// Clipping of gradients on the device (a shard, or the whole buffer): when norm > max_norm,
// shard *= max_norm / norm.
void dist_clip_shard_cuda(float* shard, size_t count, float norm, float max_norm);
// A device buffer of count floats holding host[0 .. count) (zeros when host is NULL); back.
float* dist_shard_alloc_cuda(const float* host, size_t count);
void dist_shard_to_host_cuda(float* host, const float* device, size_t count);
void dist_shard_free_cuda(float* device);

#ifdef __cplusplus
}
#endif
#endif
