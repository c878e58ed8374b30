// attention.cu — causal grouped-query attention on the GPU (mirror of src/attention.c).
// q (B,T,H*hs), k and v (B,T,G*hs), out (B,T,H*hs), att (B,H,T,T); query head h reads
// key/value head h / (H/G).
//
// Every kernel here works on 32×32 tiles, staged in shared memory:
//   - a block owns ATT_TILE = 32 rows (query rows of one (b,h), or keys of one (b,g)); each
//     of its ATT_WARPS = 8 warps owns ATT_ROWS = 4 of them;
//   - it walks the other side (keys, or queries) a tile of 32 at a time, and the head
//     dimension hs a chunk of 32 at a time, so any T and any hs fit the same shared memory;
//   - in a tile of scores lane j owns key (or column) j: a dot product reads a row of one
//     tile (the same word in every lane: a broadcast) against row j of the other (tiles are
//     padded to 33 columns, so the 32 lanes hit 32 different banks); in a tile of outputs
//     lane i owns dimension i of the chunk.
// Every query, key, value and output gradient is read from global memory once per tile of 32
// rows instead of once per row, and every load of a tile is coalesced (32 neighbouring floats
// of a row).
//
// The backward keeps no (B,H,T,T) scratch: each score's gradient is recomputed where it is
// needed, from the saved probabilities and dp = dout . v (flash attention's trick), with
// the per-row sum D_t = sum_t2 p dp kept in a (B,H,T) scratch between its two kernels.
#include <math.h>

#include "common.cuh"
#include "layers.cuh"

#define ATT_TILE 32                          // rows per block, keys per tile, dims per chunk
#define ATT_WARPS 8                          // warps per block
#define ATT_ROWS (ATT_TILE / ATT_WARPS)      // rows per warp
#define ATT_THREADS (ATT_WARPS * WARP_SIZE)  // threads per block

typedef float Tile[ATT_TILE][ATT_TILE + 1];  // [row][dim], padded against bank conflicts

// Loading a tile: tile[r][i] = x[b, t0 + r, head, c + i] of a (B,T,n_heads*hs) tensor, 0 past
// T or hs. Each of the block's 256 threads first fetches its share, 4 elements, into registers
// (the 4 loads in flight together, while the block may still be reading the old tile), then
// between two barriers stores them: the block's reads of what the tile held are over before
// it is overwritten, and the whole new tile is written before anyone reads it.
#define TILE_SHARE (ATT_TILE * ATT_TILE / ATT_THREADS)  // elements of a tile per thread

__device__ void fetch_tile(float share[TILE_SHARE], const float* x, size_t b, size_t t0,
                           size_t T, size_t head, size_t n_heads, size_t c, size_t hs) {
#pragma unroll
    for (int n = 0; n < TILE_SHARE; n++) {
        size_t r = (threadIdx.x + n * ATT_THREADS) / ATT_TILE, i = threadIdx.x % ATT_TILE;
        bool inside = t0 + r < T && c + i < hs;
        share[n] = inside ? x[((b * T + t0 + r) * n_heads + head) * hs + c + i] : 0.0f;
    }
}

__device__ void store_tile(Tile tile, const float share[TILE_SHARE]) {
#pragma unroll
    for (int n = 0; n < TILE_SHARE; n++)
        tile[(threadIdx.x + n * ATT_THREADS) / ATT_TILE][threadIdx.x % ATT_TILE] = share[n];
}

__device__ void load_tile(Tile tile, const float* x, size_t b, size_t t0, size_t T, size_t head,
                          size_t n_heads, size_t c, size_t hs) {
    float share[TILE_SHARE];
    fetch_tile(share, x, b, t0, T, head, n_heads, c, hs);
    __syncthreads();
    store_tile(tile, share);
    __syncthreads();
}

// Two tiles at once, their 8 loads in flight together: a_tile from a (rows a_t0.., head
// a_head of a_heads), x_tile from x (rows x_t0.., head x_head of x_heads), the same chunk c
__device__ void load_two_tiles(Tile a_tile, const float* a, size_t a_t0, size_t a_head,
                               size_t a_heads, Tile x_tile, const float* x, size_t x_t0,
                               size_t x_head, size_t x_heads, size_t b, size_t T, size_t c,
                               size_t hs) {
    float a_share[TILE_SHARE], x_share[TILE_SHARE];
    fetch_tile(a_share, a, b, a_t0, T, a_head, a_heads, c, hs);
    fetch_tile(x_share, x, b, x_t0, T, x_head, x_heads, c, hs);
    __syncthreads();
    store_tile(a_tile, a_share);
    store_tile(x_tile, x_share);
    __syncthreads();
}

// dots[r] = a_t . x_t2 over all hs, for the warp's rows t = a_t0 + ATT_ROWS * warp + r of
// a (head a_head of a_heads) and the lane's key t2 = x_t0 + lane of x (head x_head of
// x_heads); each dot product sums its dims in order, in one float. Rows or keys past T give 0.
__device__ void tile_dots(float dots[ATT_ROWS], Tile a_tile, Tile x_tile, const float* a,
                          size_t a_t0, size_t a_head, size_t a_heads, const float* x, size_t x_t0,
                          size_t x_head, size_t x_heads, size_t b, size_t T, size_t hs) {
    unsigned int warp = threadIdx.x / WARP_SIZE, lane = threadIdx.x % WARP_SIZE;
    for (int r = 0; r < ATT_ROWS; r++) dots[r] = 0.0f;
    for (size_t c = 0; c < hs; c += ATT_TILE) {
        load_two_tiles(a_tile, a, a_t0, a_head, a_heads, x_tile, x, x_t0, x_head, x_heads, b, T,
                       c, hs);
        for (int r = 0; r < ATT_ROWS; r++) {
            const float* a_row = a_tile[warp * ATT_ROWS + r];
            for (int i = 0; i < ATT_TILE; i++) dots[r] += a_row[i] * x_tile[lane][i];
        }
    }
}

// att[b,h,t,:] = softmax over t2 <= t of q_t . k_t2 / sqrt(hs) (zero above the diagonal);
// out_t = sum_t2 att[b,h,t,t2] v_t2. Block (query tile, h, b), 8 warps of 4 query rows.
__global__ void attention_forward_kernel(float* out, float* att, const float* q, const float* k,
                                         const float* v, size_t B, size_t T, size_t H, size_t G,
                                         size_t hs) {
    __shared__ Tile q_tile, kv_tile;
    unsigned int warp = threadIdx.x / WARP_SIZE, lane = threadIdx.x % WARP_SIZE;
    size_t b = blockIdx.z, h = blockIdx.y, g = h / (H / G);
    size_t t0 = (size_t)blockIdx.x * ATT_TILE, row0 = t0 + warp * ATT_ROWS;
    size_t end = t0 + ATT_TILE < T ? t0 + ATT_TILE : T;  // the rows see keys 0 .. end-1
    float scale = 1.0f / sqrtf((float)hs);
    (void)B;

    // 1. the scaled scores into att (lane j: key k0 + j), and each lane's largest
    float max_score[ATT_ROWS];
    for (int r = 0; r < ATT_ROWS; r++) max_score[r] = -INFINITY;
    for (size_t k0 = 0; k0 < end; k0 += ATT_TILE) {
        float score[ATT_ROWS];
        tile_dots(score, q_tile, kv_tile, q, t0, h, H, k, k0, g, G, b, T, hs);
        size_t t2 = k0 + lane;
        for (int r = 0; r < ATT_ROWS; r++) {
            size_t t = row0 + r;
            if (t < T && t2 <= t) {
                att[((b * H + h) * T + t) * T + t2] = score[r] * scale;
                max_score[r] = fmaxf(max_score[r], score[r] * scale);
            }
        }
    }
    // 2. softmax along each row, in place (lane j wrote the keys t2 = j mod 32 above)
    for (int r = 0; r < ATT_ROWS; r++) {
        size_t t = row0 + r;
        if (t >= T) break;  // the same for the whole warp
        warp_causal_softmax(att + ((b * H + h) * T + t) * T, max_score[r], t, T);
    }

    // 3. out_t = sum_t2 p_t2 v_t2, one chunk of 32 dims at a time (lane i: dim c + i); every
    // lane reads its rows' whole probabilities, which the barrier in load_tile publishes
    for (size_t c = 0; c < hs; c += ATT_TILE) {
        float acc[ATT_ROWS] = {0.0f};
        for (size_t k0 = 0; k0 < end; k0 += ATT_TILE) {
            load_tile(kv_tile, v, b, k0, T, g, G, c, hs);
            for (int r = 0; r < ATT_ROWS; r++) {
                size_t t = row0 + r;
                if (t >= T) break;
                const float* att_row = att + ((b * H + h) * T + t) * T;
                for (size_t t2 = k0; t2 < k0 + ATT_TILE && t2 <= t; t2++)
                    acc[r] += att_row[t2] * kv_tile[t2 - k0][lane];
            }
        }
        for (int r = 0; r < ATT_ROWS; r++) {
            size_t t = row0 + r;
            if (t < T && c + lane < hs) out[(b * T + t) * H * hs + h * hs + c + lane] = acc[r];
        }
    }
}

// The backward, from the forward's s = q_t . k_t2 * scale, p = softmax(s), out_t = sum p v:
//   dp_t2 = dout_t . v_t2,  D_t = sum_t2 p_t2 dp_t2,  ds_t2 = scale * p_t2 (dp_t2 - D_t)
//   dq_t += sum_t2 ds_t2 k_t2,  dk_t2 += sum_t ds_t2 q_t,  dv_t2 += sum_t p_t2 dout_t
// (ds already carries the score's scale). ds is never stored: the two kernels below each
// recompute the tile of it they need.

// ds for the warp's rows t = row0 + r and the lane's key t2 of one tile, from dp and D;
// 0 above the diagonal and past T
__device__ float score_gradient(const float* att, const float* dp, const float* D, size_t r,
                                size_t row0, size_t t2, size_t T, size_t bh, float scale) {
    size_t t = row0 + r;
    if (t >= T || t2 > t) return 0.0f;
    float p = att[(bh * T + t) * T + t2];
    return scale * p * (dp[r] - D[r]);
}

// dq, and D_t into dp_sum (B,H,T) for the key kernel. Block (query tile, h, b), 8 warps of 4
// query rows: D first (a pass over the keys), then ds tile by tile into dq.
__global__ void attention_backward_query_kernel(float* dq, float* dp_sum, const float* dout,
                                                const float* att, const float* k, const float* v,
                                                size_t B, size_t T, size_t H, size_t G,
                                                size_t hs) {
    __shared__ Tile dout_tile, kv_tile, ds_tile;
    unsigned int warp = threadIdx.x / WARP_SIZE, lane = threadIdx.x % WARP_SIZE;
    size_t b = blockIdx.z, h = blockIdx.y, g = h / (H / G), bh = b * H + h;
    size_t t0 = (size_t)blockIdx.x * ATT_TILE, row0 = t0 + warp * ATT_ROWS;
    size_t end = t0 + ATT_TILE < T ? t0 + ATT_TILE : T;
    float scale = 1.0f / sqrtf((float)hs);
    (void)B;

    // 1. D_t = sum_t2 p_t2 dp_t2 (lane: the keys t2 = lane mod 32, then across the warp)
    float D[ATT_ROWS] = {0.0f}, dp[ATT_ROWS];
    for (size_t k0 = 0; k0 < end; k0 += ATT_TILE) {
        tile_dots(dp, dout_tile, kv_tile, dout, t0, h, H, v, k0, g, G, b, T, hs);
        for (int r = 0; r < ATT_ROWS; r++) {
            size_t t = row0 + r, t2 = k0 + lane;
            if (t < T && t2 <= t) D[r] += att[(bh * T + t) * T + t2] * dp[r];
        }
    }
    for (int r = 0; r < ATT_ROWS; r++) {
        D[r] = warp_sum(D[r]);
        if (lane == 0 && row0 + r < T) dp_sum[bh * T + row0 + r] = D[r];
    }

    // 2. per key tile: ds (lane: key) into ds_tile, then dq_t += sum over the tile's keys
    // of ds k_t2, a chunk of dims at a time (lane: dim)
    for (size_t k0 = 0; k0 < end; k0 += ATT_TILE) {
        tile_dots(dp, dout_tile, kv_tile, dout, t0, h, H, v, k0, g, G, b, T, hs);
        for (int r = 0; r < ATT_ROWS; r++)
            ds_tile[warp * ATT_ROWS + r][lane] =
                score_gradient(att, dp, D, r, row0, k0 + lane, T, bh, scale);
        for (size_t c = 0; c < hs; c += ATT_TILE) {
            load_tile(kv_tile, k, b, k0, T, g, G, c, hs);  // its barrier also publishes ds_tile
            for (int r = 0; r < ATT_ROWS; r++) {
                size_t t = row0 + r;
                const float* ds_row = ds_tile[warp * ATT_ROWS + r];
                float sum = 0.0f;
                for (int j = 0; j < ATT_TILE; j++) sum += ds_row[j] * kv_tile[j][lane];
                if (t < T && c + lane < hs) dq[(b * T + t) * H * hs + h * hs + c + lane] += sum;
            }
        }
    }
}

// dk and dv. Block (key tile, g, b): over the query heads h of group g and the query tiles
// that see the block's keys, ds and p for (32 queries) x (32 keys) go to shared memory
// (warps: queries, lanes: keys), then each warp sums them into its 4 keys' dk and dv, a chunk
// of dims at a time (lane: dim), in a fixed order: heads, then query tiles.
__global__ void attention_backward_key_value_kernel(float* dk, float* dv, const float* dp_sum,
                                                    const float* dout, const float* att,
                                                    const float* q, const float* v, size_t B,
                                                    size_t T, size_t H, size_t G, size_t hs) {
    __shared__ Tile a_tile, x_tile, ds_tile, p_tile;
    unsigned int warp = threadIdx.x / WARP_SIZE, lane = threadIdx.x % WARP_SIZE;
    size_t b = blockIdx.z, g = blockIdx.y, k0 = (size_t)blockIdx.x * ATT_TILE;
    size_t heads_per_group = H / G;
    float scale = 1.0f / sqrtf((float)hs);
    (void)B;

    for (size_t h = g * heads_per_group; h < (g + 1) * heads_per_group; h++) {
        size_t bh = b * H + h;
        for (size_t t0 = k0; t0 < T; t0 += ATT_TILE) {  // query tiles at and below the keys'
            size_t row0 = t0 + warp * ATT_ROWS, t2 = k0 + lane;
            float dp[ATT_ROWS], D[ATT_ROWS];
            tile_dots(dp, a_tile, x_tile, dout, t0, h, H, v, k0, g, G, b, T, hs);
            for (int r = 0; r < ATT_ROWS; r++) {
                size_t t = row0 + r;
                D[r] = t < T ? dp_sum[bh * T + t] : 0.0f;
                bool seen = t < T && t2 <= t;
                p_tile[warp * ATT_ROWS + r][lane] = seen ? att[(bh * T + t) * T + t2] : 0.0f;
                ds_tile[warp * ATT_ROWS + r][lane] =
                    score_gradient(att, dp, D, r, row0, t2, T, bh, scale);
            }
            for (size_t c = 0; c < hs; c += ATT_TILE) {
                // its barriers also publish ds_tile and p_tile
                load_two_tiles(a_tile, q, t0, h, H, x_tile, dout, t0, h, H, b, T, c, hs);
                for (int r = 0; r < ATT_ROWS; r++) {
                    size_t key = warp * ATT_ROWS + r;
                    float dk_sum = 0.0f, dv_sum = 0.0f;
                    for (int j = 0; j < ATT_TILE; j++) {
                        dk_sum += ds_tile[j][key] * a_tile[j][lane];
                        dv_sum += p_tile[j][key] * x_tile[j][lane];
                    }
                    if (k0 + key < T && c + lane < hs) {
                        size_t at = (b * T + k0 + key) * G * hs + g * hs + c + lane;
                        dk[at] += dk_sum;
                        dv[at] += dv_sum;
                    }
                }
            }
        }
    }
}

static dim3 attention_grid(size_t T, size_t heads, size_t B) {
    return dim3(ceil_div(T, ATT_TILE), (unsigned int)heads, (unsigned int)B);
}

void attention_forward_cuda(float* out, float* att, const float* q, const float* k,
                            const float* v, size_t B, size_t T, size_t H, size_t G, size_t hs) {
    launch_kernel(attention_forward_kernel, attention_grid(T, H, B), ATT_THREADS,
                  out, att, q, k, v, B, T, H, G, hs);
}

void attention_backward_cuda(float* dq, float* dk, float* dv, const float* dout, const float* att,
                             const float* q, const float* k, const float* v,
                             size_t B, size_t T, size_t H, size_t G, size_t hs) {
    float* dp_sum = cuda_workspace(attention_workspace_floats_cuda(B, T, H));
    launch_kernel(attention_backward_query_kernel, attention_grid(T, H, B),
                  ATT_THREADS, dq, dp_sum, dout, att, k, v, B, T, H, G, hs);
    launch_kernel(attention_backward_key_value_kernel, attention_grid(T, G, B),
                  ATT_THREADS, dk, dv, dp_sum, dout, att, q, v, B, T, H, G, hs);
}

size_t attention_workspace_floats_cuda(size_t B, size_t T, size_t H) { return B * H * T; }
