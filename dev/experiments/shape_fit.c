// shape_fit.c — the reading of `make shape` (dev/experiments/shape.sh): at one parameter
// count and one token budget, which depth gives each residual mode its lowest loss, and how
// sure the seeds let us be. The paper's claim (its figure on the optimal shape): the baseline
// is best shallow and wide, AttnRes deeper and narrower.
//
// usage: build/shape_fit RUNS.csv [BEST.csv]
//   RUNS.csv  as make scaling's (sweep_runs.h), the size column the depth L: one line a run,
//             mode,L,seed,params,tokens,flops,val_loss, the depths from shallow to deep in
//             the order of the file; the first mode is the baseline
//   BEST.csv  written: mode,L,mean,sd,share_best (a line per mode and depth: the loss over
//             the seeds, and the share of the bootstrap resamples in which that depth is best)
// Prints the table (per depth: the baseline's parameters and tokens, the fewest tokens a
// parameter of any mode, the baseline's FLOPs, each mode's loss, mean ± sd over the seeds), then per mode the best depth (the
// lowest mean), how often each depth is best, how often the mode's best depth is deeper
// than the baseline's, and the loss difference of each pair of neighbouring depths.
//
// The bootstrap: 2000 resamples; each redraws, for every (mode, depth), its seeds with
// replacement and takes their mean; the best depth of a resample is the one with the lowest
// mean. The shares are over resamples; the differences' intervals are their 2.5th and 97.5th
// percentiles. With 2 seeds a cell has 3 distinct means, so the shares are coarse.
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include "../../src/rng.h"
#include "sweep_runs.h"

enum { RESAMPLES = 2000 };

// the index of the lowest of mean[0 .. n) (the first on a tie)
static int lowest(const double* mean, int n) {
    int best = 0;
    for (int z = 1; z < n; z++) {
        if (mean[z] < mean[best]) { best = z; }
    }
    return best;
}

int main(int argc, char** argv) {
    if (argc < 2 || argc > 3) {
        fprintf(stderr, "usage: shape_fit RUNS.csv [BEST.csv]\n");
        return 1;
    }
    static Sweep s;
    sweep_read(&s, argv[1], "shape_fit");
    sweep_print_table(&s, "L");

    double mean[MAX_MODES][MAX_SIZES], sd[MAX_MODES][MAX_SIZES];
    int best[MAX_MODES];
    for (int m = 0; m < s.n_modes; m++) {
        for (int z = 0; z < s.n_sizes; z++) {
            mean_sd(s.modes[m].loss[z], s.modes[m].n_seeds[z], &mean[m][z], &sd[m][z]);
        }
        best[m] = lowest(mean[m], s.n_sizes);
    }
    // the bootstrap: per resample and mode, the depths' means of redrawn seeds, the best of
    // them and the differences of neighbours
    static int best_count[MAX_MODES][MAX_SIZES], deeper[MAX_MODES], same[MAX_MODES];
    static double step[MAX_MODES][MAX_SIZES][RESAMPLES];  // mean[z + 1] − mean[z]
    uint64_t rng = 20261127;
    for (int r = 0; r < RESAMPLES; r++) {
        int best_r[MAX_MODES];
        for (int m = 0; m < s.n_modes; m++) {
            const Mode* md = &s.modes[m];
            double mean_r[MAX_SIZES];
            for (int z = 0; z < s.n_sizes; z++) {
                double sum = 0;
                for (int k = 0; k < md->n_seeds[z]; k++) {
                    sum += md->loss[z][(int)(rng_uniform(&rng) * md->n_seeds[z])];
                }
                mean_r[z] = sum / md->n_seeds[z];
            }
            for (int z = 0; z + 1 < s.n_sizes; z++) { step[m][z][r] = mean_r[z + 1] - mean_r[z]; }
            best_r[m] = lowest(mean_r, s.n_sizes);
            best_count[m][best_r[m]]++;
            deeper[m] += best_r[m] > best_r[0];
            same[m] += best_r[m] == best_r[0];
        }
    }

    printf("\n| mode | best L | its loss | how often each L is best (%d bootstrap resamples) |"
           " best L deeper / the same / shallower than %s's |\n", RESAMPLES, s.modes[0].name);
    printf("|---|---|---|---|---|\n");
    for (int m = 0; m < s.n_modes; m++) {
        printf("| %s | %s | %.4f ± %.4f |", s.modes[m].name, s.size_name[best[m]],
               mean[m][best[m]], sd[m][best[m]]);
        const char* separator = " ";
        for (int z = 0; z < s.n_sizes; z++) {
            if (best_count[m][z] == 0) { continue; }
            printf("%s%s: %.0f %%", separator, s.size_name[z], 100.0 * best_count[m][z] / RESAMPLES);
            separator = ", ";
        }
        if (m == 0) {
            printf(" | (the baseline) |\n");
        } else {
            printf(" | %.0f %% / %.0f %% / %.0f %% |\n", 100.0 * deeper[m] / RESAMPLES,
                   100.0 * same[m] / RESAMPLES, 100.0 * (RESAMPLES - deeper[m] - same[m]) / RESAMPLES);
        }
    }

    printf("\n| mode |");
    for (int z = 0; z + 1 < s.n_sizes; z++) { printf(" L %s → %s |", s.size_name[z], s.size_name[z + 1]); }
    printf("\n|---|");
    for (int z = 0; z + 1 < s.n_sizes; z++) { printf("---|"); }
    printf("\n");
    for (int m = 0; m < s.n_modes; m++) {
        printf("| %s |", s.modes[m].name);
        for (int z = 0; z + 1 < s.n_sizes; z++) {
            qsort(step[m][z], RESAMPLES, sizeof(double), compare_doubles);
            printf(" %+.4f [%+.4f, %+.4f] |", mean[m][z + 1] - mean[m][z],
                   step[m][z][(int)(0.025 * RESAMPLES)], step[m][z][(int)(0.975 * RESAMPLES)]);
        }
        printf("\n");
    }
    printf("(loss of the deeper minus the shallower, mean over the seeds, 95 %% bootstrap interval:"
           " below 0, the deeper is better)\n");

    if (argc == 3) {
        FILE* out = fopen(argv[2], "w");
        if (out == NULL) { sweep_fail("cannot write ", argv[2]); }
        fprintf(out, "mode,L,mean,sd,share_best\n");
        for (int m = 0; m < s.n_modes; m++) {
            for (int z = 0; z < s.n_sizes; z++) {
                fprintf(out, "%s,%s,%.6g,%.6g,%.4g\n", s.modes[m].name, s.size_name[z], mean[m][z],
                        sd[m][z], (double)best_count[m][z] / RESAMPLES);
            }
        }
        fclose(out);
    }
    return 0;
}
