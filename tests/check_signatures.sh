#!/usr/bin/env bash
# check_signatures.sh [FILE...] — no function of the project takes more than 16 parameters:
# where one would, its arguments are really a few things (saved state, parameter rows,
# switches), passed as named structs (STYLE.md, "Narrow signatures"). Reads each FILE (by
# default src/*.c, src/*.h, cuda/*.cu, cuda/*.cuh and train.c) without its comments, strings,
# character constants and preprocessor lines, and prints one line for each function definition
# or prototype, and each function-pointer member (the kernel table's `(*name)(...)`), that has
# more than 16 parameters:
#   file:line: NAME takes N parameters (at most 16)
# exiting 1 if any. A declaration is a name with a type word before it (`void`, `float*`,
# `static int`, ...) and a parameter list followed by `{` or `;`; a call has none (it follows
# `;`, `{`, `=`, `(`, `return`, ...), so fprintf with many arguments is not one.
# Run from the repository root; tests/run_all.sh runs it in make test.
set -u
limit=16
if [ $# -gt 0 ]; then
    files=("$@")
else
    files=(src/*.c src/*.h cuda/*.cu cuda/*.cuh train.c)
fi
awk -v limit="$limit" '
    # a line without its comments, strings and character constants (each left as a space);
    # in_block: inside a /* comment, carried from line to line
    function clean(line,    out, token) {
        out = ""
        while (line != "") {
            if (in_block) {
                if (!match(line, /\*\//)) return out
                line = substr(line, RSTART + 2); in_block = 0; out = out " "
                continue
            }
            if (!match(line, /\/\/|\/\*|"|\047/)) return out line
            out = out substr(line, 1, RSTART - 1) " "
            token = substr(line, RSTART, RLENGTH)
            line = substr(line, RSTART + RLENGTH)
            if (token == "//") return out
            if (token == "/*") { in_block = 1; continue }
            # a string or a character constant: to its closing quote, past escapes
            while (token == "\"" ? match(line, /\\.|"/) : match(line, /\\.|\047/)) {
                closed = RLENGTH == 1
                line = substr(line, RSTART + RLENGTH)
                if (closed) break
            }
        }
        return out
    }
    # the last word of s (an identifier), "" if s does not end in one
    function last_word(s) {
        if (match(s, /[A-Za-z_][A-Za-z0-9_]*$/)) return substr(s, RSTART)
        return ""
    }
    function trim_end(s) { sub(/[ \t\n]+$/, "", s); return s }
    # the line of character position p of s
    function line_of(s, p,    head) { head = substr(s, 1, p); return gsub(/\n/, "", head) + 1 }
    # every declaration in code (the text of file, cleaned) with more than limit parameters
    function check(file, code,    rest, offset, name, name_at, before, from, word, pointer,
                   depth, j, c, n, params, after, count) {
        # attributes between a return type and the name take no part
        gsub(/__launch_bounds__[ \t]*\([^()]*\)/, "", code)
        rest = code; offset = 0; n = length(code)
        while (match(rest, /[A-Za-z_][A-Za-z0-9_]*[ \t\n]*\)?[ \t\n]*\(/)) {
            name = substr(rest, RSTART, RLENGTH)
            pointer = name ~ /\)/  # name)( of a function-pointer declarator (*name)(
            sub(/[ \t\n)(]+$/, "", name)
            name_at = offset + RSTART
            offset += RSTART + RLENGTH - 1  # the opening parenthesis of the list
            rest = substr(rest, RSTART + RLENGTH)
            if (name ~ /^(if|for|while|switch|return|sizeof|else|case|do|defined|static_assert|decltype|alignof|__attribute__)$/) continue
            # what stands before the name: a type word, past pointers and references (and
            # the "(*" of a function pointer); a few lines of it are enough
            from = name_at > 400 ? name_at - 400 : 1
            before = trim_end(substr(code, from, name_at - from))
            if (pointer) {
                if (!sub(/\([ \t\n]*\*$/, "", before)) continue
                before = trim_end(before)
            }
            sub(/[*& \t\n]+$/, "", before)
            word = last_word(before)
            if (word == "" || word ~ /^(return|else|case|goto|sizeof|new|delete|throw|do)$/) continue
            # the parameter list, to its matching parenthesis, then a body or a semicolon
            depth = 1; params = ""
            for (j = offset + 1; j <= n && depth > 0; j++) {
                c = substr(code, j, 1)
                if (c == "(" || c == "[" || c == "{") depth++
                else if (c == ")" || c == "]" || c == "}") depth--
                if (depth > 0) params = params c
            }
            after = substr(code, j, 200)
            sub(/^[ \t\n]+/, "", after)
            if (after !~ /^[{;]/) continue
            # commas inside nested brackets do not separate parameters
            while (gsub(/\([^()]*\)|\[[^\[\]]*\]|\{[^{}]*\}/, "", params) > 0) {}
            gsub(/[ \t\n]/, "", params)
            if (params == "" || params == "void") continue
            count = gsub(/,/, "", params) + 1
            if (count <= limit) continue
            printf "%s:%d: %s takes %d parameters (at most %d)\n", file, line_of(code, name_at),
                   name, count, limit
            found = 1
        }
    }
    FNR == 1 {
        if (NR > 1) check(file, code)
        file = FILENAME; code = ""; in_block = 0; directive = 0
    }
    {
        # a preprocessor line, and the lines it continues with a backslash, count as empty
        if (!in_block && (directive || $0 ~ /^[ \t]*#/)) {
            directive = $0 ~ /\\$/
            code = code "\n"
            next
        }
        code = code clean($0) "\n"
    }
    END { if (NR > 0) check(file, code); exit found }
' "${files[@]}"
