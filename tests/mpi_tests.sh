# mpi_tests.sh — data-parallel training (build/train_mpi under mpirun) against one process
# (./train). Sourced by tests/run_all.sh, which runs each function below as one test, with a
# fresh folder in $TEST_DIR.
#
# Losses are compared from --diagnostics' train.csv (every logged loss, 6 significant
# digits): the processes sum their gradients in another order than one process sums its
# rows, so the losses agree to float rounding, not bit for bit; the same process count twice
# must agree bit for bit.

# mpirun on the 2-core CI machine: more processes than cores, and as root when CI is root
mpi_run() {
    local np=$1
    shift
    local extra=()
    [ "$(id -u)" -eq 0 ] && extra+=(--allow-run-as-root)
    mpirun --oversubscribe "${extra[@]}" -np "$np" "$@"
}

MPI_FLAGS=(--task reverse --length 4 --symbols 6 --d 16 --L 2 --H 2 --G 1 --F 24 --batch 12
           --steps 50 --warmup 5 --log-every 1 --eval-every 25 --eval-examples 32 --threads 1)

# same_losses A B TOL: every loss of run A's train.csv within TOL (relative) of run B's,
# step by step (0 = bit-identical as printed)
mpi_same_losses() {
    paste -d, <(tail -n +2 "$1/train.csv" | cut -d, -f1,2) <(tail -n +2 "$2/train.csv" | cut -d, -f1,2) |
        awk -F, -v tol="$3" '
            { n++; d = $2 - $4; if (d < 0) d = -d; r = d / ($4 < 0 ? -$4 : $4)
              if (r > worst) worst = r; if ($1 != $3 || r > tol) bad = 1 }
            END { printf "%d losses, worst relative difference %.2e\n", n, worst; exit (bad || n == 0) }'
}

# 1, 2 and 3 processes, the same global batch (12 rows), 50 steps: losses within 1e-5; two
# runs of 2 processes: identical
mpi_matches_one_process() {
    local dir=$TEST_DIR
    ./train "${MPI_FLAGS[@]}" "$@" --diagnostics "$dir/p1" >/dev/null &&
        mpi_run 2 build/train_mpi "${MPI_FLAGS[@]}" "$@" --diagnostics "$dir/p2" >/dev/null &&
        mpi_run 2 build/train_mpi "${MPI_FLAGS[@]}" "$@" --diagnostics "$dir/p2b" >/dev/null &&
        mpi_run 3 build/train_mpi "${MPI_FLAGS[@]}" "$@" --diagnostics "$dir/p3" >/dev/null &&
        mpi_same_losses "$dir/p2" "$dir/p1" 1e-5 && mpi_same_losses "$dir/p3" "$dir/p1" 1e-5 &&
        mpi_same_losses "$dir/p2b" "$dir/p2" 0
}

# interrupted at step 25 on P processes, resumed on P' to step 50: the losses of steps
# 26..50 are those of an uninterrupted run on one process (further flags: for every run)
mpi_resume_across() {
    local from=$1 to=$2 dir=$TEST_DIR
    shift 2
    local run=(build/train_mpi "${MPI_FLAGS[@]}" --mode block --block-size 2 "$@")
    ./train "${MPI_FLAGS[@]}" --mode block --block-size 2 "$@" --diagnostics "$dir/whole" >/dev/null &&
        mpi_run "$from" "${run[@]}" --checkpoint "$dir/ck" --stop-after 25 --diagnostics "$dir/cut" >/dev/null &&
        mpi_run "$to" "${run[@]}" --checkpoint "$dir/ck" --resume --diagnostics "$dir/cut" >/dev/null &&
        mpi_same_losses "$dir/cut" "$dir/whole" 1e-5
}

# ZeRO-1: after 10 steps, the AdamW moments that 2 sharded processes gather into their
# checkpoint equal one process's unsharded moments (and the parameters too), to rounding
mpi_moments_match() {
    local dir=$TEST_DIR
    ./train "${MPI_FLAGS[@]}" --mode full --steps 10 --eval-every 10 --checkpoint "$dir/one" >/dev/null &&
        mpi_run 2 build/train_mpi "${MPI_FLAGS[@]}" --mode full --steps 10 --eval-every 10 \
            --checkpoint "$dir/two" >/dev/null &&
        build/compare_checkpoints "$dir/one" "$dir/two"
}

# a rank killed mid-run ends the whole job within seconds, with a message; the last
# checkpoint it wrote still loads
mpi_rank_killed() {
    local dir=$TEST_DIR
    mpi_run 2 build/train_mpi "${MPI_FLAGS[@]}" --steps 1000000 --log-every 1000 \
        --eval-every 20 --checkpoint "$dir/ck" >"$dir/out" 2>&1 &
    local job=$!
    local i=0
    while [ ! -f "$dir/ck" ] && [ $i -lt 100 ]; do sleep 0.1; i=$((i + 1)); done
    local victim
    victim=$(pgrep -f "^build/train_mpi.*$dir/ck" | tail -1)
    [ -n "$victim" ] || { echo "no rank to kill"; kill $job; return 1; }
    kill -9 "$victim"
    local start=$SECONDS
    while kill -0 $job 2>/dev/null && [ $((SECONDS - start)) -lt 20 ]; do sleep 0.2; done
    if kill -0 $job 2>/dev/null; then echo "the job still runs 20 s later"; kill -9 $job; return 1; fi
    wait $job
    local status=$?
    echo "job ended in $((SECONDS - start)) s with status $status:"
    grep -iE "signal|killed|exited" "$dir/out" | head -3
    # the checkpoint loads: one process decodes from it
    [ "$status" -ne 0 ] && ./train --sample --checkpoint "$dir/ck" >/dev/null
    local ok=$?
    return $ok
}

# --microbatches with data parallel: 2 processes, each its 6 rows in 2 and in 3 parts, against
# one process's whole batch (losses within 1e-5, the order of the sums apart); a part count
# that does not divide a process's rows is refused in one line
mpi_microbatches() {
    local dir=$TEST_DIR out
    ./train "${MPI_FLAGS[@]}" --mode block --block-size 2 --diagnostics "$dir/p1" >/dev/null &&
        mpi_run 2 build/train_mpi "${MPI_FLAGS[@]}" --mode block --block-size 2 --microbatches 2 --diagnostics "$dir/m2" >/dev/null &&
        mpi_run 2 build/train_mpi "${MPI_FLAGS[@]}" --mode block --block-size 2 --microbatches 3 --diagnostics "$dir/m3" >/dev/null &&
        mpi_same_losses "$dir/m2" "$dir/p1" 1e-5 && mpi_same_losses "$dir/m3" "$dir/p1" 1e-5 || return 1
    out=$(mpi_run 2 build/train_mpi "${MPI_FLAGS[@]}" --microbatches 4 2>&1 >/dev/null)
    echo "$out" | grep -qx "error: --microbatches 4 does not divide 6 rows (--batch 12 over 2 processes)" || { echo "$out"; return 1; }
}

# one line and status 1: a batch that does not divide, processes given different flags,
# --sample under mpirun, a --text that is a pipe with no writer (under timeout: a job that
# waits for one fails rather than hangs)
mpi_refuses() {
    local out
    out=$(mpi_run 3 build/train_mpi "${MPI_FLAGS[@]}" --batch 8 2>&1 >/dev/null)
    echo "$out" | grep -qx "error: --batch 8 does not divide among 3 processes (each takes an equal share of every batch)" || { echo "$out"; return 1; }
    out=$(mpi_run 1 build/train_mpi "${MPI_FLAGS[@]}" --seed 1 : -np 1 build/train_mpi "${MPI_FLAGS[@]}" --seed 2 2>&1 >/dev/null)
    echo "$out" | grep -qx "error: the processes were started with different flags (rank 1's differ from rank 0's)" || { echo "$out"; return 1; }
    out=$(mpi_run 2 build/train_mpi --sample --checkpoint /nonexistent 2>&1 >/dev/null)
    echo "$out" | grep -qx "error: --sample runs in one process: start it without mpirun" || { echo "$out"; return 1; }
    out=$(mpi_run 2 build/train_mpi --export "$TEST_DIR/out.safetensors" --checkpoint /nonexistent 2>&1 >/dev/null)
    echo "$out" | grep -qx "error: --export runs in one process: start it without mpirun" || { echo "$out"; return 1; }
    mkfifo "$TEST_DIR/pipe"
    out=$(export -f mpi_run; timeout 60 bash -c 'mpi_run 2 build/train_mpi --task text --text "$0"' \
          "$TEST_DIR/pipe" 2>&1 >/dev/null)
    echo "$out" | grep -qx "error: text '$TEST_DIR/pipe': is not a regular file (a device, pipe or socket)" || { echo "$out"; return 1; }
}
