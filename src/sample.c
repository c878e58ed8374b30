// sample.c — ./train --sample: generate from a checkpoint.
// The prompt is --prompt (bytes; V = 256 is read as a byte-level text model), --prompt-tokens,
// or for a task model the first held-out example of --task/--length/--symbols/--seed (the
// checkpoint's run record gives the training's), whose expected answer is printed too. The
// draws come from --seed's generator (with --temperature > 0).
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "checkpoint.h"
#include "dataset.h"
#include "inference.h"
#include "sample.h"
#include "util.h"

typedef struct {
    int* prompt;
    size_t n_prompt;
    int* expected;      // the task's answer, NULL for text and --prompt-tokens
    size_t n_expected;
} Prompt;

#define FAIL(...) do { snprintf(err, err_len, __VA_ARGS__); return -1; } while (0)

static int check_sample_flags(const Options* o, char* err, size_t err_len) {
    if (o->checkpoint == NULL) { FAIL("--sample needs --checkpoint PATH"); }
    if (o->prompt != NULL && o->prompt_tokens != NULL) {
        FAIL("give --prompt or --prompt-tokens, not both");
    }
    if (o->sample_tokens < 0 || o->top_k < 0) {  // --temperature's range is the parser's
        FAIL("--tokens and --top-k must not be negative");
    }
    // greedy decoding takes the likeliest token, whatever --top-k says: a flag that would do
    // nothing
    if (option_given(o, "--top-k") && !(o->temperature > 0.0f)) {
        FAIL("--top-k needs --temperature above 0 (at temperature 0, the default, decoding is "
             "greedy and --top-k changes nothing)");
    }
    return 0;
}

// "3,1,4" -> prompt->prompt (malloc'd), each in [0, V)
static int parse_token_list(Prompt* prompt, const char* list, int V, char* err, size_t err_len) {
    size_t n = 1;
    for (const char* c = list; *c; c++) { n += *c == ','; }
    prompt->prompt = mallocCheck(n * sizeof(int));
    prompt->n_prompt = n;
    const char* s = list;
    for (size_t i = 0; i < n; i++) {
        char* end = NULL;
        errno = 0;
        long v = strtol(s, &end, 10);
        if (end == s || errno != 0 || v < 0 || v >= V || (*end != ',' && *end != '\0')) {
            FAIL("--prompt-tokens '%s': expected token ids in [0, %d) separated by commas", list, V);
        }
        prompt->prompt[i] = (int)v;
        s = end + 1;
    }
    return 0;
}

// the first held-out example of the task the flags describe: its prompt and separator, and
// its answer
static int task_prompt(Prompt* prompt, const Options* o, int V, char* err, size_t err_len) {
    Dataset ds;
    if (dataset_init_task(&ds, o->task, o->length, o->symbols, (size_t)o->eval_examples,
                          o->seed, err, err_len) != 0) { return -1; }
    if (ds.vocab_size != V) {
        dataset_free(&ds);
        FAIL("checkpoint %s has V = %d, but --task %s --symbols %d gives V = %d", o->checkpoint,
             V, o->task, o->symbols, ds.vocab_size);
    }
    size_t T = (size_t)ds.seq_len;
    prompt->n_prompt = (size_t)ds.answer_start + 1;  // the prompt and the separator
    prompt->n_expected = (size_t)ds.answer_len;
    prompt->prompt = mallocCheck(T * sizeof(int));
    int* y = mallocCheck(T * sizeof(int));
    dataset_eval_batch(&ds, prompt->prompt, y, 1, 0);
    prompt->expected = mallocCheck(prompt->n_expected * sizeof(int));
    memcpy(prompt->expected, y + ds.answer_start, prompt->n_expected * sizeof(int));
    free(y);
    dataset_free(&ds);
    return 0;
}

static int make_prompt(Prompt* prompt, const Options* o, int V, int is_text, char* err,
                       size_t err_len) {
    *prompt = (Prompt){NULL, 0, NULL, 0};
    if (o->prompt != NULL) {
        if (!is_text) {
            FAIL("--prompt needs a text model (V = 256), this one has V = %d: use --prompt-tokens", V);
        }
        prompt->n_prompt = strlen(o->prompt);
        if (prompt->n_prompt == 0) { FAIL("--prompt is empty"); }
        prompt->prompt = mallocCheck(prompt->n_prompt * sizeof(int));
        for (size_t i = 0; i < prompt->n_prompt; i++) {
            prompt->prompt[i] = (unsigned char)o->prompt[i];
        }
        return 0;
    }
    if (o->prompt_tokens != NULL) {
        return parse_token_list(prompt, o->prompt_tokens, V, err, err_len);
    }
    if (is_text) { FAIL("--sample with a text model needs --prompt \"text\" or --prompt-tokens"); }
    return task_prompt(prompt, o, V, err, err_len);
}

// a text model's bytes, printed as they are drawn (decoder_generate's TokenCallback)
static void print_byte(void* context, const int* tokens, size_t B) {
    (void)context;
    (void)B;
    putchar(tokens[0]);
    fflush(stdout);
}

// tasks: the three token lists, one per line
static void print_task_sample(const Prompt* prompt, const int* generated, size_t n_new) {
    const char* labels[] = {"prompt:   ", "generated:", "expected: "};
    const int* lists[] = {prompt->prompt, generated, prompt->expected};
    size_t lengths[] = {prompt->n_prompt, n_new, prompt->n_expected};
    for (int l = 0; l < 3 && lists[l] != NULL; l++) {
        printf("%s", labels[l]);
        for (size_t i = 0; i < lengths[l]; i++) { printf(" %d", lists[l][i]); }
        printf("\n");
    }
}

// The checkpoint's run record (version 2) gives --sample its defaults: the task, its length
// and symbols and the seed, when the flags do not say; and *context, the T the model was
// trained on, which generation never exceeds (0 for a version 1 checkpoint: no limit known).
// A flag that contradicts the record is refused.
static int sample_defaults(Options* o, size_t* context, char* err, size_t err_len) {
    RunRecord run;
    int recorded;
    *context = 0;
    if (checkpoint_read_run(o->checkpoint, &run, &recorded, err, err_len) != 0) { return -1; }
    if (!recorded) { return 0; }
    const char* trained = task_name(run.task);
    if (!option_given(o, "--task")) { o->task = trained; }
    if (strcmp(o->task, trained) != 0) {
        FAIL("checkpoint %s was trained on --task %s, not %s", o->checkpoint, trained, o->task);
    }
    const char* flags[] = {"--length", "--symbols"};
    int* values[] = {&o->length, &o->symbols};
    int recorded_values[] = {run.length, run.symbols};
    for (int i = 0; i < 2 && run.task != TASK_TEXT; i++) {
        if (!option_given(o, flags[i])) { *values[i] = recorded_values[i]; }
        if (*values[i] != recorded_values[i]) {
            FAIL("checkpoint %s was trained with %s %d, not %d", o->checkpoint, flags[i],
                 recorded_values[i], *values[i]);
        }
    }
    if (!option_given(o, "--seed")) { o->seed = run.seed; }
    if (!option_given(o, "--eval-examples")) { o->eval_examples = run.eval_examples; }
    *context = (size_t)run.seq_len;
    return 0;
}

// --sample reads the variant from the checkpoint; a variant flag that says otherwise is refused
static int check_sample_variant(const Options* o, const ModelConfig* trained, char* err,
                                size_t err_len) {
    // a window of W >= 2L sources of the checkpoint's L is its full mode (window 0)
    int window = o->model.depth_window;
    if (trained->block_size == 1 && window >= 2 * trained->n_layers) { window = 0; }
    const char* flags[] = {"--depth-score", "--key-norm", "--depth-query", "--depth-heads",
                           "--depth-window", "--mixing"};
    const int asked[] = {o->model.depth_score, o->model.key_norm_off, o->model.depth_query,
                         o->model.depth_heads, window, o->model.mixing};
    const int have[] = {trained->depth_score, trained->key_norm_off, trained->depth_query,
                        trained->depth_heads, trained->depth_window, trained->mixing};
    for (int i = 0; i < 6; i++) {
        if (option_given(o, flags[i]) && asked[i] != have[i]) {
            char variant[128];
            variant_describe(trained, variant, sizeof(variant));
            FAIL("checkpoint %s was trained with %s (%s disagrees)", o->checkpoint, variant,
                 flags[i]);
        }
    }
    return 0;
}

int sample_main(const Options* flags, char* err, size_t err_len) {
    Options options = *flags, *o = &options;
    size_t context;
    ModelConfig config;
    int step;
    if (check_sample_flags(o, err, err_len) != 0 ||
        sample_defaults(o, &context, err, err_len) != 0 ||
        checkpoint_read_config(o->checkpoint, &config, &step, err, err_len) != 0 ||
        check_sample_variant(o, &config, err, err_len) != 0) {
        return -1;
    }
    int V = config.vocab_size, is_text = V == 256;
    Prompt prompt;
    if (make_prompt(&prompt, o, V, is_text, err, err_len) != 0) {
        free(prompt.prompt);
        return -1;
    }
    size_t n_new = o->sample_tokens > 0 ? (size_t)o->sample_tokens
                                        : (is_text ? 256 : (size_t)o->length);
    size_t positions = prompt.n_prompt + n_new - 1;  // the decoder holds at most the trained T
    size_t max_T = context > 0 && context < positions ? context : positions;
    // the model's buffers hold the longest prefill: the prompt, or a window of max_T once the
    // context slides (a version 1 checkpoint, whose T is not known, never slides)
    size_t prefill = max_T < positions ? max_T : prompt.n_prompt;
    Model model;
    model_build(&model, &config, 1, prefill);
    if (checkpoint_load(&model, o->checkpoint, &step, err, err_len) != 0) {
        model_free(&model);
        free(prompt.prompt);
        free(prompt.expected);
        return -1;
    }
    Decoder dec;
    decoder_build(&dec, &model, 1, max_T);
    int* generated = mallocCheck(n_new * sizeof(int));
    uint64_t rng = o->seed;
    if (is_text) {  // the prompt, then each byte as it comes
        for (size_t i = 0; i < prompt.n_prompt; i++) { putchar(prompt.prompt[i]); }
        fflush(stdout);
    }
    decoder_generate(&dec, 1, prompt.prompt, prompt.n_prompt, generated, n_new, o->temperature,
                     o->top_k, &rng, is_text ? print_byte : NULL, NULL);
    if (is_text) { putchar('\n'); }
    else { print_task_sample(&prompt, generated, n_new); }
    free(prompt.prompt);
    free(prompt.expected);
    free(generated);
    decoder_free(&dec);
    model_free(&model);
    return 0;
}

void sample_print_text(Decoder* dec, const Dataset* ds, int* x, int* y) {
    const size_t n_prompt = 24, n_new = 72;
    if ((size_t)ds->seq_len < n_prompt) { return; }
    dataset_eval_batch(ds, x, y, 1, 0);
    int out[72];
    decoder_generate(dec, 1, x, n_prompt, out, n_new, 0.0f, 0, NULL, NULL, NULL);
    printf("sample: \"");
    const int* parts[] = {x, out};
    size_t lengths[] = {n_prompt, n_new};
    for (int k = 0; k < 2; k++) {
        if (k == 1) { printf("\" -> \""); }
        for (size_t i = 0; i < lengths[k]; i++) {
            int c = parts[k][i];
            if (c == '\n') { printf("\\n"); }
            else if (c == '"' || c == '\\') { printf("\\%c", c); }
            else if (c >= 32 && c < 127) { putchar(c); }
            else { printf("\\x%02x", c); }
        }
    }
    printf("\"\n");
}
