#!/usr/bin/env bash
# pipeline_timeline.sh — the schedule a pipeline ran, drawn (gnuplot): from the CSV of
# `./train_mpi --pipeline P --pipeline-trace FILE`, one row per stage, each forward (solid)
# and backward (hatched) a box from its start to its end, coloured by microbatch and
# labelled with its chunk; the gaps are the bubble.
#
# usage: dev/experiments/pipeline_timeline.sh TRACE.csv OUT.png [STEP]
#   (make plots TRACE=trace.csv [OUT=dir] [STEP=n]: OUT/timeline.png)
# STEP: the training step drawn (default: the last in the file; the first steps also time
# the processes' start-up). Its times count from its first start, in milliseconds.
set -euo pipefail
if [ $# -lt 2 ]; then
    echo "usage: dev/experiments/pipeline_timeline.sh TRACE.csv OUT.png [STEP]" >&2
    exit 1
fi
trace=$1 png=$2
[ -f "$trace" ] || { echo "error: trace '$trace' not found" >&2; exit 1; }
[ "$(head -1 "$trace")" = "step,stage,chunk,microbatch,kind,start_ms,end_ms" ] ||
    { echo "error: '$trace' is not a --pipeline-trace file (its first line differs)" >&2; exit 1; }
step=${3:-$(tail -n +2 "$trace" | cut -d, -f1 | sort -n | tail -1)}
[ -n "$step" ] || { echo "error: '$trace' holds no forward or backward" >&2; exit 1; }
data=$(mktemp)
trap 'rm -f "$data"' EXIT
# the step's lines of the trace, their times from its first start: stage chunk microbatch F|B start end
awk -F, -v step="$step" 'NR > 1 && $1 == step { print }' "$trace" |
    sort -t, -k6,6g |
    awk -F, 'NR == 1 { t0 = $6 } { printf "%d %d %d %s %.4f %.4f\n", $2, $3, $4, $5, $6 - t0, $7 - t0 }' > "$data"
[ -s "$data" ] || { echo "error: '$trace' has no step $step" >&2; exit 1; }
stages=$(awk '{ if ($1 + 1 > n) n = $1 + 1 } END { print n }' "$data")
micros=$(awk '{ if ($3 + 1 > n) n = $3 + 1 } END { print n }' "$data")
# the colour bar: one band per microbatch drawn, band m over [m - 0.5, m + 0.5], each a flat
# colour (its two ends the same; 8 colours, then they repeat)
colours=("#1b9e77" "#d95f02" "#7570b3" "#e7298a" "#66a61e" "#e6ab02" "#a6761d" "#666666")
bands=""
for ((m = 0; m < micros; m++)); do
    bands+="${bands:+, }$m \"${colours[m % 8]}\", $((m + 1)) \"${colours[m % 8]}\""
done
gnuplot <<EOF
set terminal pngcairo size 1200, $((160 + 70 * stages)) font "sans,10"
set output "$png"
set title "pipeline schedule, step $step: $stages stages, $micros microbatches (solid: forward, hatched: backward; the label is the chunk)"
set xlabel "milliseconds from the step's first start"
set ylabel "stage"
set yrange [$stages - 0.5:-0.5]
set ytics 1
set grid xtics
set style fill solid 0.8 border -1
set palette defined ($bands)
set cbrange [-0.5:$micros - 0.5]
set cbtics 1
set cblabel "microbatch"
plot "$data" using ((\$5 + \$6) / 2):1:5:6:(\$1 - 0.35):(\$1 + 0.35):3 \
         every ::0 with boxxyerror lc palette fs solid 0.85 title "", \
     "< awk '\$4 == \"B\"' $data" using ((\$5 + \$6) / 2):1:5:6:(\$1 - 0.35):(\$1 + 0.35) \
         with boxxyerror lc rgb "white" fs transparent pattern 4 title "", \
     "$data" using ((\$5 + \$6) / 2):1:(sprintf("%d", \$2)) with labels font "sans,8" title ""
EOF
echo "wrote $png"
