#!/usr/bin/env bash
# check_docs.sh — the front page stays a front page and docs/ holds what is true today.
# Prints one line for each limit broken, with the number that broke it, and exits 1 if any:
#   README.md: ≤ 300 lines, ≤ 2,500 words, no paragraph (or list item) over 100 words outside
#     code blocks, no table cell over 300 characters; "Numbers at a glance" one table of at
#     most 6 rows, each with its date, and no narrative (≤ 40 words beside the table); the
#     AttnRes paper cited by its arXiv number, and mHC and DenseFormer where they are named
#   docs/cuda.md ≤ 350 lines, docs/speed.md ≤ 250
#   README.md and docs/*.md: no "lease", no "was undone", no commit hashes (a word of 7 to 40
#     hex digits with a letter and a digit in it)
# Run from the repository root; tests/run_all.sh runs it in make test.
set -u
readme=${README:-README.md}
docs=${DOCS:-docs}
bad=0
broke() { echo "$1"; bad=1; }

lines=$(wc -l <"$readme")
[ "$lines" -le 300 ] || broke "$readme: $lines lines (at most 300)"
words=$(wc -w <"$readme")
[ "$words" -le 2500 ] || broke "$readme: $words words (at most 2,500)"

# paragraphs, list items and table cells, outside ``` blocks; the glance section's table
awk -v file="$readme" '
    function flush() {
        if (para_words > 100) { printf "%s:%d: a paragraph of %d words (at most 100)\n", file, para_line, para_words; bad = 1 }
        para_words = 0
    }
    /^```/ { flush(); fence = !fence; next }
    fence { next }
    /^#/ {
        flush()
        if (glance) glance_end()
        glance = ($0 ~ /^## Numbers at a glance/)
        next
    }
    /^\|/ {
        flush()
        n = split($0, cells, "|")
        for (i = 2; i < n; i++) {
            gsub(/^[ \t]+|[ \t]+$/, "", cells[i])
            if (length(cells[i]) > 300) { printf "%s:%d: a table cell of %d characters (at most 300)\n", file, NR, length(cells[i]); bad = 1 }
        }
        if (glance) {
            if (!in_table) tables++
            in_table = 1
            if ($0 !~ /^\| *:?-+/ && header_seen) {
                rows++
                if ($0 !~ /20[0-9][0-9]-[01][0-9]-[0-3][0-9]/) { printf "%s:%d: a row of Numbers at a glance without its date (YYYY-MM-DD)\n", file, NR; bad = 1 }
            }
            header_seen = 1
        }
        next
    }
    { in_table = 0 }
    /^[ \t]*$/ { flush(); next }
    /^[ \t]*([-*+]|[0-9]+\.) / { flush() }
    {
        if (para_words == 0) para_line = NR
        para_words += NF
        if (glance) prose_words += NF
    }
    function glance_end() {
        glance_seen = 1
        if (tables != 1) { printf "%s: Numbers at a glance has %d tables (one)\n", file, tables; bad = 1 }
        if (rows > 6) { printf "%s: Numbers at a glance has %d rows (at most 6)\n", file, rows; bad = 1 }
        if (prose_words > 40) { printf "%s: Numbers at a glance has %d words of prose beside its table (at most 40)\n", file, prose_words; bad = 1 }
        glance = 0
    }
    END {
        flush()
        if (glance) glance_end()
        if (!glance_seen) { printf "%s: no \"## Numbers at a glance\" section\n", file; bad = 1 }
        exit bad
    }' "$readme" || bad=1

grep -q 'arXiv:2603\.15031' "$readme" || broke "$readme: the AttnRes paper (arXiv:2603.15031) is not cited"
! grep -q 'mHC' "$readme" || grep -q 'arXiv:2512\.24880' "$readme" || broke "$readme: mHC is named but arXiv:2512.24880 is not cited"
! grep -q 'DenseFormer' "$readme" || grep -q 'arXiv:2402\.02622' "$readme" ||
    broke "$readme: DenseFormer is named but arXiv:2402.02622 is not cited"

for limit in cuda.md:350 speed.md:250; do
    page=$docs/${limit%%:*}
    [ -f "$page" ] || { broke "$page: missing"; continue; }
    n=$(wc -l <"$page")
    [ "$n" -le "${limit#*:}" ] || broke "$page: $n lines (at most ${limit#*:})"
done

# the history words and hashes, in every page
pages=("$readme" "$docs"/*.md)
while IFS= read -r hit; do broke "$hit: history belongs to git"; done < <(
    grep -nHiE '\blease[ds]?\b|leasing|was undone' "${pages[@]}")
while IFS= read -r hit; do broke "$hit: a commit hash (history belongs to git)"; done < <(
    grep -nHoE '\b[0-9a-f]{7,40}\b' "${pages[@]}" | grep -E ':[^:]*[a-f][^:]*$' | grep -E ':[^:]*[0-9][^:]*$')
exit $bad
