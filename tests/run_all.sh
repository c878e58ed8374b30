#!/usr/bin/env bash
# run_all.sh — what `make test` runs after building: every suite, then one summary line
# "N passed, M failed" (doctest test cases and state files counted one each).
set -u
passed=0
failed=0
failures=()

# run a doctest binary; add its test-case counts
doctest_suite() {
    local name=$1; shift
    echo "== $name: $*"
    local log
    log=$(mktemp)
    "$@" 2>&1 | tee "$log"
    local status=${PIPESTATUS[0]}
    local line
    line=$(grep -E '^\[doctest\] test cases:' "$log" | tail -1)
    local p f
    p=$(echo "$line" | sed -E 's/.*\| *([0-9]+) passed.*/\1/')
    f=$(echo "$line" | sed -E 's/.*\| *([0-9]+) failed.*/\1/')
    [[ "$p" =~ ^[0-9]+$ ]] || p=0
    [[ "$f" =~ ^[0-9]+$ ]] || f=0
    if [ "$status" -ne 0 ] && [ "$f" -eq 0 ]; then f=1; fi  # crashed or died early
    passed=$((passed + p))
    failed=$((failed + f))
    [ "$f" -eq 0 ] || failures+=("$name")
    rm -f "$log"
}

# run one command as one test
single() {
    local name=$1; shift
    if "$@" >/tmp/attnres_single.log 2>&1; then
        passed=$((passed + 1))
        echo "ok   $name"
    else
        failed=$((failed + 1))
        failures+=("$name")
        echo "FAIL $name"
        cat /tmp/attnres_single.log
    fi
}

doctest_suite "unit tests" ./test_attnres

echo "== parity with the PyTorch reference (tests/data/*.bin)"
for f in tests/data/*.bin; do
    single "check_state $f" ./check_state "$f"
done

if [ -x ./test_cuda_emu ]; then
    doctest_suite "CUDA kernels vs CPU (emulated, forward thread order)" env CUDA_EMU_ORDER=forward ./test_cuda_emu
    doctest_suite "CUDA kernels vs CPU (emulated, reverse thread order)" env CUDA_EMU_ORDER=reverse ./test_cuda_emu
fi
if [ -x ./test_cuda_emu_asan ]; then
    doctest_suite "CUDA kernels vs CPU (emulated, AddressSanitizer)" ./test_cuda_emu_asan
fi

echo
if [ ${#failures[@]} -gt 0 ]; then
    echo "failed: ${failures[*]}"
fi
echo "${passed} passed, ${failed} failed"
[ "$failed" -eq 0 ]
