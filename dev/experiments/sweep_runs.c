// sweep_runs.c — a sweep's runs.csv, read; the table of losses per size and mode
// (sweep_runs.h).
#include "sweep_runs.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char* program_name = "sweep";

void sweep_fail(const char* message, const char* detail) {
    fprintf(stderr, "error: %s: %s%s\n", program_name, message, detail);
    exit(1);
}

// the index of name in names[0 .. *n), appended when new
static int find_or_add(char names[][32], int* n, int max, const char* name, const char* what) {
    for (int i = 0; i < *n; i++) {
        if (strcmp(names[i], name) == 0) { return i; }
    }
    if (*n == max) { sweep_fail("too many ", what); }
    snprintf(names[*n], 32, "%s", name);
    return (*n)++;
}

void sweep_read(Sweep* s, const char* path, const char* program) {
    program_name = program;
    FILE* f = fopen(path, "r");
    if (f == NULL) { sweep_fail("cannot open ", path); }
    char line[512], mode[32], size[32];
    char mode_names[MAX_MODES][32];
    int seed;
    double params, tokens, flops, loss;
    memset(s, 0, sizeof(*s));
    if (fgets(line, sizeof(line), f) == NULL) { sweep_fail("empty file ", path); }
    while (fgets(line, sizeof(line), f) != NULL) {
        line[strcspn(line, "\r\n")] = '\0';
        if (sscanf(line, "%31[^,],%31[^,],%d,%lf,%lf,%lf,%lf", mode, size, &seed, &params,
                   &tokens, &flops, &loss) != 7 || !(flops > 0) || !(loss > 0)) {
            sweep_fail("malformed line (want mode,size,seed,params,tokens,flops,val_loss with"
                       " flops, loss > 0): ", line);
        }
        int m = find_or_add(mode_names, &s->n_modes, MAX_MODES, mode, "modes");
        int z = find_or_add(s->size_name, &s->n_sizes, MAX_SIZES, size, "sizes");
        snprintf(s->modes[m].name, sizeof(s->modes[m].name), "%s", mode);
        Mode* md = &s->modes[m];
        md->flops[z] = flops;
        md->params[z] = params;
        md->tokens[z] = tokens;
        if (md->n_seeds[z] == MAX_SEEDS) { sweep_fail("too many seeds at size ", size); }
        md->loss[z][md->n_seeds[z]++] = loss;
    }
    fclose(f);
    if (s->n_modes < 2 || s->n_sizes < 2) { sweep_fail("need at least 2 modes and 2 sizes in ", path); }
    for (int m = 0; m < s->n_modes; m++) {
        for (int z = 0; z < s->n_sizes; z++) {
            if (s->modes[m].n_seeds[z] == 0) { sweep_fail("a mode lacks a size: ", s->modes[m].name); }
        }
    }
}

void mean_sd(const double* x, int n, double* mean, double* sd) {
    double sum = 0, var = 0;
    for (int k = 0; k < n; k++) { sum += x[k]; }
    *mean = sum / n;
    for (int k = 0; k < n; k++) { var += (x[k] - *mean) * (x[k] - *mean); }
    *sd = n > 1 ? sqrt(var / (n - 1)) : 0;
}

void sweep_print_table(const Sweep* s, const char* size_heading) {
    printf("| %s | params | tokens | tokens/param | FLOPs |", size_heading);
    for (int m = 0; m < s->n_modes; m++) { printf(" %s |", s->modes[m].name); }
    printf("\n|---|---|---|---|---|");
    for (int m = 0; m < s->n_modes; m++) { printf("---|"); }
    printf("\n");
    for (int z = 0; z < s->n_sizes; z++) {
        const Mode* base = &s->modes[0];
        double fewest = base->tokens[z] / base->params[z];
        for (int m = 1; m < s->n_modes; m++) {
            fewest = fmin(fewest, s->modes[m].tokens[z] / s->modes[m].params[z]);
        }
        printf("| %s | %.3g | %.3g | %.1f | %.3g |", s->size_name[z], base->params[z],
               base->tokens[z], fewest, base->flops[z]);
        for (int m = 0; m < s->n_modes; m++) {
            double mean, sd;
            mean_sd(s->modes[m].loss[z], s->modes[m].n_seeds[z], &mean, &sd);
            printf(" %.4f ± %.4f |", mean, sd);
        }
        printf("\n");
    }
}

int compare_doubles(const void* a, const void* b) {
    double x = *(const double*)a, y = *(const double*)b;
    return (x > y) - (x < y);
}
