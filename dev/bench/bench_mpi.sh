#!/usr/bin/env bash
# bench_mpi.sh — `make bench-mpi`: data parallel on this machine's cores, in one run.
# The bench model (d=256 L=8 H=8 G=4 F=704, byte-level text, B=8 T=128, block S=4) trained
# by 2 processes x 1 thread (mpirun -np 2 build/train_mpi --threads 1) against 1 process x 2
# threads (./train --threads 2), taking turns for ROUNDS rounds; each run's ms/step is its
# second log window (the first holds the warm-up). Prints the medians, their ratio, and the
# time the 2 processes spend in collectives (reduce-scatter, all-gather, sums) per step.
set -u
cd "$(dirname "$0")/../.."
rounds=${ROUNDS:-3}
steps=12
flags=(--task text --text README.md --seq-len 128 --batch 8 --d 256 --L 8 --H 8 --G 4 --F 704
       --mode block --block-size 4 --steps $steps --log-every $((steps / 2)) --eval-every 1000
       --eval-examples 8)
# shellcheck source=dev/bench/bench_lib.sh
source dev/bench/bench_lib.sh
echo "bench_mpi: block S=4 bench model, B=8 T=128, $rounds rounds of $steps steps each way"
for r in $(seq "$rounds"); do
    ./train "${flags[@]}" --threads 2 >"$tmp/one_$r" 2>&1 || { cat "$tmp/one_$r"; exit 1; }
    mpirun --oversubscribe "${extra[@]}" -np 2 build/train_mpi "${flags[@]}" --threads 1 \
        >"$tmp/two_$r" 2>&1 || { cat "$tmp/two_$r"; exit 1; }
    echo "  round $r: 1 process x 2 threads $(ms_of "$tmp/one_$r") ms/step, 2 processes x 1 thread $(ms_of "$tmp/two_$r") ms/step"
done
one=$(for r in $(seq "$rounds"); do ms_of "$tmp/one_$r"; done | median)
two=$(for r in $(seq "$rounds"); do ms_of "$tmp/two_$r"; done | median)
comm=$(for r in $(seq "$rounds"); do
           sed -nE 's/.*collectives ([0-9.]+) ms\/step.*/\1/p' "$tmp/two_$r"; done | median)
mb=$(sed -nE 's/.*\| ([0-9.]+) MB sent and received.*/\1/p' "$tmp/two_1")
echo "1 process  x 2 threads: $one ms/step (median)"
echo "2 processes x 1 thread: $two ms/step (median), of which collectives $comm ms/step" \
     "($mb MB sent and received by each process per step)"
awk -v a="$one" -v b="$two" -v c="$comm" 'BEGIN {
    printf "ratio (2 processes / 1 process): %.2f; collectives %.1f%% of the 2-process step\n",
           b / a, 100 * c / b }'
