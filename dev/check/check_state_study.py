#!/usr/bin/python3
"""check_state_study.py — does check_state's tolerance track conditioning? (`make check-state-study`)

check_state passes a tensor when max_rel <= tol = max(TOL_FLOOR, TOL_FACTOR * spread), the
spread measured on the C computation itself (dev/check/check_state.c). On random configs drawn by
dev/check/reference.py --random this script shows that
  1. the correct code passes every one (and how many the old fixed rule fails: max|c-r| /
     max|r| <= 1e-5 for every tensor), with the worst error / tolerance ratio and the error /
     spread ratios that TOL_FACTOR must cover;
  2. a one-term bug still fails: for each bug in BUGS, check_state is built from a scratch copy
     of the repository with that term dropped and run on every config where the term is
     non-zero, counted under the new rule and under the old one.
The default seeds (1000..1099) are not the calibration configs TOL_FACTOR and N_NUDGES were
chosen on (--seed 0 --count 200).

usage: /usr/bin/python3 dev/check/check_state_study.py [--count 100] [--seed 1000] [--keep DIR]
Needs torch (Debian's python3-torch) for dev/check/reference.py, and ./check_state built (make).
The state files go to a temporary folder, removed at the end unless --keep DIR names one.
"""
import argparse
import math
import re
import shutil
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]  # the repository (this file is in dev/check/)
sys.path.insert(0, str(ROOT / "dev" / "check"))
import reference  # noqa: E402  (the state-file reader and the random configs)

OLD_TOL = 1e-5  # the fixed rule check_state used before

# One-term bugs: (file, the exact text, what replaces it, description, and which configs the
# term is non-zero in: a predicate on (config, K AdamW steps, init)).
BUGS = [
    ("src/rmsnorm.c", "dx[c] += r * weight[c] * dy[c] - correction * x[c];",
     "dx[c] += r * weight[c] * dy[c];",
     "rmsnorm backward: dx without the mean-square term", lambda c, K, init: True),
    ("src/depth_attention.c", "dv[c] += a * d[c] + key_scale * wg[c] - correction * v[c];",
     "dv[c] += a * d[c] + key_scale * wg[c];",
     # zero while the pseudo-queries are (SPEC init)
     "depth attention backward: key path without its rmsnorm term",
     lambda c, K, init: c["S"] > 0 and init == "rand"),
    ("src/attention.c", "ds_r[j] = a_r[j] * (ds_r[j] - D[r]) * scale;",
     "ds_r[j] = a_r[j] * (ds_r[j]) * scale;",
     "attention backward: softmax without - D_t (= dout_t . out_t = sum_j a_j da_j)",
     lambda c, K, init: c["T"] > 1),
    ("src/swiglu.c", "float dsilu = sigmoid * (1.0f + a * (1.0f - sigmoid));",
     "float dsilu = sigmoid * (a * (1.0f - sigmoid));",
     "swiglu backward: silu' without its 1 +", lambda c, K, init: True),
    ("src/adamw.c", "params[i] -= lr * (m_hat / (sqrtf(v_hat) + eps) + weight_decay * params[i]);",
     "params[i] -= lr * (m_hat / (sqrtf(v_hat) + eps));",
     "AdamW: no weight decay", lambda c, K, init: K >= 2),
]

LINE = re.compile(r"^\s+(\S+)\s+n=(\d+)\s+max_abs (\S+)\s+max_rel (\S+)\s+spread (\S+)\s+tol (\S+)\s+(ok|FAIL)$")


def run_check_state(binary, state, out):
    """Runs check_state on a state file, writing what C computed to out. Returns (exit status,
    [(tensor, max_rel, spread, tol)])."""
    p = subprocess.run([str(binary), str(state), "--out", str(out)], capture_output=True, text=True)
    if p.returncode not in (0, 1):
        sys.exit(f"error: {binary} {state}: exit status {p.returncode}: {p.stderr.strip()}")
    rows = [(m[1], float(m[4]), float(m[5]), float(m[6]))
            for m in map(LINE.match, p.stdout.splitlines()) if m]
    return p.returncode, rows


def old_rule_fails(ref_path, c_path):
    """The old verdict: some tensor with max|c - r| / max|r| > 1e-5 (an all-zero reference
    matched exactly)."""
    _, _, _, _, _, _, r = reference.read_state(ref_path)
    _, _, _, _, _, _, c = reference.read_state(c_path)
    pairs = [(c["logits"], r["logits"]), (c["loss"], r["loss"]), (c["losses"], r["losses"])]
    pairs += [(c["grads"][n], r["grads"][n]) for n in r["grads"]]
    for a, b in pairs:
        a, b = np.asarray(a, np.float64).ravel(), np.asarray(b, np.float64).ravel()
        if b.size == 0:
            continue
        diff, scale = np.abs(a - b).max(), np.abs(b).max()
        rel = diff / scale if scale > 0 else (math.inf if diff > 0 else 0.0)
        if not rel <= OLD_TOL:
            return True
    return False


def build_mutant(scratch, file, text, replacement):
    """A copy of what check_state is built from, with one term dropped; returns its binary."""
    for part in ("src", "data", "dev", "Makefile"):
        src, dst = ROOT / part, scratch / part
        shutil.copytree(src, dst) if src.is_dir() else shutil.copy(src, dst)
    source = (scratch / file).read_text()
    if source.count(text) != 1:
        sys.exit(f"error: {file} no longer holds exactly one `{text}` (update BUGS)")
    (scratch / file).write_text(source.replace(text, replacement))
    p = subprocess.run(["make", "-j2", "check_state"], cwd=scratch, capture_output=True, text=True)
    if p.returncode != 0:
        sys.exit(f"error: building the mutant of {file} failed:\n{p.stderr}")
    return scratch / "check_state"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--count", type=int, default=100, help="random configs (default 100)")
    ap.add_argument("--seed", type=int, default=1000, help="first seed (default 1000)")
    ap.add_argument("--keep", metavar="DIR", help="write the state files here and keep them")
    a = ap.parse_args()
    binary = ROOT / "check_state"
    if not binary.exists():
        sys.exit("error: ./check_state is missing (run make first)")
    work = Path(tempfile.mkdtemp(prefix="check_state_study_"))
    try:
        files = Path(a.keep) if a.keep else work / "states"
        subprocess.run([sys.executable, str(ROOT / "dev/check/reference.py"), "--random", str(files),
                        "--count", str(a.count), "--seed", str(a.seed)],
                       check=True, stdout=subprocess.DEVNULL)
        seeds = range(a.seed, a.seed + a.count)
        cases = {s: reference.random_case(s) for s in seeds}
        states = {s: files / f"random_{s}.bin" for s in seeds}
        modes = Counter({0: "none", 1: "full"}.get(c["S"], "block") for c, _, _, _ in cases.values())
        inits = Counter(init for _, _, init, _ in cases.values())
        print(f"check_state study: {a.count} random configs (dev/check/reference.py --random, seeds "
              f"{a.seed}..{a.seed + a.count - 1}): " + ", ".join(f"{m} {n}" for m, n in modes.items())
              + "; init " + ", ".join(f"{i} {n}" for i, n in inits.items()))

        # 1. the correct code
        new_fails, old_fails, tensors = [], [], []
        for s in seeds:
            status, rows = run_check_state(binary, states[s], work / "c.bin")
            if status:
                new_fails.append(s)
            if old_rule_fails(states[s], work / "c.bin"):
                old_fails.append(s)
            tensors += [(s,) + row for row in rows]
        print(f"correct code: FAIL on {len(new_fails)} / {a.count} configs"
              + (f" (seeds {new_fails})" if new_fails else "")
              + f"; under the old fixed rule (max|c-r|/max|r| <= {OLD_TOL:g}): {len(old_fails)}"
              f" / {a.count}" + (f" (seeds {old_fails})" if old_fails else ""))
        worst = max(tensors, key=lambda t: t[2] / t[4])
        print(f"  worst error / tolerance: {worst[2] / worst[4]:.2f} (seed {worst[0]} {worst[1]}:"
              f" max_rel {worst[2]:.2e}, tol {worst[4]:.1e})")
        big = [t for t in tensors if t[2] > 1e-6 and t[3] > 0]
        ratios = sorted(t[2] / t[3] for t in big)
        top = max(big, key=lambda t: t[2] / t[3])
        print(f"  error / spread over the {len(big)} of {len(tensors)} tensors with max_rel > 1e-6:"
              f" median {ratios[len(ratios) // 2]:.2f}, 99th percentile"
              f" {ratios[int(0.99 * (len(ratios) - 1))]:.2f}, max {ratios[-1]:.2f} (seed {top[0]}"
              f" {top[1]}: max_rel {top[2]:.2e}, spread {top[3]:.1e})")
        over = [t for t in tensors if t[2] > OLD_TOL]
        if over:
            print(f"  the {len(over)} tensors with max_rel > {OLD_TOL:g}: error / spread at most "
                  f"{max(t[2] / t[3] if t[3] > 0 else math.inf for t in over):.2f}, max_rel up to "
                  f"{max(t[2] for t in over):.1e}")
        largest = max(tensors, key=lambda t: t[4])
        print(f"  largest tolerance: {largest[4]:.1e} (seed {largest[0]} {largest[1]}, max_rel "
              f"{largest[2]:.1e})")

        # 2. one-term bugs
        print("one-term bugs, each built from a scratch copy and run on the configs where the term"
              " is non-zero: how many FAIL")
        for i, (file, text, replacement, what, uses) in enumerate(BUGS):
            mutant = build_mutant(work / f"bug{i}", file, text, replacement)
            used = [s for s in seeds if uses(*cases[s][:3])]
            caught, caught_old = set(), set()
            for s in used:
                status, _ = run_check_state(mutant, states[s], work / "c.bin")
                if status:
                    caught.add(s)
                if old_rule_fails(states[s], work / "c.bin"):
                    caught_old.add(s)
            # what the old rule caught on configs where it passes the correct code
            only_old = sorted(caught_old - caught - set(old_fails))
            print(f"  {file}: {what}\n    {len(caught)} / {len(used)}; old rule {len(caught_old)}"
                  f" / {len(used)} ({len(caught_old & set(old_fails))} of them fail without the"
                  f" bug); caught by the old rule only: {len(only_old)}"
                  + (f" (seeds {only_old})" if only_old else ""))
    finally:
        shutil.rmtree(work)


if __name__ == "__main__":
    main()
