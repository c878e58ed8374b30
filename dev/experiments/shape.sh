#!/usr/bin/env bash
# shape.sh — the paper's claim on the best shape, in miniature: at one parameter count and one
# token budget, the baseline is best shallow and wide, AttnRes deeper and narrower. Trains
# none, block and full at 5 depths, the width of each chosen so that every depth has the same
# non-embedding parameter count, 2 seeds each, with the recipe of make scaling (Muon + WSD,
# recipe.sh). dev/experiments/shape_fit.c prints each mode's loss by depth, its best depth
# and how often each depth is best over bootstrap resamples of the seeds; two charts show the
# loss against depth and the hidden state's RMS by sub-layer at the deepest depth (the
# dilution). docs/shape.md explains how to read them.
#
# usage: dev/experiments/shape.sh [OUT]   (make shape [QUICK=1] [TEXT=file] [OUT=dir];
#                                         OUT = runs/shape)
#        dev/experiments/shape.sh --print-sizes   the size table alone, a line a depth:
#                                         "L d H G F S non_embedding_params all_params"
# environment (defaults below):
#   QUICK=1   a quarter of the steps (the whole sweep, table and charts in ≤ 10 min on 2
#             cores; the full sweep takes ≤ 45 min)
#   TARGET    the non-embedding parameters every depth matches (172000)
#   TPP       tokens a parameter (20), counting every parameter of the widest model
#   DEPTHS    the depths L, shallow to deep ("2 4 8 12 16")
#   STEPS     the steps of every run (default: from TPP, below)
#   OPT       muon (the paper's recipe) or adamw
#   TEXT      the text; unset: Debian's fortunes (compare.sh's fortunes_text), 2.6 MB
#   MODES, SEEDS   what to train ("none block full", "1 2"; the first mode is the baseline)
#   JOBS, THREADS, TRAIN   as in dev/experiments/compare.sh
# Runs: OUT/L<L>/<mode>_seed<k>/ (run.log and the --diagnostics CSVs); OUT/runs.csv (one line
# a run, shape_fit's input), OUT/sizes.md, OUT/best.csv, OUT/table.md, OUT/shape.png and
# OUT/rms.png (its data: OUT/rms_<mode>.csv, sub-layer index and RMS).
#
# The sizes (shape_sizes): head size 8, H = d/8 query heads and as many key/value heads
# (G = H, so that any multiple of 8 is a width); at each depth the width d whose F, tuned to
# meet TARGET, is nearest 2.75 d (in ratio). Non-embedding parameters are every parameter but
# the token embedding and lm_head (256 · d each): the baseline's
#   L · (4d² + 3Fd + 2d) + d   (attention, SwiGLU, the two norms a layer; the final norm)
# and AttnRes adds 2d a sub-layer and one more pair (its pseudo-queries and key norms,
# 2d(2L + 1), at most 1.2 % here). Steps: every depth trains on the same tokens, TPP times the
# widest (most) parameters counting the embedding and lm_head, in steps of 1024 tokens. The
# time budget sets TARGET: a run of the deepest full costs about 3x one of the shallowest
# none (docs/shape.md has the timings).
set -euo pipefail
here=$(dirname "$0")
# shellcheck source=compare.sh
source "$here/compare.sh"
# shellcheck source=recipe.sh
source "$here/recipe.sh"

TARGET=${TARGET:-172000}
TPP=${TPP:-20}
DEPTHS=${DEPTHS:-"2 4 8 12 16"}
MODES=${MODES:-"none block full"}
SEEDS=${SEEDS:-"1 2"}
OPT=${OPT:-muon}
SHAPE="--seq-len 64 --batch 16"
case "$OPT" in muon|adamw) ;; *) echo "error: OPT=$OPT (valid: muon, adamw)" >&2; exit 1 ;; esac

# shape_sizes TARGET DEPTHS: a line a depth, "L d H G F S non_embedding all" (the header's rule)
shape_sizes() {
    local L
    for L in $2; do
        awk -v N="$1" -v L="$L" -v S="$(block_size "$L")" 'BEGIN {
            head = 8
            for (d = head; d <= 1024; d += head) {
                F = int((N - L * (4 * d * d + 2 * d) - d) / (3 * d * L) + 0.5)
                if (F < 1) break
                off = F / d / 2.75; off = off < 1 ? 1 / off : off
                if (best_d == "" || off < best_off) { best_d = d; best_F = F; best_off = off }
            }
            if (best_d == "") { printf "error: no width meets TARGET=%d at L = %d\n", N, L > "/dev/stderr"; exit 1 }
            d = best_d; F = best_F
            params = L * (4 * d * d + 3 * F * d + 2 * d) + d
            printf "%d %d %d %d %d %d %d %d\n", L, d, d / head, d / head, F, S, params, params + 2 * 256 * d }' \
            || return 1
    done
}
sizes=$(shape_sizes "$TARGET" "$DEPTHS")
if [ "${1:-}" = --print-sizes ]; then
    echo "$sizes"
    exit 0
fi

out=${1:-runs/shape}
[ -x "$TRAIN" ] || { echo "error: $TRAIN not found: run make first" >&2; exit 1; }
T=$(flag_value --seq-len "$SHAPE"); B=$(flag_value --batch "$SHAPE")
widest=$(awk '$8 > most { most = $8 } END { print most }' <<< "$sizes")
steps=$(quarter "${STEPS:-$(( (TPP * widest + B * T - 1) / (B * T) ))}")
tokens=$(( steps * B * T ))
mkdir -p "$out"
TEXT=$(text_file "$out")

n_runs=$(( $(wc -l <<< "$sizes") * $(wc -w <<< "$MODES") * $(wc -w <<< "$SEEDS") ))
echo "shape: depths $DEPTHS x modes $MODES x seeds $SEEDS = $n_runs runs, $OPT + wsd," \
     "$steps steps of $((B * T)) tokens$([ "${QUICK:-0}" = 1 ] && echo " (QUICK: a quarter)"), into $out"
echo "text: $TEXT ($(wc -c < "$TEXT") bytes, $(awk -v t="$tokens" -v n="$(wc -c < "$TEXT")" \
     'BEGIN { printf "%.1f", t / (0.9 * n) }') epochs of its training nine tenths); $SHAPE"
{
    echo "| L | d | H | G | F | F/d | block S | non-embedding params | all params | tokens | tokens/param (non-emb., all) |"
    echo "|---|---|---|---|---|---|---|---|---|---|---|"
    while read -r L d H G F S params all; do
        printf "| %d | %d | %d | %d | %d | %.2f | %d (%d blocks) | %d | %d | %d | %.1f, %.1f |\n" "$L" "$d" \
            "$H" "$G" "$F" "$(awk -v F="$F" -v d="$d" 'BEGIN { print F / d }')" "$S" $(( 2 * L / S )) \
            "$params" "$all" "$tokens" "$(awk -v t="$tokens" -v p="$params" 'BEGIN { print t / p }')" \
            "$(awk -v t="$tokens" -v p="$all" 'BEGIN { print t / p }')"
    done <<< "$sizes"
} | tee "$out/sizes.md"
start=$(date +%s)
train_depth_mode() {
    local L=$1 d=$2 H=$3 G=$4 F=$5 mode=$6 seed=$7 run
    run="$out/L$L/${mode}_seed$seed"
    train_recipe "$run" "$TEXT" "$d" "$L" "$H" "$G" "$F" "$steps" "$mode" "$seed" || return 1
    printf "  L %-3s %-5s seed %s: val loss %.4f  (%s, %d s elapsed)\n" "$L" "$mode" "$seed" \
        "$(last_eval "$run" 2)" "$(grep -o 'time [0-9.]* s' "$run/run.log")" $(( $(date +%s) - start ))
}
# the deepest first (AttnRes's runs there are the longest), so that the pool's last runs are short
while read -r L d H G F S params all; do
    for seed in $SEEDS; do
        for mode in $MODES; do pool_run train_depth_mode "$L" "$d" "$H" "$G" "$F" "$mode" "$seed"; done
    done
done < <(tac <<< "$sizes")
pool_wait
trained=$(( $(date +%s) - start ))
echo "trained $n_runs runs in $((trained / 60)) min $((trained % 60)) s"

# runs.csv: params is each run's non-embedding count (the trainer's params less 2 · 256 · d)
echo "mode,size,seed,params,tokens,flops,val_loss" > "$out/runs.csv"
for mode in $MODES; do
    while read -r L d H G F S params all; do
        read -r shared _ < <(flops "$mode" "$d" "$L" "$H" "$G" "$F" "$steps")
        for seed in $SEEDS; do
            run="$out/L$L/${mode}_seed$seed"
            echo "$mode,$L,$seed,$(( $(grep -o 'params [0-9]*' "$run/run.log" | cut -d' ' -f2) - 512 * d ))," \
                 "$tokens,$shared,$(last_eval "$run" 2)" | tr -d ' ' >> "$out/runs.csv"
        done
    done <<< "$sizes"
done
make -s build/shape_fit
build/shape_fit "$out/runs.csv" "$out/best.csv" | tee "$out/table.md"
echo "(validation loss: mean ± sd over seeds $SEEDS; params: the baseline's non-embedding count;"
echo " tokens/param: the fewest of any mode, each counted with its own non-embedding parameters;"
echo " FLOPs: the shared matmuls of training, recipe.sh's flops. The paper: the baseline is best"
echo " shallower and wider, AttnRes deeper and narrower)"

# the charts: the loss against depth, each run a point and each mode's mean a line; the RMS
# of the hidden state fed to each sub-layer at the deepest depth, first seed, last log step
dev/infra/ensure_deps.sh gnuplot >/dev/null
deepest=$(tail -n 1 <<< "$sizes" | cut -d' ' -f1)
first_seed=${SEEDS%% *}
{
    echo "set terminal pngcairo size 900,600; set output '$out/shape.png'"
    echo "set logscale x; set xlabel 'layers L (log scale; every depth $TARGET non-embedding parameters)'"
    echo "set ylabel 'validation loss'; set key top right; set datafile separator ','"
    echo "set title 'loss against depth at one size and budget ($tokens tokens, $OPT + wsd, seeds $SEEDS)'"
    echo "set xtics (${DEPTHS// /, }); set xrange [${DEPTHS%% *} * 0.8:$deepest * 1.25]"
    loss_ytics "$out/runs.csv" 7
    plot="plot"
    i=1
    for mode in $MODES; do
        plot="$plot '$out/runs.csv' using (strcol(1) eq '$mode' ? \$2 : 1/0):7 with points pt 7 lc $i title '$mode',"
        plot="$plot '$out/runs.csv' using (strcol(1) eq '$mode' ? \$2 : 1/0):7 smooth unique with lines lc $i notitle,"
        i=$((i + 1))
    done
    echo "${plot%,}"
} | gnuplot
# layers.csv: step,index,name,input_rms,...; its last step's sub-layers and output
for mode in $MODES; do
    awk -F, 'NR == FNR { last = $1; next } FNR > 1 && $1 == last && $2 >= 0 { print $2 "," $4 }' \
        "$out/L$deepest/${mode}_seed$first_seed/layers.csv" "$out/L$deepest/${mode}_seed$first_seed/layers.csv" \
        > "$out/rms_$mode.csv"
done
{
    echo "set terminal pngcairo size 900,600; set output '$out/rms.png'"
    echo "set xlabel 'sub-layer (its input; the last: the final hidden state)'; set logscale y"
    echo "set ylabel 'RMS of the hidden state'; set key top left; set datafile separator ','"
    echo "set title 'the hidden state by depth at L = $deepest (seed $first_seed, last log step)'"
    plot="plot"
    i=1
    for mode in $MODES; do
        plot="$plot '$out/rms_$mode.csv' using 1:2 with linespoints pt 7 lc $i title '$mode',"
        i=$((i + 1))
    done
    echo "${plot%,}"
} | gnuplot
echo "wrote $out/shape.png and $out/rms.png"
total=$(( $(date +%s) - start ))
echo "shape: done in $((total / 60)) min $((total % 60)) s"
