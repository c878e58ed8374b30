# bench_sizes_tests.sh — make bench-sizes' choice of PyTorch's BLAS (dev/bench/bench_sizes.sh),
# with nothing timed and no torch. Sourced by tests/run_all.sh, which runs each test function
# below as one test, with a fresh folder in $TEST_DIR.
#
# The script runs in a tree of its own, where build/bench_sizes prints one size (200 ms a step) and
# dev/infra/ensure_deps.sh logs its call, then "installs" the OpenMP build in $STUB_INSTALLS
# (unset: it fails). PYTHON is a stub whose torch "loads" the first libblas.so.3 on
# LD_LIBRARY_PATH (the file holds the BLAS line it prints), else OpenBLAS's pthread build, the
# system's (always with STUB_OWN_BLAS: a torch with a BLAS of its own); with STUB_CORE, that
# BLAS is an OpenBLAS whose core is OPENBLAS_CORETYPE where set (with STUB_CORE_STAYS, never),
# else STUB_CORE; each timing run logs its OPENBLAS_CORETYPE in $TEST_DIR/timed_cores. Its step
# takes 300 ms, so the ratio is 1.50x. The CPU's flags are $TEST_DIR/cpuinfo's (bench_sizes_cpu).
bench_sizes_tree() {
    local tree=$TEST_DIR/tree
    mkdir -p "$tree/dev/bench" "$tree/dev/infra" "$tree/build" "$TEST_DIR/pthread" "$TEST_DIR/openmp"
    cp dev/bench/bench_sizes.sh "$tree/dev/bench/"
    cat >"$tree/build/bench_sizes" <<'STUB'
#!/usr/bin/env bash
echo "size d=256 L=8 T=128: H=8 G=4 F=704 V=256 B=8, 3.00 GFLOP/step counted; matmul (1024 x 256)(256 x 704): 300.0 GFLOP/s"
echo "none       attnres.c                      200.00 ms/step      5120 tokens/s     15.0 GFLOP/s   5.0% of the matmul"
STUB
    cat >"$tree/dev/infra/ensure_deps.sh" <<'STUB'
#!/usr/bin/env bash
echo "ensure_deps.sh $*" >>"$TEST_DIR/ensure_deps.log"
[ -n "${STUB_INSTALLS:-}" ] || { echo "error: missing packages; run: sudo apt-get install -y libopenblas0-openmp"; exit 1; }
mkdir -p "$STUB_INSTALLS" && echo "OpenBLAS 0.3.21, OpenMP build: $STUB_INSTALLS/libblas.so.3" >"$STUB_INSTALLS/libblas.so.3"
STUB
    cat >"$TEST_DIR/python" <<'STUB'
#!/usr/bin/env bash
[ "$1" = -c ] && exit 0  # import torch
case "$*" in
    *--check-only*)
        lib=${LD_LIBRARY_PATH%%:*}/libblas.so.3
        if [ -n "${LD_LIBRARY_PATH:-}" ] && [ -f "$lib" ] && [ -z "${STUB_OWN_BLAS:-}" ]; then
            echo "BLAS: $(cat "$lib")"
        else
            echo "BLAS: OpenBLAS 0.3.21, pthread build: /usr/lib/x86_64-linux-gnu/openblas-pthread/libblas.so.3"
        fi
        if [ -n "${STUB_CORE:-}" ]; then
            [ -n "${STUB_CORE_STAYS:-}" ] && echo "BLAS core: $STUB_CORE" || echo "BLAS core: ${OPENBLAS_CORETYPE:-$STUB_CORE}"
        fi ;;
    *)
        echo "${OPENBLAS_CORETYPE:-}" >>"$TEST_DIR/timed_cores"
        echo "size d=256 L=8 T=128: H=8 G=4 F=704 V=256 B=8, 3.00 GFLOP/step counted; torch.mm (1024 x 256)(256 x 704): 200.0 GFLOP/s"
        echo "best none       d=256 L=8 T=128:    300.00 ms/step     10.0 GFLOP/s   5.0% of torch.mm (eager)" ;;
esac
STUB
    echo "OpenBLAS 0.3.21, pthread build: $TEST_DIR/pthread/libblas.so.3" >"$TEST_DIR/pthread/libblas.so.3"
    echo "OpenBLAS 0.3.21, OpenMP build: $TEST_DIR/openmp/libblas.so.3" >"$TEST_DIR/openmp/libblas.so.3"
    chmod +x "$tree/build/bench_sizes" "$tree/dev/infra/ensure_deps.sh" "$TEST_DIR/python"
    bench_sizes_cpu fpu sse sse2
}
bench_sizes_cpu() {  # FLAG...: the CPU's flags, as /proc/cpuinfo gives them
    printf 'processor\t: 0\nflags\t\t: %s\n' "$*" >"$TEST_DIR/cpuinfo"
}
bench_sizes_blas() {  # VAR=VALUE ...: bench_sizes.sh's output in $TEST_DIR/out, its status returned
    rm -f "$TEST_DIR/timed_cores"
    env -u TORCH_BLAS -u LD_LIBRARY_PATH -u DEVICE -u OPENBLAS_CORETYPE TEST_DIR="$TEST_DIR" \
        PYTHON="$TEST_DIR/python" CPUINFO="$TEST_DIR/cpuinfo" SIZES=256,8,128 "$@" \
        "$TEST_DIR/tree/dev/bench/bench_sizes.sh" >"$TEST_DIR/out" 2>&1
}
bench_sizes_blas_has() {  # TEXT...: each a line of the output; else the output, and status 1
    local text
    for text; do
        grep -qxF -- "$text" "$TEST_DIR/out" || { echo "no line \"$text\" in:"; cat "$TEST_DIR/out"; return 1; }
    done
}
bench_sizes_row() {  # RATIO: the table's row has that ratio column; else the output, and status 1
    grep -qE "^256,8,128 +none +200\.00 .* 300\.00 .*\(eager\) +$1\$" "$TEST_DIR/out" ||
        { echo "no row with the ratio $1 in:"; cat "$TEST_DIR/out"; return 1; }
}
bench_sizes_runs_pytorch_on_openmp_blas() {
    local dir=$TEST_DIR
    bench_sizes_tree
    # installed: chosen, named beside the ratio, ensure_deps not asked
    bench_sizes_blas OPENMP_BLAS="$dir/openmp" && bench_sizes_row "1\.50x" && bench_sizes_blas_has \
        "ratio: PyTorch's ms/step over attnres.c's, PyTorch on OpenBLAS 0.3.21, OpenMP build ($dir/openmp/libblas.so.3)" ||
        return 1
    [ ! -e "$dir/ensure_deps.log" ] || { echo "ensure_deps.sh ran with the OpenMP build installed"; return 1; }
    # missing: ensure_deps.sh blas installs it, and it is chosen
    bench_sizes_blas OPENMP_BLAS="$dir/installed" STUB_INSTALLS="$dir/installed" &&
        grep -qx "ensure_deps.sh blas" "$dir/ensure_deps.log" && bench_sizes_row "1\.50x" && bench_sizes_blas_has \
            "ratio: PyTorch's ms/step over attnres.c's, PyTorch on OpenBLAS 0.3.21, OpenMP build ($dir/installed/libblas.so.3)" ||
        return 1
    # missing and not installed: exit 1 before timing anything, naming TORCH_BLAS
    bench_sizes_blas OPENMP_BLAS="$dir/absent"
    local status=$?
    [ $status -eq 1 ] && bench_sizes_blas_has \
        "error: PyTorch's matmuls want OpenBLAS's OpenMP build (above), or TORCH_BLAS=DIR: the folder of the libblas.so.3 to run them on" &&
        ! grep -q "ms/step" "$dir/out" || { echo "status $status"; cat "$dir/out"; return 1; }
}
bench_sizes_no_ratio_on_a_slow_blas() {
    local dir=$TEST_DIR
    bench_sizes_tree
    # a torch that keeps its pthread build: no ratio, the BLAS and the fixing TORCH_BLAS named
    bench_sizes_blas OPENMP_BLAS="$dir/openmp" STUB_OWN_BLAS=1 && bench_sizes_row - && bench_sizes_blas_has \
        "no ratio: PyTorch ran on OpenBLAS 0.3.21, pthread build (/usr/lib/x86_64-linux-gnu/openblas-pthread/libblas.so.3), a BLAS that makes it slow; rerun with TORCH_BLAS=$dir/openmp" ||
        return 1
    # the pthread build that TORCH_BLAS names: honoured, named beside the ratio
    bench_sizes_blas OPENMP_BLAS="$dir/openmp" TORCH_BLAS="$dir/pthread" && bench_sizes_row "1\.50x" && bench_sizes_blas_has \
        "ratio: PyTorch's ms/step over attnres.c's, PyTorch on OpenBLAS 0.3.21, pthread build (TORCH_BLAS=$dir/pthread: $dir/pthread/libblas.so.3)"
}
bench_sizes_timed_with() {  # CORE: every PyTorch timing run had OPENBLAS_CORETYPE=CORE ("": unset)
    [ -s "$TEST_DIR/timed_cores" ] && [ -z "$(grep -vxF -- "$1" "$TEST_DIR/timed_cores")" ] ||
        { echo "PyTorch timed with OPENBLAS_CORETYPE: $(sort -u "$TEST_DIR/timed_cores" | paste -sd,), not \"$1\""; return 1; }
}
# OpenBLAS's core: a generic one (Prescott) on a CPU with AVX-512 or AVX2 is replaced by
# SkylakeX or Haswell for PyTorch's runs, said in a line and beside the ratio; OpenBLAS's own
# wide core, or one OPENBLAS_CORETYPE names, is kept and named; a generic core that stays, no ratio
bench_sizes_names_openblas_core() {
    local dir=$TEST_DIR ran="ratio: PyTorch's ms/step over attnres.c's, PyTorch on OpenBLAS 0.3.21, OpenMP build"
    bench_sizes_tree
    bench_sizes_cpu fpu sse2 avx avx2 fma avx512f avx512dq avx512bw avx512vl
    bench_sizes_blas OPENMP_BLAS="$dir/openmp" STUB_CORE=Prescott && bench_sizes_row "1\.50x" && bench_sizes_blas_has \
        "PyTorch's OpenBLAS took this CPU for a generic Prescott core: PyTorch runs with OPENBLAS_CORETYPE=SkylakeX (the CPU has AVX-512)" \
        "$ran, core SkylakeX (OPENBLAS_CORETYPE, set here) ($dir/openmp/libblas.so.3)" && bench_sizes_timed_with SkylakeX ||
        return 1
    bench_sizes_cpu fpu sse2 avx avx2 fma
    bench_sizes_blas OPENMP_BLAS="$dir/openmp" STUB_CORE=Prescott && bench_sizes_row "1\.50x" && bench_sizes_blas_has \
        "PyTorch's OpenBLAS took this CPU for a generic Prescott core: PyTorch runs with OPENBLAS_CORETYPE=Haswell (the CPU has AVX2)" \
        "$ran, core Haswell (OPENBLAS_CORETYPE, set here) ($dir/openmp/libblas.so.3)" && bench_sizes_timed_with Haswell ||
        return 1
    # OpenBLAS's own choice, and the environment's, kept and named
    bench_sizes_cpu fpu sse2 avx avx2 fma avx512f avx512dq avx512bw avx512vl
    bench_sizes_blas OPENMP_BLAS="$dir/openmp" STUB_CORE=Cooperlake && bench_sizes_row "1\.50x" &&
        bench_sizes_blas_has "$ran, core Cooperlake ($dir/openmp/libblas.so.3)" && bench_sizes_timed_with "" &&
        ! grep -q "took this CPU" "$dir/out" || return 1
    bench_sizes_blas OPENMP_BLAS="$dir/openmp" STUB_CORE=Cooperlake OPENBLAS_CORETYPE=Haswell && bench_sizes_row "1\.50x" &&
        bench_sizes_blas_has "$ran, core Haswell (OPENBLAS_CORETYPE) ($dir/openmp/libblas.so.3)" &&
        bench_sizes_timed_with Haswell || return 1
    # a generic core that stays (the environment's, or one OPENBLAS_CORETYPE does not move): no ratio
    bench_sizes_blas OPENMP_BLAS="$dir/openmp" STUB_CORE=Cooperlake OPENBLAS_CORETYPE=Prescott && bench_sizes_row - &&
        bench_sizes_blas_has "no ratio: PyTorch ran on OpenBLAS 0.3.21, OpenMP build, core Prescott (OPENBLAS_CORETYPE) ($dir/openmp/libblas.so.3), a generic core on a CPU with AVX-512; rerun with OPENBLAS_CORETYPE=SkylakeX" ||
        return 1
    bench_sizes_blas OPENMP_BLAS="$dir/openmp" STUB_CORE=Prescott STUB_CORE_STAYS=1 && bench_sizes_row - &&
        grep -q "^no ratio: .*core Prescott (OPENBLAS_CORETYPE, set here)" "$dir/out" || { cat "$dir/out"; return 1; }
    # on a CPU without AVX2, Prescott is its core: kept, and the ratio given
    bench_sizes_cpu fpu sse sse2 sse3
    bench_sizes_blas OPENMP_BLAS="$dir/openmp" STUB_CORE=Prescott && bench_sizes_row "1\.50x" &&
        bench_sizes_blas_has "$ran, core Prescott ($dir/openmp/libblas.so.3)" && bench_sizes_timed_with ""
}
