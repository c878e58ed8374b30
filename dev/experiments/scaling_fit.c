// scaling_fit.c — the fit of `make scaling` (dev/experiments/scaling.sh): loss = A · C^−α per
// residual mode, and each mode's compute multiplier against the baseline with a bootstrap
// interval over the seeds. The paper's Table 2 and its fits, in miniature.
//
// usage: build/scaling_fit RUNS.csv [FITS.csv]
//   RUNS.csv  a header line, then one line a run: mode,size,seed,params,tokens,flops,val_loss
//             (sweep_runs.h; sizes in any order)
//   FITS.csv  written: mode,A,alpha,multiplier,multiplier_lo,multiplier_hi (A for C in
//             PFLOP/s-days)
// Prints the table (per size: the baseline's parameters and tokens, the fewest tokens a
// parameter of any mode, the baseline's FLOPs, and each mode's validation loss, mean ± sd over
// the seeds), each mode's A and α, and its compute multiplier. Each mode is fitted at its own
// FLOPs (a mode may count more than the baseline, or train more tokens).
//
// The fit: least squares of ln loss = ln A − α ln C over every run of the mode (each seed a
// point), with C in PFLOP/s-days (8.64e19 FLOPs) as in the paper, so that A is the loss the
// fit extrapolates to one PFLOP/s-day (α and the multipliers do not depend on the unit).
// The compute multiplier of mode M at compute C is the compute the baseline (the first mode
// in the file) needs to reach M's fitted loss at C, over C:
//   C_base = (A_base / (A_M C^−α_M))^(1/α_base),  multiplier = C_base / C,
// taken at the baseline's largest C. Above 1: M reaches that loss with less compute.
// The interval: 2000 bootstrap resamples; each redraws, for every (mode, size), its seeds
// with replacement and refits every mode; the 2.5th and 97.5th percentiles of the
// multiplier. With 2 seeds a cell has 3 distinct draws, so the interval is coarse.
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include "../../src/rng.h"
#include "sweep_runs.h"

enum { RESAMPLES = 2000 };
static const double PFLOP_S_DAY = 1e15 * 86400;  // FLOPs

// least squares of ln loss = ln A − α ln C over the losses given per size (n[z] of them, at
// compute flops[z])
static void fit_power_law(const Sweep* s, const double* flops, double loss[][MAX_SEEDS],
                          const int* n, double* A, double* alpha) {
    double sx = 0, sy = 0, sxx = 0, sxy = 0, count = 0;
    for (int z = 0; z < s->n_sizes; z++) {
        double x = log(flops[z] / PFLOP_S_DAY);
        for (int k = 0; k < n[z]; k++) {
            double y = log(loss[z][k]);
            sx += x; sy += y; sxx += x * x; sxy += x * y; count += 1;
        }
    }
    double slope = (count * sxy - sx * sy) / (count * sxx - sx * sx);
    *alpha = -slope;
    *A = exp((sy - slope * sx) / count);
}

// the baseline's compute to reach mode (A, alpha)'s loss at C, over C (C in PFLOP/s-days)
static double compute_multiplier(double A_base, double alpha_base, double A, double alpha,
                                 double C) {
    double loss = A * pow(C, -alpha);
    return pow(A_base / loss, 1.0 / alpha_base) / C;
}

int main(int argc, char** argv) {
    if (argc < 2 || argc > 3) {
        fprintf(stderr, "usage: scaling_fit RUNS.csv [FITS.csv]\n");
        return 1;
    }
    static Sweep s;
    sweep_read(&s, argv[1], "scaling_fit");
    double C_max = 0;
    for (int z = 0; z < s.n_sizes; z++) { C_max = fmax(C_max, s.modes[0].flops[z] / PFLOP_S_DAY); }

    sweep_print_table(&s, "size");

    double A[MAX_MODES], alpha[MAX_MODES];
    for (int m = 0; m < s.n_modes; m++) {
        fit_power_law(&s, s.modes[m].flops, s.modes[m].loss, s.modes[m].n_seeds, &A[m], &alpha[m]);
    }
    // the bootstrap: every mode refitted on redrawn seeds, the multipliers kept per mode
    static double draws[MAX_MODES][RESAMPLES];
    uint64_t rng = 20261127;
    for (int r = 0; r < RESAMPLES; r++) {
        double A_r[MAX_MODES], alpha_r[MAX_MODES], loss[MAX_SIZES][MAX_SEEDS];
        for (int m = 0; m < s.n_modes; m++) {
            const Mode* md = &s.modes[m];
            for (int z = 0; z < s.n_sizes; z++) {
                for (int k = 0; k < md->n_seeds[z]; k++) {
                    loss[z][k] = md->loss[z][(int)(rng_uniform(&rng) * md->n_seeds[z])];
                }
            }
            fit_power_law(&s, md->flops, loss, md->n_seeds, &A_r[m], &alpha_r[m]);
            draws[m][r] = compute_multiplier(A_r[0], alpha_r[0], A_r[m], alpha_r[m], C_max);
        }
    }

    if (!(alpha[0] > 0)) {
        sweep_fail("the baseline's loss does not fall with compute (alpha <= 0): no multiplier", "");
    }
    FILE* fits = argc == 3 ? fopen(argv[2], "w") : NULL;
    if (argc == 3 && fits == NULL) { sweep_fail("cannot write ", argv[2]); }
    if (fits != NULL) { fprintf(fits, "mode,A,alpha,multiplier,multiplier_lo,multiplier_hi\n"); }
    printf("\n| mode | fit loss = A · C^−α (C in PFLOP/s-days) | compute multiplier at C = %.3g"
           " FLOPs (95 %% bootstrap) |\n", C_max * PFLOP_S_DAY);
    printf("|---|---|---|\n");
    for (int m = 0; m < s.n_modes; m++) {
        double multiplier = compute_multiplier(A[0], alpha[0], A[m], alpha[m], C_max);
        qsort(draws[m], RESAMPLES, sizeof(double), compare_doubles);
        double lo = draws[m][(int)(0.025 * RESAMPLES)], hi = draws[m][(int)(0.975 * RESAMPLES)];
        printf("| %s | %.4g · C^−%.4f | ", s.modes[m].name, A[m], alpha[m]);
        if (m == 0) {
            printf("1 (the baseline) |\n");
        } else {
            printf("%.2f× [%.2f, %.2f] |\n", multiplier, lo, hi);
        }
        if (fits != NULL) {
            fprintf(fits, "%s,%.6g,%.6g,%.6g,%.6g,%.6g\n", s.modes[m].name, A[m], alpha[m],
                    multiplier, lo, hi);
        }
    }
    if (fits != NULL) { fclose(fits); }
    return 0;
}
