#!/usr/bin/env bash
# same_bits.sh REPO OUTDIR — what a change that must not alter behaviour is checked with.
# Builds REPO's ./train and ./check_state (make all), then
#   - trains 12 configs for 60 steps each (every mode, a window, both mixings, every variant
#     switch, heads), keeping each checkpoint and the printed losses (timings stripped);
#   - samples from three of the checkpoints (greedy and drawn);
#   - runs check_state on every tests/data/*.bin state file, keeping what it prints.
# Run it on a checkout before the change and on one after, then `diff -r BEFORE AFTER`:
# no output means the same bits (parameters, AdamW moments, losses, samples, verdicts).
set -euo pipefail
[ $# -eq 2 ] || { echo "usage: dev/check/same_bits.sh REPO OUTDIR" >&2; exit 2; }
REPO=$(cd "$1" && pwd); OUT=$2
mkdir -p "$OUT"; OUT=$(cd "$OUT" && pwd)
cd "$REPO"
make -s all >/dev/null
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
for c in "${configs[@]}"; do
  name=${c%%:*}; flags=${c#*:}
  rm -f "$OUT/$name.ckpt"
  $T $flags --checkpoint "$OUT/$name.ckpt" 2>&1 | sed -E 's/\| *[0-9]+ tok\/s.*//; s/\| time .*//; s/\| threads .*//; s#'"$OUT"'#OUT#g' > "$OUT/$name.log" || true
done
for name in block4 none qinput; do
  ./train --sample --checkpoint "$OUT/$name.ckpt" 2>&1 | sed 's#'"$OUT"'#OUT#g' > "$OUT/$name.sample0" || echo "rc=$?" >> "$OUT/$name.sample0"
  ./train --sample --checkpoint "$OUT/$name.ckpt" --temperature 1 --seed 7 2>&1 | sed 's#'"$OUT"'#OUT#g' > "$OUT/$name.sample1" || echo "rc=$?" >> "$OUT/$name.sample1"
done
for f in tests/data/*.bin; do
  ./check_state "$f" 2>&1 | sed 's#'"$REPO"'#REPO#g' > "$OUT/check_$(basename "$f").txt" || echo "rc=$?" >> "$OUT/check_$(basename "$f").txt"
done
ls "$OUT" | wc -l
