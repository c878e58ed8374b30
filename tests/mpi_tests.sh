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

# interrupted at step 25 on W processes, resumed on W' to step 50: the losses of steps
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
# checkpoint it wrote still loads (further flags: for the run, e.g. a pipeline's). The kill
# waits for the first checkpoint however long the start takes on a busy machine (the job
# ending first, or 10 minutes, fails the test: guards, not measures)
mpi_rank_killed() {
    local dir=$TEST_DIR
    mpi_run 2 build/train_mpi "${MPI_FLAGS[@]}" "$@" --steps 1000000 --log-every 1000 \
        --eval-every 20 --checkpoint "$dir/ck" >"$dir/out" 2>&1 &
    local job=$!
    local i=0
    while [ ! -f "$dir/ck" ] && kill -0 $job 2>/dev/null && [ $i -lt 6000 ]; do sleep 0.1; i=$((i + 1)); done
    [ -f "$dir/ck" ] || { echo "no checkpoint written:"; cat "$dir/out"; kill $job 2>/dev/null; return 1; }
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

# --microbatches with data parallel: 2 processes, each its 6 sequences in 2 and in 3 parts, against
# one process's whole batch (losses within 1e-5, the order of the sums apart); a part count
# that does not divide a process's sequences is refused in one line
mpi_microbatches() {
    local dir=$TEST_DIR out
    ./train "${MPI_FLAGS[@]}" --mode block --block-size 2 --diagnostics "$dir/p1" >/dev/null &&
        mpi_run 2 build/train_mpi "${MPI_FLAGS[@]}" --mode block --block-size 2 --microbatches 2 --diagnostics "$dir/m2" >/dev/null &&
        mpi_run 2 build/train_mpi "${MPI_FLAGS[@]}" --mode block --block-size 2 --microbatches 3 --diagnostics "$dir/m3" >/dev/null &&
        mpi_same_losses "$dir/m2" "$dir/p1" 1e-5 && mpi_same_losses "$dir/m3" "$dir/p1" 1e-5 || return 1
    out=$(mpi_run 2 build/train_mpi "${MPI_FLAGS[@]}" --microbatches 4 2>&1 >/dev/null)
    echo "$out" | grep -qx "error: --microbatches 4 does not divide 6 sequences (--batch 12 over 2 processes)" || { echo "$out"; return 1; }
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

# ---- pipeline parallelism (src/pipeline.c) ----
# 16 rows, 4 microbatches: each replica's M = 4 microbatches take 4 rows (D = 1) or 2 (D = 2)
PIPE_FLAGS=(--task reverse --length 4 --symbols 6 --d 16 --H 2 --G 1 --F 24 --batch 16
            --microbatches 4 --steps 20 --warmup 5 --log-every 5 --eval-every 10
            --eval-examples 32 --threads 1)

# mpi_pipeline_matches L MODE...: P in {2, 4} x V in {1, 2} x D in {1, 2} pipelines (P*D
# processes) of an L-layer model train 20 steps, against the run they must equal: one process
# with --microbatches 4 (D = 1), or D processes of data parallel with it (D = 2: their
# gradients add over the replicas as the pipeline's do). --pipeline-cache off, and none and
# mhc whatever the cache: the same checkpoint bit for bit. The cache on, in full and block,
# once V > 1: a cached block's gradient adds up in pieces, one on each stage that caches it
# and one carried along the backward, which meet there, where one process adds every term
# in turn; the bits of the sums differ, and 20 steps of AdamW carry that on. So those
# are held to check_state's floor, 1e-5 of each kind's largest value (measured: at most
# 2.7e-6, block S = 4; the parameters at most 2.4e-7); the differences are printed.
# PIPE_CASES (D:P:V triples) narrows the runs: `make mutants` judges with a few, and V = 3
# (a cached block two chunks deep) needs a model of 3 x 2 x P sub-layers. With V = 1 the
# cache has nothing to keep (a stage's chunks are all its first), so it is bit for bit too.
mpi_pipeline_matches() {
    local L=$1 dir=$TEST_DIR exact=0
    shift
    local flags=("${PIPE_FLAGS[@]}" --L "$L" "$@")
    local cases=${PIPE_CASES:-"1:2:1 1:2:2 1:4:1 1:4:2 2:2:1 2:2:2 2:4:1 2:4:2"}
    case "$*" in *none* | *mhc*) exact=1 ;; esac
    ./train "${flags[@]}" --checkpoint "$dir/ref1" >"$dir/ref1.out" &&
        mpi_run 2 build/train_mpi "${flags[@]}" --checkpoint "$dir/ref2" >"$dir/ref2.out" || return 1
    local D P V cache triple
    for triple in $cases; do
        IFS=: read -r D P V <<<"$triple"
        for cache in off on; do
            rm -f "$dir/pipe"
            mpi_run $((P * D)) build/train_mpi "${flags[@]}" --pipeline "$P" --virtual "$V" \
                --pipeline-cache $cache --checkpoint "$dir/pipe" >"$dir/out" 2>&1 || { cat "$dir/out"; return 1; }
            if [ $cache = off ] || [ $exact = 1 ] || [ "$V" = 1 ]; then
                cmp -s "$dir/pipe" "$dir/ref$D" || { echo "P=$P V=$V D=$D cache $cache: other bits"; return 1; }
                # the printed losses, norms and evaluations too (timings apart)
                diff <(mpi_printed "$dir/ref$D.out") <(mpi_printed "$dir/out") ||
                    { echo "P=$P V=$V D=$D cache $cache: other printed losses"; return 1; }
            else
                echo "P=$P V=$V D=$D, cache on:"
                build/compare_checkpoints "$dir/ref$D" "$dir/pipe" 1e-5 &&
                    mpi_close_losses "$dir/ref$D.out" "$dir/out" || return 1
            fi
        done
    done
}

# the training and evaluation lines a run printed, without their timings
mpi_printed() {
    grep -E "^(step|eval step|final)" "$1" | sed -E 's/\| *[0-9.]+ tok\/s.*//; s/\| time .*//'
}

# every loss and norm two runs printed, within one unit of their last printed digit (the
# loss's 4 decimals, the norm's 3)
mpi_close_losses() {
    paste -d' ' <(grep -E "^step" "$1" | awk -F'|' '{ print $2, $4 }' | awk '{ print $2, $4 }') \
                <(grep -E "^step" "$2" | awk -F'|' '{ print $2, $4 }' | awk '{ print $2, $4 }') |
        awk '{ n++; dl = $1 - $3; dn = $2 - $4; if (dl < 0) dl = -dl; if (dn < 0) dn = -dn
               if (dl > 1.0001e-4 || dn > 1.0001e-3) bad = 1 }
             END { exit (bad || n == 0) }' || { echo "losses or norms differ"; return 1; }
}

# the bytes each stage printed it sent a step are what pipeline_floats_into counts: with the
# cache, its "cached" column (and fewer than naive once V > 1); without, the naive one
mpi_pipeline_bytes() {
    local dir=$TEST_DIR cache
    for cache in on off; do
        mpi_run 2 build/train_mpi "${PIPE_FLAGS[@]}" --L 4 --mode block --block-size 2 --pipeline 2 \
            --virtual 2 --pipeline-cache $cache >"$dir/out" || return 1
        grep -E "^  stage [0-9]: sent" "$dir/out"
        # stage s: sent F forward and B back a step (forward naive N, cached K)
        awk -v cache=$cache '/^  stage [0-9]: sent/ {
                gsub(/[(),]/, ""); sent = $4; expected = cache == "on" ? $16 : $14
                n++; if (sent != expected || sent == 0) bad = 1
                if (cache == "on" && $16 >= $14 && $2 == "0:") bad = 1 }
             END { exit (bad || n != 2) }' "$dir/out" || { echo "cache $cache: not the counted bytes"; return 1; }
        # the bubble the schedule gives (pipeline_simulate) and the formula's, counted:
        # (P-1)/(V*M+P-1) = 1/9 with P = 2, V = 2, M = 4
        grep -qE "bubble: measured [0-9.]+% \(the stages' idle share\), schedule 11\.1% \(pipeline_simulate\), formula \(P-1\)/\(V\*M\+P-1\) = 11\.1%$" "$dir/out" ||
            { echo "cache $cache: not the bubble of 2 stages x 2 chunks x 4 microbatches:"; grep -F bubble "$dir/out"; return 1; }
        # each stage's idle share, and the bubble measured, are shares, in (0, 100) %: a
        # stage's busy time is its sub-layers' compute alone, its step's time also its
        # gradients zeroed, its messages received and copied, the embedding, so the share is
        # above 0 however loaded the machine (a clock stopped at 0 makes them all 0)
        sed -nE 's/.*\| idle ([0-9.-]+)%.*/\1/p; s/.*bubble: measured ([0-9.-]+)%.*/\1/p' "$dir/out" |
            awk '{ n++; if ($1 <= 0 || $1 >= 100) bad = 1 } END { exit (bad || n != 3) }' ||
            { echo "cache $cache: an idle share outside (0, 100) %"; return 1; }
    done
}

# a stage holds its chunks' parameters alone: the stages' params add up to the whole model's
mpi_pipeline_memory() {
    local dir=$TEST_DIR
    mpi_run 4 build/train_mpi "${PIPE_FLAGS[@]}" --L 4 --mode full --pipeline 4 >"$dir/out" || return 1
    local whole stages
    whole=$(sed -nE 's/.*\| params ([0-9]+) \|.*/\1/p' "$dir/out" | head -1)
    stages=$(sed -nE 's/^  stage [0-9]: .*\| params ([0-9]+) floats.*/\1/p' "$dir/out")
    echo "whole model $whole; stages: $(echo $stages)"
    [ "$(echo "$stages" | wc -l)" -eq 4 ] && [ "$(echo "$stages" | paste -sd+ | bc)" -eq "$whole" ] &&
        [ "$(echo "$stages" | sort -n | tail -1)" -lt "$whole" ]
}

# interrupted at step 10 under a pipeline, resumed on one process (and the reverse): the
# checkpoint at step 20 is the uninterrupted one process's, bit for bit
mpi_pipeline_resume() {
    local dir=$TEST_DIR
    local flags=("${PIPE_FLAGS[@]}" --L 4 --mode block --block-size 2)
    local pipe=(--pipeline 2 --virtual 2 --pipeline-cache off)
    ./train "${flags[@]}" --checkpoint "$dir/whole" >/dev/null &&
        mpi_run 2 build/train_mpi "${flags[@]}" "${pipe[@]}" --checkpoint "$dir/a" --stop-after 10 >/dev/null &&
        ./train "${flags[@]}" --checkpoint "$dir/a" --resume >/dev/null &&
        ./train "${flags[@]}" --checkpoint "$dir/b" --stop-after 10 >/dev/null &&
        mpi_run 2 build/train_mpi "${flags[@]}" "${pipe[@]}" --checkpoint "$dir/b" --resume >/dev/null &&
        cmp "$dir/a" "$dir/whole" && cmp "$dir/b" "$dir/whole"
}

# --pipeline-trace: a row per forward and backward of each stage, chunk, microbatch and step,
# each once; each ending after it starts, and the stage's rows never overlapping (in the
# order of their start, then of their end: a row of no length ties with the next's start)
mpi_pipeline_trace() {
    local dir=$TEST_DIR
    mpi_run 2 build/train_mpi "${PIPE_FLAGS[@]}" --L 4 --mode block --block-size 2 --pipeline 2 \
        --virtual 2 --steps 3 --warmup 1 --pipeline-trace "$dir/trace.csv" >/dev/null || return 1
    head -3 "$dir/trace.csv"
    # 3 steps x 2 stages x 2 chunks x 4 microbatches x (F, B) = 96 rows, no key twice (stage s
    # runs chunks s and s + 2)
    [ "$(head -1 "$dir/trace.csv")" = "step,stage,chunk,microbatch,kind,start_ms,end_ms" ] &&
        [ "$(tail -n +2 "$dir/trace.csv" | wc -l)" -eq 96 ] &&
        [ "$(tail -n +2 "$dir/trace.csv" | cut -d, -f1-5 | sort -u | wc -l)" -eq 96 ] &&
        tail -n +2 "$dir/trace.csv" | awk -F, '{ if (!($1 >= 1 && $1 <= 3 && $3 >= 0 && $3 < 4 && $3 % 2 == $2 &&
                                                      $4 >= 0 && $4 < 4 && ($5 == "F" || $5 == "B"))) bad = 1 }
                                               END { exit bad }' &&
        sort -t, -k2,2n -k6,6n -k7,7n <(tail -n +2 "$dir/trace.csv") |
        awk -F, '{ if ($7 < $6) bad = 1; if ($2 == stage && $6 < last) bad = 1; stage = $2; last = $7 }
                 END { exit bad }'
}

# --pipeline-trace goes through outputs.c's check before step 1, under mpirun too: onto the
# checkpoint (D17), the training text (D18), a pipe, a link to the text, a device (D19), a
# folder not there (D20): one line, status 1, no step trained, and every file as it was
mpi_pipeline_trace_refused() {
    local dir=$TEST_DIR out status
    head -c 4000 /usr/share/common-licenses/GPL-3 >"$dir/t.txt"
    mkfifo "$dir/pipe" && ln -s "$dir/t.txt" "$dir/link" || return 1
    ./train "${PIPE_FLAGS[@]}" --L 4 --mode none --steps 2 --warmup 1 --checkpoint "$dir/run.ckpt" \
        >/dev/null || return 1
    local before
    before=$(cd "$dir" && md5sum t.txt run.ckpt run.ckpt.best)
    local text_flags=(--task text --text "$dir/t.txt" --seq-len 16)
    local shape=(--d 16 --H 2 --G 1 --F 24 --batch 16 --microbatches 4 --warmup 1 --threads 1)
    refused() {  # refused "WORDS" TRACE FLAGS...: one line holding WORDS, status 1, no step
        local words=$1 trace=$2
        shift 2
        [ "${1:-}" = --task ] || set -- --task reverse --length 4 --symbols 6 "$@"
        out=$(mpi_run 2 build/train_mpi "${shape[@]}" --L 4 --mode none --pipeline 2 --steps 3 \
              --pipeline-trace "$trace" "$@" 2>&1)
        status=$?
        echo "$out" | grep -q '^step' && { echo "trained: $out"; return 1; }
        [ "$status" -ne 0 ] && [ "$(echo "$out" | grep -c '^error: ')" -eq 1 ] &&
            echo "$out" | grep -F -- "$words" | grep -qF -- "$trace" ||
            { echo "status $status: $out"; return 1; }
    }
    refused "is the --pipeline-trace file" "$dir/run.ckpt" --checkpoint "$dir/run.ckpt" &&
        refused "is the --text file" "$dir/t.txt" "${text_flags[@]}" &&
        refused "not a regular file" "$dir/pipe" &&
        refused "is the --text file" "$dir/link" "${text_flags[@]}" &&
        refused "not a regular file" /dev/null &&
        refused "cannot write" /nonexistent-attnres/t.csv &&
        [ "$(cd "$dir" && md5sum t.txt run.ckpt run.ckpt.best)" = "$before" ] &&
        [ -p "$dir/pipe" ] && [ -L "$dir/link" ] && [ -c /dev/null ]
}

# one line and status 1 each: P*D not the world, chunks that are not whole blocks, M < P, M
# not dividing B/D, M not a multiple of P when interleaved
mpi_pipeline_refuses() {
    local out
    expect() {  # expect "LINE" NP FLAGS...: the run's one error line, whichever ranks print it
        local line=$1 np=$2
        shift 2
        # the error lines, not the first line: under load mpirun's own banner (a line of
        # dashes) can reach stderr before a rank's line does
        out=$(mpi_run "$np" build/train_mpi "${PIPE_FLAGS[@]}" --L 4 "$@" 2>&1 >/dev/null | grep '^error: ' | sort -u)
        [ "$out" = "$line" ] || { echo "got: $out"; echo "not: $line"; return 1; }
    }
    expect "error: --pipeline 2 does not divide the 3 processes (the world is P stages x D replicas)" 3 --pipeline 2 &&
        expect "error: --pipeline 2 --virtual 2: 4 chunks cannot each hold whole layers and whole blocks (S = 4) of the 2L = 8 sub-layers" 2 --pipeline 2 --virtual 2 --mode block --block-size 4 &&
        expect "error: --microbatches 2 is fewer than the 4 stages: 1F1B needs M >= P" 4 --pipeline 4 --microbatches 2 --mode none &&
        expect "error: --microbatches 3 does not divide 8 sequences (--batch 16 over 2 replicas of 2 stages)" 4 --pipeline 2 --microbatches 3 &&
        expect "error: --virtual 2: the interleaved schedule takes the microbatches P at a time, so --microbatches 6 must be a multiple of --pipeline 4" 4 --pipeline 4 --virtual 2 --L 8 --mode none --batch 12 --microbatches 6
}

# what `make mutants` judges src/pipeline.c by (dev/check/mutants.py's SHELL_TESTS): the
# bytes, a resume, then the pipelines of every carried kind (blocks, the stream, m streams)
mpi_pipeline_judge() {
    local PIPE_CASES="1:2:2 1:4:1 2:2:1"
    mpi_pipeline_bytes >/dev/null && mpi_pipeline_trace >/dev/null && mpi_pipeline_resume &&
        mpi_pipeline_matches 8 --mode block --block-size 2 &&
        PIPE_CASES="1:2:3" mpi_pipeline_matches 6 --mode block --block-size 2 &&
        PIPE_CASES="2:2:1" mpi_pipeline_matches 8 --mode full --optimizer muon &&
        mpi_pipeline_matches 8 --mode none && mpi_pipeline_matches 8 --mode mhc
}
