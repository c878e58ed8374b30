// embedding.cu — token embedding lookup on the GPU (mirror of src/embedding.c).
#include "common.cuh"
#include "layers.cuh"

// out (N,C) = wte[tokens]; one thread per output element
__global__ void embedding_forward_kernel(float* out, const int* tokens, const float* wte,
                                         size_t N, size_t C) {
    size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= N * C) return;
    size_t n = idx / C, c = idx % C;
    out[idx] = wte[(size_t)tokens[n] * C + c];
}

// dwte[tokens[n]] += dout[n]. Rows that share a token must add up without atomics and in a
// fixed order, and more than C threads should work (one thread per column walking every row
// would leave the rest of the GPU idle). So row n owns its token if no earlier row has it,
// and block (n, column chunk) does two walks over the tokens, read through shared memory
// TOKEN_CHUNK at a time: rows 0 .. n-1 decide whether it owns its token (every thread reads
// the same tokens, so all of a block agree); then the owner adds, in row order, the rows from
// n on with that token into dwte[token]: the order of src/embedding.c, so the result equals
// the CPU's bit for bit.
#define TOKEN_CHUNK 256

// chunk[0 .. count) = tokens[first ..], then a barrier: the chunk is complete
__device__ void load_token_chunk(int* chunk, const int* tokens, size_t first, size_t count) {
    for (size_t i = threadIdx.x; i < count; i += blockDim.x) chunk[i] = tokens[first + i];
    __syncthreads();
}

__global__ void embedding_backward_kernel(float* dwte, const float* dout, const int* tokens,
                                          size_t N, size_t C) {
    __shared__ int chunk[TOKEN_CHUNK];
    size_t n = blockIdx.x;
    size_t c = (size_t)blockIdx.y * blockDim.x + threadIdx.x;
    int token = tokens[n];
    bool owner = true;
    for (size_t first = 0; first < n; first += TOKEN_CHUNK) {
        size_t count = n - first < TOKEN_CHUNK ? n - first : TOKEN_CHUNK;
        load_token_chunk(chunk, tokens, first, count);
        for (size_t i = 0; i < count; i++) owner = owner && chunk[i] != token;
        __syncthreads();  // everyone has read the chunk before the next one overwrites it
    }
    bool adds = owner && c < C;
    float acc = adds ? dwte[(size_t)token * C + c] : 0.0f;
    for (size_t first = n; first < N; first += TOKEN_CHUNK) {
        size_t count = N - first < TOKEN_CHUNK ? N - first : TOKEN_CHUNK;
        load_token_chunk(chunk, tokens, first, count);
        for (size_t i = 0; i < count && adds; i++)
            if (chunk[i] == token) acc += dout[(first + i) * C + c];
        __syncthreads();
    }
    if (adds) dwte[(size_t)token * C + c] = acc;
}

void embedding_forward_cuda(float* out, const int* tokens, const float* wte, size_t N, size_t C) {
    const size_t threads = 256;
    launch_kernel(embedding_forward_kernel, ceil_div(N * C, threads), threads,
                  out, tokens, wte, N, C);
}

void embedding_backward_cuda(float* dwte, const float* dout, const int* tokens, size_t N,
                             size_t C) {
    const size_t threads = 128;
    launch_kernel(embedding_backward_kernel, dim3((unsigned int)N, ceil_div(C, threads)),
                  threads, dwte, dout, tokens, N, C);

}
