#!/usr/bin/env bash
# check_docs_names.sh — the names and counts README.md and docs/*.md quote exist in the code.
# Reads every `code span` outside ``` blocks and prints one line for each problem, exiting 1
# if any:
#   - an anchor `path/file.ext:name` (the walkthrough's `file:function` and `file:NAME`, e.g.
#     `src/model.c:model_zero_grad`): the file exists, from the repository root, and defines
#     name (defines, below), not merely holds it as a word; `model.c:645` and URLs are no
#     anchors;
#   - a function's name, in any other span: a word of the form name_forward, name_backward or
#     name_cuda, or a snake_case name (each part two characters or more, so not the maths'
#     f_l(h) or softmax_i(s)) called as `name(…)`, not `x.name(…)`: it is a word somewhere in
#     src/, cuda/, data/, train.c, tests/, dev/ or Makefile (not in their .md files); words in
#     a path (with a /) are not names;
#   - the kernel table's size: in a paragraph (or a table row) that names src/kernels.h or the
#     kernel table, "N entries" (or "N named entries") is the number of entries of the struct
#     `Kernels` in src/kernels.h, an entry being a function-pointer member `(*name)(`, as a
#     reader would count the table's lines that open with a type and (*name).
# Run from the repository root; README= and DOCS= point it at other pages (as
# tests/check_docs.sh); tests/run_all.sh runs it in make test.
set -u
readme=${README:-README.md}
docs=${DOCS:-docs}
pages=("$readme" "$docs"/*.md)
bad=0
broke() { echo "$1"; bad=1; }

# FILE<TAB>LINE<TAB>SPAN for each code span (one across lines is joined with spaces)
spans() {
    awk '
        FNR == 1 { code = 0; fence = 0 }
        /^[ \t]*```/ { fence = !fence; code = 0; next }
        fence { next }
        /^[ \t]*$/ { code = 0; next }
        {
            n = split($0, part, "`")
            for (i = 1; i <= n; i++) {
                if (i > 1) {
                    if (code) { if (span != "") printf "%s\t%d\t%s\n", FILENAME, start, span; code = 0 }
                    else { code = 1; span = ""; start = FNR }
                }
                if (code) span = (i == 1 ? span " " : span) part[i]
            }
        }' "$@"
}

# FILE<TAB>LINE<TAB>anchor|name<TAB>WHAT, what each span cites
cited() {
    awk -F '\t' '
        $3 ~ /^[A-Za-z0-9_.\/-]+\.[A-Za-z0-9]+:[A-Za-z_][A-Za-z0-9_]*(\(\))?$/ {
            sub(/\(\)$/, "", $3)
            printf "%s\t%s\tanchor\t%s\n", $1, $2, $3
            next
        }
        {
            n = split($3, words, /[ \t]+/)
            for (w = 1; w <= n; w++) {
                word = words[w]
                if (word ~ /\//) continue
                rest = word
                before = ""
                while (match(rest, /[A-Za-z0-9_]+/)) {
                    name = substr(rest, RSTART, RLENGTH)
                    prev = RSTART > 1 ? substr(rest, RSTART - 1, 1) : before
                    next_char = substr(rest, RSTART + RLENGTH, 1)
                    if (name ~ /^[a-z][a-z0-9_]*_(forward|backward|cuda)$/ ||
                        (name ~ /^[a-z][a-z0-9]+(_[a-z0-9][a-z0-9]+)+$/ && next_char == "(" && prev != "."))
                        printf "%s\t%s\tname\t%s\n", $1, $2, name
                    before = substr(rest, RSTART + RLENGTH, 1)
                    rest = substr(rest, RSTART + RLENGTH + 1)
                }
            }
        }'
}

# defines FILE NAME: whether FILE defines NAME. In C, C++ and CUDA: a function or kernel (a
# line that starts in column 0 with its type and holds `NAME(`, or one that starts with
# `NAME(` after a line with the type), a macro (#define NAME), a type (struct, union or enum
# NAME; typedef ... NAME; `} NAME;`), an enumerator, a field of a struct or union (declared
# inside its braces; a function pointer `(*NAME)(` too) or a variable at file scope (column
# 0, `= ` or `;` after it); in a script, a function (`NAME() {`, `def NAME`), a class, or a
# variable or Makefile target set in column 0 (`NAME=`, `NAME :=`, `NAME:`). Comments are no
# definitions.
defines() {
    awk -v name="$2" -v file="$1" '
        function has(text, before, after) { return text ~ (before name after) }
        BEGIN { end = "([^A-Za-z0-9_]|$)"; script = file ~ /(\.(sh|py|mk)|Makefile)$/ }
        {
            line = $0
            if (script) { sub(/(^|[ \t])#.*/, "", line) } else { sub(/\/\/.*/, "", line) }
        }
        script {
            if (has(line, "^[ \t]*(function[ \t]+)?", "[ \t]*\\(\\)") ||
                has(line, "^[ \t]*(def|class)[ \t]+", end) ||
                has(line, "^", "[ \t]*([:?+]?=|:)")) { found = 1; exit }
            next
        }
        has(line, "^[ \t]*#[ \t]*define[ \t]+", end) ||
        has(line, "^[ \t]*(typedef[ \t]+)?(struct|union|enum)[ \t]+", end) ||
        has(line, "^(typedef[^;]*[^A-Za-z0-9_]|}[ \t]*)", "[ \t]*;") ||
        (line ~ /^[A-Za-z_]/ && line !~ /^(return|if|for|while|switch|else|do)[^A-Za-z0-9_]/ &&
         (has(line, "^[^=;]*[^A-Za-z0-9_.>]", "[ \t]*\\(") || has(line, "^", "[ \t]*\\(") ||
          has(line, "^[^(=;]*[ \t*]", "[ \t]*(\\[[^]]*\\][ \t]*)*(=|;)"))) { found = 1; exit }
        # inside the braces of a struct, union or enum: its fields and enumerators
        depth == 0 && line ~ /(^|[^A-Za-z0-9_])(struct|union|enum)([ \t]+[A-Za-z_][A-Za-z0-9_]*)?[ \t]*\{/ {
            kind = line ~ /(^|[^A-Za-z0-9_])enum([^A-Za-z0-9_]|$)/ ? "enum" : "struct"
            text = line
            sub(/^[^{]*\{/, "", text)
            depth = 1
            line = text
        }
        depth > 0 {
            if (kind == "enum" && has(line, "(^|[{,])[ \t]*", "[ \t]*(=|,|}|$)")) { found = 1; exit }
            if (kind == "struct" && (has(line, "(^|[ \t*,])", "[ \t]*(\\[[^]]*\\][ \t]*)*[;,]") ||
                                     has(line, "\\(\\*[ \t]*", "[ \t]*\\)[ \t]*\\("))) { found = 1; exit }
            opened = gsub(/\{/, "{", line)
            closed = gsub(/\}/, "}", line)
            depth += opened - closed
        }
        END { exit !found }' "$1"
}

words=$(mktemp)
trap 'rm -f "$words"' EXIT
grep -rhoI --exclude='*.md' -E '[A-Za-z0-9_]+' src cuda data train.c tests dev Makefile | sort -u >"$words"
while IFS=$'\t' read -r page line kind what; do
    if [ "$kind" = anchor ]; then
        file=${what%%:*} name=${what#*:}
        if [ ! -f "$file" ]; then
            broke "$page:$line: $what: no file $file"
        elif ! grep -qw -- "$name" "$file"; then
            broke "$page:$line: $what: no $name in $file"
        elif ! defines "$file" "$name"; then
            broke "$page:$line: $what: $file holds $name but defines no $name"
        fi
    elif ! grep -qxF -- "$what" "$words"; then
        broke "$page:$line: $what: no $what in src/, cuda/, data/, train.c, tests/, dev/ or Makefile"
    fi
done < <(spans "${pages[@]}" | cited)

# the kernel table's size
entries=$(awk '/^typedef struct/ { inside = 1; n = 0 }
               inside { n += gsub(/\(\*[A-Za-z_][A-Za-z0-9_]*\)\(/, "") }
               /^} *Kernels;/ { print n; exit }' src/kernels.h)
[ -n "$entries" ] || broke "src/kernels.h: no struct Kernels"
while IFS=$'\t' read -r page line said; do
    [ "$said" = "${entries:-}" ] || broke "$page:$line: $said entries: src/kernels.h's Kernels has ${entries:-none}"
done < <(awk '
    # a paragraph (or a table row) is its lines joined by tabs: the tabs before a number
    # count the lines after its first
    function tabs(s) { return gsub(/\t/, "", s) }
    function flush(   text, said) {
        text = para
        while (match(text, /(^|[^0-9,.])[0-9]+[ \t]+(named[ \t]+)?entries/)) {
            said = substr(text, RSTART, RLENGTH)
            start += tabs(substr(text, 1, RSTART - 1))
            sub(/^[^0-9]/, "", said)
            if (para ~ /kernels\.h|[Kk]ernel table/) printf "%s\t%d\t%d\n", file, start, said + 0
            start += tabs(said)
            text = substr(text, RSTART + RLENGTH)
        }
        para = ""
    }
    FNR == 1 { flush(); fence = 0 }
    /^[ \t]*```/ { flush(); fence = !fence; next }
    fence { next }
    /^[ \t]*$/ || /^[ \t]*\|/ || /^#/ { flush() }
    /^[ \t]*$/ { next }
    { if (para == "") { para = $0; start = FNR; file = FILENAME } else para = para "\t" $0 }
    /^[ \t]*\|/ || /^#/ { flush() }
    END { flush() }' "${pages[@]}")
exit $bad
