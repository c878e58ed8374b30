// sweep_runs.h — a sweep's runs.csv, read into memory: what make scaling's fit
// (scaling_fit.c) and make shape's (shape_fit.c) share.
//
// RUNS.csv: a header line, then one line a run: mode,size,seed,params,tokens,flops,val_loss
// (every mode at every size, with the same seeds). The first mode in the file is the
// baseline; the sizes keep the order of their first appearance.
#ifndef ATTNRES_SWEEP_RUNS_H
#define ATTNRES_SWEEP_RUNS_H

enum { MAX_MODES = 8, MAX_SIZES = 16, MAX_SEEDS = 8 };

typedef struct {
    char name[32];
    double loss[MAX_SIZES][MAX_SEEDS];  // by size, seed
    int n_seeds[MAX_SIZES];
    double flops[MAX_SIZES];            // C of the mode's runs at each size
    double params[MAX_SIZES], tokens[MAX_SIZES];  // of the mode's runs at each size
} Mode;

typedef struct {
    int n_modes, n_sizes;
    Mode modes[MAX_MODES];
    char size_name[MAX_SIZES][32];
} Sweep;

// prints "error: PROGRAM: message detail" (PROGRAM as given to sweep_read) and exits 1
void sweep_fail(const char* message, const char* detail);
// reads path into s; any malformed line, a missing (mode, size) or fewer than 2 modes and 2
// sizes is an error (sweep_fail)
void sweep_read(Sweep* s, const char* path, const char* program);
// the mean and the sample sd (0 for one value) of x[0 .. n)
void mean_sd(const double* x, int n, double* mean, double* sd);
// prints the table: a line per size, the baseline's parameters and tokens, the fewest tokens a
// parameter of any mode's runs (each counted with its own parameters) and the baseline's
// FLOPs, then each mode's loss, mean ± sd over its seeds; size_heading heads the first column
void sweep_print_table(const Sweep* s, const char* size_heading);
int compare_doubles(const void* a, const void* b);  // for qsort, ascending

#endif
