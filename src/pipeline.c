// pipeline.c — pipeline parallelism (pipeline.h; docs/pipeline.md). Read it top to bottom:
//   1. the schedule: which forward or backward a stage runs next (1F1B, interleaved), and a
//      simulation of it on every stage at once (the bubble);
//   2. what travels between two chunks, and the cross-stage cache;
//   3. a microbatch's buffers: each chunk's activation slots, one per microbatch in flight,
//      and where a slot finds the blocks it reads (bind: the cache);
//   4. one chunk's forward and backward on one microbatch, and the step that runs them in the
//      schedule's order;
//   5. the optimiser: the loss and the gradient norm as one process has them, then each
//      chunk's own Trainer (ZeRO-1 over the stage's replicas);
//   6. building a stage (its chunks: each a Model of its sub-layers alone,
//      model_build_chunk), rank 0's whole model (evaluation, checkpoints), the bytes, the
//      memory, the trace.
// The model code (model.c) runs a range of sub-layers and knows nothing of processes; this
// file knows nothing of the layers: it moves buffers and calls model_* in order.
//
// Chunk c (0 .. C-1, C = P*V) holds sub-layers [c*U, (c+1)*U), U = 2L/C, and runs on stage
// c mod P as that stage's chunk v = c / P. Chunk 0 holds the embedding, chunk C-1 the head.
#include "pipeline.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "checkpoint.h"  // checkpoint_temp_path
#include "options.h"
#include "threads.h"
#include "trainer.h"
#include "util.h"

// ---------------------------------------------------------------------------------------
// 1. The schedule (Megatron-LM's, Narayanan et al. 2021). A stage first runs `warmup`
// forwards, then one forward and one backward in turn, then the backwards left. The k-th
// forward of a stage is microbatch (k / (P*V)) * P + k % P of its chunk (k / P) % V: P
// microbatches through one chunk, then the same P through the next chunk; the backwards
// go through the chunks in the reverse order. V = 1 is plain 1F1B: forward k is microbatch k.

static void nth_op(int P, int V, int k, char kind, PipelineOp* op) {
    int group = (k / P) % V;
    op->kind = kind;
    op->v = kind == 'F' ? group : V - 1 - group;
    op->micro = (k / (P * V)) * P + k % P;
}

int pipeline_schedule(int P, int V, int M, int stage, PipelineOp* ops, int* slots) {
    int total = M * V;
    // the forwards before the first backward: stage P-1 runs its first backward as soon as
    // it can, each earlier stage has one more (V = 1) or two more (interleaved) in flight
    int warmup = V == 1 ? P - stage - 1 : (P - stage - 1) * 2 + (V - 1) * P;
    if (warmup > total) { warmup = total; }
    int n = 0, forwards = 0, backwards = 0;
    for (; forwards < warmup; forwards++) { nth_op(P, V, forwards, 'F', &ops[n++]); }
    for (; forwards < total; forwards++, backwards++) {
        nth_op(P, V, forwards, 'F', &ops[n++]);
        nth_op(P, V, backwards, 'B', &ops[n++]);
    }
    for (; backwards < total; backwards++) { nth_op(P, V, backwards, 'B', &ops[n++]); }
    // slots: a forward takes its chunk's lowest free one, its backward gives it back
    int* used = callocCheck((size_t)V * (size_t)M, sizeof(int));      // used[v * M + slot]
    int* slot_of = callocCheck((size_t)V * (size_t)M, sizeof(int));   // slot_of[v * M + micro]
    for (int v = 0; slots != NULL && v < V; v++) { slots[v] = 0; }
    for (int i = 0; i < n; i++) {
        PipelineOp* op = &ops[i];
        int* chunk_used = used + (size_t)op->v * M;
        if (op->kind == 'F') {
            int s = 0;
            while (chunk_used[s]) { s++; }
            chunk_used[s] = 1;
            slot_of[op->v * M + op->micro] = s;
            if (slots != NULL && s + 1 > slots[op->v]) { slots[op->v] = s + 1; }
        }
        op->slot = slot_of[op->v * M + op->micro];
        if (op->kind == 'B') { chunk_used[op->slot] = 0; }
    }
    free(used);
    free(slot_of);
    return n;
}

double pipeline_simulate(int P, int V, int M, double* bubble) {
    int C = P * V, n = 2 * M * V;
    PipelineOp* ops = mallocCheck((size_t)P * (size_t)n * sizeof(PipelineOp));
    for (int s = 0; s < P; s++) { pipeline_schedule(P, V, M, s, ops + (size_t)s * n, NULL); }
    // done[kind][c * M + m]: when that op ends (-1: not yet)
    double* done = mallocCheck(2 * (size_t)C * (size_t)M * sizeof(double));
    for (size_t i = 0; i < 2 * (size_t)C * (size_t)M; i++) { done[i] = -1.0; }
    double* clock = callocCheck((size_t)P, sizeof(double));
    int* next = callocCheck((size_t)P, sizeof(int));
    int left = P * n, progress = 1;
    while (left > 0 && progress) {
        progress = 0;
        for (int s = 0; s < P; s++) {
            if (next[s] == n) { continue; }
            const PipelineOp* op = &ops[(size_t)s * n + next[s]];
            int c = op->v * P + s, m = op->micro, backward = op->kind == 'B';
            // what it waits for: the forward of chunk c-1, or the backward of chunk c+1
            double ready = 0.0;
            if (!backward && c > 0) { ready = done[(size_t)(c - 1) * M + m]; }
            if (backward && c < C - 1) { ready = done[(size_t)C * M + (size_t)(c + 1) * M + m]; }
            if (ready < 0.0) { continue; }
            double start = clock[s] > ready ? clock[s] : ready;
            clock[s] = start + (backward ? 2.0 : 1.0);
            done[(size_t)backward * C * M + (size_t)c * M + m] = clock[s];
            next[s]++;
            left--;
            progress = 1;
        }
    }
    double makespan = 0.0;
    for (int s = 0; s < P; s++) { makespan = clock[s] > makespan ? clock[s] : makespan; }
    free(ops);
    free(done);
    free(clock);
    free(next);
    if (left > 0) { return -1.0; }  // every stage waits on another: a deadlock
    *bubble = 1.0 - 3.0 * M * V / makespan;  // each stage works 3 units a chunk and microbatch
    return makespan;
}

// ---------------------------------------------------------------------------------------
// 2. What travels into chunk c. none: the residual stream h_{c*U}; mhc: the m streams
// entering sub-layer c*U; AttnRes: the blocks b_0 .. b_{c*N_p} (N_p = U/S a chunk), as
// every later depth attention reads them all. With the cache, a stage keeps the blocks of
// its previous chunk (c - P: its sources and outputs, b_0 .. b_{(c-P+1)*N_p}) for as long as
// the microbatch is in flight, so only the blocks made since, by the P-1 chunks on the other
// stages, travel: (P-1)*N_p of them. A chunk of the first round (c < P) has no previous chunk
// on its stage and receives all c*N_p + 1: the largest transition with the cache is the one
// into chunk P-1, (P-1)*N_p + 1 blocks. The gradients travel back the same way; a cached
// block's gradient adds up where it is cached (a later chunk's depth attentions add into the
// buffer of the stage's first chunk that held the block) and meets the rest when that chunk
// runs its backward. The cache saves bytes, not memory: a slot has its own buffers for
// every block it reads, and leaves the cached ones unused.
// P = 2, V = 2, S = 2, L = 4 (8 sub-layers, C = 4 chunks of U = 2, N_p = 1), with the cache:
//   chunk  stage  sub-layers  makes  reads       receives  its depth attentions add db_j into
//   0      0      0, 1        b_1    b_0         -         its own buffers
//   1      1      2, 3        b_2    b_0, b_1    b_0, b_1  its own buffers
//   2      0      4, 5        b_3    b_0 .. b_2  b_2       chunk 0's for b_0, b_1; its own for b_2
//   3      1      6, 7, head  b_4    b_0 .. b_3  b_3       chunk 1's for b_0 .. b_2; its own for b_3
// Backward: chunk 3 sends db_3 back; chunk 2 adds it to its db_3, runs, and sends db_2;
// chunk 1 adds that to its db_2, which holds chunk 3's piece already, runs, and sends db_0
// (model.c's dx0), db_1; chunk 0 adds them to its own, which hold chunk 2's pieces. Without
// the cache every chunk receives b_0 .. b_{c*N_p} and sends all their gradients back.

typedef struct {
    int C, U, S, N_p;  // chunks, sub-layers a chunk, block size (0: none or mhc), blocks a chunk
    int P, cache;
} Cut;

static Cut cut_of(const ModelConfig* config, int P, int V, int cache) {
    Cut k;
    k.P = P;
    k.C = P * V;
    k.U = 2 * config->n_layers / k.C;
    k.S = config->block_size;
    k.N_p = k.S > 0 ? k.U / k.S : 0;
    k.cache = cache;
    return k;
}

// The first block that travels into chunk c (AttnRes): b_0 without the cache or on the
// stage's first chunk, else the first one made after its previous chunk's output
static int first_travelling(const Cut* k, int c) {
    return k->cache && c >= k->P ? (c + 1 - k->P) * k->N_p + 1 : 0;
}

// The last block that chunk c reads and does not make itself: b_{c*N_p}
static int last_received(const Cut* k, int c) { return c * k->N_p; }

size_t pipeline_floats_into(const ModelConfig* config, int P, int V, int c, int cache) {
    Cut k = cut_of(config, P, V, cache);
    size_t d = (size_t)config->d_model;
    if (k.S == 0) { return (config->streams > 0 ? (size_t)config->streams : 1) * d; }
    return (size_t)(last_received(&k, c) - first_travelling(&k, c) + 1) * d;
}

int pipeline_check(const ModelConfig* config, int P, int V, int M, int world, char* err,
                   size_t err_len) {
    int n_sub = 2 * config->n_layers, S = config->block_size, C = P * V;
    if (P < 1 || V < 1) {
        snprintf(err, err_len, "--pipeline %d --virtual %d: both must be at least 1", P, V);
        return -1;
    }
    if (world % P != 0) {
        snprintf(err, err_len, "--pipeline %d does not divide the %d processes (the world is P "
                 "stages x D replicas)", P, world);
        return -1;
    }
    // whole layers, and whole blocks: no partial sum is ever cut in two
    int unit = S > 0 && S % 2 == 1 ? 2 * S : (S > 2 ? S : 2);
    if (n_sub % C != 0 || (n_sub / C) % unit != 0) {
        char blocks[64] = "";
        if (S > 0) { snprintf(blocks, sizeof(blocks), " and whole blocks (S = %d)", S); }
        snprintf(err, err_len, "--pipeline %d --virtual %d: %d chunks cannot each hold whole "
                 "layers%s of the 2L = %d sub-layers", P, V, C, blocks, n_sub);
        return -1;
    }
    if (M < P) {
        snprintf(err, err_len, "--microbatches %d is fewer than the %d stages: 1F1B needs M >= P",
                 M, P);
        return -1;
    }
    if (V > 1 && M % P != 0) {
        snprintf(err, err_len, "--virtual %d: the interleaved schedule takes the microbatches P "
                 "at a time, so --microbatches %d must be a multiple of --pipeline %d", V, M, P);
        return -1;
    }
    if (2 * C * M > 32767) {  // the messages' tags (MPI guarantees 32767)
        snprintf(err, err_len, "--pipeline %d --virtual %d --microbatches %d: at most 32767 "
                 "messages a step (2*P*V*M)", P, V, M);
        return -1;
    }
    return 0;
}

// ---------------------------------------------------------------------------------------
// 3. A stage. Each chunk trains as a Model of its own (its share of the parameters) with a
// Trainer of its own; each microbatch in flight has a slot: the chunk's activations for it.

typedef struct {
    Activations acts;  // the slot's buffers (point_chunk_activations); x0 and the partials of
                       // the blocks before the chunk are rebound when the cache is on
    float* memory;
    size_t floats;     // memory's size
    float **block, **dblock;  // b_j and db_j (j = 0 .. c*N_p): the slot's own buffers
} Slot;

struct Pipeline {
    Cut cut;
    int P, V, M, stage, D, replica;
    Dist world, stages, replicas;  // the job, this replica's stages, this stage's replicas
    ModelConfig config;
    size_t sequences, T, d;  // a microbatch's sequences, their length, the width
    Model* chunks;       // V: chunk v holds sub-layers [c*U, (c+1)*U), c = v*P + stage
    Trainer* trainers;   // V: each chunk's optimiser step, ZeRO-1 over `replicas` (D > 1)
    Dist* chunk_dists;   // V copies of `replicas` (each Trainer's, with its own shards)
    int* n_slots;        // V: the microbatches each chunk has in flight at most
    Slot* slots;         // V * M (the first n_slots[v] of chunk v's M used)
    PipelineOp* ops;     // this stage's schedule
    int n_ops;
    int* slot_index;     // V * M: the slot of chunk v's microbatch m (the schedule's)
    float* message;      // what a receive lands in
    const int *x, *y;    // this step's sequences
    size_t n_targets;
    double loss_sum;     // the last stage: the sequences' losses this step
    // the accounting: floats sent (forward, backward), the time computing and in steps
    size_t sent[2];
    double busy_seconds, step_seconds;
    int steps;
    PipelineEvent* events;
    size_t n_events, max_events;
    double run_start;
};

static int chunk_index(const Pipeline* p, int v) { return v * p->P + p->stage; }

// chunk v's slot s
static Slot* slot_at(Pipeline* p, int v, int s) { return &p->slots[(size_t)v * p->M + s]; }

// b_j's buffer and its gradient's in a: x0 for j = 0, else the partial sum ending block j
static float** block_in(Activations* a, int S, int j, int grad) {
    if (j == 0) { return grad ? &a->dx0 : &a->x0; }
    return grad ? &a->sub[j * S - 1].dpartial : &a->sub[j * S - 1].partial;
}

static void build_slots(Pipeline* p) {
    const Cut* k = &p->cut;
    p->slots = callocCheck((size_t)p->V * p->M, sizeof(Slot));
    for (int v = 0; v < p->V; v++) {
        int c = chunk_index(p, v);
        for (int s = 0; s < p->n_slots[v]; s++) {
            Slot* slot = slot_at(p, v, s);
            Activations* a = &slot->acts;
            a->sub = callocCheck(2 * (size_t)p->config.n_layers + 1, sizeof(SubLayer));
            slot->floats = point_chunk_activations(a, &p->config, p->sequences, p->T, c * k->U,
                                                   (c + 1) * k->U, NULL);
            slot->memory = callocCheck(slot->floats, sizeof(float));
            point_chunk_activations(a, &p->config, p->sequences, p->T, c * k->U, (c + 1) * k->U,
                                    slot->memory);
            int blocks = k->S > 0 ? last_received(k, c) + 1 : 0;
            slot->block = callocCheck((size_t)blocks + 1, sizeof(float*));
            slot->dblock = callocCheck((size_t)blocks + 1, sizeof(float*));
            for (int j = 0; j < blocks; j++) {
                slot->block[j] = *block_in(a, k->S, j, 0);
                slot->dblock[j] = *block_in(a, k->S, j, 1);
            }
        }
    }
}

// Points chunk v's model at the slot of op, and, AttnRes, the blocks it reads before its
// own at their buffers: the slot's own, or (cached) the buffers the stage's previous chunk
// reads them from for the same microbatch (its own, or, V >= 3, those of a chunk before it),
// which is still in flight: its backward comes after this one's
static Slot* bind(Pipeline* p, const PipelineOp* op) {
    const Cut* k = &p->cut;
    int v = op->v, c = chunk_index(p, v);
    Slot* slot = slot_at(p, v, op->slot);
    if (k->S > 0) {
        Activations* previous = NULL;
        if (k->cache && v > 0) {
            previous = &slot_at(p, v - 1, p->slot_index[(size_t)(v - 1) * p->M + op->micro])->acts;
        }
        int cached = previous != NULL ? first_travelling(k, c) - 1 : -1;  // b_0 .. b_cached
        for (int j = 0; j <= last_received(k, c); j++) {
            *block_in(&slot->acts, k->S, j, 0) = j <= cached ? *block_in(previous, k->S, j, 0) : slot->block[j];
            *block_in(&slot->acts, k->S, j, 1) = j <= cached ? *block_in(previous, k->S, j, 1) : slot->dblock[j];
        }
    }
    p->chunks[v].acts = slot->acts;
    return slot;
}

// The buffers that travel into chunk c, as they are in a (the sender's activations or the
// receiver's): x[i] and its gradient dx[i], `width` floats a position each; returns their number
static int travelling(const Pipeline* p, int c, Activations* a, float** x, float** dx,
                      size_t* width) {
    const Cut* k = &p->cut;
    *width = p->d;
    if (k->S == 0 && p->config.streams > 0) {  // mhc
        *width = p->d * (size_t)p->config.streams;
        x[0] = a->sub[c * k->U].streams;
        dx[0] = a->dstreams;
        return 1;
    }
    if (k->S == 0) {  // none: the stream; its gradient is carried in dx0 (model.h)
        x[0] = a->sub[c * k->U].h;
        dx[0] = a->dx0;
        return 1;
    }
    int n = 0;
    for (int j = first_travelling(k, c); j <= last_received(k, c); j++, n++) {
        x[n] = *block_in(a, k->S, j, 0);
        dx[n] = *block_in(a, k->S, j, 1);
    }
    return n;
}

// The MPI tag of what travels into chunk c for microbatch m: forward (0) or backward (1)
static int tag_of(const Pipeline* p, int backward, int c, int m) {
    return (backward * p->cut.C + c) * p->M + m;
}

// Sends the buffers xs (count of them, sequences x T x width floats each) as one message
static void send_buffers(Pipeline* p, int to_chunk, int backward, int c, int m, float** xs,
                         int count, size_t width) {
    size_t n = p->sequences * p->T * width;
    for (int i = 0; i < count; i++) { memcpy(p->message + (size_t)i * n, xs[i], n * sizeof(float)); }
    dist_send(&p->stages, to_chunk % p->P, tag_of(p, backward, c, m), p->message,
              (size_t)count * n * sizeof(float));
    p->sent[backward] += (size_t)count * n;
}

// Receives one message into p->message; then the caller copies (forward) or adds (backward)
static void receive(Pipeline* p, int from_chunk, int backward, int c, int m, int count,
                    size_t width) {
    size_t n = (size_t)count * p->sequences * p->T * width;
    dist_recv(&p->stages, from_chunk % p->P, tag_of(p, backward, c, m), p->message,
              n * sizeof(float));
}

// ---------------------------------------------------------------------------------------
// 4. One chunk on one microbatch, and the step.

static void record(Pipeline* p, const PipelineOp* op, double start) {
    double end = now_seconds();
    p->busy_seconds += end - start;
    if (p->n_events == p->max_events) {
        p->max_events = p->max_events ? 2 * p->max_events : 256;
        p->events = realloc(p->events, p->max_events * sizeof(PipelineEvent));
        if (p->events == NULL) { fprintf(stderr, "error: out of memory for the trace\n"); exit(1); }
    }
    p->events[p->n_events++] = (PipelineEvent){start - p->run_start, end - p->run_start,
                                               p->steps + 1, p->stage,
                                               chunk_index(p, op->v), op->micro, op->kind};
}

static void chunk_forward(Pipeline* p, const PipelineOp* op) {
    const Cut* k = &p->cut;
    int v = op->v, c = chunk_index(p, v), m = op->micro;
    Model* model = &p->chunks[v];
    Slot* slot = bind(p, op);
    size_t N = p->sequences * p->T, at = (size_t)m * N;
    model_set_batch(model, p->x + at, p->y + at, p->n_targets, p->sequences, p->T);
    // the gradients this microbatch will carry start at zero, in the slot's own buffers (dx0:
    // AttnRes's b_0, which bind may have pointed elsewhere; none's stream)
    model_zero_carried_buffers(model, k->S > 0 ? slot->dblock[0] : model->acts.dx0);
    float *x[2 * p->config.n_layers + 2], *dx[2 * p->config.n_layers + 2];
    size_t width;
    if (c == 0) {
        model_embedding_forward(model);
    } else {  // what chunk c-1 sent, into this slot's buffers
        int count = travelling(p, c, &model->acts, x, dx, &width);
        receive(p, c - 1, 0, c, m, count, width);
        for (int i = 0; i < count; i++) { memcpy(x[i], p->message + (size_t)i * N * width, N * width * sizeof(float)); }
    }
    double start = now_seconds();
    model_sublayers_forward(model, c * k->U, (c + 1) * k->U);
    if (c == k->C - 1) {
        model_head_forward(model);
        p->loss_sum += model->kernels->sum(model->acts.losses, N);
    } else {  // what chunk c+1 reads and its stage does not hold
        int count = travelling(p, c + 1, &model->acts, x, dx, &width);
        send_buffers(p, c + 1, 0, c + 1, m, x, count, width);
    }
    record(p, op, start);
}

static void chunk_backward(Pipeline* p, const PipelineOp* op) {
    const Cut* k = &p->cut;
    int v = op->v, c = chunk_index(p, v), m = op->micro;
    Model* model = &p->chunks[v];
    bind(p, op);
    size_t N = p->sequences * p->T, at = (size_t)m * N;
    model_set_batch(model, p->x + at, p->y + at, p->n_targets, p->sequences, p->T);
    float *x[2 * p->config.n_layers + 2], *dx[2 * p->config.n_layers + 2];
    size_t width;
    if (c == k->C - 1) {
        model_head_backward(model);
    } else {  // the gradients of what this chunk sent on, added where they are kept: here a
              // cached block's pieces and the travelling sum meet
        int count = travelling(p, c + 1, &model->acts, x, dx, &width);
        receive(p, c + 1, 1, c, m, count, width);
        for (int i = 0; i < count; i++) {
            const float* g = p->message + (size_t)i * N * width;
            for (size_t j = 0; j < N * width; j++) { dx[i][j] += g[j]; }
        }
    }
    double start = now_seconds();
    const float* dinput = model_sublayers_backward(model, c * k->U, (c + 1) * k->U);
    if (c == 0) { model_embedding_backward(model, dinput); }
    record(p, op, start);
    if (c > 0) {  // the gradients of what this chunk received, back to where they came from
        int count = travelling(p, c, &model->acts, x, dx, &width);
        if (dinput != NULL) { dx[0] = (float*)dinput; }  // none, mhc: the input's gradient
        send_buffers(p, c - 1, 1, c - 1, m, dx, count, width);
    }
}

void pipeline_step(Pipeline* p, const int* x, const int* y, size_t n_targets) {
    double start = now_seconds();
    p->x = x;
    p->y = y;
    p->n_targets = n_targets;
    for (int v = 0; v < p->V; v++) { model_zero_grad(&p->chunks[v]); }
    for (int i = 0; i < p->n_ops; i++) {
        if (p->ops[i].kind == 'F') { chunk_forward(p, &p->ops[i]); }
        else { chunk_backward(p, &p->ops[i]); }
    }
    dist_wait_sends();
    p->step_seconds += now_seconds() - start;
    p->steps++;
}

// ---------------------------------------------------------------------------------------
// 5. The optimiser. The loss and the norm must be one process's bits: the sequences' losses
// add up on the last stage (in microbatch order, as --microbatches does), and the gradient
// comes together on rank 0 in the whole model's order, where its sum of squares runs as one
// process's does (or, with D replicas, as data parallel's D shards do). Then each chunk's
// Trainer clips and updates its share: AdamW goes element by element and Muon matrix by
// matrix, so the chunks' updates are the whole model's.

// Which floats of chunk v of `rank` reach rank 0's whole model: its shape (the share's
// sizes and offsets, in `shape`) and the part [lo, hi) of its flat buffer that rank holds:
// gradients and moments, its ZeRO-1 shard when D > 1; parameters, the whole share, from
// replica 0 alone (hi = lo = 0 elsewhere)
enum { WHOLE_GRADIENTS, WHOLE_PARAMS, WHOLE_M, WHOLE_V };

static void part_of(const Pipeline* p, int rank, int v, int what, Model* shape, size_t* lo,
                    size_t* hi) {
    int stage = rank % p->P, replica = rank / p->P, c = v * p->P + stage;
    memset(shape, 0, sizeof(*shape));
    shape->config = p->config;
    shape->dims = model_dims(&p->config);
    shape->sub_begin = c * p->cut.U;
    shape->sub_end = (c + 1) * p->cut.U;
    shape->num_params = param_share(&p->config, shape->sub_begin, shape->sub_end,
                                    shape->param_offsets, shape->param_sizes);
    *lo = 0;
    *hi = shape->num_params;
    if (what == WHOLE_PARAMS) {
        if (replica != 0) { *hi = 0; }
    } else if (p->D > 1) {
        Dist replicas = p->replicas;
        size_t* bounds = NULL;
        if (p->trainers[0].optimizer == OPTIMIZER_MUON) {
            bounds = mallocCheck(((size_t)p->D + 1) * sizeof(size_t));
            model_muon_shard_bounds(shape, p->D, bounds);
        }
        replicas.shard_bounds = bounds;
        dist_shard_of(&replicas, shape->num_params, replica, lo, hi);
        free(bounds);
    }
}

// The floats [lo, hi) of a chunk's flat buffer (`part`) to their places in the whole model's
static void place_in_whole(const Model* shape, const float* part, size_t lo, size_t hi,
                           float* whole) {
    size_t at = 0;  // where tensor i's share starts in the chunk's buffer
    for (int i = 0; i < N_PARAM_TENSORS; i++) {
        size_t first = at > lo ? at : lo, end = at + shape->param_sizes[i] < hi ? at + shape->param_sizes[i] : hi;
        if (first < end) {
            memcpy(whole + shape->param_offsets[i] + (first - at), part + (first - lo),
                   (end - first) * sizeof(float));
        }
        at += shape->param_sizes[i];
    }
}

// What this rank holds of `what` for chunk v (part_of's [lo, hi), from lo)
static const float* held(const Pipeline* p, int v, int what) {
    const Trainer* t = &p->trainers[v];
    const Model* chunk = &p->chunks[v];
    if (what == WHOLE_PARAMS) { return chunk->params_memory; }
    if (what == WHOLE_GRADIENTS) { return t->sharded ? t->grad_shard : chunk->grads_memory; }
    if (what == WHOLE_M) { return t->sharded ? t->m_shard : chunk->m_memory; }
    return t->sharded ? t->v_shard : chunk->v_memory;
}

// Every rank's parts of `what` to rank 0, into whole (the whole model's flat buffer there)
static void gather_whole(Pipeline* p, int what, float* whole) {
    Model shape;
    size_t lo, hi;
    float* incoming = NULL;
    for (int rank = 0; rank < p->world.world; rank++) {
        for (int v = 0; v < p->V; v++) {
            part_of(p, rank, v, what, &shape, &lo, &hi);
            if (hi == lo) { continue; }
            if (rank == p->world.rank && rank == 0) {
                place_in_whole(&shape, held(p, v, what), lo, hi, whole);
            } else if (rank == p->world.rank) {
                dist_send(&p->world, 0, v, held(p, v, what), (hi - lo) * sizeof(float));
            } else if (p->world.rank == 0) {
                incoming = realloc(incoming, (hi - lo) * sizeof(float));
                if (incoming == NULL) { fprintf(stderr, "error: out of memory\n"); exit(1); }
                dist_recv(&p->world, rank, v, incoming, (hi - lo) * sizeof(float));
                place_in_whole(&shape, incoming, lo, hi, whole);
            }
        }
    }
    free(incoming);
    dist_wait_sends();
}

float pipeline_loss_and_norm(Pipeline* p, Model* whole, float* norm) {
    for (int v = 0; v < p->V; v++) {  // D > 1: this replica's shard of the summed gradients
        Trainer* t = &p->trainers[v];
        if (t->sharded) {
            dist_reduce_scatter(t->dist, t->grad_shard, p->chunks[v].grads_memory,
                                p->chunks[v].num_params);
        }
    }
    double loss = dist_sum(&p->world, p->loss_sum);
    p->loss_sum = 0.0;
    gather_whole(p, WHOLE_GRADIENTS, whole->grads_memory);
    double sum_sq = 0.0;
    if (p->world.rank == 0) {  // one process's sum, or data parallel's: shard by shard
        size_t* bounds = mallocCheck(((size_t)p->D + 1) * sizeof(size_t));
        Dist replicas = p->replicas;
        replicas.shard_bounds = NULL;
        if (p->trainers[0].optimizer == OPTIMIZER_MUON && p->D > 1) {
            model_muon_shard_bounds(whole, p->D, bounds);
            replicas.shard_bounds = bounds;
        }
        for (int r = 0; r < p->D; r++) {
            size_t lo, hi;
            dist_shard_of(&replicas, whole->num_params, r, &lo, &hi);
            sum_sq += sum_of_squares(whole->grads_memory + lo, hi - lo);
        }
        free(bounds);
    }
    dist_broadcast(&p->world, &sum_sq, sizeof(sum_sq));
    *norm = (float)sqrt(sum_sq);
    return p->n_targets > 0 ? (float)(loss / (double)p->n_targets) : 0.0f;
}

void pipeline_clip(Pipeline* p, float norm, float max_norm) {
    for (int v = 0; v < p->V; v++) { trainer_clip(&p->trainers[v], norm, max_norm); }
}

void pipeline_update(Pipeline* p, float lr, float beta1, float beta2, float eps,
                     float weight_decay, int adam_t) {
    for (int v = 0; v < p->V; v++) {
        trainer_update(&p->trainers[v], lr, beta1, beta2, eps, weight_decay, adam_t);
    }
}

// ---------------------------------------------------------------------------------------
// 6. Building a stage, rank 0's whole model, the accounting.

Pipeline* pipeline_create(const Model* whole, const Dist* world, int P, int V, int M,
                          int cache, size_t sequences, size_t T, int optimizer, float muon_momentum) {
    Pipeline* p = callocCheck(1, sizeof(Pipeline));
    p->config = whole->config;
    p->cut = cut_of(&p->config, P, V, cache);
    p->P = P;
    p->V = V;
    p->M = M;
    p->world = *world;
    dist_split(world, P, &p->stages, &p->replicas);
    p->stage = p->stages.rank;
    p->D = p->replicas.world;
    p->replica = p->replicas.rank;
    p->sequences = sequences;
    p->T = T;
    p->d = (size_t)p->config.d_model;
    p->run_start = now_seconds();
    // the schedule, and each chunk's slots
    p->ops = mallocCheck(2 * (size_t)M * V * sizeof(PipelineOp));
    p->n_slots = callocCheck((size_t)V, sizeof(int));
    p->n_ops = pipeline_schedule(P, V, M, p->stage, p->ops, p->n_slots);
    p->slot_index = callocCheck((size_t)V * M, sizeof(int));
    for (int i = 0; i < p->n_ops; i++) {
        p->slot_index[(size_t)p->ops[i].v * M + p->ops[i].micro] = p->ops[i].slot;
    }
    // the chunks: their share of the whole model's parameters and moments, and a Trainer each
    p->chunks = callocCheck((size_t)V, sizeof(Model));
    p->trainers = callocCheck((size_t)V, sizeof(Trainer));
    p->chunk_dists = callocCheck((size_t)V, sizeof(Dist));
    const float* from[] = {whole->params_memory, whole->m_memory, whole->v_memory};
    for (int v = 0; v < V; v++) {
        int c = chunk_index(p, v);
        Model* chunk = &p->chunks[v];
        model_build_chunk(chunk, &p->config, c * p->cut.U, (c + 1) * p->cut.U);
        chunk->max_B = sequences;
        chunk->max_T = T;
        float* to[] = {chunk->params_memory, chunk->m_memory, chunk->v_memory};
        for (int b = 0; b < 3; b++) {
            size_t at = 0;
            for (int i = 0; i < N_PARAM_TENSORS; i++) {
                memcpy(to[b] + at, from[b] + chunk->param_offsets[i], chunk->param_sizes[i] * sizeof(float));
                at += chunk->param_sizes[i];
            }
        }
        p->chunk_dists[v] = p->replicas;
        trainer_init(&p->trainers[v], chunk, &p->chunk_dists[v], sequences, T, optimizer, muon_momentum);
    }
    build_slots(p);
    size_t largest = (2 * (size_t)p->config.n_layers + 2) * sequences * T * p->d *
                     (p->config.streams > 0 ? (size_t)p->config.streams : 1);
    p->message = mallocCheck(largest * sizeof(float));
    return p;
}

void pipeline_free(Pipeline* p) {
    if (p == NULL) { return; }
    for (int v = 0; v < p->V; v++) {
        for (int s = 0; s < p->n_slots[v]; s++) {
            Slot* slot = slot_at(p, v, s);
            free(slot->memory);
            free(slot->acts.sub);
            free(slot->block);
            free(slot->dblock);
        }
        trainer_free(&p->trainers[v]);
        p->chunks[v].acts.sub = NULL;  // the slots' (freed above)
        model_free(&p->chunks[v]);
    }
    free(p->slots);
    free(p->n_slots);
    free(p->slot_index);
    free(p->ops);
    free(p->chunks);
    free(p->trainers);
    free(p->chunk_dists);
    free(p->message);
    free(p->events);
    free(p);
}

void pipeline_gather(Pipeline* p, Model* whole) {
    gather_whole(p, WHOLE_PARAMS, whole->params_memory);
    gather_whole(p, WHOLE_M, whole->m_memory);
    gather_whole(p, WHOLE_V, whole->v_memory);
}

size_t pipeline_param_floats(const Pipeline* p) {
    size_t n = 0;
    for (int v = 0; v < p->V; v++) { n += p->chunks[v].num_params; }
    return n;
}

size_t pipeline_memory_bytes(const Pipeline* p) {
    size_t floats = 0;
    for (int v = 0; v < p->V; v++) {
        const Trainer* t = &p->trainers[v];
        // parameters and gradients; the moments, whole or this replica's shard with the
        // shard of the summed gradients
        floats += 2 * p->chunks[v].num_params + (t->sharded ? 3 * (t->hi - t->lo)
                                                            : 2 * p->chunks[v].num_params);
        for (int s = 0; s < p->n_slots[v]; s++) { floats += p->slots[(size_t)v * p->M + s].floats; }
    }
    floats += (2 * (size_t)p->config.n_layers + 2) * p->sequences * p->T * p->d *
              (p->config.streams > 0 ? (size_t)p->config.streams : 1);
    return floats * sizeof(float);
}

// The floats a step sends into chunk c from the stage before it (forward; the gradients back
// are as many), with the cache or without
static size_t step_floats_into(const Pipeline* p, int c, int cache) {
    return pipeline_floats_into(&p->config, p->P, p->V, c, cache) * p->sequences * p->T * (size_t)p->M;
}

void pipeline_report(Pipeline* p, size_t whole_bytes, int steps) {
    // per stage: the bytes it sent a step (measured: forward, back), what it sends forward
    // a step without the cache and with it (pipeline_floats_into), its parameters (floats),
    // its memory, its idle share
    enum { FORWARD, BACKWARD, NAIVE, CACHED, PARAMS, MEMORY, IDLE, N_REPORT };
    double mine[N_REPORT] = {0};
    mine[FORWARD] = 4.0 * (double)p->sent[0] / (steps > 0 ? steps : 1);
    mine[BACKWARD] = 4.0 * (double)p->sent[1] / (steps > 0 ? steps : 1);
    for (int v = 0; v < p->V; v++) {
        int c = chunk_index(p, v);
        if (c + 1 < p->cut.C) {
            mine[NAIVE] += 4.0 * (double)step_floats_into(p, c + 1, 0);
            mine[CACHED] += 4.0 * (double)step_floats_into(p, c + 1, 1);
        }
    }
    mine[PARAMS] = (double)pipeline_param_floats(p);
    mine[MEMORY] = (double)pipeline_memory_bytes(p);
    mine[IDLE] = p->step_seconds > 0.0 ? 1.0 - p->busy_seconds / p->step_seconds : 0.0;
    double* all = callocCheck((size_t)p->P * N_REPORT, sizeof(double));
    if (p->replica == 0) {  // replica 0's stages report to its stage 0, rank 0
        if (p->stage != 0) { dist_send(&p->stages, 0, 0, mine, sizeof(mine)); }
        for (int s = 0; p->stage == 0 && s < p->P; s++) {
            if (s == 0) { memcpy(all, mine, sizeof(mine)); }
            else { dist_recv(&p->stages, s, 0, all + s * N_REPORT, sizeof(mine)); }
        }
        dist_wait_sends();
    }
    if (p->world.rank == 0) {
        double idle = 0.0, simulated = 0.0, total[2] = {0.0, 0.0};
        printf("pipeline: %d stages x %d chunks a stage (%d chunks of %d sub-layers), %d "
               "microbatches of %zu sequences, %d replica%s; cross-stage cache %s\n", p->P, p->V,
               p->cut.C, p->cut.U, p->M, p->sequences, p->D, p->D == 1 ? "" : "s",
               p->cut.cache ? "on" : "off");
        for (int s = 0; s < p->P; s++) {
            const double* r = all + s * N_REPORT;
            printf("  stage %d: sent %.0f bytes forward and %.0f back a step (forward naive %.0f, "
                   "cached %.0f) | params %.0f floats | memory %.2f MiB | idle %.1f%%\n", s,
                   r[FORWARD], r[BACKWARD], r[NAIVE], r[CACHED], r[PARAMS],
                   r[MEMORY] / 1048576.0, 100.0 * r[IDLE]);
            idle += r[IDLE] / p->P;
            total[0] += r[NAIVE];
            total[1] += r[CACHED];
        }
        pipeline_simulate(p->P, p->V, p->M, &simulated);
        printf("  all stages: %.0f bytes forward a step naive, %.0f cached (%.2fx less); one "
               "process (./train) allocates %.2f MiB for this run, rank 0 that too besides its "
               "stage (the whole model, for evaluation)\n", total[0], total[1],
               total[1] > 0 ? total[0] / total[1] : 1.0, (double)whole_bytes / 1048576.0);
        printf("  bubble: measured %.1f%% (the stages' idle share), schedule %.1f%% "
               "(pipeline_simulate), formula (P-1)/(V*M+P-1) = %.1f%%\n", 100.0 * idle,
               100.0 * simulated, 100.0 * (p->P - 1) / (p->V * p->M + p->P - 1));
    }
    free(all);
}

int pipeline_write_trace(Pipeline* p, const char* path, char* err, size_t err_len) {
    // replica 0's stages send their events to rank 0, 7 numbers each
    size_t n = p->n_events;
    float* mine = mallocCheck((7 * n + 1) * sizeof(float));
    for (size_t i = 0; i < n; i++) {
        const PipelineEvent* e = &p->events[i];
        float fields[7] = {(float)e->step, (float)e->stage, (float)e->chunk, (float)e->micro,
                        e->kind == 'F' ? 0.0f : 1.0f, (float)(1000.0 * e->start),
                        (float)(1000.0 * e->end)};
        memcpy(mine + 7 * i, fields, sizeof(fields));
    }
    int status = 0;
    if (p->replica == 0 && p->stage != 0) {
        float count = (float)n;
        dist_send(&p->stages, 0, 1, &count, sizeof(count));
        dist_send(&p->stages, 0, 2, mine, 7 * n * sizeof(float));
        dist_wait_sends();
    } else if (p->world.rank == 0) {
        char tmp[4200];
        FILE* f = checkpoint_temp_path(tmp, sizeof(tmp), path) == 0 ? fopen(tmp, "w") : NULL;
        if (f == NULL) {
            snprintf(err, err_len, "--pipeline-trace: cannot write %s", path);
            status = -1;
        }
        if (f != NULL) { fprintf(f, "%s\n", PIPELINE_TRACE_HEADER); }
        for (int s = 0; s < p->P; s++) {
            float* events = mine;
            size_t count = n;
            if (s != 0) {
                float got;
                dist_recv(&p->stages, s, 1, &got, sizeof(got));
                count = (size_t)got;
                events = mallocCheck((7 * count + 1) * sizeof(float));
                dist_recv(&p->stages, s, 2, events, 7 * count * sizeof(float));
            }
            for (size_t i = 0; f != NULL && i < count; i++) {
                const float* r = events + 7 * i;
                fprintf(f, "%d,%d,%d,%d,%c,%.3f,%.3f\n", (int)r[0], (int)r[1], (int)r[2],
                        (int)r[3], r[4] == 0.0f ? 'F' : 'B', (double)r[5], (double)r[6]);
            }
            if (events != mine) { free(events); }
        }
        if (f != NULL && (fclose(f) != 0 || rename(tmp, path) != 0)) {
            snprintf(err, err_len, "--pipeline-trace: cannot write %s", path);
            status = -1;
        }
    }
    free(mine);
    return status;
}
