// compare_checkpoints.c — two checkpoints of the same model (src/checkpoint.h) hold the same
// parameters and AdamW moments: each kind within TOL (2e-6 unless given) of its largest value
// (rounding apart; the moments not all zero). Measured: 2 or 3 processes against 1 after 10
// steps, at most 2e-7 of the largest value; the emulated GPU's sharded step against ./train
// after 6 steps, 6.5e-7 (its sums run in other orders). The pipeline's cross-stage cache
// against one process after 20 steps is held to check_state's floor, 1e-5 (tests/
// mpi_tests.sh says why). Prints the largest difference of each kind and its share of the
// largest value; exit status 1 if not within TOL, 2 for an unreadable file or bad TOL.
//
//   build/compare_checkpoints A B [TOL]
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include "util.h"

// the 3 x n_params floats after the 256-int header
static float* load(const char* path, size_t* n_params) {
    FILE* f = fopen(path, "rb");
    int32_t header[256];
    if (f == NULL || fread(header, sizeof(int32_t), 256, f) != 256) {
        fprintf(stderr, "error: cannot read checkpoint %s\n", path);
        exit(2);
    }
    *n_params = (size_t)(uint32_t)header[10] | ((size_t)(uint32_t)header[11] << 32);
    float* values = mallocCheck(3 * *n_params * sizeof(float));
    if (fread(values, sizeof(float), 3 * *n_params, f) != 3 * *n_params) {
        fprintf(stderr, "error: checkpoint %s is truncated\n", path);
        exit(2);
    }
    fclose(f);
    return values;
}

int main(int argc, char** argv) {
    if (argc != 3 && argc != 4) {
        fprintf(stderr, "usage: compare_checkpoints A B [TOL]\n");
        return 2;
    }
    double tol = argc == 4 ? atof(argv[3]) : 2e-6;
    if (!(tol > 0.0 && tol < 1.0)) {
        fprintf(stderr, "error: TOL must be in (0, 1) (got '%s')\n", argv[3]);
        return 2;
    }
    size_t n_params, n_params2;
    float* a = load(argv[1], &n_params);
    float* b = load(argv[2], &n_params2);
    if (n_params != n_params2) {
        fprintf(stderr, "error: %zu parameters against %zu\n", n_params, n_params2);
        return 1;
    }
    const char* kinds[3] = {"parameters", "AdamW m", "AdamW v"};
    int ok = 1;
    for (int k = 0; k < 3; k++) {
        double scale = 0.0, worst = 0.0;
        int nonzero = 0;
        for (size_t i = k * n_params; i < (k + 1) * n_params; i++) {
            scale = fmax(scale, fabs(a[i]));
            worst = fmax(worst, fabs((double)a[i] - (double)b[i]));
            nonzero |= b[i] != 0.0f;
        }
        printf("%s: %zu values, largest |difference| %.3g (largest value %.3g: %.2g of it)\n",
               kinds[k], n_params, worst, scale, scale > 0.0 ? worst / scale : 0.0);
        ok = ok && nonzero && worst <= tol * scale;
    }
    free(a);
    free(b);
    return ok ? 0 : 1;
}
