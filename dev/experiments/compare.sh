#!/usr/bin/env bash
# compare.sh — none vs full vs block AttnRes on one task with one budget, over 3 seeds.
# Trains every (mode, seed) with --diagnostics, prints a table (final val loss and exact
# match, mean ± sd over seeds; steps until exact match first reached 99 %; ms per training
# step, median over the log windows of all seeds) and draws the curves with
# dev/experiments/plots.sh.
#
# usage: dev/experiments/compare.sh [OUT]
#        (make compare; OUT = runs/compare; ~5 min on 2 quiet cores)
# environment (defaults below):
#   SETTING  the flags every run shares: the task, the model and the budget
#   BLOCK_SIZE  S of the block mode (4)
#   SEEDS    the seeds ("1 2 3")
#   JOBS     runs at once (2), each with THREADS OpenMP threads (1): on a 2-core machine
#            two single-threaded runs use the cores best, and every run sees the same load
#   TRAIN    the trainer (./train)
#
# dev/experiments/ablate.sh, scaling.sh and shape.sh source this file for the helpers below
# (runs in a pool, the text, the per-seed statistics); sourced, it defines them and returns
# before the experiment.
set -euo pipefail

JOBS=${JOBS:-2}
THREADS=${THREADS:-1}
TRAIN=${TRAIN:-./train}

# train_run RUN FLAG...: $TRAIN FLAG... on THREADS threads with RUN as its --diagnostics
# directory; its stdout (with the text heatmap) goes to RUN/run.log
train_run() {
    local run=$1
    shift
    rm -rf "$run"
    mkdir -p "$run"
    if ! OMP_WAIT_POLICY=PASSIVE "$TRAIN" "$@" --threads "$THREADS" --diagnostics "$run" \
            > "$run/run.log" 2>&1; then
        echo "error: $run failed, see $run/run.log" >&2
        return 1
    fi
}

# pool_run COMMAND...: COMMAND in the background as soon as fewer than JOBS are running;
# pool_wait: waits for every one of them, and fails if one failed
pool_pids=()
pool_run() {
    while [ "$(jobs -rp | wc -l)" -ge "$JOBS" ]; do wait -n || true; done
    "$@" &
    pool_pids+=($!)
}
pool_wait() {
    local pid failed=0
    for pid in "${pool_pids[@]}"; do wait "$pid" || failed=1; done
    pool_pids=()
    return "$failed"
}

# flag_value FLAG FLAGS: the value FLAG has in the list FLAGS
flag_value() { awk -v flag="$1" '{ for (i = 1; i < NF; i++) if ($i == flag) print $(i + 1) }' <<< "$2"; }

# fortunes_text FILE: every fortune of /usr/share/games/fortunes (the plain files, not the
# .dat indexes or the .u8 links) into FILE, the '%' separator lines dropped, the fortunes
# shuffled with a fixed Park-Miller stream (exact in any awk) so that the trainer's
# validation split, the last tenth of the file, is a sample of all of them and not the last
# files' topics; one empty line between fortunes. The text of `make ablate` and `make scaling`.
fortunes_text() {
    local fortunes=/usr/share/games/fortunes
    [ -f "$fortunes/wisdom" ] || {
        echo "error: $fortunes is missing: run dev/infra/ensure_deps.sh fortunes" >&2
        return 1
    }
    find "$fortunes" -maxdepth 1 -type f ! -name '*.dat' | LC_ALL=C sort | xargs awk '
        function keep() { if (body != "") text[++n] = body; body = "" }
        FNR == 1 { keep() }
        $0 == "%" { keep(); next }
        { body = body $0 "\n" }
        END {
            keep()
            x = 1
            for (i = n; i > 1; i--) {
                x = (x * 16807) % 2147483647
                j = 1 + x % i
                swap = text[i]; text[i] = text[j]; text[j] = swap
            }
            for (i = 1; i <= n; i++) printf "%s%s", (i > 1 ? "\n" : ""), text[i]
        }' > "$1"
}

# text_file OUT: the text a sweep trains on: TEXT, which must be a file, or, unset, every
# fortune (fortunes_text) written into OUT/fortunes.txt; prints its path
text_file() {
    local text=${TEXT:-}
    if [ -z "$text" ]; then
        text=$1/fortunes.txt
        fortunes_text "$text" || return 1
    fi
    [ -f "$text" ] || { echo "error: TEXT=$text is not a file" >&2; return 1; }
    echo "$text"
}

# last_eval RUN COLUMN: eval.csv's COLUMN at the last evaluation (2: val loss, 4: exact match)
last_eval() { awk -F, -v column="$2" 'NR > 1 { value = $column } END { print value }' "$1/eval.csv"; }

# first_step_at RUN PERCENT: the first evaluated step with exact match >= PERCENT, or -
first_step_at() {
    awk -F, -v percent="$2" 'NR > 1 && first == "" && $4 >= percent { first = $1 }
                             END { print first == "" ? "-" : first }' "$1/eval.csv"
}

# mean_sd: the mean and the sample sd (0 for one value) of the numbers on stdin, one a line
mean_sd() {
    awk '{ x[++n] = $1 }
         END {
             for (i = 1; i <= n; i++) s += x[i]
             m = s / n
             for (i = 1; i <= n; i++) v += (x[i] - m) ^ 2
             printf "%.17g %.17g\n", m, n < 2 ? 0 : sqrt(v / (n - 1))
         }'
}

# steps_summary: first_step_at's answers on stdin, one a line, as "283 ± 76" (every seed got
# there), "475 (2 of 3 seeds)" (the mean over those that did) or "—" (none did)
steps_summary() {
    awk '{ n++; if ($1 != "-") { k++; x[k] = $1; s += $1 } }
         END {
             if (k == 0) { print "—"; exit }
             m = s / k
             for (i = 1; i <= k; i++) v += (x[i] - m) ^ 2
             if (k < n) printf "%.0f (%d of %d seeds)\n", m, k, n
             else if (n > 1) printf "%.0f ± %.0f\n", m, sqrt(v / (n - 1))
             else printf "%.0f\n", m
         }'
}

# median_ms_per_step RUN...: the median of the ms/step of every log window of these runs
median_ms_per_step() {
    local run
    for run in "$@"; do awk -F, 'NR > 1 { print $5 }' "$run/train.csv"; done | sort -g |
        awk '{ x[NR] = $1 } END { print NR % 2 ? x[(NR + 1) / 2] : (x[NR / 2] + x[NR / 2 + 1]) / 2 }'
}

[ "${BASH_SOURCE[0]}" = "$0" ] || return 0

out=${1:-runs/compare}
SETTING=${SETTING:-"--task reverse --length 12 --symbols 16 --L 8 --d 64 --H 4 --G 2 --F 176 \
--batch 32 --steps 500 --warmup 50 --lr 3e-3 --eval-every 50 --log-every 25 --eval-examples 200"}
BLOCK_SIZE=${BLOCK_SIZE:-4}  # block mode's S (the other modes refuse --block-size)
SEEDS=${SEEDS:-"1 2 3"}
MODES="none full block"

[ -x "$TRAIN" ] || { echo "error: $TRAIN not found: run make first" >&2; exit 1; }
mkdir -p "$out"
echo "compare: $MODES x seeds $SEEDS, $JOBS at a time with $THREADS thread(s) each, into $out"
echo "setting: $SETTING"

# train one run: the shared setting, its mode and seed
train_one() {
    local mode=$1 seed=$2 block=()
    [ "$mode" = block ] && block=(--block-size "$BLOCK_SIZE")
    # shellcheck disable=SC2086  # SETTING is a list of flags
    train_run "$out/${mode}_seed$seed" $SETTING --mode "$mode" "${block[@]}" --seed "$seed" || return 1
    echo "  done $mode seed $seed: $(grep '^final' "$out/${mode}_seed$seed/run.log")"
}

start=$(date +%s)
for seed in $SEEDS; do
    for mode in $MODES; do pool_run train_one "$mode" "$seed"; done
done
pool_wait
echo "trained in $(( $(date +%s) - start )) s"

# the table: one row per mode, from the runs' eval.csv and train.csv
table() {
    local mode seed run runs loss loss_sd match match_sd
    echo "| mode | final val loss | exact match (%) | steps to 99 % exact match | ms/step |"
    echo "|---|---|---|---|---|"
    for mode in $MODES; do
        runs=()
        for seed in $SEEDS; do runs+=("$out/${mode}_seed$seed"); done
        read -r loss loss_sd < <(for run in "${runs[@]}"; do last_eval "$run" 2; done | mean_sd)
        read -r match match_sd < <(for run in "${runs[@]}"; do last_eval "$run" 4; done | mean_sd)
        printf "| %s | %.4f ± %.4f | %.1f ± %.1f | %s | %.1f |\n" "$mode" "$loss" "$loss_sd" \
            "$match" "$match_sd" \
            "$(for run in "${runs[@]}"; do first_step_at "$run" 99; done | steps_summary)" \
            "$(median_ms_per_step "${runs[@]}")"
    done
}
table | tee "$out/table.md"
echo "(mean ± sd over seeds $SEEDS; steps to 99 %: first eval at or above 99 %, mean over the"
echo " seeds that got there; ms/step: median of the log windows, $JOBS run(s) at a time with"
echo " $THREADS thread(s) each)"

runs=()
for mode in $MODES; do for seed in $SEEDS; do runs+=("$out/${mode}_seed$seed"); done; done
"$(dirname "$0")/plots.sh" -o "$out" "${runs[@]}"
