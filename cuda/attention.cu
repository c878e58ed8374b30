// attention.cu — causal grouped-query attention on the GPU (mirror of src/attention.c): the
// forward saves lse (B,H,T), each query row's log-sum-exp of its scaled scores, and no
// probabilities; the backward recomputes them tile by tile, a = e^{s scale - lse}, and takes
// D_t = dout_t . out_t for softmax's sum_j a_j da_j (src/attention.c's header says why).
// q (B,T,H*hs), k and v (B,T,G*hs), out (B,T,H*hs); query head h reads key/value head h / (H/G).
//
// Read top to bottom, as the C file:
//   the naive version, one thread per query (attention_query_online's loops, a key at a time:
//     each key a part (v, s, 1) merged into the running (o, m, l) by the online-softmax rule),
//     and its backward, one thread per query (dq) then one per key (dk, dv);
//   the flash kernels the model runs: a block per tile of 32 queries and a head, the keys
//     streamed through shared memory a tile of 32 at a time, each tile a part merged into the
//     rows' running (o, m, l) as attention_forward merges its key tiles; the backward
//     recomputes each (32 queries) x (32 keys) tile of probabilities from q, k and lse.
// No kernel holds anything of size T^2: out itself carries the running sums o.
//
// The flash kernels work on 32x32 tiles, staged in shared memory:
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
#include <math.h>

#include "common.cuh"
#include "layers.cuh"

// The online-softmax merge of src/online_softmax.h, as its two factors: merging a part
// (o2, m2, l2) into the running (o, m, l) makes o = scale1 o + scale2 o2, and this updates m
// and l. A part with m2 = -inf (no key) leaves everything as it is (scale1 1, scale2 0).
__device__ void merge_factors(float* m, float* l, float m2, float l2, float* scale1,
                              float* scale2) {
    if (m2 == -INFINITY) {
        *scale1 = 1.0f;
        *scale2 = 0.0f;
        return;
    }
    float merged = fmaxf(*m, m2);
    *scale1 = expf(*m - merged);
    *scale2 = expf(m2 - merged);
    *l = *scale1 * *l + *scale2 * l2;
    *m = merged;
}

// ---- the naive version ----
// One thread per query row (b, h, t), in the order of (b, h, t): scores, the online softmax
// and the weighted sum, a key at a time, the running o kept in out's row itself.
__global__ void attention_forward_naive_kernel(float* out, float* lse, const float* q,
                                               const float* k, const float* v, size_t B,
                                               size_t T, size_t H, size_t G, size_t hs) {
    size_t row = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (row >= B * H * T) return;
    size_t t = row % T, h = row / T % H, b = row / (T * H), g = h / (H / G);
    const float* q_t = q + (b * T + t) * H * hs + h * hs;
    float* o = out + (b * T + t) * H * hs + h * hs;
    float scale = 1.0f / sqrtf((float)hs), m = -INFINITY, l = 0.0f;
    for (size_t i = 0; i < hs; i++) o[i] = 0.0f;
    for (size_t t2 = 0; t2 <= t; t2++) {
        const float* k_t2 = k + (b * T + t2) * G * hs + g * hs;
        const float* v_t2 = v + (b * T + t2) * G * hs + g * hs;
        float score = 0.0f;
        for (size_t i = 0; i < hs; i++) score += q_t[i] * k_t2[i];
        float scale1, scale2;  // the part of key t2: (v_t2, score * scale, 1)
        merge_factors(&m, &l, score * scale, 1.0f, &scale1, &scale2);
        for (size_t i = 0; i < hs; i++) o[i] = scale1 * o[i] + scale2 * v_t2[i];
    }
    for (size_t i = 0; i < hs; i++) o[i] /= l;
    lse[row] = m + logf(l);
}

// The backward's pieces for query row (b, h, t) and key t2 <= t: a = e^{s scale - lse_t},
// da = dout_t . v_t2, and ds = scale a (da - D_t), the score's gradient times its scale
__device__ void naive_score_gradient(float* a, float* ds, const float* q_t, const float* dout_t,
                                     const float* k_t2, const float* v_t2, float row_lse,
                                     float D, size_t hs) {
    float score = 0.0f, da = 0.0f, scale = 1.0f / sqrtf((float)hs);
    for (size_t i = 0; i < hs; i++) {
        score += q_t[i] * k_t2[i];
        da += dout_t[i] * v_t2[i];
    }
    *a = expf(score * scale - row_lse);
    *ds = scale * *a * (da - D);
}

// dq_t += sum_t2 ds k_t2, and D_t = dout_t . out_t into D (B,H,T) for the key kernel; one
// thread per query row (b, h, t)
__global__ void attention_backward_naive_query_kernel(float* dq, float* D, const float* dout,
                                                      const float* out, const float* lse,
                                                      const float* q, const float* k,
                                                      const float* v, size_t B, size_t T,
                                                      size_t H, size_t G, size_t hs) {
    size_t row = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (row >= B * H * T) return;
    size_t t = row % T, h = row / T % H, b = row / (T * H), g = h / (H / G);
    size_t at = (b * T + t) * H * hs + h * hs;
    float D_t = 0.0f;
    for (size_t i = 0; i < hs; i++) D_t += dout[at + i] * out[at + i];
    D[row] = D_t;
    for (size_t t2 = 0; t2 <= t; t2++) {
        const float* k_t2 = k + (b * T + t2) * G * hs + g * hs;
        float a, ds;
        naive_score_gradient(&a, &ds, q + at, dout + at, k_t2, v + (b * T + t2) * G * hs + g * hs,
                             lse[row], D_t, hs);
        for (size_t i = 0; i < hs; i++) dq[at + i] += ds * k_t2[i];
    }
}

// dk_t2 += sum ds q_t and dv_t2 += sum a dout_t over the query heads h of group g, then the
// queries t >= t2, in that order; one thread per key row (b, g, t2)
__global__ void attention_backward_naive_key_value_kernel(float* dk, float* dv, const float* D,
                                                          const float* dout, const float* lse,
                                                          const float* q, const float* k,
                                                          const float* v, size_t B, size_t T,
                                                          size_t H, size_t G, size_t hs) {
    size_t key = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (key >= B * G * T) return;
    size_t t2 = key % T, g = key / T % G, b = key / (T * G);
    size_t at = (b * T + t2) * G * hs + g * hs;
    for (size_t h = g * (H / G); h < (g + 1) * (H / G); h++) {
        for (size_t t = t2; t < T; t++) {
            size_t row = (b * H + h) * T + t, q_at = (b * T + t) * H * hs + h * hs;
            float a, ds;
            naive_score_gradient(&a, &ds, q + q_at, dout + q_at, k + at, v + at, lse[row], D[row],
                                 hs);
            for (size_t i = 0; i < hs; i++) {
                dk[at + i] += ds * q[q_at + i];
                dv[at + i] += a * dout[q_at + i];
            }
        }
    }
}

#define NAIVE_THREADS 256

void attention_forward_naive_cuda(float* out, float* lse, const float* q, const float* k,
                                  const float* v, size_t B, size_t T, size_t H, size_t G,
                                  size_t hs) {
    launch_kernel(attention_forward_naive_kernel, ceil_div(B * H * T, NAIVE_THREADS),
                  NAIVE_THREADS, out, lse, q, k, v, B, T, H, G, hs);
}

void attention_backward_naive_cuda(float* dq, float* dk, float* dv, const float* dout,
                                   const float* out, const float* lse, const float* q,
                                   const float* k, const float* v, size_t B, size_t T, size_t H,
                                   size_t G, size_t hs) {
    float* D = cuda_workspace(attention_workspace_floats_cuda(B, T, H));
    launch_kernel(attention_backward_naive_query_kernel, ceil_div(B * H * T, NAIVE_THREADS),
                  NAIVE_THREADS, dq, D, dout, out, lse, q, k, v, B, T, H, G, hs);
    launch_kernel(attention_backward_naive_key_value_kernel, ceil_div(B * G * T, NAIVE_THREADS),
                  NAIVE_THREADS, dk, dv, D, dout, lse, q, k, v, B, T, H, G, hs);
}

// ---- the flash kernels the model runs ----
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

// Two tiles at once, their 8 loads in flight together: lhs_tile from lhs (rows lhs_t0.., head
// lhs_head of lhs_heads), rhs_tile from rhs (rows rhs_t0.., head rhs_head of rhs_heads), the
// same chunk c
__device__ void load_two_tiles(Tile lhs_tile, const float* lhs, size_t lhs_t0, size_t lhs_head,
                               size_t lhs_heads, Tile rhs_tile, const float* rhs, size_t rhs_t0,
                               size_t rhs_head, size_t rhs_heads, size_t b, size_t T, size_t c,
                               size_t hs) {
    float lhs_share[TILE_SHARE], rhs_share[TILE_SHARE];
    fetch_tile(lhs_share, lhs, b, lhs_t0, T, lhs_head, lhs_heads, c, hs);
    fetch_tile(rhs_share, rhs, b, rhs_t0, T, rhs_head, rhs_heads, c, hs);
    __syncthreads();
    store_tile(lhs_tile, lhs_share);
    store_tile(rhs_tile, rhs_share);
    __syncthreads();
}

// dots[r] = lhs_t . rhs_t2 over all hs, for the warp's rows t = lhs_t0 + ATT_ROWS * warp + r
// of lhs (head lhs_head of lhs_heads) and the lane's key t2 = rhs_t0 + lane of rhs (head
// rhs_head of rhs_heads); each dot product sums its dims in order, in one float. Rows or keys
// past T give 0.
__device__ void tile_dots(float dots[ATT_ROWS], Tile lhs_tile, Tile rhs_tile, const float* lhs,
                          size_t lhs_t0, size_t lhs_head, size_t lhs_heads, const float* rhs,
                          size_t rhs_t0, size_t rhs_head, size_t rhs_heads, size_t b, size_t T,
                          size_t hs) {
    unsigned int warp = threadIdx.x / WARP_SIZE, lane = threadIdx.x % WARP_SIZE;
    for (int r = 0; r < ATT_ROWS; r++) dots[r] = 0.0f;
    for (size_t c = 0; c < hs; c += ATT_TILE) {
        load_two_tiles(lhs_tile, lhs, lhs_t0, lhs_head, lhs_heads, rhs_tile, rhs, rhs_t0,
                       rhs_head, rhs_heads, b, T, c, hs);
        for (int r = 0; r < ATT_ROWS; r++) {
            const float* lhs_row = lhs_tile[warp * ATT_ROWS + r];
            for (int i = 0; i < ATT_TILE; i++) dots[r] += lhs_row[i] * rhs_tile[lane][i];
        }
    }
}

// out_t = the softmax-weighted sum over t2 <= t of v_t2, lse_t = log sum e^{s}. Block (query
// tile, h, b), 8 warps of 4 query rows. Per key tile: the scaled scores (lane j: key k0 + j),
// the tile's part per row (its max m2 over the warp, a = e^{s - m2} into a_tile, l2 their
// sum), merged into the row's (m, l); then, a chunk of 32 dims at a time (lane i: dim c + i),
// o = scale1 o + scale2 (A V) in out's row. At the end out /= l and lse = m + log l.
__global__ void attention_forward_kernel(float* out, float* lse, const float* q, const float* k,
                                         const float* v, size_t B, size_t T, size_t H, size_t G,
                                         size_t hs) {
    __shared__ Tile q_tile, kv_tile, a_tile;
    unsigned int warp = threadIdx.x / WARP_SIZE, lane = threadIdx.x % WARP_SIZE;
    size_t b = blockIdx.z, h = blockIdx.y, g = h / (H / G);
    size_t t0 = (size_t)blockIdx.x * ATT_TILE, row0 = t0 + warp * ATT_ROWS;
    size_t end = t0 + ATT_TILE < T ? t0 + ATT_TILE : T;  // the rows see keys 0 .. end-1
    float scale = 1.0f / sqrtf((float)hs);
    (void)B;

    float m[ATT_ROWS], l[ATT_ROWS];  // the same in every lane of the warp
    for (int r = 0; r < ATT_ROWS; r++) {
        m[r] = -INFINITY;
        l[r] = 0.0f;
    }
    for (size_t k0 = 0; k0 < end; k0 += ATT_TILE) {
        float score[ATT_ROWS], scale1[ATT_ROWS], scale2[ATT_ROWS];
        tile_dots(score, q_tile, kv_tile, q, t0, h, H, k, k0, g, G, b, T, hs);
        size_t t2 = k0 + lane;
        for (int r = 0; r < ATT_ROWS; r++) {
            size_t t = row0 + r;
            bool seen = t < T && t2 <= t;
            float s = seen ? score[r] * scale : -INFINITY;
            float m2 = warp_max(s);  // -inf: no key of the tile is seen (or t >= T)
            float a = seen ? expf(s - m2) : 0.0f;
            float l2 = warp_sum(a);
            a_tile[warp * ATT_ROWS + r][lane] = a;
            merge_factors(&m[r], &l[r], m2, l2, &scale1[r], &scale2[r]);
        }
        for (size_t c = 0; c < hs; c += ATT_TILE) {
            load_tile(kv_tile, v, b, k0, T, g, G, c, hs);  // its barrier also publishes a_tile
            for (int r = 0; r < ATT_ROWS; r++) {
                size_t t = row0 + r;
                const float* a_row = a_tile[warp * ATT_ROWS + r];
                float o2 = 0.0f;
                for (int j = 0; j < ATT_TILE; j++) o2 += a_row[j] * kv_tile[j][lane];
                if (t < T && c + lane < hs) {
                    float* o = out + (b * T + t) * H * hs + h * hs + c + lane;
                    // the first tile starts the sum: out's old contents are never read
                    *o = k0 == 0 ? scale2[r] * o2 : scale1[r] * *o + scale2[r] * o2;
                }
            }
        }
    }
    for (int r = 0; r < ATT_ROWS; r++) {
        size_t t = row0 + r;
        if (t >= T) break;
        for (size_t c = lane; c < hs; c += WARP_SIZE) out[(b * T + t) * H * hs + h * hs + c] /= l[r];
        if (lane == 0) lse[(b * H + h) * T + t] = m[r] + logf(l[r]);
    }
}

// The backward, from the forward's s = q_t . k_t2 * scale, a = softmax(s), out_t = sum a v:
//   a = e^{s - lse_t} (recomputed),  da_t2 = dout_t . v_t2,  D_t = dout_t . out_t,
//   ds_t2 = scale * a (da_t2 - D_t)
//   dq_t += sum_t2 ds_t2 k_t2,  dk_t2 += sum_t ds_t2 q_t,  dv_t2 += sum_t a_t2 dout_t
// (ds already carries the score's scale). Neither a nor ds is stored: the two kernels below
// each recompute the tiles of them they need.

// a and ds for the warp's row t = row0 + r and the lane's key t2 of one tile, from the
// tile's scores s and da; 0 above the diagonal and past T
__device__ void score_gradient(float* a, float* ds, const float* s, const float* da,
                               const float* D, const float* lse, size_t r, size_t row0,
                               size_t t2, size_t T, size_t bh, float scale) {
    size_t t = row0 + r;
    if (t >= T || t2 > t) {
        *a = *ds = 0.0f;
        return;
    }
    *a = expf(s[r] * scale - lse[bh * T + t]);
    *ds = scale * *a * (da[r] - D[r]);
}

// dq, and D_t into D_rows (B,H,T) for the key kernel. Block (query tile, h, b), 8 warps of 4
// query rows: D first (lanes over the dims), then per key tile the scores and da, ds into
// ds_tile, and dq_t += sum over the tile's keys of ds k_t2, a chunk of dims at a time (lane: dim).
__global__ void attention_backward_query_kernel(float* dq, float* D_rows, const float* dout,
                                                const float* out, const float* lse,
                                                const float* q, const float* k, const float* v,
                                                size_t B, size_t T, size_t H, size_t G,
                                                size_t hs) {
    __shared__ Tile lhs_tile, kv_tile, ds_tile;
    unsigned int warp = threadIdx.x / WARP_SIZE, lane = threadIdx.x % WARP_SIZE;
    size_t b = blockIdx.z, h = blockIdx.y, g = h / (H / G), bh = b * H + h;
    size_t t0 = (size_t)blockIdx.x * ATT_TILE, row0 = t0 + warp * ATT_ROWS;
    size_t end = t0 + ATT_TILE < T ? t0 + ATT_TILE : T;
    float scale = 1.0f / sqrtf((float)hs);
    (void)B;

    // 1. D_t = dout_t . out_t (lane: dims lane mod 32, then across the warp)
    float D[ATT_ROWS];
    for (int r = 0; r < ATT_ROWS; r++) {
        size_t t = row0 + r;
        float sum = 0.0f;
        if (t < T)
            for (size_t c = lane; c < hs; c += WARP_SIZE) {
                size_t at = (b * T + t) * H * hs + h * hs + c;
                sum += dout[at] * out[at];
            }
        D[r] = warp_sum(sum);
        if (lane == 0 && t < T) D_rows[bh * T + t] = D[r];
    }

    // 2. per key tile: s and da (lane: key), ds into ds_tile, then dq (lane: dim)
    for (size_t k0 = 0; k0 < end; k0 += ATT_TILE) {
        float s[ATT_ROWS], da[ATT_ROWS];
        tile_dots(s, lhs_tile, kv_tile, q, t0, h, H, k, k0, g, G, b, T, hs);
        tile_dots(da, lhs_tile, kv_tile, dout, t0, h, H, v, k0, g, G, b, T, hs);
        for (int r = 0; r < ATT_ROWS; r++) {
            float a;
            score_gradient(&a, &ds_tile[warp * ATT_ROWS + r][lane], s, da, D, lse, r, row0,
                           k0 + lane, T, bh, scale);
        }
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
// that see the block's keys, a and ds for (32 queries) x (32 keys) are recomputed into shared
// memory (warps: queries, lanes: keys), then each warp sums them into its 4 keys' dk and dv, a
// chunk of dims at a time (lane: dim), in a fixed order: heads, then query tiles.
__global__ void attention_backward_key_value_kernel(float* dk, float* dv, const float* D_rows,
                                                    const float* dout, const float* lse,
                                                    const float* q, const float* k,
                                                    const float* v, size_t B, size_t T, size_t H,
                                                    size_t G, size_t hs) {
    __shared__ Tile lhs_tile, rhs_tile, ds_tile, a_tile;
    unsigned int warp = threadIdx.x / WARP_SIZE, lane = threadIdx.x % WARP_SIZE;
    size_t b = blockIdx.z, g = blockIdx.y, k0 = (size_t)blockIdx.x * ATT_TILE;
    size_t heads_per_group = H / G;
    float scale = 1.0f / sqrtf((float)hs);
    (void)B;

    for (size_t h = g * heads_per_group; h < (g + 1) * heads_per_group; h++) {
        size_t bh = b * H + h;
        for (size_t t0 = k0; t0 < T; t0 += ATT_TILE) {  // query tiles at and below the keys'
            size_t row0 = t0 + warp * ATT_ROWS;
            float s[ATT_ROWS], da[ATT_ROWS], D[ATT_ROWS];
            tile_dots(s, lhs_tile, rhs_tile, q, t0, h, H, k, k0, g, G, b, T, hs);
            tile_dots(da, lhs_tile, rhs_tile, dout, t0, h, H, v, k0, g, G, b, T, hs);
            for (int r = 0; r < ATT_ROWS; r++) {
                size_t t = row0 + r;
                D[r] = t < T ? D_rows[bh * T + t] : 0.0f;
                score_gradient(&a_tile[warp * ATT_ROWS + r][lane],
                               &ds_tile[warp * ATT_ROWS + r][lane], s, da, D, lse, r, row0,
                               k0 + lane, T, bh, scale);
            }
            for (size_t c = 0; c < hs; c += ATT_TILE) {
                // its barriers also publish ds_tile and a_tile
                load_two_tiles(lhs_tile, q, t0, h, H, rhs_tile, dout, t0, h, H, b, T, c, hs);
                for (int r = 0; r < ATT_ROWS; r++) {
                    size_t key = warp * ATT_ROWS + r;
                    float dk_sum = 0.0f, dv_sum = 0.0f;
                    for (int j = 0; j < ATT_TILE; j++) {
                        dk_sum += ds_tile[j][key] * lhs_tile[j][lane];
                        dv_sum += a_tile[j][key] * rhs_tile[j][lane];
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

void attention_forward_cuda(float* out, float* lse, const float* q, const float* k,
                            const float* v, size_t B, size_t T, size_t H, size_t G, size_t hs) {
    launch_kernel(attention_forward_kernel, attention_grid(T, H, B), ATT_THREADS,
                  out, lse, q, k, v, B, T, H, G, hs);
}

void attention_backward_cuda(float* dq, float* dk, float* dv, const float* dout, const float* out,
                             const float* lse, const float* q, const float* k, const float* v,
                             size_t B, size_t T, size_t H, size_t G, size_t hs) {
    float* D = cuda_workspace(attention_workspace_floats_cuda(B, T, H));
    launch_kernel(attention_backward_query_kernel, attention_grid(T, H, B),
                  ATT_THREADS, dq, D, dout, out, lse, q, k, v, B, T, H, G, hs);
    launch_kernel(attention_backward_key_value_kernel, attention_grid(T, G, B),
                  ATT_THREADS, dk, dv, D, dout, lse, q, k, v, B, T, H, G, hs);
}

// D_t, one float per query row: O(T), like lse
size_t attention_workspace_floats_cuda(size_t B, size_t T, size_t H) { return B * H * T; }
