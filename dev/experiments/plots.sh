#!/usr/bin/env bash
# plots.sh — PNG charts of training runs written by `./train --diagnostics DIR` (gnuplot).
#
# usage: dev/experiments/plots.sh [-o OUT] [-g] RUN...       (make plots RUN="dir1 dir2" [OUT=dir])
#   OUT/loss.png      training loss, validation loss and exact match against steps, every
#                     run on one chart
#   OUT/depth.png     by depth: RMS of the hidden state fed to each sub-layer and of the
#                     sub-layer's output (at the last logged step), and the gradient norm of
#                     each sub-layer's weights (mean over the logged steps)
#   RUN/heatmap.png   AttnRes runs: the depth-attention weights at the last eval, the rows
#                     before attention and before the MLP apart (with K >= 2 depth heads: the
#                     mean over the heads); notes under the plots name the variant (sigmoid
#                     and DenseFormer weights are not normalised, a window's rows, mixing)
#   RUN/heatmap_h<k>.png  runs with K >= 2 depth heads: head k's weights (alpha.csv's
#                     alpha_h<k> column), one chart per head
#   RUN/mhc.png       mHC-lite runs (--mode mhc), beside AttnRes's heatmap: at the last eval,
#                     by sub-layer, the read weights a_pre and the write weights a_post of
#                     each stream, the entries H[s][t] of the mixing matrix, and H's diagonal
#                     mass (trace / m: 1 when every stream keeps to itself) (mhc.csv)
# OUT defaults to the first RUN. Colour tells the mode (none, full, block, mhc); runs of one mode
# differ by dash pattern; a run's label is its directory's name. With -g colour tells the
# group instead: runs whose names differ only in a _seed<k> suffix (the rows of
# dev/experiments/ablate.sh).
set -euo pipefail

out=""
by_group=0
while [ $# -gt 0 ]; do
    case "$1" in
        -o) out=$2; shift 2 ;;
        -g) by_group=1; shift ;;
        *) break ;;
    esac
done
if [ $# -eq 0 ]; then
    echo "usage: dev/experiments/plots.sh [-o OUT] [-g] RUN...   (RUN: a directory of ./train --diagnostics)" >&2
    exit 1
fi
for run in "$@"; do
    for f in meta.csv train.csv eval.csv layers.csv; do
        [ -f "$run/$f" ] || { echo "error: $run/$f is missing (train with --diagnostics $run)" >&2; exit 1; }
    done
    # a run stopped before its first log line or evaluation has headers only: nothing to draw
    for f in train.csv eval.csv layers.csv; do
        [ "$(wc -l <"$run/$f")" -gt 1 ] || {
            echo "error: $run/$f has only its header line (the run stopped before its first $([ $f = eval.csv ] && echo evaluation || echo log line)): nothing to plot" >&2
            exit 1
        }
    done
done
out=${out:-$1}
mkdir -p "$out"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

meta() { awk -F, -v k="$2" '$1 == k { print $2 }' "$1/meta.csv"; }
runs=("$@")

# one plot clause per run: colour by mode (-g: by group, the groups taking the palette's
# colours in order), dash by how many runs of that mode (group) came before
palette=("#555555" "#1f77b4" "#d62728" "#2ca02c" "#ff7f0e" "#9467bd" "#8c564b" "#e377c2"
         "#17becf" "#bcbd22" "#000000")
declare -A seen=() group_colour=()
styles=()
for run in "${runs[@]}"; do
    mode=$(meta "$run" mode)
    case "$mode" in
        none) colour="#555555" ;; full) colour="#1f77b4" ;; mhc) colour="#2ca02c" ;; *) colour="#d62728" ;;
    esac
    key=$mode
    if [ "$by_group" = 1 ]; then
        key=$(basename "$run")
        key=${key%_seed*}
        [ -n "${group_colour[$key]:-}" ] \
            || group_colour[$key]=${palette[$(( ${#group_colour[@]} % ${#palette[@]} ))]}
        colour=${group_colour[$key]}
    fi
    seen[$key]=$(( ${seen[$key]:-0} + 1 ))
    styles+=("lc rgb '$colour' dt ${seen[$key]} lw 1.6 title '$(basename "$run")' noenhanced")
done

# $1: file name inside each run, $2: "using" columns; one clause per run, joined by commas
clauses() {
    local i=0 sep="" line=""
    for run in "${runs[@]}"; do
        line+="$sep'$run/$1' using $2 with lines ${styles[$i]}"
        sep=", "
        i=$((i + 1))
    done
    echo "$line"
}

# exact match exists for the tasks only (empty for text)
panels=2
for run in "${runs[@]}"; do
    if awk -F, 'NR > 1 && $4 != "" { found = 1 } END { exit !found }' "$run/eval.csv"; then panels=3; fi
done
# one step axis for every panel: 0 to the last step any run logged
last_step=$(for run in "${runs[@]}"; do tail -n 1 "$run/train.csv"; done | cut -d, -f1 | sort -n | tail -1)
gnuplot <<EOF
set terminal pngcairo size $((500 * panels)),480 font "DejaVu Sans,10"
set output "$out/loss.png"
set datafile separator ","
set multiplot layout 1,$panels
set grid lc rgb "#dddddd"
set xlabel "step"
set xrange [0:$last_step]
set lmargin 9
set rmargin 2
set logscale y
set format y "%g"
# a log axis labelled 1-2-5 in every decade, not only at powers of ten
set ytics (0.0001, 0.0002, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2, 5, 10, 20, 50)
set key top right font ",8"
set title "training loss"
plot $(clauses train.csv "1:2 every ::1")
unset key
set title "validation loss"
plot $(clauses eval.csv "1:2 every ::1")
if ($panels == 3) {
    unset logscale y
    set ytics autofreq
    set yrange [0:100]
    set title "exact match (%), greedy decoding"
    plot $(clauses eval.csv "1:4 every ::1")
}
unset multiplot
EOF

# depth profiles, one .dat per run: index, input RMS, output RMS, mean gradient norm, name
for i in "${!runs[@]}"; do
    awk -F, 'NR > 1 {
        last = $1; name[$2] = $3; grad[$2] += $6; count[$2]++
        input[$1, $2] = $4; output[$1, $2] = $5; if ($2 > max) max = $2
    } END {
        for (k = -1; k <= max; k++) {
            in_rms = input[last, k] == "" ? "NaN" : input[last, k]
            out_rms = output[last, k] == "" ? "NaN" : output[last, k]
            print k, in_rms, out_rms, grad[k] / count[k], name[k]
        }
    }' "${runs[$i]}/layers.csv" > "$work/depth$i.dat"
done
depth_clauses() {
    local line="" sep=""
    for i in "${!runs[@]}"; do
        line+="$sep'$work/depth$i.dat' using 1:$1:xtic(5) with linespoints pt 7 ps 0.5 ${styles[$i]}"
        sep=", "
    done
    echo "$line"
}
gnuplot <<EOF
set terminal pngcairo size 1500,480 font "DejaVu Sans,10"
set output "$out/depth.png"
set multiplot layout 1,3
set grid lc rgb "#dddddd"
set xtics rotate by 60 right font ",8"
set key top left font ",8"
set title "RMS of the hidden state fed to each sub-layer (last log step)"
plot $(depth_clauses 2)
unset key
set logscale y
set format y "%g"
set ytics (0.0001, 0.0002, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2, 5, 10, 20, 50)
set title "RMS of each sub-layer's output f_l (last log step)"
plot $(depth_clauses 3)
set title "gradient norm of each sub-layer's weights (mean over log steps)"
plot $(depth_clauses 4)
unset multiplot
EOF

# heatmaps of the AttnRes runs: rows of the last eval; before-attention rows on the left,
# before-MLP rows (and the output aggregation) on the right.
# $1: run, $2: alpha.csv's column of the weights (6: alpha, the mean over heads; 7 + k: head
# k), $3: the PNG, $4: the chart's title, $5: its notes under the plots (one per line)
heatmap() {
    local run=$1 column=$2 png=$3 title=$4 notes=$5
    awk -F, -v dir="$work" -v value="$column" 'NR > 1 { step[NR] = $1; row[NR] = $2; col[NR] = $4
                                    name[NR] = $5; alpha[NR] = $value; last = $1 }
    END {
        for (i in step) if (step[i] == last && row[i] > n_sub) n_sub = row[i]  # the out row
        for (i in step) {
            if (step[i] != last) continue
            file = (row[i] % 2 == 0 && row[i] < n_sub) ? "attn" : "mlp"
            y = (row[i] == n_sub) ? n_sub / 2 : int(row[i] / 2)
            print col[i], y, alpha[i] > (dir "/" file ".dat")
            if (alpha[i] + 0 > top) top = alpha[i] + 0
            xname[col[i]] = name[i]
            if (col[i] > max_x) max_x = col[i]
        }
        tics = ""
        for (x = 0; x <= max_x; x++) tics = tics (x ? ", " : "") "\"" xname[x] "\" " x
        print "set xtics (" tics ")" > (dir "/xtics.gp")
        tics = ""
        for (y = 0; y < n_sub / 2; y++) tics = tics (y ? ", " : "") "\"L" y "\" " y
        print "set ytics (" tics ")" > (dir "/ytics_attn.gp")
        print "set ytics (" tics ", \"out\" " n_sub / 2 ")" > (dir "/ytics_mlp.gp")
        print "n_layers = " n_sub / 2 "; n_cols = " max_x + 1 "; step = " last > (dir "/size.gp")
        # the colour scale: 0 to 1, or to the largest weight (DenseFormer) if that is more
        print "top = " (top > 1 ? top : 1) >> (dir "/size.gp")
    }' "$run/alpha.csv"
    # one label per note line, 16 pixels apart under the plots: the chart grows with them
    local lines height
    lines=$(printf '%s\n' "$notes" | wc -l)
    height=$((540 + 16 * lines))
    printf '%s\n' "$notes" | awk -v h="$height" -v n="$lines" '{
        gsub(/"/, "\\\"")
        printf "set label %d \"%s\" at screen 0.5, screen %.4f center font \",9\"\n", NR, $0,
               (12 + 16 * (n - NR)) / h
    }' > "$work/notes.gp"
    gnuplot <<EOF
load "$work/size.gp"
set terminal pngcairo size 1400,$height font "DejaVu Sans,10" noenhanced
set output "$png"
load "$work/notes.gp"
set bmargin $((4 + lines))
set multiplot layout 1,2 title sprintf("${title//%/%%}, step %d", step)
set palette defined (0 "#ffffff", 0.3 "#9ecae1", 1 "#08306b")
set cbrange [0:top]
unset colorbox
set xrange [-0.5:n_cols - 0.5]
# grey where a row has no such source (later sources, or outside a window)
set object 1 rectangle from graph 0, graph 0 to graph 1, graph 1 behind fc rgb "#e8e8e8" fs solid noborder
set xlabel "source"
set tics nomirror scale 0
load "$work/xtics.gp"
set title "input of the attention sub-layers"
set yrange [n_layers - 0.5:-0.5]
load "$work/ytics_attn.gp"
label(a) = abs(a) >= 0.005 ? sprintf("%.0f", 100 * a) : ""
plot "$work/attn.dat" using 1:2:(0.5):(0.5):3 with boxxy fc palette fs solid notitle, \
     "" using 1:2:(label(\$3)):(\$3 > 0.55 * top ? 0xffffff : 0) with labels tc rgb variable font ",8" notitle
set title "input of the MLP sub-layers, and the output aggregation"
set yrange [n_layers + 0.5:-0.5]
load "$work/ytics_mlp.gp"
plot "$work/mlp.dat" using 1:2:(0.5):(0.5):3 with boxxy fc palette fs solid notitle, \
     "" using 1:2:(label(\$3)):(\$3 > 0.55 * top ? 0xffffff : 0) with labels tc rgb variable font ",8" notitle
unset multiplot
EOF
    rm -f "$work"/attn.dat "$work"/mlp.dat
    echo "wrote $png"
}

for run in "${runs[@]}"; do
    [ -f "$run/alpha.csv" ] && [ "$(wc -l < "$run/alpha.csv")" -gt 1 ] || continue
    # the variant (an older run's meta.csv has none of these keys: the default model)
    heads=$(( $(head -n 1 "$run/alpha.csv" | awk -F, '{ print NF }') - 6 ))  # alpha_h<k> columns
    score=$(meta "$run" depth_score)
    mixing=$(meta "$run" mixing)
    window=$(meta "$run" depth_window)
    # what the columns are, as the text heatmap says it
    if [ "$(meta "$run" block_size)" = 1 ]; then
        notes="a<i>, m<i>: the output of layer i's attention, MLP; grey: the row has no such source"
    else
        notes="b<n>: block n (its sum; in the rows inside block n, the partial sum so far); grey: the row has no such source"
    fi
    what="depth-attention weights α (%), mean over the tokens of an eval batch"
    case "$mixing" in
        static)
            what="static depth mixing (%): softmax of learned logits, the same for every token"
            notes+=$'\n'"static mixing: row l is softmax(res_logits row l), learned, not input-dependent" ;;
        dense)
            what="DenseFormer depth mixing: the learned scalars β (× 100), the same for every token"
            notes+=$'\n'"DenseFormer: h = Σ β_i V_i, not normalised: rows do not sum to 100 %, a weight may be negative (100: β = 1, PreNorm's plain sum); colours from 0 to the largest β" ;;
    esac
    if [ "$score" = sigmoid ]; then
        what="depth-attention sigmoid weights α (%), mean over the tokens of an eval batch"
        notes+=$'\n'"sigmoid scores: each weight is sigmoid(s_i) on its own, not normalised: rows do not sum to 100 %"
    fi
    if [ "${window:-0}" -gt 0 ]; then
        notes+=$'\n'"depth window W = $window: a row reads emb and its $window most recent outputs only"
    fi
    name=$(basename "$run")
    if [ "$heads" -le 0 ]; then
        heatmap "$run" 6 "$run/heatmap.png" "$name: $what" "$notes"
        continue
    fi
    channels=$(( $(meta "$run" d_model) / heads ))
    heatmap "$run" 6 "$run/heatmap.png" "$name: $what and the $heads heads" \
        "$notes"$'\n'"$heads heads of $channels channels: each cell is the mean over the heads; heatmap_h0.png .. heatmap_h$((heads - 1)).png show each head"
    for ((k = 0; k < heads; k++)); do
        heatmap "$run" $((7 + k)) "$run/heatmap_h$k.png" \
            "$name, head $k of $heads (channels $((k * channels)) .. $(((k + 1) * channels - 1))): $what" \
            "$notes"$'\n'"head $k's own weights (alpha.csv's alpha_h$k); heatmap.png shows the mean over the $heads heads"
    done
done
# mHC-lite's coefficients at the last eval (mhc.csv: step,row,row_name,stream,a_pre,a_post,
# h_0..h_<m-1>): $1 the run, $2 the PNG. Four panels, one row per sub-layer: a_pre and a_post
# by stream, H's m x m entries side by side, and H's diagonal mass.
mhc_chart() {
    local run=$1 png=$2
    awk -F, -v dir="$work" 'NR == 1 { m = NF - 6; next } { last = $1; line[NR] = $0 }
    END {
        for (i in line) {
            split(line[i], v, ",")
            if (v[1] != last) continue
            l = v[2]; s = v[4]; name[l] = v[3]; if (l > n_rows) n_rows = l
            print s, l, v[5] > (dir "/pre.dat")
            print s, l, v[6] > (dir "/post.dat")
            for (t = 0; t < m; t++) print s * m + t, l, v[7 + t] > (dir "/h.dat")
            diagonal[l] += v[7 + s] / m
        }
        for (l = 0; l <= n_rows; l++) print l, diagonal[l] > (dir "/diagonal.dat")
        tics = ""
        for (l = 0; l <= n_rows; l++) tics = tics (l ? ", " : "") "\"" name[l] "\" " l
        print "set ytics (" tics ")" > (dir "/mhc_ytics.gp")
        tics = ""
        for (i = 0; i < m * m; i++) tics = tics (i ? ", " : "") "\"" int(i / m) ">" i % m "\" " i
        print "set xtics (" tics ") rotate by 90 right" > (dir "/mhc_htics.gp")
        print "m = " m "; n_rows = " n_rows + 1 "; step = " last > (dir "/mhc_size.gp")
    }' "$run/mhc.csv"
    local height=$((240 + 22 * $(wc -l < "$work/diagonal.dat")))
    gnuplot <<EOF
load "$work/mhc_size.gp"
set terminal pngcairo size 1700,$height font "DejaVu Sans,10" noenhanced
set output "$png"
set multiplot layout 1,4 title sprintf("$(basename "$run"): mHC-lite, %d streams, means over the tokens of an eval batch, step %d", m, step)
set palette defined (0 "#ffffff", 0.3 "#c7e9c0", 1 "#00441b")
unset colorbox
set tics nomirror scale 0
set yrange [n_rows - 0.5:-0.5]
load "$work/mhc_ytics.gp"
label(a) = abs(a) >= 0.005 ? sprintf("%.2f", a) : ""
set xrange [-0.5:m - 0.5]
set xtics 1
set xlabel "stream s"
set cbrange [0:1]
set title "read weights a_pre: input = Σ a_pre[s] X_s"
plot "$work/pre.dat" using 1:2:(0.5):(0.5):3 with boxxy fc palette fs solid notitle, \
     "" using 1:2:(label(\$3)):(\$3 > 0.55 ? 0xffffff : 0) with labels tc rgb variable font ",8" notitle
set cbrange [0:2]
set title "write weights a_post: X_s gets a_post[s] f"
plot "$work/post.dat" using 1:2:(0.5):(0.5):3 with boxxy fc palette fs solid notitle, \
     "" using 1:2:(label(\$3)):(\$3 > 1.1 ? 0xffffff : 0) with labels tc rgb variable font ",8" notitle
set cbrange [0:1]
set xrange [-0.5:m * m - 0.5]
load "$work/mhc_htics.gp"
set xlabel "s>t: H[s][t], the share of stream s that flows into stream t"
set title "mixing matrix H (rows and columns sum to 1)"
plot "$work/h.dat" using 1:2:(0.5):(0.5):3 with boxxy fc palette fs solid notitle, \
     "" using 1:2:(label(\$3)):(\$3 > 0.55 ? 0xffffff : 0) with labels tc rgb variable font ",6" notitle
set xrange [0:1.05]
set xtics 0.25 norotate
set xlabel "trace(H) / m"
set grid xtics lc rgb "#dddddd"
set title "H's diagonal mass (1: every stream keeps to itself)"
plot "$work/diagonal.dat" using 2:1 with linespoints pt 7 ps 0.6 lc rgb "#2ca02c" notitle
unset multiplot
EOF
    rm -f "$work"/pre.dat "$work"/post.dat "$work"/h.dat "$work"/diagonal.dat
    echo "wrote $png"
}
for run in "${runs[@]}"; do
    [ -f "$run/mhc.csv" ] && [ "$(wc -l < "$run/mhc.csv")" -gt 1 ] || continue
    mhc_chart "$run" "$run/mhc.png"
done
echo "wrote $out/loss.png $out/depth.png"
