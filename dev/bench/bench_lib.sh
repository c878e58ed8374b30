# bench_lib.sh — what bench_mpi.sh and bench_pipeline.sh share (sourced after they set
# $steps): mpirun's flags when run as root, a scratch folder removed at exit, a run's
# ms/step (its last log line's, at step $steps) and the median of numbers on stdin.
extra=()
[ "$(id -u)" -eq 0 ] && extra+=(--allow-run-as-root)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
ms_of() { grep -E "^step +$steps/" "$1" | sed -E 's/.*\| *([0-9.]+) ms\/step/\1/'; }
median() { sort -g | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }'; }
