// run_record.c — the checks a training run makes before it trains (run_record.h).
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "inference.h"  // decoder_floats
#include "run_record.h"
#include "util.h"

RunRecord run_record_of(const Options* o, const Dataset* ds, int best_step, float best_val_loss) {
    RunRecord run;
    memset(&run, 0, sizeof(run));
    run.task = (int)ds->kind;
    int text = ds->kind == TASK_TEXT;
    run.length = text ? 0 : o->length;
    run.symbols = text ? 0 : o->symbols;
    run.seq_len = ds->seq_len;
    run.batch = o->batch;
    run.microbatches = o->microbatches;
    run.steps = o->steps;
    run.warmup = o->warmup;
    run.eval_examples = o->eval_examples;
    run.seed = o->seed;
    run.lr = o->lr;
    run.final_lr_frac = o->final_lr_frac;
    run.weight_decay = o->weight_decay;
    run.grad_clip = o->grad_clip;
    run.beta1 = o->beta1;
    run.beta2 = o->beta2;
    run.adam_eps = o->adam_eps;
    run.schedule = o->schedule_kind;
    run.decay_frac = o->schedule_kind == SCHEDULE_WSD ? o->decay_frac : 0.0f;
    run.optimizer = o->optimizer_kind;
    run.muon_momentum = o->optimizer_kind == OPTIMIZER_MUON ? o->muon_momentum : 0.0f;
    if (text) {
        const char* slash = strrchr(o->text_path, '/');
        snprintf(run.text_name, sizeof(run.text_name), "%s", slash ? slash + 1 : o->text_path);
        run.text_bytes = ds->n_text;
    }
    run.best_step = best_step;
    run.best_val_loss = best_val_loss;
    return run;
}

#define FAIL(...) do { snprintf(err, err_len, __VA_ARGS__); return -1; } while (0)

int run_record_check_resume(const char* path, const RunRecord* now, RunRecord* was,
                            int* recorded, char* err, size_t err_len) {
    if (checkpoint_read_run(path, was, recorded, err, err_len) != 0) { return -1; }
    if (!*recorded) { return 0; }
    const char* fix = "resume with the training's flags, or start a new run";
    if (was->task != now->task) {
        FAIL("checkpoint %s was trained on --task %s, this run has --task %s (%s)", path,
             task_name(was->task), task_name(now->task), fix);
    }
    if (strcmp(was->text_name, now->text_name) != 0 || was->text_bytes != now->text_bytes) {
        FAIL("checkpoint %s was trained on --text %s (%llu bytes), this run reads %s (%llu "
             "bytes) (%s)", path, was->text_name, was->text_bytes, now->text_name,
             now->text_bytes, fix);
    }
    const char* int_flags[] = {"--length", "--symbols", "--seq-len", "--batch", "--microbatches",
                               "--steps", "--warmup", "--eval-examples"};
    int int_was[] = {was->length, was->symbols, was->seq_len, was->batch, was->microbatches,
                     was->steps, was->warmup, was->eval_examples};
    int int_now[] = {now->length, now->symbols, now->seq_len, now->batch, now->microbatches,
                     now->steps, now->warmup, now->eval_examples};
    for (int i = 0; i < 8; i++) {
        if (int_was[i] != int_now[i]) {
            FAIL("checkpoint %s was trained with %s %d, this run has %s %d (%s)", path,
                 int_flags[i], int_was[i], int_flags[i], int_now[i], fix);
        }
    }
    if (was->seed != now->seed) {
        FAIL("checkpoint %s was trained with --seed %llu, this run has --seed %llu (%s)", path,
             was->seed, now->seed, fix);
    }
    const char* schedules[] = {"cosine", "wsd"};  // checkpoint_read_run checked the value
    if (was->schedule != now->schedule) {
        FAIL("checkpoint %s was trained with --schedule %s, this run has --schedule %s (%s)",
             path, schedules[was->schedule], schedules[now->schedule], fix);
    }
    const char* optimizers[] = {"adamw", "muon"};  // checkpoint_read_run checked the value
    if (was->optimizer != now->optimizer) {
        FAIL("checkpoint %s was trained with --optimizer %s, this run has --optimizer %s (%s)",
             path, optimizers[was->optimizer], optimizers[now->optimizer], fix);
    }
    if (was->muon_momentum != now->muon_momentum) {
        FAIL("checkpoint %s was trained with --muon-momentum %g, this run has --muon-momentum "
             "%g (%s)", path, (double)was->muon_momentum, (double)now->muon_momentum, fix);
    }
    const char* float_flags[] = {"--lr", "--final-lr-frac", "--weight-decay", "--grad-clip",
                                 "--beta1", "--beta2", "--decay-frac"};
    float float_was[] = {was->lr, was->final_lr_frac, was->weight_decay, was->grad_clip,
                         was->beta1, was->beta2, was->decay_frac};
    float float_now[] = {now->lr, now->final_lr_frac, now->weight_decay, now->grad_clip,
                         now->beta1, now->beta2, now->decay_frac};
    for (int i = 0; i < 7; i++) {
        if (float_was[i] != float_now[i]) {
            FAIL("checkpoint %s was trained with %s %g, this run has %s %g (%s)", path,
                 float_flags[i], (double)float_was[i], float_flags[i], (double)float_now[i], fix);
        }
    }
    return 0;
}

size_t available_memory(void) {
    FILE* f = fopen("/proc/meminfo", "r");
    if (f == NULL) { return 0; }
    char line[256];
    size_t kib = 0;
    while (fgets(line, sizeof(line), f) != NULL) {
        if (sscanf(line, "MemAvailable: %zu kB", &kib) == 1) { break; }
    }
    fclose(f);
    return kib * 1024;
}

int run_memory_check(const ModelConfig* c, size_t B, size_t T, size_t decoder_sequences,
                     const Dist* dist, size_t data_bytes, size_t* bytes,
                     size_t* activation_bytes, char* err, size_t err_len) {
    size_t sizes[N_PARAM_TENSORS];
    size_t params = param_sizes(c, sizes);
    Activations sizing;
    sizing.sub = mallocCheck((size_t)(2 * c->n_layers + 1) * sizeof(SubLayer));
    size_t activations = point_activations(&sizing, c, B, T, 1, NULL);
    free(sizing.sub);
    size_t world = (size_t)dist->world, shard = (params + world - 1) / world;
    size_t state = world == 1 ? 4 * params : 2 * params + 3 * shard;
    size_t decoder = dist->rank == 0 ? decoder_floats(c, decoder_sequences, T) : 0;
    *bytes = (state + activations + decoder) * sizeof(float) + 3 * B * T * sizeof(int) +
             data_bytes;
    *activation_bytes = activations * sizeof(float);
    size_t available = available_memory();
    if (available > 0 && *bytes > available) {
        FAIL("this run needs %.2f GiB (%.2f GiB of them activations, %.1f KiB for each of the "
             "B x T = %zu tokens), more than the %.2f GiB available: lower --batch or --seq-len "
             "(or --d, --L)", (double)*bytes / 1073741824.0,
             (double)*activation_bytes / 1073741824.0,
             (double)*activation_bytes / 1024.0 / (double)(B * T), B * T,
             (double)available / 1073741824.0);
    }
    return 0;
}
