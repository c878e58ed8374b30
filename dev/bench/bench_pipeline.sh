#!/usr/bin/env bash
# bench_pipeline.sh — `make bench-pipeline`: the pipeline (src/pipeline.c) on this machine's
# cores. The bench model in block mode (d=256 L=8 H=8 G=4 F=704, S=2, byte-level text, B=8
# T=128) with --microbatches 4, trained by 1 process x 2 threads (./train --threads 2) and by
# 2 processes x 1 thread as a pipeline (mpirun -np 2 build/train_mpi --pipeline 2 --threads 1)
# with V = 1 and V = 2 chunks a stage, the cross-stage cache on and off, taking turns for
# ROUNDS rounds; each run's ms/step is its second log window (the first holds the warm-up).
# Prints the medians, the bytes the stages sent a step (all stages, forward; the gradients
# back are as many), and the bubble measured against the formula. Two processes on 2 cores
# share the machine with MPI's polling: the times are indicative; the bytes are exact.
set -u
cd "$(dirname "$0")/../.."
rounds=${ROUNDS:-3}
steps=12
flags=(--task text --text README.md --seq-len 128 --batch 8 --microbatches 4 --d 256 --L 8
       --H 8 --G 4 --F 704 --mode block --block-size 2 --steps $steps --log-every $((steps / 2))
       --eval-every 1000 --eval-examples 8)
# shellcheck source=dev/bench/bench_lib.sh
source dev/bench/bench_lib.sh
runs=("one" "P2_V1" "P2_V2" "P2_V2_off")
pipe_flags() {
    case $1 in
        P2_V1) echo "--pipeline 2 --virtual 1" ;;
        P2_V2) echo "--pipeline 2 --virtual 2" ;;
        P2_V2_off) echo "--pipeline 2 --virtual 2 --pipeline-cache off" ;;
    esac
}
echo "bench_pipeline: block S=2 bench model, B=8 T=128, 4 microbatches, $rounds rounds of $steps steps each"
for r in $(seq "$rounds"); do
    ./train "${flags[@]}" --threads 2 >"$tmp/one_$r" 2>&1 || { cat "$tmp/one_$r"; exit 1; }
    line="  round $r: 1 process $(ms_of "$tmp/one_$r")"
    for run in "${runs[@]:1}"; do
        # shellcheck disable=SC2046
        mpirun --oversubscribe "${extra[@]}" -np 2 build/train_mpi "${flags[@]}" --threads 1 \
            $(pipe_flags "$run") >"$tmp/${run}_$r" 2>&1 || { cat "$tmp/${run}_$r"; exit 1; }
        line="$line, $run $(ms_of "$tmp/${run}_$r")"
    done
    echo "$line ms/step"
done
printf "%-50s %10s %16s %16s %9s %9s\n" "run" "ms/step" "bytes naive" "bytes sent" "bubble" "formula"
for run in "${runs[@]}"; do
    ms=$(for r in $(seq "$rounds"); do ms_of "$tmp/${run}_$r"; done | median)
    if [ "$run" = one ]; then
        printf "%-50s %10s %16s %16s %9s %9s\n" "1 process x 2 threads, M=4" "$ms" "-" "-" "-" "-"
        continue
    fi
    f=$tmp/${run}_1
    naive=$(sed -nE 's/^  all stages: ([0-9]+) bytes forward a step naive.*/\1/p' "$f")
    sent=$(awk '/^  stage [0-9]: sent/ { s += $4 } END { print s }' "$f")
    bubble=$(for r in $(seq "$rounds"); do
                 sed -nE 's/^  bubble: measured ([0-9.]+)%.*/\1/p' "$tmp/${run}_$r"; done | median)
    formula=$(sed -nE 's/.*formula \(P-1\)\/\(V\*M\+P-1\) = ([0-9.]+)%.*/\1/p' "$f")
    printf "%-50s %10s %16s %16s %8s%% %8s%%\n" "2 stages x 1 thread, $(pipe_flags "$run" | sed 's/--pipeline 2 //')" \
        "$ms" "$naive" "$sent" "$bubble" "$formula"
done
