// distributed.cu — the GPU collectives of data-parallel training (see distributed.cuh).
#include "distributed.cuh"

#include "common.cuh"
#include "layers.cuh"
#ifdef ATTNRES_MPI
#include <nccl.h>
#endif

float* dist_shard_alloc_cuda(const float* host, size_t count) {
    float* device = cuda_malloc_floats(count);
    if (host != NULL) {
        cudaCheck(cudaMemcpy(device, host, count * sizeof(float), cudaMemcpyHostToDevice));
    } else {
        cudaCheck(cudaMemset(device, 0, count * sizeof(float)));
    }
    return device;
}

void dist_shard_to_host_cuda(float* host, const float* device, size_t count) {
    cudaCheck(cudaMemcpy(host, device, count * sizeof(float), cudaMemcpyDeviceToHost));
}

void dist_shard_free_cuda(float* device) { cudaCheck(cudaFree(device)); }

void dist_clip_shard_cuda(float* shard, size_t count, float norm, float max_norm) {
    clip_gradients_cuda(shard, count, norm, max_norm);
}

#ifdef ATTNRES_MPI

static ncclComm_t comm = NULL;

// Every NCCL call is checked; a failure ends the job with one line naming the call.
static void nccl_check(ncclResult_t status, const char* call) {
    if (status == ncclSuccess) return;
    fprintf(stderr, "error: %s failed: %s\n", call, ncclGetErrorString(status));
    dist_abort(1);
}

void dist_init_cuda(const Dist* d) {
    int devices = 0;
    cudaCheck(cudaGetDeviceCount(&devices));
    cudaCheck(cudaSetDevice(d->local_rank % devices));
    ncclUniqueId id;
    if (d->rank == 0) nccl_check(ncclGetUniqueId(&id), "ncclGetUniqueId");
    dist_broadcast(d, &id, sizeof(id));
    nccl_check(ncclCommInitRank(&comm, d->world, id, d->rank), "ncclCommInitRank");
}

void dist_finalize_cuda(void) {
    if (comm != NULL) ncclCommDestroy(comm);
    comm = NULL;
}

void dist_reduce_scatter_cuda(const Dist* d, float* shard, const float* grads, size_t n) {
    nccl_check(ncclGroupStart(), "ncclGroupStart");
    for (int r = 0; r < d->world; r++) {  // shard r summed onto rank r
        size_t lo, hi;
        dist_shard_of(d, n, r, &lo, &hi);
        nccl_check(ncclReduce(grads + lo, r == d->rank ? shard : NULL, hi - lo, ncclFloat,
                              ncclSum, r, comm, cuda_stream),
                   "ncclReduce (the gradients)");
    }
    nccl_check(ncclGroupEnd(), "ncclGroupEnd");
}

void dist_all_gather_cuda(const Dist* d, float* params, size_t n) {
    nccl_check(ncclGroupStart(), "ncclGroupStart");
    for (int r = 0; r < d->world; r++) {  // shard r from rank r, in place
        size_t lo, hi;
        dist_shard_of(d, n, r, &lo, &hi);
        nccl_check(ncclBroadcast(params + lo, params + lo, hi - lo, ncclFloat, r, comm,
                                 cuda_stream),
                   "ncclBroadcast (the parameters)");
    }
    nccl_check(ncclGroupEnd(), "ncclGroupEnd");
}

#else  // one process: nothing to exchange

void dist_init_cuda(const Dist* d) { (void)d; }
void dist_finalize_cuda(void) {}

void dist_reduce_scatter_cuda(const Dist* d, float* shard, const float* grads, size_t n) {
    (void)d;
    cudaCheck(cudaMemcpyAsync(shard, grads, n * sizeof(float), cudaMemcpyDeviceToDevice,
                              cuda_stream));
}

void dist_all_gather_cuda(const Dist* d, float* params, size_t n) {
    (void)d;
    (void)params;
    (void)n;
}

#endif
