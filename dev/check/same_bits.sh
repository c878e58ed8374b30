#!/usr/bin/env bash
# same_bits.sh REPO OUTDIR — what a change that must not alter behaviour is checked with.
# Builds REPO's ./train and ./check_state (make all), then
#   - trains 12 configs for 60 steps each (every mode, a window, both mixings, every variant
#     switch, heads), keeping each checkpoint and the printed losses (timings stripped);
#   - samples from three of the checkpoints (greedy and drawn);
#   - runs check_state on every tests/data/*.bin state file, keeping what it prints;
#   - with SAME_BITS_CUDA=1, builds build/emu/train_cuda (./train_cuda with the emulated
#     kernels) and trains 6 small configs with it, graphs and --no-graph, keeping each
#     checkpoint and the printed losses; and, where mpirun is, build/train_mpi on 2 processes
#     and build/emu/train_cuda_mpi on 1 (the sharded steps), 2 configs each, and a 2-stage
#     pipeline (build/train_mpi --pipeline 2 --virtual 2).
# Run it on a checkout before the change and on one after, then `diff -r BEFORE AFTER`:
# no output means the same bits (parameters, AdamW moments, losses, samples, verdicts).
set -euo pipefail
[ $# -eq 2 ] || { echo "usage: dev/check/same_bits.sh REPO OUTDIR" >&2; exit 2; }
REPO=$(cd "$1" && pwd); OUT=$2
mkdir -p "$OUT"; OUT=$(cd "$OUT" && pwd)
cd "$REPO"
make -s all >/dev/null
# train NAME COMMAND...: runs COMMAND --checkpoint OUT/NAME.ckpt (a fresh one), its output
# without the timings (and a pipeline's measured idle shares) into OUT/NAME.log
train() {
  local name=$1; shift
  rm -f "$OUT/$name.ckpt"
  "$@" --checkpoint "$OUT/$name.ckpt" 2>&1 |
    sed -E 's/\| *[0-9.]+ tok\/s.*//; s/\| time .*//; s/\| threads .*//; s/collectives .*//; s/\| idle .*//; s/measured [0-9.]+%//; s#'"$OUT"'#OUT#g' \
    > "$OUT/$name.log" || true
}
T="./train --steps 60 --eval-every 30 --log-every 10 --threads 2"
configs=(
  "none:--mode none"
  "full:--mode full"
  "block4:--mode block"
  "block2:--mode block --block-size 2"
  "window3:--mode full --depth-window 3"
  "static:--mode full --mixing static"
  "dense:--mode block --mixing dense"
  "sigmoid:--mode full --depth-score sigmoid"
  "keynorm:--mode block --key-norm off"
  "qinput:--mode full --depth-query input"
  "heads2:--mode block --depth-heads 2"
  "mix:--mode block --block-size 2 --task sort --depth-score sigmoid --key-norm off --depth-query input --depth-heads 4 --H 4 --G 1"
)
# shellcheck disable=SC2086
for c in "${configs[@]}"; do train "${c%%:*}" $T ${c#*:}; done
for name in block4 none qinput; do
  ./train --sample --checkpoint "$OUT/$name.ckpt" 2>&1 | sed 's#'"$OUT"'#OUT#g' > "$OUT/$name.sample0" || echo "rc=$?" >> "$OUT/$name.sample0"
  ./train --sample --checkpoint "$OUT/$name.ckpt" --temperature 1 --seed 7 2>&1 | sed 's#'"$OUT"'#OUT#g' > "$OUT/$name.sample1" || echo "rc=$?" >> "$OUT/$name.sample1"
done
for f in tests/data/*.bin; do
  ./check_state "$f" 2>&1 | sed 's#'"$REPO"'#REPO#g' > "$OUT/check_$(basename "$f").txt" || echo "rc=$?" >> "$OUT/check_$(basename "$f").txt"
done
if [ "${SAME_BITS_CUDA:-0}" = 1 ]; then
  make -s build/emu/train_cuda >/dev/null
  E="build/emu/train_cuda --task reverse --length 4 --symbols 6 --d 16 --L 2 --H 2 --G 1 --F 24
     --batch 4 --steps 6 --warmup 2 --log-every 1 --eval-every 3 --eval-examples 16 --threads 1"
  cuda_configs=(
    "cuda_none:--mode none"
    "cuda_block2:--mode block --block-size 2"
    "cuda_variants:--mode block --block-size 2 --depth-score sigmoid --depth-heads 2 --depth-query input"
    "cuda_static:--mode full --depth-window 2 --mixing static"
    "cuda_mhc:--mode mhc --streams 3"
    "cuda_muon:--mode block --block-size 2 --optimizer muon"
    "cuda_nograph:--mode full --depth-score sigmoid --depth-heads 2 --no-graph"
  )
  # shellcheck disable=SC2086
  for c in "${cuda_configs[@]}"; do train "${c%%:*}" $E ${c#*:}; done
  if command -v mpirun >/dev/null; then
    make -s build/train_mpi build/emu/train_cuda_mpi >/dev/null
    R=(mpirun --oversubscribe); [ "$(id -u)" -eq 0 ] && R+=(--allow-run-as-root)
    for c in "mpi_block2:--mode block --block-size 2" "mpi_muon:--mode full --optimizer muon"; do
      name=${c%%:*}; flags=${c#*:}
      # shellcheck disable=SC2086
      train "$name" "${R[@]}" -np 2 build/train_mpi ${E#build/emu/train_cuda} $flags
      # shellcheck disable=SC2086
      train "${name}_cuda" "${R[@]}" -np 1 build/emu/train_cuda_mpi ${E#build/emu/train_cuda} $flags
    done
    # the pipeline: 2 stages x 2 chunks, the cache on (and the bytes it prints)
    # shellcheck disable=SC2086
    train mpi_pipeline "${R[@]}" -np 2 build/train_mpi ${E#build/emu/train_cuda} --L 4 --batch 8 \
      --microbatches 4 --mode block --block-size 2 --pipeline 2 --virtual 2
  fi
fi
ls "$OUT" | wc -l
