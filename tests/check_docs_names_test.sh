#!/usr/bin/env bash
# check_docs_names_test.sh — tests/check_docs_names.sh itself turns red on an anchor whose
# name is only a word of its file, not a definition: in a copy of README.md and docs/, one
# paragraph cites `src/matmul_tile.h:tile` (the file says "tile" in comments and defines
# tile_any, tile_loops and tile_avx512, no tile), and the check must print exactly one line
# naming it, and exit 1. Run from the repository root; tests/run_all.sh runs it in make test.
set -u
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
mkdir -p "$dir/docs"
cp docs/*.md "$dir/docs/" && cp README.md "$dir/README.md" || exit 1
grep -qw tile src/matmul_tile.h || { echo "src/matmul_tile.h no longer says tile: pick another word"; exit 1; }
printf '\nThe register tile, `src/matmul_tile.h:tile`.\n' >>"$dir/docs/walkthrough.md"
line=$(wc -l <"$dir/docs/walkthrough.md")
README=$dir/README.md DOCS=$dir/docs tests/check_docs_names.sh >"$dir/out"
status=$?
echo "$dir/docs/walkthrough.md:$line: src/matmul_tile.h:tile: src/matmul_tile.h holds tile but defines no tile" >"$dir/expected"
[ $status -eq 1 ] || echo "status $status (expected 1)"
diff "$dir/expected" "$dir/out" && [ $status -eq 1 ]
