// bench_attention_cpu.c — `make bench-attention`: the CPU's causal attention, version by
// version, at T = 128 (the bench model), 1024, 4096 and 16384:
//   version 1  dev/bench/attention_v1_materialised.c: saves the probabilities att (B,H,T,T)
//              for the backward, which also holds a (T,T) scratch per thread;
//   version 2  src/attention.c (what the model runs): saves lse (B,H,T), recomputes each
//              tile of probabilities in the backward, tiles of TILE_ROWS x TILE_COLS scores.
// Prints the best of a few rounds of one forward and one backward (ms), the bytes each keeps
// from its forward for the backward beside q, k, v and out (which the model keeps anyway),
// and how far version 2's out, dq, dk, dv are from version 1's (max |diff| / max |v1|).
// Larger T runs fewer heads and rounds, so that the whole run takes seconds on 2 cores
// (3 s on the 2-core AMD EPYC); version 1 is skipped (and the row says so) where its att and scratch would pass
// MAX_V1_BYTES.
//
// ./build/bench_attention_cpu
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include "layers.h"
#include "rng.h"
#include "threads.h"  // now_seconds
#include "util.h"

// attention_v1_materialised.c
void attention_forward_v1(float* out, float* att, const float* q, const float* k, const float* v,
                          size_t B, size_t T, size_t H, size_t G, size_t hs);
void attention_backward_v1(float* dq, float* dk, float* dv, const float* dout, const float* att,
                           const float* q, const float* k, const float* v,
                           size_t B, size_t T, size_t H, size_t G, size_t hs);

#define MAX_V1_BYTES (3.0 * 1073741824.0)

typedef struct {
    size_t B, T, H, G, hs;
    int rounds;
} Config;

typedef struct {
    float *out, *dq, *dk, *dv;
    double forward_ms, backward_ms;
} Result;

static float* uniform_floats(size_t n, uint64_t* state) {
    float* x = mallocCheck(n * sizeof(float));
    for (size_t i = 0; i < n; i++) { x[i] = 2.0f * (float)rng_uniform(state) - 1.0f; }
    return x;
}

// max |a - b| / max |b| over n floats
static double relative_difference(const float* a, const float* b, size_t n) {
    double diff = 0.0, scale = 0.0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - b[i]), s = fabs((double)b[i]);
        diff = d > diff ? d : diff;
        scale = s > scale ? s : scale;
    }
    return scale > 0.0 ? diff / scale : diff;
}

// Times one version (1 or 2): the best of c->rounds forward calls and backward calls, the
// gradients of the last round's backward (from zero) left in r
static void run_version(int version, const Config* c, const float* q, const float* k,
                        const float* v, const float* dout, float* saved, Result* r) {
    size_t B = c->B, T = c->T, H = c->H, G = c->G, hs = c->hs;
    size_t nq = B * T * H * hs, nkv = B * T * G * hs;
    r->out = mallocCheck(nq * sizeof(float));
    r->dq = mallocCheck(nq * sizeof(float));
    r->dk = mallocCheck(nkv * sizeof(float));
    r->dv = mallocCheck(nkv * sizeof(float));
    r->forward_ms = r->backward_ms = 1e30;
    for (int round = 0; round < c->rounds; round++) {
        memset(r->dq, 0, nq * sizeof(float));
        memset(r->dk, 0, nkv * sizeof(float));
        memset(r->dv, 0, nkv * sizeof(float));
        double t0 = now_seconds();
        if (version == 1) attention_forward_v1(r->out, saved, q, k, v, B, T, H, G, hs);
        else attention_forward(r->out, saved, q, k, v, B, T, H, G, hs);
        double t1 = now_seconds();
        if (version == 1) attention_backward_v1(r->dq, r->dk, r->dv, dout, saved, q, k, v, B, T, H, G, hs);
        else attention_backward(r->dq, r->dk, r->dv, dout, r->out, saved, q, k, v, B, T, H, G, hs);
        double t2 = now_seconds();
        if (1000.0 * (t1 - t0) < r->forward_ms) r->forward_ms = 1000.0 * (t1 - t0);
        if (1000.0 * (t2 - t1) < r->backward_ms) r->backward_ms = 1000.0 * (t2 - t1);
    }
}

static void free_result(Result* r) {
    free(r->out);
    free(r->dq);
    free(r->dk);
    free(r->dv);
}

int main(void) {
    const Config configs[] = {
        {8, 128, 8, 4, 32, 50},  // the bench model's layer (make bench)
        {1, 1024, 8, 4, 32, 20},
        {1, 4096, 4, 2, 32, 5},
        {1, 16384, 2, 1, 32, 2},
    };
    int threads = omp_get_max_threads();
    printf("causal attention on the CPU, %d threads: best of the rounds, ms; kept = what the "
           "forward saves for the backward beyond q, k, v, out\n", threads);
    printf("%-30s %-8s %10s %10s %12s  %s\n", "B T H G hs (rounds)", "version", "forward",
           "backward", "kept", "v2 against v1 (max |diff| / max |v1|)");
    for (size_t i = 0; i < sizeof(configs) / sizeof(configs[0]); i++) {
        const Config* c = &configs[i];
        size_t B = c->B, T = c->T, H = c->H, G = c->G, hs = c->hs;
        size_t nq = B * T * H * hs, nkv = B * T * G * hs;
        uint64_t state = 42 + i;
        float *q = uniform_floats(nq, &state), *k = uniform_floats(nkv, &state);
        float *v = uniform_floats(nkv, &state), *dout = uniform_floats(nq, &state);
        char shape[64];
        snprintf(shape, sizeof shape, "%zu %zu %zu %zu %zu (%d)", B, T, H, G, hs, c->rounds);

        double lse_bytes = (double)B * H * T * sizeof(float);
        float* lse = mallocCheck(B * H * T * sizeof(float));
        Result v2;
        run_version(2, c, q, k, v, dout, lse, &v2);
        printf("%-30s %-8s %10.2f %10.2f %9.2f MiB\n", shape, "2 (lse)", v2.forward_ms,
               v2.backward_ms, lse_bytes / 1048576.0);

        double att_bytes = (double)B * H * T * T * sizeof(float);
        double scratch_bytes = (double)threads * T * T * sizeof(float);  // the backward's dS
        if (att_bytes + scratch_bytes > MAX_V1_BYTES) {
            printf("%-30s %-8s %10s %10s %9.2f MiB  skipped: att and the backward's scratch "
                   "would take %.1f GiB\n", shape, "1 (att)", "-", "-", att_bytes / 1048576.0,
                   (att_bytes + scratch_bytes) / 1073741824.0);
        } else {
            float* att = mallocCheck((size_t)att_bytes);
            Result v1;
            run_version(1, c, q, k, v, dout, att, &v1);
            printf("%-30s %-8s %10.2f %10.2f %9.2f MiB  out %.1e dq %.1e dk %.1e dv %.1e\n",
                   shape, "1 (att)", v1.forward_ms, v1.backward_ms, att_bytes / 1048576.0,
                   relative_difference(v2.out, v1.out, nq), relative_difference(v2.dq, v1.dq, nq),
                   relative_difference(v2.dk, v1.dk, nkv), relative_difference(v2.dv, v1.dv, nkv));
            free_result(&v1);
            free(att);
        }
        free_result(&v2);
        free(lse);
        free(q);
        free(k);
        free(v);
        free(dout);
    }
    return 0;
}
