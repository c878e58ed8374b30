#!/usr/bin/env bash
# gpu_check.sh — what `make gpu-check` runs after building: everything that needs a GPU, in
# one go, for a machine that may have no network (nothing is installed; the build needs only
# the CUDA toolkit and the tree). Prints a summary and exits 1 if anything failed.
#
#   1. the kernel and whole-model agreement tests on the GPU (build/test_cuda_gpu; mHC-lite's
#      operators at the bench size and its whole model too)
#   2. ./train against ./train_cuda, loss by loss: a tiny model in every mode (mHC-lite with
#      4 streams and with 2) and in two runs of SPEC's variants (within 1e-4)
#      and the bench model (within 2e-3, see below); ./train_cuda (its step as CUDA graphs)
#      against ./train_cuda --no-graph in four tiny runs, the bench model and a wide one
#      (d = 1024), every loss and the final parameters and moments bit for bit; the
#      data-parallel NCCL path on one GPU (mpirun -np 1 build/train_cuda_mpi) against
#      ./train_cuda, where MPI is installed or carried (make carry: .carry/openmpi)
#   3. speed: ms/step and tokens/s per mode and of SPEC's variants with our matmul, per mode
#      with cuBLAS, per mode as CUDA graphs against queued call by call; the matmul version by
#      version (naive, 16x16 tiles, ours) and cuBLAS SGEMM on the bench shapes; PyTorch on the
#      same GPU, the same model checked against the reference state files, eager, compiled
#      and with CUDA graphs, when the machine's python3 has a CUDA-enabled torch (a line
#      saying it was skipped otherwise)
#   4. compute-sanitizer memcheck, racecheck, synccheck and initcheck on the model test and
#      on one training step at the bench size (where the machine's runtime refuses the tool,
#      e.g. "Device not supported" under gVisor, a skip line says so)
#   5. what says where the time goes, as far as the time budget allows (GPU_CHECK_BUDGET
#      seconds since make gpu-check started, 450 by default: the whole stays under 8 minutes;
#      a part starts only if its longest expected time still fits, else a skip line), the
#      most telling first: the depth attention's kernels (dev/bench/bench_depth.cu), checked
#      against the CPU and timed, with the step, in the plain build and with each block shape
#      of DEPTH_SHAPES (dev/infra/gpu.mk; which shape to make the default); the benchmarks
#      built with cuda/, src/, dev/ and the Makefile of an earlier commit when make carry
#      AB=commit put them in .carry/ab (before/after on one GPU); how cost grows with size
#      (attnres.c and PyTorch per mode at four sizes, dev/bench/bench_sizes.sh); PyTorch
#      compiled with max-autotune; the causal attention's two versions
#      (dev/bench/bench_attention.cu), checked and timed; Nsight Compute's time per kernel of
#      a block and of a none step (dev/bench/profile_cuda.py)
#
# GPU_CHECK_OUT=DIR keeps every log there (make gpu-check OUT=DIR); GPU_CHECK_START is when
# make gpu-check began (seconds since 1970; the build counts against the budget).
# GPU_CHECK_QUICK=1 (make gpu-check QUICK=1), to check a fix when the GPU's time is short:
# parts 1 to 3 whole, part 4 without racecheck (by far its slowest tool: on an H200 at
# b804e4a 148 s for the whole-model test, 107 s for the step; the emulator proves the
# barriers), and of part 5 the block shapes and the before/after only; a skip line for each
# part left out.
# GPU_CHECK_SWEEP=1 (make gpu-check SWEEP=1): the size sweep even with QUICK (on an H200,
# QUICK took 3 min 25 s and the sweep's budget is 230 s: both fit one 10-minute call).
set -u
cd "$(dirname "$0")/../.."
start=${GPU_CHECK_START:-$(date +%s)}
budget=${GPU_CHECK_BUDGET:-450}
quick=${GPU_CHECK_QUICK:-}
[ "$quick" = 0 ] && quick=
sweep=${GPU_CHECK_SWEEP:-}
[ "$sweep" = 0 ] && sweep=
out=${GPU_CHECK_OUT:-$(mktemp -d)}
mkdir -p "$out"
summary=()
failed=0

if ! nvidia-smi -L >/dev/null 2>&1; then
    echo "gpu-check: no NVIDIA GPU here (nvidia-smi finds none): built everything, ran nothing"
    exit 0
fi
gpu=$(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | head -1)
echo "gpu-check on: $gpu ($(date -u +%Y-%m-%d))"

# check NAME LOG TIMEOUT_S COMMAND...: runs it, keeps its output in $out/LOG, records ok/FAIL
check() {
    local name=$1 log=$2 limit=$3
    shift 3
    local start=$SECONDS
    if declare -F "$1" >/dev/null; then "$@" >>"$out/$log" 2>&1  # a function of this script
    else timeout "$limit" "$@" >>"$out/$log" 2>&1; fi
    local status=$?
    local took=$((SECONDS - start))
    if [ $status -eq 0 ]; then
        summary+=("ok    $name (${took} s)")
    else
        summary+=("FAIL  $name (exit $status after ${took} s; see $log)")
        failed=1
    fi
    echo "${summary[-1]}"
    return $status
}

# in_budget NAME SECONDS: 0 if SECONDS more (an estimate of the longest NAME takes) still
# fit the budget; else records a skip line for NAME and returns 1
in_budget() {
    local elapsed=$(($(date +%s) - start))
    [ $((elapsed + $2)) -le "$budget" ] && return 0
    summary+=("skip  $1: would end past the time budget (${elapsed} s + ${2} s > ${budget} s; GPU_CHECK_BUDGET)")
    echo "${summary[-1]}"
    return 1
}
# optional NAME SECONDS: as in_budget, for a part QUICK leaves out (a skip line saying so)
optional() {
    if [ -n "$quick" ]; then
        summary+=("skip  $1 (QUICK)")
        echo "${summary[-1]}"
        return 1
    fi
    in_budget "$@"
}
# sweep_optional NAME SECONDS: the size sweep, optional unless SWEEP=1 (then the budget alone
# decides)
sweep_optional() {
    if [ -n "$sweep" ]; then in_budget "$@"; else optional "$@"; fi
}
# the bench model (d=256 L=8 H=8 G=4 F=704, V=256 bytes), block AttnRes, one step of B=8 T=128
bench_flags=(--task text --text README.md --seq-len 128 --batch 8 --d 256 --L 8 --H 8 --G 4
             --F 704 --mode block --block-size 4 --eval-examples 8 --threads 8)

# ---- 1. agreement tests ----------------------------------------------------------------
check "kernels and whole model on the GPU vs the CPU (build/test_cuda_gpu)" tests.log 300 \
    build/test_cuda_gpu
grep -E "test cases:|assertions:" "$out/tests.log" | tail -2

# ---- 2. ./train vs ./train_cuda, loss by loss ---------------------------------------------
# train.csv of --diagnostics holds every logged loss with 6 significant digits.
# same_losses A B TOL: every loss of run A within TOL (relative) of run B's
same_losses() {
    paste -d, <(tail -n +2 "$1/train.csv" | cut -d, -f1,2) <(tail -n +2 "$2/train.csv" | cut -d, -f1,2) |
        awk -F, -v tol="$3" '
            { n++; d = $2 - $4; if (d < 0) d = -d; r = d / ($4 < 0 ? -$4 : $4)
              if (r > worst) worst = r; if ($1 != $3 || r > tol) bad = 1 }
            END { printf "  %d losses, worst relative difference %.2e (tolerance %g)\n", n, worst, tol
                  exit (bad || n == 0) }'
}
tiny_flags=(--task reverse --length 4 --symbols 6 --d 16 --L 2 --H 2 --G 1 --F 24 --batch 8
            --steps 30 --warmup 5 --log-every 1 --eval-every 30 --eval-examples 32 --threads 4)
# name:flags, the modes (mHC-lite with m = 4 streams, m! = 24 permutations, and with m = 2),
# two runs of SPEC's variants (every attention switch at once; the window with DenseFormer's
# mixing) and Muon (muon.cu's Newton-Schulz and step)
declare -A run_flags  # name: flags, for the --no-graph runs below
for run in "none:--mode none" "full:--mode full" "block:--mode block --block-size 2" \
           "mhc:--mode mhc --streams 4" "mhc2:--mode mhc --streams 2" \
           "variants:--mode full --depth-score sigmoid --key-norm off --depth-query input --depth-heads 2" \
           "mixing:--mode full --depth-window 2 --mixing dense" \
           "muon:--mode block --block-size 2 --optimizer muon"; do
    name=${run%%:*} flags=${run#*:}
    # shellcheck disable=SC2086  # flags: words on purpose
    ./train "${tiny_flags[@]}" $flags --diagnostics "$out/cpu_$name" >>"$out/losses.log" 2>&1
    # shellcheck disable=SC2086
    ./train_cuda "${tiny_flags[@]}" $flags --diagnostics "$out/gpu_$name" \
        --checkpoint "$out/gpu_$name.ckpt" >>"$out/losses.log" 2>&1
    run_flags[$name]=$flags
    check "./train_cuda = ./train, tiny model, $name ($flags), 30 steps (1e-4)" losses.log 60 \
        same_losses "$out/gpu_$name" "$out/cpu_$name" 1e-4
    tail -1 "$out/losses.log"
done
# The bench model over 10 steps: the GPU sums in other orders (tiled matmuls, warp
# reductions), a relative difference of ~1e-6 per operation; AdamW's first steps move every
# weight by ~lr whatever the gradient's size, so a weight whose gradient is near zero can
# step either way, and these differences grow with the steps: 2e-3 on the loss after 10.
./train "${bench_flags[@]}" --steps 10 --eval-every 10 --log-every 1 --warmup 2 \
    --diagnostics "$out/cpu_bench" >>"$out/losses.log" 2>&1
./train_cuda "${bench_flags[@]}" --steps 10 --eval-every 10 --log-every 1 --warmup 2 \
    --diagnostics "$out/gpu_bench" --checkpoint "$out/gpu_bench.ckpt" >>"$out/losses.log" 2>&1
check "./train_cuda = ./train, bench model, block S=4, 10 steps (2e-3)" losses.log 60 \
    same_losses "$out/gpu_bench" "$out/cpu_bench" 2e-3
tail -1 "$out/losses.log"
run_flags[bench]="${bench_flags[*]} --steps 10 --eval-every 10 --log-every 1 --warmup 2"
# A wide model (d = 1024, F = 2816, L = 2), 3 steps, for the graph check below only: its
# products take 128 x 128 tiles that split K, the most scratch a step borrows, all of which
# must be reserved before the capture (a GPU refuses cudaFree and cudaMalloc during one)
run_flags[wide]="${bench_flags[*]} --d 1024 --F 2816 --L 2 --steps 3 --eval-every 3 --log-every 1 --warmup 1"
# shellcheck disable=SC2086  # flags: words on purpose
./train_cuda ${run_flags[wide]} --diagnostics "$out/gpu_wide" --checkpoint "$out/gpu_wide.ckpt" \
    >>"$out/losses.log" 2>&1

# ./train_cuda's step as CUDA graphs (the runs above) against --no-graph, the same calls
# queued one by one: the same kernels in the same order with the same arguments, so every
# logged loss is the same (0 difference) and the parameters and AdamW moments (Muon's
# momentum) after the last step are the same bytes (the checkpoints after their 1 KB header)
same_run() {  # DIR_A DIR_B
    same_losses "$1" "$2" 0 && cmp <(tail -c +1025 "$1.ckpt") <(tail -c +1025 "$2.ckpt") &&
        echo "  parameters and moments after the last step: the same bytes"
}
for name in none mhc muon variants bench wide; do
    in_budget "./train_cuda --no-graph, $name" 30 || continue
    tiny=("${tiny_flags[@]}"); [ $name = bench ] || [ $name = wide ] && tiny=()
    # shellcheck disable=SC2086  # flags: words on purpose
    ./train_cuda "${tiny[@]}" ${run_flags[$name]} --no-graph --diagnostics "$out/nograph_$name" \
        --checkpoint "$out/nograph_$name.ckpt" >>"$out/losses.log" 2>&1
    check "./train_cuda = ./train_cuda --no-graph, $name (${run_flags[$name]:0:40}...), every loss and the final state bit for bit" \
        losses.log 60 same_run "$out/gpu_$name" "$out/nograph_$name"
    tail -2 "$out/losses.log"
done

# The NCCL path (build/train_cuda_mpi, when MPI is installed here or carried in .carry/openmpi
# by `make carry`): one process under mpirun takes the sharded step (NCCL reduce and
# broadcast on one rank), against ./train_cuda
if [ -x build/train_cuda_mpi ] && command -v mpirun >/dev/null 2>&1; then
    root=(); [ "$(id -u)" -eq 0 ] && root=(--allow-run-as-root)
    echo "mpirun: $(command -v mpirun)" >>"$out/losses.log"
    timeout 120 mpirun "${root[@]}" -np 1 build/train_cuda_mpi "${tiny_flags[@]}" --mode full \
        --diagnostics "$out/nccl_full" >>"$out/losses.log" 2>&1
    check "NCCL path: mpirun -np 1 ./train_cuda_mpi = ./train_cuda, tiny model, full (1e-5)" \
        losses.log 60 same_losses "$out/nccl_full" "$out/gpu_full" 1e-5
    tail -1 "$out/losses.log"
else
    summary+=("skip  NCCL path: no build/train_cuda_mpi or no mpirun here (OpenMPI: install it, or run make carry where it is and take .carry along)")
fi

# ---- 3. speed ------------------------------------------------------------------------------
check "training step speed, our matmul, modes and SPEC's variants (build/bench_cuda --variants)" \
    speed.log 120 build/bench_cuda --variants
check "training step speed, cuBLAS matmul (build/bench_cuda --cublas)" speed.log 120 \
    build/bench_cuda --cublas
in_budget "training step speed, CUDA graphs" 30 &&
    check "training step speed per mode as CUDA graphs against call by call (build/bench_cuda --graph; \"graph\" lines, vs the mode)" \
        speed.log 120 build/bench_cuda --graph
check "the matmul version by version and cuBLAS SGEMM vs the CPU, and their speed (build/bench_gemm)" speed.log 120 \
    build/bench_gemm
# PyTorch on the same GPU: the same model written as a PyTorch user would, checked against
# the reference state files, then eager, torch.compile and torch.compile with CUDA graphs,
# each (mode, way) compiling in its own process, all at once; a way not compiled within the
# budget gets a skip line (dev/bench/bench_pytorch.py). torch.compile's max-autotune, whose
# autotuning took ~28 s per matmul shape on an H200, only outside QUICK, on its own budget.
# torch: this machine's python3 (exit 3: it has no CUDA-enabled torch)
pytorch() {
    local name=$1 limit=$2
    shift 2
    timeout "$limit" python3 dev/bench/bench_pytorch.py --device cuda --steps 30 \
        --logs "$out/pytorch" "$@" >>"$out/speed.log" 2>&1
    local status=$?
    if [ $status -eq 3 ]; then
        summary+=("skip  $name: this machine's python3 has no CUDA-enabled torch")
    elif [ $status -ne 0 ]; then
        summary+=("FAIL  $name (exit $status; see speed.log and pytorch/)")
        failed=1
    else
        summary+=("ok    $name (dev/bench/bench_pytorch.py --device cuda $*)")
    fi
    echo "${summary[-1]}"
}
# Three rounds of 30 steps, the processes taking turns, each way's best round kept: PyTorch's
# CUDA graphs took 3.74 ms a step in one call and 5.22 in another on the same H200; then our
# captured step again, so that both sides are timed within the same minute
pytorch "PyTorch on the GPU: eager, compiled, CUDA graphs" 200 \
    --ways eager,default,reduce-overhead --budget 120 --rounds 3
in_budget "training step speed, CUDA graphs, right after PyTorch" 30 &&
    check "training step speed as CUDA graphs right after PyTorch's (build/bench_cuda --graph)" \
        speed.log 120 build/bench_cuda --graph

# ---- 4. compute-sanitizer ---------------------------------------------------------------
sanitizer=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
# a first run on a tiny program tells whether this machine lets the tool attach at all
if [ ! -x "$sanitizer" ]; then
    summary+=("skip  compute-sanitizer: not installed here (no $sanitizer)")
    echo "${summary[-1]}"
elif "$sanitizer" --tool memcheck build/test_cuda_gpu -tc="embedding*" >"$out/sanitizer_probe.log" 2>&1 ||
   ! grep -qiE "not supported|error 999|unable to|failed to initialize" "$out/sanitizer_probe.log"; then
    # racecheck last: it follows every shared-memory access, so it is by far the slowest
    # (H200, b804e4a: 148 s for the whole-model test, 107 s for the step)
    for tool in memcheck synccheck initcheck racecheck; do
        limit=180; [ $tool = racecheck ] && limit=300
        if [ -n "$quick" ] && [ $tool = racecheck ]; then
            summary+=("skip  compute-sanitizer racecheck (QUICK)")
            echo "${summary[-1]}"
            continue
        fi
        check "compute-sanitizer $tool: the whole-model test" sanitizer.log $limit \
            "$sanitizer" --tool "$tool" --error-exitcode 9 \
            build/test_cuda_gpu -tc="the whole model on the GPU matches the CPU*"
        check "compute-sanitizer $tool: one training step at the bench size" sanitizer.log $limit \
            "$sanitizer" --tool "$tool" --error-exitcode 9 \
            ./train_cuda "${bench_flags[@]}" --steps 1 --eval-every 1 --log-every 1
    done
else
    summary+=("skip  compute-sanitizer: this machine refuses it: $(grep -iE 'not supported|error 999|unable to|failed to initialize' "$out/sanitizer_probe.log" | head -1)")
    echo "${summary[-1]}"
fi
grep -E "ERROR SUMMARY|RACECHECK SUMMARY" "$out/sanitizer.log" 2>/dev/null | sort | uniq -c

# ---- 5. where the time goes, as far as the budget allows --------------------------------------
# The depth attention's kernels (bench_depth: checked against the CPU, then the 17 calls of a
# step timed) and the step (bench_cuda), in the plain build (its block shape, DEPTH_ROWS rows
# of ROW_THREADS threads taking DEPTH_COLS columns at a time, the default) and in each of the
# DEPTH_SHAPES (dev/infra/gpu.mk); then one line per shape, and the shape of the lowest `block`
# overhead, the one to make the default
shape_table=()
for shape in default ${DEPTH_SHAPES:-}; do
    dir=build/shape/$shape; [ "$shape" = default ] && dir=build
    [ -x "$dir/bench_cuda" ] && [ -x "$dir/bench_depth" ] || continue
    in_budget "block shape $shape" 20 || break
    log=shape_$shape.log
    check "depth attention, block shape $shape: against the CPU, timed ($dir/bench_depth)" \
        "$log" 120 "$dir/bench_depth" || continue
    check "training step, block shape $shape ($dir/bench_cuda --rounds 200)" "$log" 120 \
        "$dir/bench_cuda" --rounds 200 || continue
    # the default build's depth-kernel table in full (its log: bench_depth's, then bench_cuda's)
    [ "$shape" = default ] && sed -n '/^bench_cuda:/q; p' "$out/$log" >>"$out/speed.log"
    shape_table+=("$(awk -v shape="$shape" '
        /^none +[0-9.]+ ms\/step/ { none = $2 }
        /^full +[0-9.]+ ms\/step/ { full = $2; full_over = $9 }
        /^block S=4 +[0-9.]+ ms\/step/ { block = $3; block_over = $10 }
        /adds to a step/ { adds[++n] = sprintf("%.0f", $(NF - 5) + $(NF - 4)) }
        END { printf "%-8s %8s %8s %7s %8s %7s %10s %10s", shape, none, full, full_over, block,
                     block_over, adds[1], adds[2] }' "$out/$log")")
done
if [ ${#shape_table[@]} -gt 0 ]; then
    {
        echo "== the depth attention's block shape (rows x threads per row x columns a thread takes"
        echo "   at a time; default: the plain build's): ms/step, overhead vs none, and what the"
        echo "   fused depth kernels add to a step over none's norms (us)"
        printf '%-8s %8s %8s %7s %8s %7s %10s %10s\n' shape none full "" "block" "" "full adds" \
            "block adds"
        printf '%s\n' "${shape_table[@]}"
        # the overheads (block vs none in one process, interleaved) compare across shapes;
        # the ms/step of separate processes less so
        printf '%s\n' "${shape_table[@]}" | awk '
            $6 !~ /%$/ { next }  # a line with a number missing
            { over = $6; sub(/%$/, "", over) }
            best == "" || over + 0 < best + 0 { best = over; shape = $1 }
            $1 == "default" { default_over = $6 }
            END {
                if (shape == "") exit
                hint = ": its RxTxK are DEPTH_ROWS, ROW_THREADS, DEPTH_COLS in cuda/depth_rows.cuh"
                if (shape == "default") hint = ""
                printf "   lowest block S=4 overhead: %s, %s%% (default %s)%s\n", shape, best,
                       default_over, hint
            }'
    } >>"$out/speed.log"
fi
# Before/after on this one GPU: the benchmarks built with cuda/, src/, dev/ and the Makefile
# as at an earlier commit (make carry AB=commit put those files in .carry/ab), in a copy of the tree
# under build/ab, then the current build again right after, so that the two runs are
# neighbours in time. Like for like: the step per mode (bench_cuda, whose flags every
# version has), and the matmul and the depth attention where that commit has their
# benchmarks (make -k builds what it can). Carried on purpose, it runs with QUICK too, before
# the sweeps.
if [ -f .carry/ab/COMMIT ] && in_budget "before/after (.carry/ab)" 90; then
    ab_commit=$(cut -d' ' -f1 .carry/ab/COMMIT)
    rm -rf build/ab && mkdir -p build/ab
    cp -r Makefile train.c src cuda data dev tests build/ab/
    for part in cuda src dev; do
        if [ -d .carry/ab/$part ]; then cp -r .carry/ab/$part/. build/ab/$part/; fi
    done
    if [ -f .carry/ab/Makefile ]; then cp .carry/ab/Makefile build/ab/; fi
    make -C build/ab --no-print-directory -k -j"$(nproc)" build/bench_cuda build/bench_depth \
        build/bench_gemm >>"$out/ab.log" 2>&1
    if check "benchmarks built with cuda/, src/, dev/ and the Makefile as at $ab_commit (build/ab)" ab.log 10 \
        test -x build/ab/build/bench_cuda; then
        for version in "before:build/ab/build" "after:build"; do
            name=${version%%:*} dir=${version#*:}
            echo "== $name ($([ "$name" = before ] && cat .carry/ab/COMMIT || echo this tree))" >>"$out/speed.log"
            check "$name: training step speed ($dir/bench_cuda --rounds 100)" speed.log 120 \
                "$dir/bench_cuda" --rounds 100
            for bench in bench_gemm bench_depth; do
                [ -x build/ab/build/$bench ] || continue
                check "$name: $bench ($dir/$bench)" speed.log 120 "$dir/$bench"
            done
        done
    fi
fi
# How cost grows with size: attnres.c's step and PyTorch's (eager, compiled, CUDA graphs)
# per mode at the sweep's largest size and three others, each dimension grown alone
# (dev/bench/bench_sizes.sh; PyTorch's compiles within 150 s, the largest size's first, then
# PyTorch eager alone; at the bench size its run, check and nine processes, took 104 s on an
# H200)
if sweep_optional "the size sweep (bench-sizes on the GPU)" 230; then
    check "how cost grows with size, attnres.c and PyTorch (DEVICE=cuda dev/bench/bench_sizes.sh)" \
        sizes.log 280 env DEVICE=cuda ROUNDS=10 WAYS=eager,default,reduce-overhead BUDGET=150 \
        SIZES="1024,16,1024 1024,8,128 256,16,128 256,8,1024" dev/bench/bench_sizes.sh
    sed -n '/^== bench-sizes/,$p' "$out/sizes.log" >>"$out/speed.log"
fi
# PyTorch's fourth way, torch.compile(mode="max-autotune-no-cudagraphs"), within its budget
optional "PyTorch compiled with max-autotune" 260 &&
    pytorch "PyTorch on the GPU: compiled with max-autotune" 260 \
        --ways eager,max-autotune-no-cudagraphs --budget 200
# the causal attention's first and tiled versions, side by side (the tiled one is the step's)
optional "causal attention versions" 15 &&
    check "causal attention, version 1 (first) and 2 (tiled) against the CPU and timed (build/bench_attention)" \
        speed.log 120 build/bench_attention
# where one step's GPU time goes, kernel by kernel, in `block` and in `none` (their
# difference is what AttnRes adds; Nsight Compute: a machine whose runtime does not let it
# read the counters gets a skip line, as compute-sanitizer above)
ncu=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
ncu_refused='not supported|ERR_NVGPUCTRPERM|permission|unable to|error 999'
for mode in block none; do
    optional "profile of a $mode step" 90 || break
    if [ ! -x "$ncu" ]; then
        summary+=("skip  profile of a step: Nsight Compute is not installed here (no $ncu)")
    elif timeout 150 python3 dev/bench/profile_cuda.py --mode $mode --ncu "$ncu" >"$out/profile_$mode.log" 2>&1; then
        summary+=("ok    profile of a $mode step, kernel by kernel (dev/bench/profile_cuda.py; profile_$mode.log)")
    elif grep -qiE "$ncu_refused" "$out/profile_$mode.log"; then
        summary+=("skip  profile of a step: this machine refuses ncu: $(grep -iE "$ncu_refused" "$out/profile_$mode.log" | head -1 | cut -c1-160)")
    else
        summary+=("FAIL  profile of a $mode step (dev/bench/profile_cuda.py; see profile_$mode.log)")
        failed=1
    fi
    echo "${summary[-1]}"
    head -30 "$out/profile_$mode.log" >>"$out/speed.log" 2>/dev/null
    [[ "${summary[-1]}" == ok* ]] || break
done
if [ -s "$out/profile_block.log" ] && [ -s "$out/profile_none.log" ] &&
   python3 dev/bench/profile_cuda.py --diff "$out/profile_block.log" "$out/profile_none.log" \
       >"$out/profile_diff.log" 2>&1; then
    cat "$out/profile_diff.log" >>"$out/speed.log"  # where block's overhead goes, per kernel
fi
echo
cat "$out/speed.log" | grep -vE "^\s*$"

echo
echo "gpu-check summary ($gpu; logs in $out):"
printf '  %s\n' "${summary[@]}"
n_ok=$(printf '%s\n' "${summary[@]}" | grep -c '^ok')
n_fail=$(printf '%s\n' "${summary[@]}" | grep -c '^FAIL')
echo "gpu-check: $n_ok passed, $n_fail failed, $((${#summary[@]} - n_ok - n_fail)) skipped"
exit $failed
