#!/usr/bin/env python3
"""profile_cuda.py — where the GPU's time goes in one training step, kernel by kernel.

Runs ./train_cuda for one step of the bench model (d=256 L=8 H=8 G=4 F=704 V=256, B=8 T=128)
under Nsight Compute (ncu), which times every kernel launch on its own (gpu__time_duration),
and prints each kernel's launches and total time, largest first, with its share of the sum.
The sum is the GPU's busy time; against the step's wall time (make gpu-check, bench_cuda) the
difference is launch overhead and host work.

  python3 dev/bench/profile_cuda.py [--mode none|full|block|mhc] [--flags "MORE FLAGS"] [--cublas]
                                    [--ncu PATH] [--keep FILE]
  python3 dev/bench/profile_cuda.py --diff A.log B.log

--flags passes more of ./train_cuda's flags, e.g. SPEC's variants ("--depth-heads 16") or mhc's
streams ("--streams 2"); they are named in the printout's first line.
--diff reads two of its own printouts (say a block step's and a none step's) and prints,
kernel by kernel, what A spends more than B: where an AttnRes mode's overhead goes.

Needs a GPU whose runtime lets ncu read its counters (not gVisor). The step includes one
evaluation forward of 8 sequences (train_cuda evaluates at its last step).
"""
import argparse
import csv
import io
import shutil
import subprocess
import sys
from collections import defaultdict


# {kernel: (launches, total us)} and the header line of one printout of main()
def read_profile(path):
    kernels, header = {}, ""
    with open(path) as f:
        for line in f:
            if line.startswith("profile_cuda:"):
                header = line.strip()
                continue
            words = line.split()
            # a kernel line: NAME... launches total_us share%
            if len(words) >= 4 and words[-1].endswith("%") and words[-3].isdigit():
                kernels[" ".join(words[:-3])] = (int(words[-3]), float(words[-2]))
    if not kernels:
        sys.exit(f"error: {path}: no kernel lines of profile_cuda.py in it")
    return kernels, header


def diff(path_a, path_b):
    a, header_a = read_profile(path_a)
    b, header_b = read_profile(path_b)
    print(f"profile_cuda --diff: A = {header_a}\n                     B = {header_b}")
    print(f"{'kernel':<52s} {'launches A/B':>12s} {'A us':>9s} {'B us':>9s} {'A - B us':>9s}")
    names = set(a) | set(b)
    delta = {n: a.get(n, (0, 0.0))[1] - b.get(n, (0, 0.0))[1] for n in names}
    for n in sorted(names, key=lambda n: -abs(delta[n])):
        la, ta = a.get(n, (0, 0.0))
        lb, tb = b.get(n, (0, 0.0))
        print(f"{n[:52]:<52s} {f'{la}/{lb}':>12s} {ta:9.1f} {tb:9.1f} {delta[n]:+9.1f}")
    total_a, total_b = sum(t for _, t in a.values()), sum(t for _, t in b.values())
    print(f"{'all kernels':<52s} {'':>12s} {total_a:9.1f} {total_b:9.1f} {total_a - total_b:+9.1f}"
          f"  ({100 * (total_a - total_b) / total_b:+.1f} %)")


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "--diff":
        if len(sys.argv) != 4:
            sys.exit("usage: profile_cuda.py --diff A.log B.log")
        diff(sys.argv[2], sys.argv[3])
        return
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--mode", choices=["none", "full", "block", "mhc"], default="block")
    ap.add_argument("--flags", default="", help="more ./train_cuda flags (one string)")
    ap.add_argument("--cublas", action="store_true")
    ap.add_argument("--ncu", default=shutil.which("ncu") or "/usr/local/cuda/bin/ncu")
    ap.add_argument("--keep", metavar="FILE", help="also write ncu's raw CSV there")
    a = ap.parse_args()
    mode = ["--mode", a.mode] + (["--block-size", "4"] if a.mode == "block" else [])
    train = ["./train_cuda", "--task", "text", "--text", "README.md", "--seq-len", "128",
             "--batch", "8", "--d", "256", "--L", "8", "--H", "8", "--G", "4", "--F", "704",
             "--eval-examples", "8", "--threads", "8", "--steps", "1", "--eval-every", "1",
             "--log-every", "1"] + mode + a.flags.split() + (["--cublas"] if a.cublas else [])
    # the GPU's own clocks, and the caches as the step left them (ncu flushes them before
    # every kernel by default, which would make each small kernel read all it needs from
    # DRAM, where in the step its inputs were often just written and still in L2)
    cmd = [a.ncu, "--csv", "--print-units", "base", "--clock-control", "none",
           "--cache-control", "none", "--metrics", "gpu__time_duration.sum"] + train
    run = subprocess.run(cmd, capture_output=True, text=True)
    if run.returncode != 0:
        sys.exit(f"error: ncu failed (exit {run.returncode}): {run.stderr.strip()[-400:]}")
    if a.keep:
        with open(a.keep, "w") as f:
            f.write(run.stdout)
    text = run.stdout[run.stdout.find('"ID"'):]
    total = defaultdict(float)
    count = defaultdict(int)
    for row in csv.DictReader(io.StringIO(text)):
        if row.get("Metric Name") != "gpu__time_duration.sum":
            continue
        name = row["Kernel Name"].split("(")[0]
        total[name] += float(row["Metric Value"].replace(",", "")) / 1000.0  # ns -> us
        count[name] += 1
    busy = sum(total.values())
    print(f"profile_cuda: one step of the bench model, mode {a.mode}"
          f"{' ' + a.flags if a.flags else ''}{', cuBLAS' if a.cublas else ''}: "
          f"{sum(count.values())} launches, "
          f"{busy / 1000.0:.3f} ms of kernels")
    print(f"{'kernel':<52s} {'launches':>8s} {'total us':>10s} {'share':>6s}")
    for name in sorted(total, key=total.get, reverse=True):
        print(f"{name[:52]:<52s} {count[name]:8d} {total[name]:10.1f} {100 * total[name] / busy:5.1f}%")


if __name__ == "__main__":
    main()
