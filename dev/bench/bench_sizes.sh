#!/usr/bin/env bash
# bench_sizes.sh — what `make bench-sizes` runs: how a training step's cost grows with the
# model. At each size d,L,T: attnres.c's step per mode (build/bench_sizes: ms/step, tokens/s,
# GFLOP/s, its share of the matmul's rate at that size), then PyTorch's
# (dev/bench/bench_pytorch.py: the same model written as a PyTorch user would, checked once
# against the reference state files first), the two taking turns size by size; then one
# table of both and their ratio.
#
#   SIZES="d,L,T ..."  the sizes (default: the bench model, then each of d, L and T grown
#                      alone, which fits 10 minutes on 2 cores); SIZES=all: d in 256 512 1024,
#                      L in 8 16, T in 128 512 1024 (hours on 2 cores)
#   DEVICE=cuda        the GPU (build/bench_sizes_cuda, PyTorch's --device cuda; make gpu-check)
#   PYTHON             the python with torch (default /usr/bin/python3 on the CPU, Debian's
#                      torch; python3 on the GPU)
#   WAYS               PyTorch's ways (default eager; e.g. eager,default,reduce-overhead)
#   BUDGET             seconds for PyTorch's compiles over the whole sweep (0: no limit); past
#                      it, PyTorch eager alone
#   ROUNDS             attnres.c's rounds and PyTorch's steps per mode (default 3)
#   TORCH_BLAS=DIR     PyTorch's matmuls through DIR/libblas.so.3. By default on the CPU,
#                      OpenBLAS's OpenMP build (libopenblas0-openmp), installed when missing
#                      (dev/infra/ensure_deps.sh blas): the pthread build's threads spin
#                      against torch's, and the reference BLAS is ~30 times slower. The table
#                      names the BLAS PyTorch ran on; on one of those two (or the
#                      single-threaded build) that TORCH_BLAS did not name, it gives no ratio
#                      but one line with the TORCH_BLAS that fixes it
#   OPENMP_BLAS=DIR    where that OpenMP build is (default /usr/lib/*/openblas-openmp)
#   OPENBLAS_CORETYPE  the kernels OpenBLAS runs (its own choice where unset). The table names
#                      the core PyTorch's OpenBLAS ran; where OpenBLAS took a CPU with AVX-512
#                      or AVX2 for a generic core without AVX2 (Prescott: Debian's 0.3.21 on
#                      Sapphire Rapids), PyTorch runs with OPENBLAS_CORETYPE=SkylakeX or
#                      Haswell, said in a line; a generic core that stays (OPENBLAS_CORETYPE
#                      set so), no ratio
#   CPUINFO=FILE       where the CPU's flags are read (default /proc/cpuinfo)
set -u
cd "$(dirname "$0")/../.." || exit 1
device=${DEVICE:-cpu}
rounds=${ROUNDS:-3}
ways=${WAYS:-eager}
budget=${BUDGET:-0}
budget=${budget%.*}  # whole seconds
sizes=${SIZES:-"256,8,128 256,8,512 256,8,1024 256,16,128 512,8,128 1024,8,128"}
if [ "$sizes" = all ]; then
    sizes=$(for d in 256 512 1024; do for L in 8 16; do for T in 128 512 1024; do
        echo "$d,$L,$T"; done; done; done)
fi
if [ "$device" = cuda ]; then
    bench=build/bench_sizes_cuda python=${PYTHON:-python3}
else
    bench=build/bench_sizes python=${PYTHON:-/usr/bin/python3}
fi
[ -x "$bench" ] || { echo "error: no $bench (make $bench)"; exit 1; }

# PyTorch's BLAS: TORCH_BLAS's, else on the CPU (where torch imports) OpenBLAS's OpenMP build
openmp_blas() {  # the folder of OpenBLAS's OpenMP build, if it is installed
    local lib
    for lib in ${OPENMP_BLAS:-/usr/lib/*/openblas-openmp}/libblas.so.3; do
        [ -e "$lib" ] && { dirname "$lib"; return 0; }
    done
    return 1
}
blas=${TORCH_BLAS:-}
if [ -z "$blas" ] && [ "$device" = cpu ] && "$python" -c "import torch" 2>/dev/null; then
    blas=$(openmp_blas) || { dev/infra/ensure_deps.sh blas && blas=$(openmp_blas); } || {
        echo "error: PyTorch's matmuls want OpenBLAS's OpenMP build (above), or TORCH_BLAS=DIR:" \
             "the folder of the libblas.so.3 to run them on"
        exit 1
    }
fi
if [ -n "$blas" ]; then
    [ -e "$blas/libblas.so.3" ] || { echo "error: TORCH_BLAS=$blas holds no libblas.so.3"; exit 1; }
    export LD_LIBRARY_PATH="$blas${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
fi
log=$(mktemp)
trap 'rm -f "$log"' EXIT
start=$SECONDS

# PyTorch: the header (torch, BLAS or device) and the check, once; without torch, ours alone
torch_ok=1
"$python" dev/bench/bench_pytorch.py --device "$device" --check-only >"$log.check" 2>&1
status=$?
grep -vE "^check [a-z]" "$log.check"
torch_blas=$(sed -n 's/^BLAS: //p' "$log.check")  # what it is: where it is
torch_core=$(sed -n 's/^BLAS core: //p' "$log.check")  # OpenBLAS's kernels, if it is OpenBLAS
rm -f "$log.check"
if [ $status -ne 0 ]; then
    echo "bench-sizes: PyTorch left out (bench_pytorch.py --check-only exited $status)"
    torch_ok=0
fi

# OpenBLAS's cores with AVX2 kernels or wider (0.3.21's x86_64 list); any other is generic
# for a CPU that has AVX2: the kernels such a CPU calls for are SkylakeX's with AVX-512 (F and
# BW), Haswell's with AVX2, printed by cpu_core
wide_core() { case "$1" in Haswell | Zen | SkylakeX | Cooperlake | SapphireRapids) return 0 ;; esac; return 1; }
cpu_core() {
    local flags
    flags=" $(grep -m1 '^flags' "${CPUINFO:-/proc/cpuinfo}" | cut -d: -f2) "
    if [[ "$flags" == *" avx512f "* && "$flags" == *" avx512bw "* ]]; then echo "SkylakeX AVX-512"
    elif [[ "$flags" == *" avx2 "* ]]; then echo "Haswell AVX2"; fi
}
want_core=$(cpu_core)
core_set=${OPENBLAS_CORETYPE:+OPENBLAS_CORETYPE}  # "": OpenBLAS's own choice
if [ $torch_ok -eq 1 ] && [ -n "$torch_core" ] && [ -n "$want_core" ] && ! wide_core "$torch_core" &&
    [ -z "${OPENBLAS_CORETYPE:-}" ]; then
    echo "PyTorch's OpenBLAS took this CPU for a generic $torch_core core: PyTorch runs with" \
         "OPENBLAS_CORETYPE=${want_core% *} (the CPU has ${want_core#* })"
    export OPENBLAS_CORETYPE=${want_core% *}
    core_set="OPENBLAS_CORETYPE, set here"
    torch_core=$("$python" dev/bench/bench_pytorch.py --device "$device" --check-only --no-check 2>/dev/null |
                 sed -n 's/^BLAS core: //p')
fi
for size in $sizes; do
    "$bench" --size "$size" --rounds "$rounds" | tee -a "$log" | grep -v "^bench_sizes"
    [ "${PIPESTATUS[0]}" -eq 0 ] || { echo "error: $bench --size $size failed"; exit 1; }
    [ $torch_ok -eq 1 ] || continue
    left=0 size_ways=$ways  # PyTorch's budget: what is left of BUDGET (0: no limit)
    if [ "$budget" -gt 0 ]; then
        left=$((budget - (SECONDS - start)))
        if [ $left -le 0 ] && [ "$ways" != eager ]; then
            echo "skip PyTorch's compiled ways at $size: the budget ($budget s) is spent (eager alone)"
            left=0 size_ways=eager
        fi
    fi
    "$python" dev/bench/bench_pytorch.py --device "$device" --no-check --size "$size" \
        --steps "$rounds" --ways "$size_ways" --budget "$left" 2>&1 |
        grep -E "^(size|none|full|block|best|skip|FAIL)" | sed 's/^size /PyTorch at size /' | tee -a "$log"
done

# the ratio names the BLAS PyTorch ran on; on one known to be slow that TORCH_BLAS did not
# name, no ratio: one line naming it and the TORCH_BLAS that fixes it
ratio=1 note=""
if [ $torch_ok -eq 1 ] && [ -n "$torch_blas" ]; then
    ran_on="${torch_blas%%: *}${torch_core:+, core $torch_core${core_set:+ ($core_set)}}"
    ran_on+=" (${TORCH_BLAS:+TORCH_BLAS=$TORCH_BLAS: }${torch_blas#*: })"
    note="ratio: PyTorch's ms/step over attnres.c's, PyTorch on $ran_on"
    case "$torch_blas" in
        *"pthread build: "* | *"single-threaded build: "* | "reference BLAS: "*)
            if [ -z "${TORCH_BLAS:-}" ]; then
                ratio=0
                note="no ratio: PyTorch ran on $ran_on, a BLAS that makes it slow; rerun with"
                note+=" TORCH_BLAS=$(openmp_blas || echo "DIR, a folder with OpenBLAS's OpenMP build's libblas.so.3")"
            fi ;;
    esac
    if [ $ratio -eq 1 ] && [ -n "$torch_core" ] && [ -n "$want_core" ] && ! wide_core "$torch_core"; then
        ratio=0
        note="no ratio: PyTorch ran on $ran_on, a generic core on a CPU with ${want_core#* };"
        note+=" rerun with OPENBLAS_CORETYPE=${want_core% *}"
    fi
fi

# the table: per size and mode, both sides and their ratio (PyTorch's best way)
echo
echo "== bench-sizes ($device, $((SECONDS - start)) s): ms/step, GFLOP/s and share of each side's own matmul rate"
awk -v ratio=$ratio -v note="$note" '
    function num(unit,   i) { for (i = 2; i <= NF; i++) if ($i == unit) return $(i - 1); return "" }
    function per_token(ms, n) { return n > 0 ? sprintf("%.4f", ms / n) : "-" }
    /^size d=/ { split($2, a, "="); split($3, b, "="); split($4, c, "[=:]"); size = a[2] "," b[2] "," c[2]
                 if (!(size in seen)) { seen[size] = 1; order[++n] = size }
                 if (match($0, /B=[0-9]+/)) tokens[size] = substr($0, RSTART + 2, RLENGTH - 2) * c[2]
                 rate[size] = num("GFLOP/s,"); cold[size] = num("with") }
    /^PyTorch at size d=/ { torch_rate[size] = num("GFLOP/s,"); torch_cold[size] = num("with") }
    /^(none|full|block S=4) / {
        mode = ($1 == "block") ? "block" : $1
        key = size SUBSEP mode
        if ($0 ~ / attnres\.c /) { ours[key] = num("ms/step"); ours_g[key] = num("GFLOP/s"); ours_s[key] = num("of")
                                   ours_m[key] = num("MiB") }
        else { way = (mode == "block") ? $3 : $2; torch_m[key SUBSEP way] = num("MiB") }
    }
    /^best / {
        mode = ($2 == "block") ? "block" : $2
        key = size SUBSEP mode
        torch[key] = num("ms/step"); torch_g[key] = num("GFLOP/s"); torch_s[key] = num("of")
        torch_way[key] = $NF
        w = $NF; gsub(/[()]/, "", w); torch_mem[key] = torch_m[key SUBSEP w]
    }
    END {
        printf "%-13s %-6s %10s %8s %8s %8s %7s   %10s %8s %8s %8s %7s %-29s %7s\n", "d,L,T", "mode",
               "attnres.c", "ms/tok", "MiB", "GFLOP/s", "matmul", "PyTorch", "ms/tok", "MiB", "GFLOP/s",
               "matmul", " (its best way)", "ratio"
        for (i = 1; i <= n; i++) for (m = 1; m <= 3; m++) {
            mode = (m == 1) ? "none" : (m == 2) ? "full" : "block"
            key = order[i] SUBSEP mode
            if (!(key in ours)) continue
            tok = (order[i] in tokens) ? tokens[order[i]] : 0
            t = (key in torch) ? sprintf("%10.2f %8s %8s %8.1f %7s %-29s %7s", torch[key], per_token(torch[key], tok),
                                         torch_mem[key] == "" ? "-" : torch_mem[key], torch_g[key], torch_s[key],
                                         torch_way[key], ratio ? sprintf("%6.2fx", torch[key] / ours[key]) : "-") \
                               : "         -"
            printf "%-13s %-6s %10.2f %8s %8s %8.1f %6s   %s\n", order[i], mode, ours[key], per_token(ours[key], tok),
                   ours_m[key] == "" ? "-" : ours_m[key], ours_g[key], ours_s[key], t
        }
        if (note != "") print note
        for (i = 1; i <= n; i++) {  # the CPU measures each matmul out of cache too
            if (cold[order[i]] == "") continue
            if (!printed++)
                print "\nthe matmul rates, GFLOP/s: in cache / its operands out of cache " \
                      "(bench_sizes.c, matmul_rate_cold)"
            s = order[i]
            t = (s in torch_rate) ? sprintf(", torch.mm %s / %s", torch_rate[s], torch_cold[s]) : ""
            printf "%-13s attnres.c %s / %s%s\n", s, rate[s], cold[s], t
        }
    }' "$log"
