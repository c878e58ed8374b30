#!/usr/bin/env bash
# scaling.sh — the paper's scaling comparison (Table 2 of its summary, and the fits
# loss = A · C^−α), in miniature: the baseline, Block AttnRes with 8 blocks, Full AttnRes and
# mHC-lite trained at 4 model sizes on English text, 2 seeds each, with the paper's recipe
# (Muon + WSD). dev/experiments/scaling_fit.c fits each mode and prints the table, the fits
# and each mode's compute multiplier against the baseline with a bootstrap interval; a chart
# shows the losses and fits against compute. docs/scaling.md explains how to read them.
#
# usage: dev/experiments/scaling.sh [OUT]   (make scaling [TPP=20] [QUICK=1] [OPT=adamw]
#                                           [DEVICE=cuda] [TEXT=file] [OUT=dir];
#                                           OUT = runs/scaling, runs/scaling_tpp20 for TPP=20)
#        dev/experiments/scaling.sh --print-sizes   the size table alone (SIZES, below)
#        dev/experiments/scaling.sh --print-steps   every run's steps: lines "size mode steps"
# environment (defaults below):
#   TPP         2.6 or 20: the size table, about 2.6 or 20 tokens a parameter (below)
#   QUICK=1     a quarter of the steps at every size (TPP=2.6: the whole sweep, fit and chart
#               in ≤ 12 min on 2 cores, the full sweep ≤ 45 min; TPP=20: ≤ 15 and ≤ 60 min)
#   OPT         muon (the paper's recipe) or adamw: the optimiser of every run
#   DEVICE      cpu (./train, JOBS runs at a time on THREADS threads each) or cuda
#               (./train_cuda, one run at a time, the larger sizes of the cuda table)
#   TEXT        the text; unset: Debian's fortunes (compare.sh's fortunes_text), 2.6 MB
#   SEEDS, MODES, SIZES   what to train (SIZES: lines "name d L H G F steps")
#   JOBS, THREADS, TRAIN  as in dev/experiments/compare.sh
# Runs: OUT/<size>/<mode>_seed<k>/ (run.log and the --diagnostics CSVs); OUT/runs.csv (one
# line a run, scaling_fit's input), OUT/fits.csv, OUT/table.md, OUT/scaling.png, and the
# same with each mode's own arithmetic charged: OUT/runs_own.csv, fits_own.csv, table_own.md.
#
# Compute C counts the matmul FLOPs the four modes share (recipe.sh's flops: training = 3 ×
# forward; the forward's matrices, lm_head and attention scores). The residual modes' own
# arithmetic (depth attention, mHC-lite's projections) is left out, as the paper's compared
# sizes do, and charged in a second fit; docs/scaling.md says how much it is.
set -euo pipefail
here=$(dirname "$0")
# shellcheck source=compare.sh
source "$here/compare.sh"
# shellcheck source=recipe.sh
source "$here/recipe.sh"

OPT=${OPT:-muon}
DEVICE=${DEVICE:-cpu}
SEEDS=${SEEDS:-"1 2"}
MODES=${MODES:-"none block full mhc"}
case "$OPT" in muon|adamw) ;; *) echo "error: OPT=$OPT (valid: muon, adamw)" >&2; exit 1 ;; esac
# Sizes (lines "name d L H G F steps"): L = 8 layers (16 sub-layers, so block mode's S = 2
# gives the paper's 8 blocks) and the width growing; F ≈ 2.75 d; on the CPU 1024 tokens a
# step (SHAPE). TPP picks the tokens a parameter, counting every parameter of the baseline
# (the trainer's `params`, the embedding and lm_head's 2 · 256 · d included):
#   2.6  (the default) the steps grow with the parameters, about 2.6 tokens a parameter at
#        every size (the paper's Table 2 grows tokens with N) within ≤ 45 min
#   20   20 tokens a parameter at every size, steps = ⌈20 · params / 1024⌉, and every run
#        of a mode with more parameters than the baseline (AttnRes's queries and norms,
#        mHC-lite's streams: up to 1.8x at d24) trains ⌈20 · its own / 1024⌉ (run_steps), so
#        that no run sees fewer than 20. The FLOPs of a size grow as 120 · N², so the
#        largest size sets the time: d72 (508 K parameters, 9924 steps; mhc 661 K, 12905)
#        takes about 70 % of the sweep, and QUICK's quarter of it must stay within 15 min,
#        which d80 would not (docs/scaling.md has the timings). d24 at the bottom keeps the
#        compute range at 61x (params 8x) for the fit.
TPP=${TPP:-2.6}
case "$DEVICE" in
    cpu)
        case "$TPP" in
            2.6) SIZES=${SIZES:-"d32 32 8 4 2 88 280
d48 48 8 4 2 128 600
d64 64 8 4 2 176 1020
d96 96 8 4 2 264 2230"} ;;
            20) SIZES=${SIZES:-"d24 24 8 4 2 64 1238
d32 32 8 4 2 88 2131
d48 48 8 4 2 128 4456
d72 72 8 4 2 200 9924"} ;;
            *) echo "error: TPP=$TPP (valid: 2.6, 20)" >&2; exit 1 ;;
        esac
        SHAPE=${SHAPE:-"--seq-len 64 --batch 16"} ;;
    cuda)
        [ "$TPP" = 2.6 ] || { echo "error: TPP=$TPP: DEVICE=cuda has the 2.6 table only" >&2; exit 1; }
        TRAIN=${TRAIN_CUDA:-./train_cuda} JOBS=1 THREADS=${THREADS:-4}
        SIZES=${SIZES:-"d128 128 8 4 2 352 400
d192 192 8 6 2 528 900
d256 256 8 8 4 704 1600
d384 384 8 8 4 1056 3600"}
        SHAPE=${SHAPE:-"--seq-len 128 --batch 16"} ;;
    *) echo "error: DEVICE=$DEVICE (valid: cpu, cuda)" >&2; exit 1 ;;
esac
if [ "${1:-}" = --print-sizes ]; then
    echo "$SIZES"
    exit 0
fi
[ -x "$TRAIN" ] || { echo "error: $TRAIN not found: run make first (make cuda for DEVICE=cuda)" >&2; exit 1; }
T=$(flag_value --seq-len "$SHAPE"); B=$(flag_value --batch "$SHAPE")

# own_params MODE d L H G F: the model's parameters as the trainer counts them ("params N" of
# its first line), from one step on a small text (this script itself)
own_params() {
    # shellcheck disable=SC2046  # the mode's flags are a list
    "$TRAIN" --task text --text "$0" --seq-len 16 --batch 1 --steps 1 --warmup 0 \
        --eval-examples 4 --threads 1 --d "$2" --L "$3" --H "$4" --G "$5" --F "$6" \
        $(mode_flags "$1" "$3") | sed -n '1s/.*| params \([0-9]*\) .*/\1/p'
}

# run_steps MODE d L H G F STEPS: the steps of MODE's runs at a size whose table gives STEPS
# (the baseline's): with TPP=20 at least ⌈20 · its own parameters / (B · T)⌉; QUICK's quarter
run_steps() {
    local steps=$7 own
    if [ "$TPP" = 20 ]; then
        own=$(own_params "$@")
        [ -n "$own" ] || { echo "error: no parameter count from $TRAIN for $1 d=$2" >&2; return 1; }
        own=$(( (20 * own + B * T - 1) / (B * T) ))
        steps=$(( own > steps ? own : steps ))
    fi
    quarter "$steps"
}
# steps_of["SIZE MODE"]: every run's steps, counted once (with TPP=20 each asks the trainer)
declare -A steps_of
while read -r name d L H G F steps; do
    for mode in $MODES; do
        steps_of["$name $mode"]=$(run_steps "$mode" "$d" "$L" "$H" "$G" "$F" "$steps") || exit 1
    done
done <<< "$SIZES"
if [ "${1:-}" = --print-steps ]; then  # every run's steps: lines "size mode steps"
    while read -r name _; do
        for mode in $MODES; do echo "$name $mode ${steps_of["$name $mode"]}"; done
    done <<< "$SIZES"
    exit 0
fi
out=${1:-runs/scaling$([ "$TPP" = 2.6 ] || echo "_tpp$TPP")}
mkdir -p "$out"
TEXT=$(text_file "$out")

n_runs=$(( $(wc -l <<< "$SIZES") * $(wc -w <<< "$MODES") * $(wc -w <<< "$SEEDS") ))
echo "scaling: $(wc -l <<< "$SIZES") sizes x modes $MODES x seeds $SEEDS = $n_runs runs on $DEVICE," \
     "$OPT + wsd, about $TPP tokens a parameter$([ "${QUICK:-0}" = 1 ] && echo \
     " (QUICK: a quarter of the steps)"), into $out"
echo "text: $TEXT ($(wc -c < "$TEXT") bytes); $SHAPE"
start=$(date +%s)
train_size_mode() {
    local name=$1 d=$2 L=$3 H=$4 G=$5 F=$6 steps=$7 mode=$8 seed=$9 run
    run="$out/$name/${mode}_seed$seed"
    train_recipe "$run" "$TEXT" "$d" "$L" "$H" "$G" "$F" "$steps" "$mode" "$seed" || return 1
    printf "  %-5s %-5s seed %s: val loss %.4f  (%s, %d s elapsed)\n" "$name" "$mode" "$seed" \
        "$(last_eval "$run" 2)" "$(grep -o 'time [0-9.]* s' "$run/run.log")" $(( $(date +%s) - start ))
}
# the largest size first, so that the pool's last runs are short
while read -r name d L H G F _; do
    for seed in $SEEDS; do
        for mode in $MODES; do
            pool_run train_size_mode "$name" "$d" "$L" "$H" "$G" "$F" "${steps_of["$name $mode"]}" \
                "$mode" "$seed"
        done
    done
done < <(tac <<< "$SIZES")
pool_wait
trained=$(( $(date +%s) - start ))
echo "trained $n_runs runs in $((trained / 60)) min $((trained % 60)) s"

# runs.csv: C as the paper counts it (the shared matmuls); runs_own.csv: each mode's own too
header="mode,size,seed,params,tokens,flops,val_loss"
echo "$header" > "$out/runs.csv"
echo "$header" > "$out/runs_own.csv"
for mode in $MODES; do
    while read -r name d L H G F _; do
        steps=${steps_of["$name $mode"]}
        read -r shared own < <(flops "$mode" "$d" "$L" "$H" "$G" "$F" "$steps")
        for seed in $SEEDS; do
            run="$out/$name/${mode}_seed$seed"
            line="$mode,$name,$seed,$(grep -o 'params [0-9]*' "$run/run.log" | cut -d' ' -f2),$(( steps * B * T ))"
            echo "$line,$shared,$(last_eval "$run" 2)" >> "$out/runs.csv"
            echo "$line,$own,$(last_eval "$run" 2)" >> "$out/runs_own.csv"
        done
    done <<< "$SIZES"
done
make -s build/scaling_fit
echo "C: the matmul FLOPs the modes share (the paper's convention)"
build/scaling_fit "$out/runs.csv" "$out/fits.csv" | tee "$out/table.md"
echo
echo "C: every mode also charged its own residual arithmetic (the FLOPs column: the baseline's)"
build/scaling_fit "$out/runs_own.csv" "$out/fits_own.csv" | tail -n +"$(( $(wc -l <<< "$SIZES") + 3 ))" \
    | tee "$out/table_own.md"
echo "(validation loss: mean ± sd over seeds $SEEDS; params: the baseline's, every parameter"
echo " (embedding and lm_head included); tokens and FLOPs: the baseline's training, C as in"
echo " dev/experiments/recipe.sh's flops; tokens/param: the fewest of any mode, each counted"
echo " with its own parameters. The paper (Table 2, its"
echo " summary in docs/scaling.md): baseline 1.891·C^−0.057, Block AttnRes 1.870·C^−0.058,"
echo " Full AttnRes 1.865·C^−0.057 (C in PFLOP/s-days), Block matching the baseline at 1.25×"
echo " its compute)"

# the chart: every run's loss against C, log-log, each mode's fit as a line
dev/infra/ensure_deps.sh gnuplot >/dev/null
{
    echo "set terminal pngcairo size 900,600; set output '$out/scaling.png'"
    echo "set logscale xy; set xlabel 'training compute C (FLOPs)'; set ylabel 'validation loss'"
    echo "set title 'loss = A · C^{-α} per residual mode ($OPT + wsd, seeds $SEEDS)'"
    echo "set key top right; set datafile separator ','"
    loss_ytics "$out/runs.csv" 7
    plot="plot"
    i=1
    while IFS=, read -r mode A alpha rest; do
        [ "$mode" = mode ] && continue
        plot="$plot '$out/runs.csv' using (strcol(1) eq '$mode' ? \$6 : 1/0):7 with points pt 7 lc $i title '$mode',"
        plot="$plot $A * (x / 8.64e19)**(-$alpha) with lines lc $i notitle,"
        i=$((i + 1))
    done < "$out/fits.csv"
    echo "${plot%,}"
} | gnuplot
echo "wrote $out/scaling.png"
total=$(( $(date +%s) - start ))
echo "scaling: done in $((total / 60)) min $((total % 60)) s"
