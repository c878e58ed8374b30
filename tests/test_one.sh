#!/usr/bin/env bash
# test_one.sh NAME — `make test-one NAME="..."`: build what the doctest case or the shell check
# (tests/run_all.sh's `single`) named NAME needs, then run exactly it, whatever characters its
# name holds. Exit 0 when it ran and passed, 1 when it failed, 2 when nothing has that name (the
# closest names are printed). NAME is only ever data here: compared, escaped, passed on.
# test_one.sh --list (`make test-one LIST=1`): every doctest case's name, then every shell
# check's.
#
# doctest's -tc filter splits at commas and treats * and ? as wildcards, so the name is
# passed with its commas and backslashes escaped (doctest 2.4.9 reads "\," as a comma), and
# any other case the wildcards would also match is excluded by name.
set -u
name=${1:-}
# every case's name, as the sources write it
doctest_names() { grep -ohE 'TEST_CASE\("[^"]*"' tests/*.cpp | sed -E 's/^TEST_CASE\("(.*)"$/\1/'; }
all_names() { doctest_names; tests/run_all.sh --list; }
if [ "$name" = --list ]; then
    all_names
    exit 0
fi
if [ -z "$name" ]; then
    echo 'usage: make test-one NAME="a test case name"   (make test-one LIST=1 lists the names)' >&2
    exit 2
fi
# a shell check: tests/run_all.sh builds what its group needs and runs it alone
if tests/run_all.sh --list | grep -qxF -- "$name"; then
    exec tests/run_all.sh --one "$name"
fi
escape() { sed -e 's/\\/\\\\/g' -e 's/,/\\,/g' <<<"$1"; }

# the case names a doctest binary holds that match FILTER (case-sensitive), one a line
list_cases() {  # BINARY FILTER
    "$1" -nv -ltc -cs --test-case="$2" 2>/dev/null |
        sed -n '/listing all test case names/,/unskipped test cases/p' | sed '1,2d;$d' | sed '$d'
}

# The CPU suite (./test_attnres): its command-line cases run ./train, ./check_state,
# build/bench_sizes, build/scaling_fit and build/shape_fit, so those are built with it. The
# emulated CUDA suite (./test_cuda_emu), slower to build, only when its sources hold the name.
suites=("test_attnres:all test_attnres build/bench_sizes build/scaling_fit build/shape_fit")
grep -qF -- "$name" tests/cuda_test_*.cpp && suites+=("test_cuda_emu:test_cuda_emu")
filter=$(escape "$name")
for suite in "${suites[@]}"; do
    binary=./${suite%%:*}
    targets=${suite#*:}
    # shellcheck disable=SC2086
    make --no-print-directory -j2 $targets >/dev/null || { echo "error: make $targets failed" >&2; exit 1; }
    matches=$(list_cases "$binary" "$filter")
    grep -qxF -- "$name" <<<"$matches" || continue
    excludes=()
    while IFS= read -r other; do
        [ "$other" = "$name" ] || excludes+=("$(escape "$other")")
    done <<<"$matches"
    exclude=$(IFS=,; echo "${excludes[*]:-}")
    echo "== $binary: $name"
    exec "$binary" -cs --test-case="$filter" ${exclude:+--test-case-exclude="$exclude"}
done

echo "error: no test case or shell check is named \"$name\"" >&2
# the closest names: those holding the name's longest word, or the first words of the name
word=$(tr -c '[:alnum:]_-' '\n' <<<"$name" | awk '{ print length, $0 }' | sort -rn | head -1 | cut -d' ' -f2)
all_names | grep -iF -- "${word:-$name}" | head -5 | sed 's/^/  did you mean: /' >&2
exit 2
