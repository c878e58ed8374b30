#!/usr/bin/env bash
# run_all.sh LEVEL — what `make test` (LEVEL test) and `make check` (LEVEL check) run after
# building: every suite of the level, then its time, the names of the failed cases and one
# summary line "N passed, M failed" (doctest test cases and state files counted one each).
#   test:  the unit tests, every parity state file, the tools, gradcheck, the docs' limits, the
#          signatures' width and one emulator pass of the CUDA kernels: a newcomer's few minutes
#   check: all of that, then the emulator's other thread order and block shapes, the
#          sanitizers, ./train_cuda's step emulated, data parallel over MPI, ./train_cuda
# run_all.sh --list: the name of every shell check below (`single`), one a line.
# run_all.sh --one NAME: build what the shell check NAME needs (its group's `needs`), run it
#   alone and print its output; exit 0 when it passed, 1 when it failed, 2 when no shell check
#   has that name (tests/test_one.sh, `make test-one NAME=...`, runs it so).
set -u
level=${1:-check}
mode=run
one_name=""
case "$level" in
    test | check) ;;
    --list) mode=list ;;
    --one) mode=one; one_name=${2:-} ;;
    *) echo "usage: tests/run_all.sh [test|check], tests/run_all.sh --list, tests/run_all.sh --one NAME" >&2; exit 2 ;;
esac
start=$(date +%s)
passed=0
failed=0
failures=()
running() { [ "$mode" = run ]; }

# a group of single tests: its heading, and the time the group before it took
section_name=""
section_start=$SECONDS
section_end() {
    running || return 0
    [ -z "$section_name" ] || echo "-- $section_name: $((SECONDS - section_start)) s"
    section_name=""
}
section() {
    section_end
    running && echo "== $1"
    section_name=$1
    section_start=$SECONDS
    check_needs=()
}

# needs TARGET...: the make targets the next single tests run (built by --one before its check;
# make test and make check build them all first)
check_needs=()
needs() { check_needs=("$@"); }

# run a doctest binary; add its test-case counts, and each failed case's name to the failures
doctest_suite() {
    running || return 0
    local name=$1; shift
    section_end
    echo "== $name: $*"
    local log t0=$SECONDS
    log=$(mktemp)
    "$@" 2>&1 | tee "$log"
    local status=${PIPESTATUS[0]}
    echo "-- $name: $((SECONDS - t0)) s"
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
    if [ "$f" -ne 0 ]; then
        # doctest heads what it reports of a case with "TEST CASE:  NAME"; a failed check, a
        # crash or an exception then says "ERROR:" or "FATAL ERROR:"
        local case_name cases=0
        while IFS= read -r case_name; do
            failures+=("$case_name ($name)")
            cases=$((cases + 1))
        done < <(awk '/^TEST CASE:  / { name = substr($0, 13) }
                      /: (FATAL )?ERROR: / && name != "" && !seen[name]++ { print name }' "$log")
        [ "$cases" -gt 0 ] || failures+=("$name: exit status $status, no failed case named")
    fi
    rm -f "$log"
}

# run one command as one test; it may keep files in $TEST_DIR, a fresh folder removed after it.
# --list prints its name; --one runs it alone when it has the name asked for, and exits
single() {
    local name=$1; shift
    if [ "$mode" = list ]; then
        printf '%s\n' "$name"
        return 0
    fi
    if [ "$mode" = one ]; then
        [ "$name" = "$one_name" ] || return 0
        if [ ${#check_needs[@]} -gt 0 ]; then
            make --no-print-directory -j2 "${check_needs[@]}" >/dev/null ||
                { echo "error: make ${check_needs[*]} failed" >&2; exit 1; }
        fi
        echo "== $name"
    fi
    local log
    log=$(mktemp)  # one per test: runs in other checkouts at the same time keep theirs
    TEST_DIR=$(mktemp -d)
    if "$@" >"$log" 2>&1; then
        passed=$((passed + 1))
        echo "ok   $name"
    else
        failed=$((failed + 1))
        failures+=("$name")
        echo "FAIL $name"
        cat "$log"
    fi
    rm -f "$log"
    rm -rf "$TEST_DIR"
    if [ "$mode" = one ]; then
        [ "$failed" -eq 0 ]
        exit
    fi
}

# make check builds every binary it runs: one that is missing is a failure, not a skipped suite
# (--list and --one take every group: --one builds what its check needs)
built() {
    running || return 0
    [ -x "$1" ] && return 0
    failed=$((failed + 1))
    failures+=("$1 was not built")
    echo "FAIL $1 was not built"
    return 1
}
check_level() { [ "$level" = check ] || ! running; }
# the level's time, the failed tests' names (one a line) and the closing line; the exit
# status. With --list, nothing; with --one, reached only when no check had the name: exit 2
summary() {
    [ "$mode" = list ] && exit 0
    if [ "$mode" = one ]; then
        echo "error: no shell check is named \"$one_name\"" >&2
        exit 2
    fi
    section_end
    echo
    echo "make $level: $(($(date +%s) - start)) s of tests"
    if [ ${#failures[@]} -gt 0 ]; then
        echo "failed (make test-one NAME=\"...\" runs one alone):"
        printf '  %s\n' "${failures[@]}"
    fi
    echo "${passed} passed, ${failed} failed"
    [ "$failed" -eq 0 ]
    exit
}

doctest_suite "unit tests" ./test_attnres
# the safetensors reader on truncated and flipped files, under AddressSanitizer + UBSan
if check_level && built build/asan/test_safetensors; then
    doctest_suite "safetensors reader (AddressSanitizer)" build/asan/test_safetensors
fi

section "parity with the PyTorch reference (tests/data/*.bin)"
needs check_state build/gradcheck
for f in tests/data/*.bin; do
    single "check_state $f" ./check_state "$f"
done

# a bad state file, or a path that is none (a text, a directory, a device): exit status 2
# and one line naming the problem. Slots [13..18] hold SPEC's variant switches: an unknown
# value, a switch the mode does not have, a head count that does not divide d, or a
# ruled-out combination is a bad file; so is [19] (mHC-lite's streams) outside 2 .. 4, or with
# a block size.
check_state_refuses() {
    local dir=$TEST_DIR out status
    set_slot() {  # FILE SLOT BYTE: int32 slot SLOT of the header = BYTE
        printf "\\$(printf '%03o' "$3")" | dd of="$1" bs=1 seek=$((4 * $2)) conv=notrunc 2>/dev/null
    }
    cp tests/data/full_gqa_rand.bin "$dir/score.bin" && set_slot "$dir/score.bin" 13 2
    cp tests/data/none_mha_rand.bin "$dir/mode.bin" && set_slot "$dir/mode.bin" 13 1
    cp tests/data/full_gqa_rand.bin "$dir/heads.bin" && set_slot "$dir/heads.bin" 16 3
    cp tests/data/full_sigmoid_rand.bin "$dir/combination.bin" && set_slot "$dir/combination.bin" 18 1
    cp tests/data/block_s2_mqa_rand.bin "$dir/window.bin" && set_slot "$dir/window.bin" 17 2
    cp tests/data/mhc_m2_gqa_rand.bin "$dir/streams.bin" && set_slot "$dir/streams.bin" 19 5
    cp tests/data/block_s2_mqa_rand.bin "$dir/streams_block.bin" && set_slot "$dir/streams_block.bin" 19 2
    cp tests/data/none_muon_rand.bin "$dir/optimizer.bin" && set_slot "$dir/optimizer.bin" 20 2
    cp tests/data/none_mha_rand.bin "$dir/momentum.bin" && set_slot "$dir/momentum.bin" 20 1 &&
        printf '\x00\x00\x80\x3f' | dd of="$dir/momentum.bin" bs=1 seek=$((1024 + 4 * 7)) conv=notrunc 2>/dev/null
    head -c 1000 tests/data/none_mha_rand.bin >"$dir/short.bin"
    cp tests/data/none_mha_rand.bin "$dir/magic.bin" && set_slot "$dir/magic.bin" 0 0
    echo "a text, shorter than a header" >"$dir/text.bin"
    local ok=0
    refused() {  # PATH MESSAGE: ./check_state PATH exits 2 saying "error: state file PATH: MESSAGE"
        out=$(./check_state "$1" 2>&1 >/dev/null)
        status=$?
        [ "$status" -eq 2 ] && [ "$out" = "error: state file $1: $2" ] || { echo "$1: status $status: $out"; ok=1; }
    }
    refused "$dir/score.bin" "invalid shape or variant: --depth-score: unknown value 2"
    refused "$dir/mode.bin" "invalid shape or variant: --depth-score sigmoid applies to AttnRes (mode full or block), not mode none"
    refused "$dir/heads.bin" "invalid shape or variant: --depth-heads 3 must be 0 (one head) or a positive divisor of d=16"
    refused "$dir/combination.bin" "invalid shape or variant: --mixing replaces the depth attention: it does not combine with --depth-score sigmoid"
    refused "$dir/window.bin" "invalid shape or variant: --depth-window applies to mode full only"
    refused "$dir/streams.bin" "invalid shape or variant: --streams must be 2 .. 4 (got 5)"
    refused "$dir/streams_block.bin" "invalid shape or variant: --streams is for --mode mhc, not an AttnRes mode (block size 2)"
    refused "$dir/optimizer.bin" "header [20] = 2 with Muon's momentum 0.95 at float [7] is no optimiser (0 AdamW with 0, 1 Muon with [0, 1))"
    refused "$dir/momentum.bin" "header [20] = 1 with Muon's momentum 1 at float [7] is no optimiser (0 AdamW with 0, 1 Muon with [0, 1))"
    refused "$dir/short.bin" "truncated (no complete 256-int header)"
    refused "$dir/magic.bin" "wrong magic number (not a reference state file)"
    refused "$dir/text.bin" "wrong magic number (not a reference state file)"
    # what is no state file at all: a directory, and a device that reads zeros without end
    refused "$dir" "is a directory, not a state file"
    refused /dev/zero "not a regular file (a device, pipe or socket)"
    return $ok
}
single "check_state refuses a bad state file (variant slots, streams slot, optimiser slots, truncated, wrong magic, a text, a directory, /dev/zero): exit 2" check_state_refuses

# --out writes OUT.tmp and renames it over OUT: a pipe (or a device such as /dev/null) at OUT
# is refused with exit 2, not replaced by a file
check_state_out_keeps_a_pipe() {
    local pipe=$TEST_DIR/pipe out status
    rm -f "$pipe" && mkfifo "$pipe" || return 1
    out=$(./check_state tests/data/none_mha_rand.bin --out "$pipe" 2>&1 >/dev/null)
    status=$?
    [ "$status" -eq 2 ] && [ "$out" = "error: cannot write $pipe: it exists and is not a regular file" ] &&
        [ -p "$pipe" ] || { echo "status $status: $out; still a pipe: $([ -p "$pipe" ] && echo yes || echo no)"; return 1; }
}
single "check_state --out onto a pipe: refused (exit 2), the pipe kept" check_state_out_keeps_a_pipe

# --help (and -h) prints the usage on stdout and exits 0 in the tools a reader runs by hand
tools_help() {
    local ok=0 tool out
    for tool in ./check_state ./build/gradcheck; do
        for flag in --help -h; do
            out=$($tool $flag 2>&1) && [[ "$out" == usage:* ]] || { echo "$tool $flag: $out"; ok=1; }
        done
    done
    return $ok
}
single "check_state and gradcheck: --help prints the usage, exit 0" tools_help

section "every backward against finite differences (the table of make gradcheck)"
needs build/gradcheck
single "gradcheck: every layer and the whole model" ./build/gradcheck

section "the Makefile and dev/"
# `make help` lists every target: each rule named without a slash in the Makefile or
# dev/infra/gpu.mk, and each .PHONY name, has its line there (the `## ` beside the target)
make_help_lists_every_target() {
    local help targets target ok=0
    help=$(MAKEFLAGS= make --no-print-directory help) || return 1
    targets=$(sed -nE 's/^\.PHONY: *//p; s/^([A-Za-z0-9_-]+( +[A-Za-z0-9_-]+)*) *:([^=].*)?$/\1/p' \
                  Makefile dev/infra/gpu.mk | tr -s ' ' '\n' | sort -u)
    [ -n "$targets" ] || { echo "no targets found in the Makefile"; return 1; }
    for target in $targets; do
        grep -qE "^  $target +[^ ]" <<<"$help" || { echo "make help has no line for $target"; ok=1; }
    done
    return $ok
}
single "make help: one line for every target of the Makefile and dev/infra/gpu.mk" make_help_lists_every_target

# what a killed save leaves behind, PATH.tmp.PID (src/checkpoint.c's temporary name for a
# checkpoint, its .best, an export), is ignored by git, as the files it would have become are
gitignore_holds_killed_saves() {
    local file ok=0
    git rev-parse --is-inside-work-tree >/dev/null 2>&1 || { echo "not a git work tree"; return 1; }
    for file in run.ckpt.tmp.12345 run.ckpt.best.tmp.7 runs/a/model.ckpt.tmp.4194304 model.safetensors.tmp.99; do
        git check-ignore -q --no-index "$file" || { echo "$file is not ignored (.gitignore)"; ok=1; }
    done
    return $ok
}
single ".gitignore ignores the PATH.tmp.PID files a killed checkpoint or export leaves" gitignore_holds_killed_saves

# the product does not depend on its tooling: no file of src/, cuda/, data/ or train.c
# includes a file of dev/, by its path or by a name only dev/ has
product_includes_nothing_from_dev() {
    local names found
    names=$(find dev -type f \( -name '*.h' -o -name '*.c' -o -name '*.cu' -o -name '*.cuh' \) \
                -printf '%f\n' | sort -u | sed 's/\./\\./g' | paste -sd'|')
    [ -n "$names" ] || { echo "no C or CUDA files found under dev/"; return 1; }
    found=$(grep -rnE "^[[:space:]]*#[[:space:]]*include[[:space:]]*[\"<]([^\">]*/)?(dev/[^\">]*|$names)[\">]" \
                src cuda data train.c)
    [ -z "$found" ] || { echo "includes from dev/: $found"; return 1; }
}
single "src/, cuda/, data/ and train.c include nothing from dev/" product_includes_nothing_from_dev

# make test-one NAME=...: exactly the named case, commas and wildcard characters in its name
# included (the other cases its wildcards match are excluded), a shell check of this file
# alone, and exit 2 on a name nothing has; every name it lists is one thing's
test_one_runs_exactly_one() {
    local name out status
    for name in "rmsnorm backward matches finite differences, with a gain and without (NULL)" \
                "with zero gradients AdamW shrinks matrices by lr*wd*p and leaves gains and queries as they are"; do
        out=$(tests/test_one.sh "$name" 2>&1) || { echo "$name: $out"; return 1; }
        grep -qE '^\[doctest\] test cases: +1 \| +1 passed \| 0 failed' <<<"$out" || { echo "$name: $out"; return 1; }
    done
    name="src/, cuda/, data/ and train.c include nothing from dev/"
    out=$(tests/test_one.sh "$name" 2>&1) && [ "$out" = "$(printf '== %s\nok   %s' "$name" "$name")" ] ||
        { echo "$name: $out"; return 1; }
    out=$(tests/test_one.sh "rmsnorm backward matches finite differences" 2>&1)
    status=$?
    [ $status -eq 2 ] && grep -qx 'error: no test case or shell check is named "rmsnorm backward matches finite differences"' <<<"$out" ||
        { echo "status $status: $out"; return 1; }
    out=$(tests/test_one.sh --list | sort | uniq -d)
    [ -z "$out" ] || { echo "names given twice: $out"; return 1; }
}
single "make test-one runs exactly the named case, commas and all; a name no case has: exit 2" test_one_runs_exactly_one

# make test-one's NAME is data: a quote, $(shell ...), $(...) or a backtick in it runs nothing
# (neither make nor a shell expands it), and a name nothing has is a failure naming it
test_one_name_is_data() {
    local name out status mark=$TEST_DIR/ran
    for name in "x\"; touch $mark; echo \"" "\$(shell touch $mark)" "\$(touch $mark)" "\`touch $mark\`" 'a"b'; do
        out=$(MAKEFLAGS='' make --no-print-directory test-one NAME="$name" 2>&1)
        status=$?
        [ ! -e "$mark" ] || { echo "NAME=$name ran a command"; return 1; }
        [ $status -ne 0 ] && grep -qxF "error: no test case or shell check is named \"$name\"" <<<"$out" ||
            { echo "NAME=$name: status $status: $out"; return 1; }
    done
    out=$(MAKEFLAGS='' make --no-print-directory test-one LIST="\$(shell touch $mark)" 2>&1)
    [ ! -e "$mark" ] || { echo "LIST ran a command"; return 1; }
}
single "make test-one: quotes, \$(shell ...), \$(...) and backticks in NAME are data, nothing runs; no such name fails" \
    test_one_name_is_data

section "the front page and docs/"
# README.md a front page and docs/ what is true today, within tests/check_docs.sh's limits
single "README.md and docs/ within their limits (tests/check_docs.sh)" tests/check_docs.sh
single "README.md and docs/ cite anchors, functions and a kernel table size the code has (tests/check_docs_names.sh)" \
    tests/check_docs_names.sh
# tests/check_docs_names.sh itself names a misspelt anchor and a wrong count, one line each,
# in a copy of the docs
check_docs_names_names_a_typo() {
    local dir=$TEST_DIR n anchor count status
    mkdir -p "$dir/docs"
    cp docs/*.md "$dir/docs/" && cp README.md "$dir/README.md" || return 1
    sed -i '0,/`src\/model.c:model_zero_grad`/s//`src\/model.c:model_zero_grads`/' "$dir/docs/walkthrough.md"
    n=$(grep -oE '[0-9]+ entries: CPU or CUDA' README.md | grep -oE '^[0-9]+')
    [ -n "$n" ] || { echo "README.md quotes no \"N entries: CPU or CUDA\""; return 1; }
    sed -i -E "s/\b$n entries: CPU or CUDA/$((n + 1)) entries: CPU or CUDA/" "$dir/README.md"
    anchor=$(grep -n 'src/model.c:model_zero_grads`' "$dir/docs/walkthrough.md" | cut -d: -f1)
    count=$(grep -n "$((n + 1)) entries: CPU or CUDA" "$dir/README.md" | cut -d: -f1)
    README=$dir/README.md DOCS=$dir/docs tests/check_docs_names.sh >"$dir/out"
    status=$?
    printf '%s\n' "$dir/docs/walkthrough.md:$anchor: src/model.c:model_zero_grads: no model_zero_grads in src/model.c" \
        "$dir/README.md:$count: $((n + 1)) entries: src/kernels.h's Kernels has $n" >"$dir/expected"
    [ $status -eq 1 ] || echo "status $status"
    diff "$dir/expected" "$dir/out" && [ $status -eq 1 ]
}
single "tests/check_docs_names.sh names a misspelt anchor and a wrong kernel table size, one line each" \
    check_docs_names_names_a_typo
single "tests/check_docs_names.sh names an anchor that is a word of its file, not a definition (tests/check_docs_names_test.sh)" tests/check_docs_names_test.sh
# tests/check_docs.sh itself names the number that broke each limit, on a front page that
# breaks them all
check_docs_names_what_broke() {
    local dir=$TEST_DIR long cell
    mkdir -p "$dir/docs"
    long=$(printf 'word %.0s' $(seq 101))
    cell=$(printf 'x%.0s' $(seq 301))
    { echo "# a front page"; echo; echo "$long"; echo; echo "- $long"; echo
      echo "| a | b |"; echo "|---|---|"; echo "| $cell | mHC |"; echo
      echo "## Numbers at a glance"; echo; echo "| machine, date | ms |"; echo "|---|---|"
      for row in 1 2 3 4 5 6; do echo "| Xeon, 2026-11-2$row | $row |"; done
      echo "| Xeon, undated | 7 |"; echo; echo "$long"; echo "## next"
      echo "on a second lease, which was undone at 3cd0711"; } >"$dir/README.md"
    seq 351 >"$dir/docs/cuda.md"
    seq 250 >"$dir/docs/speed.md"
    README=$dir/README.md DOCS=$dir/docs tests/check_docs.sh >"$dir/out"
    local status=$? line ok=0
    [ $status -eq 1 ] || { echo "status $status"; ok=1; }
    for line in "$dir/README.md:3: a paragraph of 101 words (at most 100)" \
                "$dir/README.md:5: a paragraph of 102 words (at most 100)" \
                "$dir/README.md:9: a table cell of 301 characters (at most 300)" \
                "$dir/README.md:21: a row of Numbers at a glance without its date (YYYY-MM-DD)" \
                "$dir/README.md: Numbers at a glance has 7 rows (at most 6)" \
                "$dir/README.md: Numbers at a glance has 101 words of prose beside its table (at most 40)" \
                "$dir/README.md: the AttnRes paper (arXiv:2603.15031) is not cited" \
                "$dir/README.md: mHC is named but arXiv:2512.24880 is not cited" \
                "$dir/docs/cuda.md: 351 lines (at most 350)" \
                "$dir/README.md:25:on a second lease, which was undone at 3cd0711: history belongs to git" \
                "$dir/README.md:25:3cd0711: a commit hash (history belongs to git)"; do
        grep -qxF -- "$line" "$dir/out" || { echo "no line: $line"; ok=1; }
    done
    grep -q "speed.md" "$dir/out" && { echo "speed.md at its limit was named"; ok=1; }
    [ $ok -eq 0 ] || cat "$dir/out"
    return $ok
}
single "tests/check_docs.sh names each limit a front page breaks, with its number" check_docs_names_what_broke

section "signatures a person can hold"
single "no function of src/, cuda/ or train.c takes more than 16 parameters (tests/check_signatures.sh)" \
    tests/check_signatures.sh
# tests/check_signatures.sh itself names each declaration of 17 parameters (a definition, a
# prototype, a kernel behind __launch_bounds__, a kernel table's member) by file and line, and
# none of 16, no call with 17 arguments and no signature in a comment or a string
check_signatures_names_a_wide_function() {
    local dir=$TEST_DIR status p16 p17
    p16="int a, int b, int c, int d, int e, int f, int g, int h, int i, int j, int k, int l, int m, int n, int o, int p"
    p17="$p16, float* q"
    cat >"$dir/wide.cu" <<WIDE
// void in_a_comment($p17);
static int sixteen($p16) { return a; }
void seventeen($p17) {
    printf("%d %d %d %d %d %d %d %d %d %d %d %d %d %d %d %d", a, b, c, d, e, f, g, h, i, j, k,
           l, m, n, o, p);
    const char* text = "void in_a_string($p17);";
}
size_t prototype($p17);
__global__ void __launch_bounds__(256, 2)
kernel($p17) {}
typedef struct {
    void (*entry)($p17);
} Table;
WIDE
    tests/check_signatures.sh "$dir/wide.cu" >"$dir/out"
    status=$?
    printf '%s\n' "$dir/wide.cu:3: seventeen takes 17 parameters (at most 16)" \
        "$dir/wide.cu:8: prototype takes 17 parameters (at most 16)" \
        "$dir/wide.cu:10: kernel takes 17 parameters (at most 16)" \
        "$dir/wide.cu:12: entry takes 17 parameters (at most 16)" >"$dir/expected"
    [ $status -eq 1 ] || echo "status $status"
    diff "$dir/expected" "$dir/out" && [ $status -eq 1 ]
}
single "tests/check_signatures.sh names each declaration of 17 parameters by file and line, and no call" \
    check_signatures_names_a_wide_function

section "make bench-sizes' choice of PyTorch's BLAS (stubs, nothing timed)"
# tests/bench_sizes_tests.sh
# shellcheck source=tests/bench_sizes_tests.sh
source tests/bench_sizes_tests.sh
single "make bench-sizes runs PyTorch on OpenBLAS's OpenMP build (installed by ensure_deps.sh blas when missing) and names it beside the ratio" \
    bench_sizes_runs_pytorch_on_openmp_blas
single "make bench-sizes on a slow BLAS TORCH_BLAS did not name: no ratio, one line naming it and the TORCH_BLAS that fixes it" \
    bench_sizes_no_ratio_on_a_slow_blas
single "make bench-sizes names OpenBLAS's core, runs PyTorch with OPENBLAS_CORETYPE=SkylakeX or Haswell where OpenBLAS took an AVX-512 or AVX2 CPU for a generic one, else no ratio" \
    bench_sizes_names_openblas_core

doctest_suite "CUDA kernels and model vs CPU (emulated, forward thread order)" env CUDA_EMU_ORDER=forward ./test_cuda_emu
check_level || summary
doctest_suite "CUDA kernels and model vs CPU (emulated, reverse thread order)" env CUDA_EMU_ORDER=reverse ./test_cuda_emu
# the depth attention's kernels built with the other block shapes that make gpu-check times
# (DEPTH_SHAPES from dev/infra/gpu.mk: rows per block x threads per row x columns a thread takes
# at a time), both thread orders;
# only those, not whatever older shapes a build folder still holds
for shape in ${DEPTH_SHAPES:-}; do
    shape_test=build/emu/shape/$shape/test_cuda_emu
    built "$shape_test" || continue
    for order in forward reverse; do
        doctest_suite "CUDA depth attention vs CPU, block shape $shape (emulated, $order order)" \
            env CUDA_EMU_ORDER=$order "$shape_test" -tc="depth attention*"
    done
done
if built ./test_cuda_emu_asan; then
    doctest_suite "CUDA kernels and model vs CPU (emulated, AddressSanitizer)" ./test_cuda_emu_asan
fi
# and one of them (ASAN_SHAPE: the most column groups per thread) under AddressSanitizer
asan_shape_test=build/emu_asan/shape/${ASAN_SHAPE:-none}/test_cuda_emu_asan
if built "$asan_shape_test"; then
    doctest_suite "CUDA depth attention vs CPU, block shape ${ASAN_SHAPE:-} (emulated, AddressSanitizer)" \
        env CUDA_EMU_ORDER=reverse "$asan_shape_test" -tc="depth attention*"
fi

# the GPU's training step, cuda/trainer.cu: build/emu/train_cuda links it
# with the emulated kernels and must print what ./train prints (timings aside), each number
# within one unit of its last printed digit (the two round differently).
same_numbers() {
    local strip='s/\| *[0-9.]+ tok\/s \| *[0-9.]+ ms\/step//; s/\| time [0-9.]+ s//; s/%//g'
    paste -d'\n' <(sed -E "$strip" "$1") <(sed -E "$strip" "$2") | awk '
        NR % 2 == 1 { n = split($0, a, /[ |,:]+/); next }
        {
            m = split($0, b, /[ |,:]+/)
            if (m != n) { print "line " NR/2 " differs: " $0; bad = 1; next }
            for (i = 1; i <= n; i++) {
                if (a[i] == b[i]) continue
                if (a[i] !~ /^-?[0-9.]+(e[-+]?[0-9]+)?$/) { print "line " NR/2 ": " a[i] " vs " b[i]; bad = 1; continue }
                d = index(b[i], ".") ? length(b[i]) - index(b[i], ".") : 0
                if ((a[i] - b[i])^2 > (1.01 * 10^-d)^2) { print "line " NR/2 ": " a[i] " vs " b[i]; bad = 1 }
            }
        }
        END { exit bad }'
}
EMU_TRAIN_FLAGS="--task reverse --length 4 --symbols 6 --d 16 --L 2 --H 2 --G 1 --F 24
                 --batch 4 --steps 6 --warmup 2 --log-every 1 --eval-every 3 --eval-examples 16
                 --threads 1"
# its step as CUDA graphs (the default, replayed by the emulator) against --no-graph: the same
# output, timings aside, exactly
train_cuda_emu_graph_is_no_graph() {
    local flags="$EMU_TRAIN_FLAGS $*"
    local dir=$TEST_DIR
    local strip='s/\| *[0-9.]+ tok\/s \| *[0-9.]+ ms\/step//; s/\| time [0-9.]+ s//'
    # shellcheck disable=SC2086
    build/emu/train_cuda $flags >"$dir/graph.txt" && build/emu/train_cuda $flags --no-graph >"$dir/calls.txt" &&
        diff <(sed -E "$strip" "$dir/graph.txt") <(sed -E "$strip" "$dir/calls.txt")
}
train_cuda_emu_matches_train() {
    local flags="$EMU_TRAIN_FLAGS $*"
    local dir=$TEST_DIR
    # shellcheck disable=SC2086
    build/emu/train_cuda $flags >"$dir/cuda.txt" && ./train $flags >"$dir/cpu.txt" &&
        same_numbers "$dir/cuda.txt" "$dir/cpu.txt"
}
# --init-from on the device path: the file's weights reach the GPU model (the same losses as
# ./train from them), and ./train_cuda --export writes what ./train --export writes
train_cuda_emu_init_from_matches_train() {
    local dir=$TEST_DIR
    # shellcheck disable=SC2086
    ./train $EMU_TRAIN_FLAGS --mode mhc --streams 2 --checkpoint "$dir/trained.ckpt" >/dev/null &&
        ./train --export "$dir/cpu.safetensors" --checkpoint "$dir/trained.ckpt" >/dev/null &&
        build/emu/train_cuda --export "$dir/cuda.safetensors" --checkpoint "$dir/trained.ckpt" >/dev/null &&
        cmp "$dir/cpu.safetensors" "$dir/cuda.safetensors" &&
        train_cuda_emu_matches_train --init-from "$dir/cpu.safetensors"
}
# --microbatches is the CPU builds' (src/trainer.c): the GPU's step refuses it in one line
train_cuda_emu_refuses_cpu_flags() {
    local out
    # shellcheck disable=SC2086
    out=$(build/emu/train_cuda $EMU_TRAIN_FLAGS --microbatches 2 2>&1 >/dev/null)
    [ "$out" = "error: --microbatches runs in the CPU builds (./train, ./train_mpi): the GPU's step takes its batch whole" ] || { echo "$out"; return 1; }
    # shellcheck disable=SC2086
    out=$(build/emu/train_cuda $EMU_TRAIN_FLAGS --pipeline 2 2>&1 >/dev/null)
    [ "$out" = "error: --pipeline runs in the CPU build with MPI (./train_mpi): the GPU builds refuse it" ] || { echo "$out"; return 1; }
}
if built build/emu/train_cuda; then
    section "./train_cuda's training step with the emulated kernels, against ./train"
    needs all build/emu/train_cuda
    single "train_cuda (emulated) matches train, none" train_cuda_emu_matches_train --mode none
    single "train_cuda (emulated) matches train, block S=2" train_cuda_emu_matches_train --mode block --block-size 2
    single "train_cuda (emulated) matches train, block S=2 sigmoid + 2 heads + input query" \
        train_cuda_emu_matches_train --mode block --block-size 2 --depth-score sigmoid --depth-heads 2 --depth-query input
    single "train_cuda (emulated) matches train, full window 2 + static mixing" \
        train_cuda_emu_matches_train --mode full --depth-window 2 --mixing static
    single "train_cuda (emulated) matches train, mhc 3 streams" \
        train_cuda_emu_matches_train --mode mhc --streams 3
    single "train_cuda (emulated) matches train, block S=2 --optimizer muon" \
        train_cuda_emu_matches_train --mode block --block-size 2 --optimizer muon
    single "train_cuda (emulated) matches train from --init-from weights (mhc 2 streams), and exports them back" \
        train_cuda_emu_init_from_matches_train
    single "train_cuda (emulated) refuses --microbatches 2 and --pipeline 2 in one line: the CPU builds' flags" \
        train_cuda_emu_refuses_cpu_flags
    single "train_cuda (emulated): CUDA graphs print exactly what --no-graph prints, mhc + muon" \
        train_cuda_emu_graph_is_no_graph --mode mhc --streams 2 --optimizer muon
    single "train_cuda (emulated): CUDA graphs print exactly what --no-graph prints, full variants" \
        train_cuda_emu_graph_is_no_graph --mode full --depth-score sigmoid --depth-heads 2 --depth-query input
    # d = 128, F = 512, B*T = 288: on the emulator's 4 multiprocessors the MLP's weight
    # gradients take 128 x 128 tiles split in 4, the most matmul scratch a step borrows; the
    # process's first step is captured, so a workspace not reserved at build would be
    # allocated inside the capture, which the emulator refuses as a GPU does
    single "train_cuda (emulated): CUDA graphs print exactly what --no-graph prints, a wide model's first step captured" \
        train_cuda_emu_graph_is_no_graph --mode full --d 128 --F 512 --H 4 --G 2 --batch 32 --steps 2 --warmup 1 --eval-every 2
fi
# ./train_cuda_mpi's sharded step (ZeRO-1 on the device: shards, reduce-scatter, update,
# all-gather, moments gathered for the checkpoint) with the emulated kernels, one process
train_cuda_mpi_emu_matches_train() {
    local flags="$EMU_TRAIN_FLAGS $*"
    local dir=$TEST_DIR extra=()
    [ "$(id -u)" -eq 0 ] && extra+=(--allow-run-as-root)
    # shellcheck disable=SC2086
    mpirun "${extra[@]}" -np 1 build/emu/train_cuda_mpi $flags --checkpoint "$dir/gpu.ckpt" >"$dir/cuda.txt" &&
        ./train $flags --checkpoint "$dir/cpu.ckpt" >"$dir/cpu.txt" &&
        same_numbers <(grep -v "^checkpoints:" "$dir/cuda.txt") <(grep -v "^checkpoints:" "$dir/cpu.txt") &&
        build/compare_checkpoints "$dir/cpu.ckpt" "$dir/gpu.ckpt"
}
if built build/emu/train_cuda_mpi; then
    section "./train_cuda_mpi's sharded step with the emulated kernels, against ./train"
    needs all build/emu/train_cuda_mpi build/compare_checkpoints
    single "train_cuda_mpi (emulated, 1 process, sharded) matches train, full" train_cuda_mpi_emu_matches_train --mode full
    single "train_cuda_mpi (emulated, 1 process, sharded) matches train, full --optimizer muon" \
        train_cuda_mpi_emu_matches_train --mode full --optimizer muon
fi

# data parallel: build/train_mpi under mpirun against ./train (tests/mpi_tests.sh)
if built build/train_mpi; then
    section "data-parallel training over MPI (build/train_mpi) against one process"
    needs all build/train_mpi build/compare_checkpoints
    # shellcheck source=tests/mpi_tests.sh
    source tests/mpi_tests.sh
    single "2 and 3 processes = 1 process (50 steps, 1e-5), 2 twice identical: none" mpi_matches_one_process --mode none
    single "2 and 3 processes = 1 process (50 steps, 1e-5), 2 twice identical: full" mpi_matches_one_process --mode full
    single "2 and 3 processes = 1 process (50 steps, 1e-5), 2 twice identical: block S=2" mpi_matches_one_process --mode block --block-size 2
    single "Muon, shards cut between matrices: 2 and 3 processes = 1 process (50 steps, 1e-5), 2 twice identical" mpi_matches_one_process --mode block --block-size 2 --optimizer muon
    single "checkpoint written by 2 processes resumes on 1, same losses" mpi_resume_across 2 1
    single "checkpoint written by 1 process resumes on 3, same losses" mpi_resume_across 1 3
    single "Muon: checkpoint written by 2 processes resumes on 3 (other shards), same losses" mpi_resume_across 2 3 --optimizer muon
    single "ZeRO-1: the sharded moments gathered = one process's moments" mpi_moments_match
    single "a rank killed mid-run ends the job in seconds; its checkpoint loads" mpi_rank_killed
    single "one-line refusals: batch not dividing, different flags, --sample, --export" mpi_refuses
    single "--microbatches 2 and 3 on 2 processes = 1 process's whole batch (50 steps, 1e-5)" mpi_microbatches
    section "pipeline parallelism (--pipeline P --virtual V) against one process's --microbatches"
    needs all build/train_mpi build/compare_checkpoints
    single "pipeline = one process, P 2 4 x V 1 2 x D 1 2, cache off and on: none" mpi_pipeline_matches 8 --mode none
    single "pipeline = one process, P 2 4 x V 1 2 x D 1 2, cache off and on: full" mpi_pipeline_matches 8 --mode full
    single "pipeline = one process, P 2 4 x V 1 2 x D 1 2, cache off and on: block S=2" mpi_pipeline_matches 8 --mode block --block-size 2
    single "pipeline = one process, P 2 4 x V 1 2 x D 1 2, cache off and on: block S=4" mpi_pipeline_matches 16 --mode block --block-size 4
    single "pipeline = one process, P 2 4 x V 1 2 x D 1 2, cache off and on: mhc" mpi_pipeline_matches 8 --mode mhc
    single "pipeline = one process, P 2 4 x V 1 2 x D 1 2: full, variants and Muon" mpi_pipeline_matches 8 --mode full --depth-query input --depth-heads 2 --depth-score sigmoid --optimizer muon
    single "pipeline = one process, P 2 4 x V 1 2 x D 1 2: block S=2, dense mixing, window" mpi_pipeline_matches 8 --mode block --block-size 2 --mixing dense
    PIPE_CASES="1:2:3 2:2:3" single "pipeline = one process, P 2 x V 3 (a block cached two chunks deep) x D 1 2: block S=2" \
        mpi_pipeline_matches 6 --mode block --block-size 2
    single "pipeline: each stage sent the bytes counted, naive and cached" mpi_pipeline_bytes
    single "pipeline: the stages' parameters add up to the whole model's" mpi_pipeline_memory
    single "pipeline checkpoint resumes on one process, and the reverse, bit for bit" mpi_pipeline_resume
    single "pipeline: --pipeline-trace writes every forward and backward" mpi_pipeline_trace
    single "pipeline: --pipeline-trace onto an input, the checkpoint, a pipe, a device or a missing folder is refused before step 1" mpi_pipeline_trace_refused
    single "pipeline: one-line refusals (P*D, whole blocks, M < P, M dividing, interleaved M)" mpi_pipeline_refuses
    single "pipeline: a rank killed mid-run ends the job in seconds; its checkpoint loads" \
        mpi_rank_killed --mode block --block-size 2 --pipeline 2 --microbatches 2
fi

# ./train_cuda itself (built wherever nvcc is): on a machine without a GPU it refuses in one
# line with exit status 1; with one it trains, and the whole-model test runs on the GPU
train_cuda_refuses() {
    local out
    out=$(./train_cuda 2>&1)
    local status=$?
    [ "$status" -eq 1 ] && [ "$out" = "error: no CUDA device found (./train_cuda needs an NVIDIA GPU; use ./train on the CPU)" ]
}
# (--list names both kinds of machine's checks; --one builds ./train_cuda, which needs nvcc)
gpu_here() { nvidia-smi -L >/dev/null 2>&1; }
if [ -x ./train_cuda ] || ! running; then
    section "./train_cuda"
    needs cuda
    single "train_cuda --help" ./train_cuda --help
    if ! running || gpu_here; then
        doctest_suite "the whole model on the GPU vs CPU" build/test_cuda_gpu
        single "train_cuda trains on the GPU" ./train_cuda --steps 20 --eval-every 20 --log-every 10 --eval-examples 64
    fi
    if ! running || ! gpu_here; then
        single "train_cuda without a GPU: one line, exit status 1" train_cuda_refuses
    fi
fi

summary
