#!/usr/bin/env bash
# compare.sh — none vs full vs block AttnRes on one task with one budget, over 3 seeds.
# Trains every (mode, seed) with --diagnostics, prints a table (final val loss and exact
# match, mean ± sd over seeds; steps until exact match first reached 99 %; ms per training
# step, median over the log windows of all seeds) and draws the curves with dev/plots.sh.
#
# usage: dev/compare.sh [OUT]     (make compare; OUT = runs/compare; ~5 min on 2 quiet cores)
# environment (defaults below):
#   SETTING  the flags every run shares: the task, the model and the budget
#   BLOCK_SIZE  S of the block mode (4)
#   SEEDS    the seeds ("1 2 3")
#   JOBS     runs at once (2), each with THREADS OpenMP threads (1): on a 2-core machine
#            two single-threaded runs use the cores best, and every run sees the same load
#   TRAIN    the trainer (./train)
set -euo pipefail

out=${1:-runs/compare}
SETTING=${SETTING:-"--task reverse --length 12 --symbols 16 --L 8 --d 64 --H 4 --G 2 --F 176 \
--batch 32 --steps 500 --warmup 50 --lr 3e-3 --eval-every 50 --log-every 25 --eval-examples 200"}
BLOCK_SIZE=${BLOCK_SIZE:-4}  # block mode's S (the other modes refuse --block-size)
SEEDS=${SEEDS:-"1 2 3"}
JOBS=${JOBS:-2}
THREADS=${THREADS:-1}
TRAIN=${TRAIN:-./train}
MODES="none full block"

[ -x "$TRAIN" ] || { echo "error: $TRAIN not found: run make first" >&2; exit 1; }
mkdir -p "$out"
echo "compare: $MODES x seeds $SEEDS, $JOBS at a time with $THREADS thread(s) each, into $out"
echo "setting: $SETTING"

# train one run; its stdout (with the text heatmap) goes to OUT/RUN.log
train_one() {
    local mode=$1 seed=$2 run="$out/${1}_seed$2"
    rm -rf "$run"
    # shellcheck disable=SC2086  # SETTING is a list of flags
    local block=()
    [ "$mode" = block ] && block=(--block-size "$BLOCK_SIZE")
    if ! OMP_WAIT_POLICY=PASSIVE "$TRAIN" $SETTING --mode "$mode" "${block[@]}" --seed "$seed" \
            --threads "$THREADS" --diagnostics "$run" > "$run.log" 2>&1; then
        echo "error: $mode seed $seed failed, see $run.log" >&2
        return 1
    fi
    echo "  done $mode seed $seed: $(grep '^final' "$run.log")"
}

start=$(date +%s)
pids=()
for seed in $SEEDS; do
    for mode in $MODES; do
        while [ "$(jobs -rp | wc -l)" -ge "$JOBS" ]; do wait -n || true; done
        train_one "$mode" "$seed" &
        pids+=($!)
    done
done
failed=0
for pid in "${pids[@]}"; do wait "$pid" || failed=1; done
[ "$failed" -eq 0 ] || exit 1
echo "trained in $(( $(date +%s) - start )) s"

# the table: one row per mode, from the runs' eval.csv and train.csv
table() {
    echo "| mode | final val loss | exact match (%) | steps to 99 % exact match | ms/step |"
    echo "|---|---|---|---|---|"
    for mode in $MODES; do
        median=$(for seed in $SEEDS; do
                     awk -F, 'NR > 1 { print $5 }' "$out/${mode}_seed$seed/train.csv"
                 done | sort -g | awk '{ x[NR] = $1 }
                     END { print NR % 2 ? x[(NR + 1) / 2] : (x[NR / 2] + x[NR / 2 + 1]) / 2 }')
        # per seed: final val loss, final exact match, first step at >= 99 % (or -)
        for seed in $SEEDS; do
            awk -F, 'NR > 1 { loss = $2; match_ = $4; if (first == "" && $4 >= 99) first = $1 }
                     END { print loss, match_, (first == "" ? "-" : first) }' \
                "$out/${mode}_seed$seed/eval.csv"
        done | awk -v mode="$mode" -v median="$median" '
            function mean(x, n,   i, s) { for (i = 1; i <= n; i++) s += x[i]; return s / n }
            function sd(x, n,   i, m, s) {
                if (n < 2) return 0
                m = mean(x, n); for (i = 1; i <= n; i++) s += (x[i] - m) ^ 2
                return sqrt(s / (n - 1))
            }
            { n++; loss[n] = $1; em[n] = $2; if ($3 != "-") { k++; reach[k] = $3 } }
            END {
                steps = k == 0 ? "—" : sprintf("%.0f", mean(reach, k))
                if (k > 0 && k < n) steps = steps sprintf(" (%d of %d seeds)", k, n)
                if (k == n && n > 1) steps = steps sprintf(" ± %.0f", sd(reach, k))
                printf "| %s | %.4f ± %.4f | %.1f ± %.1f | %s | %.1f |\n", mode, mean(loss, n),
                       sd(loss, n), mean(em, n), sd(em, n), steps, median
            }'
    done
}
table | tee "$out/table.md"
echo "(mean ± sd over seeds $SEEDS; steps to 99 %: first eval at or above 99 %, mean over the"
echo " seeds that got there; ms/step: median of the log windows, $JOBS run(s) at a time with"
echo " $THREADS thread(s) each)"

runs=()
for mode in $MODES; do for seed in $SEEDS; do runs+=("$out/${mode}_seed$seed"); done; done
"$(dirname "$0")/plots.sh" -o "$out" "${runs[@]}"
