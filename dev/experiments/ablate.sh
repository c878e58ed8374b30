#!/usr/bin/env bash
# ablate.sh — the paper's ablation table (Table 4 of its 16-layer model) at toy scale: eleven
# rows, each a switch of SPEC's "Variants", trained with one budget on two measures over 3
# seeds: the validation loss of a byte-level language model on English text, and the steps
# until 99 % held-out exact match on sequence reversal. Prints the table beside the paper's
# numbers (also OUT/table.md; per seed OUT/seeds.csv) and draws loss curves with
# dev/experiments/plots.sh.
#
# usage: dev/experiments/ablate.sh [OUT]    (make ablate [TEXT=file] [OUT=dir]; OUT = runs/ablate;
#                                about 14 min on 2 cores)
# environment (defaults below):
#   TEXT      the language model's text; unset: the files of Debian's `fortunes` package
#             (dev/infra/ensure_deps.sh fortunes), shuffled into OUT/fortunes.txt
#   MODEL     the model every row shares (L = 8: 16 sub-layers, 4 blocks of S = 4)
#   TEXT_STEPS, REVERSE_STEPS   each task's budget in steps, the same for every row
#             (e.g. TEXT_STEPS=20 REVERSE_STEPS=20 SEEDS=1 for a quick check of the script)
#   TEXT_SETTING, REVERSE_SETTING   each task's flags (the budget included)
#   ROWS      the rows to train (all eleven), TASKS the measures ("text reverse")
#   SEEDS, JOBS, THREADS, TRAIN   as in dev/experiments/compare.sh, whose helpers this script uses
# Runs: OUT/<task>/<row>_seed<k>/ (the CSVs of --diagnostics, run.log: the trainer's output);
# charts: OUT/<task>/charts_<group>/loss.png (and depth.png), one per group of rows.
set -euo pipefail
here=$(dirname "$0")
# shellcheck source=compare.sh
source "$here/compare.sh"

out=${1:-runs/ablate}
MODEL=${MODEL:-"--L 8 --d 64 --H 4 --G 2 --F 176"}
TEXT_STEPS=${TEXT_STEPS:-300}
REVERSE_STEPS=${REVERSE_STEPS:-450}
# a tenth of each budget warms up (30 and 45 steps), so that a short budget keeps a warmup
# ./train accepts (one shorter than --steps)
TEXT_SETTING=${TEXT_SETTING:-"--task text --seq-len 64 --batch 8 --steps $TEXT_STEPS \
--warmup $((TEXT_STEPS / 10)) --lr 3e-3 --eval-every 100 --log-every 25 --eval-examples 256"}
REVERSE_SETTING=${REVERSE_SETTING:-"--task reverse --length 8 --symbols 16 --batch 32 \
--steps $REVERSE_STEPS --warmup $((REVERSE_STEPS / 10)) --lr 3e-3 --eval-every 25 --log-every 25 --eval-examples 200"}
TASKS=${TASKS:-"text reverse"}
SEEDS=${SEEDS:-"1 2 3"}

# the heads of the multi-head row: the paper's 16, or the divisor of d nearest to it
d=$(flag_value --d "$MODEL")
heads=$(awk -v d="$d" 'BEGIN { for (k = 0; k < 16; k++) for (s = -1; s <= 1; s += 2)
                                   if (16 + s * k >= 1 && d % (16 + s * k) == 0) { print 16 + s * k; exit } }')

# Table 4's rows: name, the row it varies (its reference for the differences), the paper's
# validation loss, the label, the flags. "↳" rows vary the row above them.
ROW_TABLE="\
baseline         -        1.766 | Baseline (PreNorm)          | --mode none
denseformer      baseline 1.767 | DenseFormer                 | --mode full --mixing dense
full             baseline 1.737 | Full AttnRes                | --mode full
full_query       full     1.731 | ↳ input-dependent query     | --mode full --depth-query input
full_static      full     1.749 | ↳ input-independent mixing  | --mode full --mixing static
full_sigmoid     full     1.741 | ↳ sigmoid                   | --mode full --depth-score sigmoid
full_no_keynorm  full     1.743 | ↳ w/o key RMSNorm           | --mode full --key-norm off
window8          baseline 1.764 | Sliding window (W = 8)      | --mode full --depth-window 8
block            baseline 1.746 | Block AttnRes (S = 4)       | --mode block --block-size 4
block_heads      block    1.752 | ↳ multi-head (K = $heads)   | --mode block --block-size 4 --depth-heads $heads
block_no_keynorm block    1.750 | ↳ w/o key RMSNorm           | --mode block --block-size 4 --key-norm off"
ALL_ROWS=$(awk '{ printf "%s%s", (NR > 1 ? " " : ""), $1 }' <<< "$ROW_TABLE")
ROWS=${ROWS:-$ALL_ROWS}
# row_field ROW FIELD: 1 name, 2 reference, 3 paper's loss, 4 label, 5 flags
row_field() {
    awk -F' *[|] *' -v row="$1" -v field="$2" '{ split($1, head, " +") }
        head[1] == row { print field <= 3 ? head[field] : $(field - 2) }' <<< "$ROW_TABLE"
}
for row in $ROWS; do
    [ -n "$(row_field "$row" 1)" ] || { echo "error: unknown row '$row' (rows: $ALL_ROWS)" >&2; exit 1; }
done
[ -x "$TRAIN" ] || { echo "error: $TRAIN not found: run make first" >&2; exit 1; }
mkdir -p "$out"

# The text: TEXT, or unset every fortune of Debian's fortunes package (compare.sh's text_file)
TEXT=$(text_file "$out")

total=$(( $(wc -w <<< "$TASKS") * $(wc -w <<< "$ROWS") * $(wc -w <<< "$SEEDS") ))
echo "ablate: $(wc -w <<< "$ROWS") rows x seeds $SEEDS x tasks $TASKS = $total runs, $JOBS at a" \
     "time with $THREADS thread(s) each, into $out"
echo "model: $MODEL"
echo "text: $TEXT ($(wc -c < "$TEXT") bytes); $TEXT_SETTING"
echo "reverse: $REVERSE_SETTING"

task_flags() { if [ "$1" = text ]; then echo "$TEXT_SETTING --text $TEXT"; else echo "$REVERSE_SETTING"; fi; }

# one run, then one progress line: how many are done, the row, the seed, its result
start=$(date +%s)
: > "$out/progress.log"
train_row() {
    local task=$1 row=$2 seed=$3 run="$out/$1/$2_seed$3" result done_count elapsed
    # shellcheck disable=SC2046  # the flags are lists
    train_run "$run" $MODEL $(task_flags "$task") $(row_field "$row" 5) --seed "$seed" || return 1
    if [ "$task" = text ]; then
        result="val loss $(printf %.4f "$(last_eval "$run" 2)")"
    else
        result="99 % exact match at step $(first_step_at "$run" 99)"
        result="${result/at step -/never} (at the end $(printf %.1f "$(last_eval "$run" 4)") %)"
    fi
    elapsed=$(( $(date +%s) - start ))
    {
        flock 9
        echo "$task $row $seed" >> "$out/progress.log"
        done_count=$(wc -l < "$out/progress.log")
        printf "  [%2d/%d] %-7s %-16s seed %s: %s  (%s, %d min %02d s elapsed)\n" "$done_count" \
            "$total" "$task" "$row" "$seed" "$result" "$(grep -o 'time [0-9.]* s' "$run/run.log")" \
            $((elapsed / 60)) $((elapsed % 60))
    } 9>> "$out/progress.log.lock"
}
for task in $TASKS; do
    mkdir -p "$out/$task"
    for seed in $SEEDS; do
        for row in $ROWS; do pool_run train_row "$task" "$row" "$seed"; done
    done
done
pool_wait
rm -f "$out/progress.log.lock"
trained=$(( $(date +%s) - start ))
echo "trained $total runs in $((trained / 60)) min $((trained % 60)) s"

# per seed: task, row, seed, final val loss, final exact match, first step at >= 99 %
{
    echo "task,row,seed,val_loss,exact_match,steps_to_99"
    for task in $TASKS; do
        for row in $ROWS; do
            for seed in $SEEDS; do
                run="$out/$task/${row}_seed$seed"
                echo "$task,$row,$seed,$(last_eval "$run" 2),$(last_eval "$run" 4),$(first_step_at "$run" 99)"
            done
        done
    done
} > "$out/seeds.csv"

# the table: per row the paper's loss and its difference from the reference row, ours on
# text (mean ± sd over seeds, and the paired difference from the reference row's run of the
# same seed), the reversal's steps to 99 %, ms/step of each task
has() { [[ " $TASKS " = *" $1 "* ]]; }
table() {
    local row reference paper loss loss_sd delta delta_sd text_runs reverse_runs
    echo "| row | paper val loss | paper Δ | text val loss | Δ (paired) | reversal: steps to 99 % |" \
         "ms/step text | ms/step reverse |"
    echo "|---|---|---|---|---|---|---|---|"
    for row in $ROWS; do
        reference=$(row_field "$row" 2)
        paper=$(row_field "$row" 3)
        text_runs=() reverse_runs=()
        for seed in $SEEDS; do
            text_runs+=("$out/text/${row}_seed$seed")
            reverse_runs+=("$out/reverse/${row}_seed$seed")
        done
        printf "| %s | %s | %s | " "$(row_field "$row" 4)" "$paper" \
            "$([ "$reference" = - ] && echo — || awk -v a="$paper" -v b="$(row_field "$reference" 3)" \
                  'BEGIN { printf "%+.3f", a - b }')"
        if has text; then
            read -r loss loss_sd < <(for run in "${text_runs[@]}"; do last_eval "$run" 2; done | mean_sd)
            printf "%.4f ± %.4f | " "$loss" "$loss_sd"
            if [ "$reference" = - ] || [[ " $ROWS " != *" $reference "* ]]; then
                printf "— | "
            else
                read -r delta delta_sd < <(for seed in $SEEDS; do
                    echo "$(last_eval "$out/text/${row}_seed$seed" 2)" \
                         "$(last_eval "$out/text/${reference}_seed$seed" 2)"
                done | awk '{ print $1 - $2 }' | mean_sd)
                printf "%+.4f ± %.4f | " "$delta" "$delta_sd"
            fi
        else
            printf "— | — | "
        fi
        if has reverse; then
            printf "%s | " "$(for run in "${reverse_runs[@]}"; do first_step_at "$run" 99; done | steps_summary)"
        else
            printf "— | "
        fi
        printf "%s | %s |\n" "$(has text && printf %.0f "$(median_ms_per_step "${text_runs[@]}")" || echo —)" \
            "$(has reverse && printf %.0f "$(median_ms_per_step "${reverse_runs[@]}")" || echo —)"
    done
}
table | tee "$out/table.md"
echo "(mean ± sd over seeds $SEEDS. Paper: Table 4, validation loss of its 16-layer model;"
echo " Δ: the row minus the row it varies (↳ rows: the row above; the others: the baseline);"
echo " ours paired by seed, mean ± sd of the differences. Reversal: the first eval (every"
echo " $(flag_value --eval-every "$REVERSE_SETTING") steps) at or above 99 % exact match, mean over the seeds that got there within the"
echo " budget; —: none did. ms/step: median of the log windows, $JOBS run(s) at a time with"
echo " $THREADS thread(s) each; per seed: $out/seeds.csv)"

# loss curves, one chart per group of rows: each row a colour, each seed a dash
groups=("residuals:baseline denseformer full window8 block"
        "full:full full_query full_static full_sigmoid full_no_keynorm"
        "block:block block_heads block_no_keynorm")
for task in $TASKS; do
    for group in "${groups[@]}"; do
        runs=()
        for row in ${group#*:}; do
            [[ " $ROWS " = *" $row "* ]] || continue
            for seed in $SEEDS; do runs+=("$out/$task/${row}_seed$seed"); done
        done
        [ ${#runs[@]} -gt 0 ] || continue
        charts="$out/$task/charts_${group%%:*}"
        mkdir -p "$charts"
        "$here/plots.sh" -g -o "$charts" "${runs[@]}" > "$charts/plots.log"
        echo "wrote $charts/loss.png $charts/depth.png (and the runs' heatmaps)"
    done
done
total_time=$(( $(date +%s) - start ))
echo "ablate: done in $((total_time / 60)) min $((total_time % 60)) s"
