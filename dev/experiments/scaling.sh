#!/usr/bin/env bash
# scaling.sh — the paper's scaling comparison (Table 2 of its summary, and the fits
# loss = A · C^−α), in miniature: the baseline, Block AttnRes with 8 blocks, Full AttnRes and
# mHC-lite trained at 4 model sizes on English text, 2 seeds each, with the paper's recipe
# (Muon + WSD). dev/experiments/scaling_fit.c fits each mode and prints the table, the fits
# and each mode's compute multiplier against the baseline with a bootstrap interval; a chart
# shows the losses and fits against compute. docs/scaling.md explains how to read them.
#
# usage: dev/experiments/scaling.sh [OUT]   (make scaling [QUICK=1] [OPT=adamw] [DEVICE=cuda]
#                                           [TEXT=file] [OUT=dir]; OUT = runs/scaling)
# environment (defaults below):
#   QUICK=1     a quarter of the steps at every size (the whole sweep, fit and chart in
#               ≤ 12 min on 2 cores; the full sweep takes ≤ 45 min)
#   OPT         muon (the paper's recipe) or adamw: the optimiser of every run
#   DEVICE      cpu (./train, JOBS runs at a time on THREADS threads each) or cuda
#               (./train_cuda, one run at a time, the larger SIZES_CUDA)
#   TEXT        the text; unset: Debian's fortunes (compare.sh's fortunes_text), 2.5 MB
#   SEEDS, MODES, SIZES   what to train (SIZES: lines "name d L H G F steps")
#   JOBS, THREADS, TRAIN  as in dev/experiments/compare.sh
# Runs: OUT/<size>/<mode>_seed<k>/ (run.log and the --diagnostics CSVs); OUT/runs.csv (one
# line a run, scaling_fit's input), OUT/fits.csv, OUT/table.md, OUT/scaling.png.
#
# Compute C counts the matmul FLOPs the four modes share, training = 3 × forward, per token:
#   forward = 2 · (the layers' matrices + lm_head) + 2 · L · 2 · d_q · (T + 1) / 2
# (the second term: QKᵀ and the weighted sum of V over the (T + 1) / 2 keys a causal row
# sees on average). The residual modes' own arithmetic (depth attention, mHC-lite's
# projections) is left out, as the paper's compared sizes do; docs/scaling.md says how much
# it is.
set -euo pipefail
here=$(dirname "$0")
# shellcheck source=compare.sh
source "$here/compare.sh"

out=${1:-runs/scaling}
OPT=${OPT:-muon}
DEVICE=${DEVICE:-cpu}
SEEDS=${SEEDS:-"1 2"}
MODES=${MODES:-"none block full mhc"}
case "$OPT" in muon|adamw) ;; *) echo "error: OPT=$OPT (valid: muon, adamw)" >&2; exit 1 ;; esac
# Sizes: L = 8 layers (16 sub-layers, so block mode's S = 2 gives the paper's 8 blocks) and
# the width growing; F ≈ 2.75 d. The steps grow with the parameters (about 2.6 tokens a
# parameter at every size, as the paper's Table 2 grows tokens with N) within the time
# budget; 1024 tokens a step.
case "$DEVICE" in
    cpu)
        SIZES=${SIZES:-"d32 32 8 4 2 88 280
d48 48 8 4 2 128 600
d64 64 8 4 2 176 1020
d96 96 8 4 2 264 2230"}
        SHAPE=${SHAPE:-"--seq-len 64 --batch 16"} ;;
    cuda)
        TRAIN=${TRAIN_CUDA:-./train_cuda} JOBS=1 THREADS=${THREADS:-4}
        SIZES=${SIZES:-"d128 128 8 4 2 352 400
d192 192 8 6 2 528 900
d256 256 8 8 4 704 1600
d384 384 8 8 4 1056 3600"}
        SHAPE=${SHAPE:-"--seq-len 128 --batch 16"} ;;
    *) echo "error: DEVICE=$DEVICE (valid: cpu, cuda)" >&2; exit 1 ;;
esac
[ -x "$TRAIN" ] || { echo "error: $TRAIN not found: run make first (make cuda for DEVICE=cuda)" >&2; exit 1; }
quarter() { if [ "${QUICK:-0}" = 1 ]; then echo $(( $1 / 4 )); else echo "$1"; fi; }
mkdir -p "$out"
if [ -z "${TEXT:-}" ]; then
    TEXT=$out/fortunes.txt
    fortunes_text "$TEXT"
fi
[ -f "$TEXT" ] || { echo "error: TEXT=$TEXT is not a file" >&2; exit 1; }

mode_flags() {
    case "$1" in
        none|full) echo "--mode $1" ;;
        block) echo "--mode block --block-size $(( 2 * $2 / 8 ))" ;;  # 8 blocks
        mhc) echo "--mode mhc --streams 4" ;;
        *) echo "error: unknown mode '$1' (valid: none, block, full, mhc)" >&2; return 1 ;;
    esac
}
optimizer_flags() {
    if [ "$OPT" = muon ]; then echo "--optimizer muon --schedule wsd --decay-frac 0.2"
    else echo "--optimizer adamw --schedule wsd --decay-frac 0.2"; fi
}
T=$(flag_value --seq-len "$SHAPE"); B=$(flag_value --batch "$SHAPE")
# flops MODE d L H G F steps: C of one run, two numbers: the matmul FLOPs every mode shares
# (the header's formula), then those plus the mode's own residual arithmetic (forward, per
# token: none 2L·d adds; AttnRes 8d per query and source, for the norm of the key, the score
# and the weighted sum, over every depth attention's sources; mHC-lite per sub-layer the
# norm over m·d, the projection 2·(2m+m!)·m·d, the read 2md, the mixing 2m²d + 2md, and the m
# final norms and their sum)
flops() {
    awk -v mode="$1" -v d="$2" -v L="$3" -v H="$4" -v G="$5" -v F="$6" -v steps="$7" -v T="$T" \
        -v B="$B" -v m=4 'BEGIN {
        hs = d / H; q = H * hs; kv = G * hs; n_sub = 2 * L
        matrices = L * (q * d + 2 * kv * d + d * q + 3 * F * d) + 256 * d
        shared = 2 * matrices + 2 * L * 2 * q * (T + 1) / 2
        if (mode == "none") own = n_sub * d
        if (mode == "full" || mode == "block") {
            S = (mode == "full") ? 1 : n_sub / 8
            for (l = 0; l <= n_sub; l++)  # sub-layer l = n_sub: the output aggregation
                pairs += (l == n_sub) ? n_sub / S + 1 : 1 + int(l / S) + (l % S > 0)
            own = 8 * d * pairs
        }
        if (mode == "mhc") {
            R = 24  # m! for m = 4
            own = n_sub * (4 * m * d + 2 * (2 * m + R) * m * d + 2 * m * d + 2 * m * m * d + 2 * m * d) \
                  + 4 * m * d + m * d
        }
        tokens = steps * B * T
        printf "%.6g %.6g\n", 3 * shared * tokens, 3 * (shared + own) * tokens }'
}

n_runs=$(( $(wc -l <<< "$SIZES") * $(wc -w <<< "$MODES") * $(wc -w <<< "$SEEDS") ))
echo "scaling: $(wc -l <<< "$SIZES") sizes x modes $MODES x seeds $SEEDS = $n_runs runs on $DEVICE," \
     "$OPT + wsd$([ "${QUICK:-0}" = 1 ] && echo ", QUICK (a quarter of the steps)"), into $out"
echo "text: $TEXT ($(wc -c < "$TEXT") bytes); $SHAPE"
start=$(date +%s)
train_size_mode() {
    local name=$1 d=$2 L=$3 H=$4 G=$5 F=$6 steps=$7 mode=$8 seed=$9 run
    run="$out/$name/${mode}_seed$seed"
    # shellcheck disable=SC2046  # the flags are lists
    train_run "$run" --task text --text "$TEXT" $SHAPE --d "$d" --L "$L" --H "$H" --G "$G" \
        --F "$F" --steps "$steps" --warmup $(( steps / 20 > 10 ? steps / 20 : 10 )) --lr 3e-3 \
        --eval-every "$steps" --log-every $(( steps / 10 > 1 ? steps / 10 : 1 )) \
        --eval-examples 256 --seed "$seed" $(mode_flags "$mode" "$L") $(optimizer_flags) || return 1
    printf "  %-5s %-5s seed %s: val loss %.4f  (%s, %d s elapsed)\n" "$name" "$mode" "$seed" \
        "$(last_eval "$run" 2)" "$(grep -o 'time [0-9.]* s' "$run/run.log")" $(( $(date +%s) - start ))
}
# the largest size first, so that the pool's last runs are short
while read -r name d L H G F steps; do
    for seed in $SEEDS; do
        for mode in $MODES; do
            pool_run train_size_mode "$name" "$d" "$L" "$H" "$G" "$F" "$(quarter "$steps")" "$mode" "$seed"
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
    while read -r name d L H G F steps; do
        steps=$(quarter "$steps")
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
echo "(validation loss: mean ± sd over seeds $SEEDS; params: the baseline's; tokens and FLOPs"
echo " of training, C as in dev/experiments/scaling.sh's header. The paper (Table 2, its"
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
    # the losses' range, a labelled tic every 0.1 (0.2 past a range of 1.5) on the log axis
    awk -F, 'NR > 1 { lo = (lo == "" || $7 < lo) ? $7 : lo; hi = ($7 > hi) ? $7 : hi }
             END { step = (hi - lo > 1.5) ? 0.2 : 0.1; tics = ""
                   for (y = int(lo / step) * step; y <= hi + step; y += step)
                       tics = tics (tics == "" ? "" : ", ") sprintf("\"%.1f\" %g", y, y)
                   printf "set yrange [%g:%g]; set ytics (%s)\n", lo * 0.97, hi * 1.03, tics }' "$out/runs.csv"
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
