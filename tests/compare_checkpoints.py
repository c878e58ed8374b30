#!/usr/bin/env python3
"""compare_checkpoints.py A B: two checkpoints of the same model (the format of
src/checkpoint.h) hold the same parameters and AdamW moments, each within 1e-5 of the
largest value of its kind; prints the largest difference of each kind. Exit status 1 if not.
Plain Python (no numpy), for tests/mpi_tests.sh and tests/run_all.sh."""
import sys
from array import array


def load(path):
    data = open(path, "rb").read()
    header = array("i", data[:1024])
    n = header[10] + (header[11] << 32)
    return n, array("f", data[1024:1024 + 12 * n])


def main():
    n, a = load(sys.argv[1])
    n2, b = load(sys.argv[2])
    if n != n2:
        sys.exit(f"error: {n} parameters against {n2}")
    ok = True
    for k, name in enumerate(["parameters", "AdamW m", "AdamW v"]):
        x, y = a[k * n:(k + 1) * n], b[k * n:(k + 1) * n]
        scale = max(abs(v) for v in x)
        worst = max(abs(u - v) for u, v in zip(x, y))
        print(f"{name}: {n} values, largest |difference| {worst:.3g} (largest value {scale:.3g})")
        ok = ok and any(v != 0.0 for v in y) and worst <= 1e-5 * scale + 1e-9
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
