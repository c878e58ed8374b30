#!/usr/bin/env bash
# recipe.sh — the paper's recipe for one run of a sweep, and what its runs are counted with:
# the helpers that scaling.sh and shape.sh share. Sourced after compare.sh (train_run); the
# caller sets OPT (muon or adamw), SHAPE (the flags --seq-len T --batch B) and, for
# quarter, QUICK.

# block_size L: block mode's S for L layers: the paper's 8 blocks (S = 2L/8) where that is a
# whole number >= 2, else the divisor S >= 2 of 2L nearest to 2L/8 (the smaller on a tie)
block_size() {
    awk -v n=$(( 2 * $1 )) 'BEGIN {
        for (s = 2; s <= n; s++) {
            if (n % s) continue
            gap = s - n / 8; gap = gap < 0 ? -gap : gap
            if (best == "" || gap < best_gap) { best = s; best_gap = gap }
        }
        print best }'
}

# mode_flags MODE L: the flags of a residual mode (mhc: the paper's m = 4 streams)
mode_flags() {
    case "$1" in
        none|full) echo "--mode $1" ;;
        block) echo "--mode block --block-size $(block_size "$2")" ;;
        mhc) echo "--mode mhc --streams 4" ;;
        *) echo "error: unknown mode '$1' (valid: none, block, full, mhc)" >&2; return 1 ;;
    esac
}

# the optimiser and the schedule: OPT, then WSD with the last 20 % decaying
optimizer_flags() { echo "--optimizer $OPT --schedule wsd --decay-frac 0.2"; }

# quarter STEPS: STEPS, or a quarter of them with QUICK=1
quarter() { if [ "${QUICK:-0}" = 1 ]; then echo $(( $1 / 4 )); else echo "$1"; fi; }

# train_recipe RUN TEXT d L H G F STEPS MODE SEED: one run of the sweep into RUN (train_run):
# lr 3e-3 with a warmup of 5 % of the steps (at least 10), one evaluation at the end over
# 256 held-out rows, a log line every tenth of the run
train_recipe() {
    local run=$1 text=$2 d=$3 L=$4 H=$5 G=$6 F=$7 steps=$8 mode=$9 seed=${10}
    # shellcheck disable=SC2046,SC2086  # the flags are lists
    train_run "$run" --task text --text "$text" $SHAPE --d "$d" --L "$L" --H "$H" --G "$G" \
        --F "$F" --steps "$steps" --warmup $(( steps / 20 > 10 ? steps / 20 : 10 )) --lr 3e-3 \
        --eval-every "$steps" --log-every $(( steps / 10 > 1 ? steps / 10 : 1 )) \
        --eval-examples 256 --seed "$seed" $(mode_flags "$mode" "$L") $(optimizer_flags)
}

# flops MODE d L H G F STEPS: C of one run, two numbers: the matmul FLOPs every mode shares,
# training = 3 × forward, per token:
#   forward = 2 · (the layers' matrices + lm_head) + 2 · L · 2 · d_q · (T + 1) / 2
# (the second term: QKᵀ and the weighted sum of V over the (T + 1) / 2 keys a causal row sees
# on average); then those plus the mode's own residual arithmetic (forward, per token: none
# 2L·d adds; AttnRes 8d per query and source, for the norm of the key, the score and the
# weighted sum, over every depth attention's sources; mHC-lite per sub-layer the norm over
# m·d, the projection 2·(2m+m!)·m·d, the read 2md, the mixing 2m²d + 2md, and the m final
# norms and their sum)
flops() {
    local T B S
    T=$(flag_value --seq-len "$SHAPE"); B=$(flag_value --batch "$SHAPE")
    S=$(block_size "$3")
    awk -v mode="$1" -v d="$2" -v L="$3" -v H="$4" -v G="$5" -v F="$6" -v steps="$7" -v T="$T" \
        -v B="$B" -v S_block="$S" -v m=4 'BEGIN {
        hs = d / H; q = H * hs; kv = G * hs; n_sub = 2 * L
        matrices = L * (q * d + 2 * kv * d + d * q + 3 * F * d) + 256 * d
        shared = 2 * matrices + 2 * L * 2 * q * (T + 1) / 2
        if (mode == "none") own = n_sub * d
        if (mode == "full" || mode == "block") {
            S = (mode == "full") ? 1 : S_block
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

# loss_ytics FILE COLUMN: gnuplot's yrange and a labelled tic every 0.1 (0.2 past a range of
# 1.5) over the losses in COLUMN of the CSV FILE (header line first)
loss_ytics() {
    awk -F, -v column="$2" 'NR > 1 { y = $column; lo = (lo == "" || y < lo) ? y : lo; hi = (y > hi) ? y : hi }
        END { step = (hi - lo > 1.5) ? 0.2 : 0.1; tics = ""
              for (y = int(lo / step) * step; y <= hi + step; y += step)
                  tics = tics (tics == "" ? "" : ", ") sprintf("\"%.1f\" %g", y, y)
              printf "set yrange [%g:%g]; set ytics (%s)\n", lo * 0.97, hi * 1.03, tics }' "$1"
}
