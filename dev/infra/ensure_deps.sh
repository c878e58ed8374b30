#!/usr/bin/env bash
# ensure_deps.sh — make sure the packages a target needs are installed:
#   dev/infra/ensure_deps.sh           what `make test` needs (doctest, boost.context)
#   dev/infra/ensure_deps.sh gnuplot   what `make plots` and `make compare` need (gnuplot-nox)
#   dev/infra/ensure_deps.sh mpi       what `make train-mpi` and `make check`'s data-parallel
#                                tests need (OpenMPI: mpicc, mpirun)
#   dev/infra/ensure_deps.sh fortunes  the English text `make ablate` trains on (fortunes:
#                                /usr/share/games/fortunes, ~2.6 MB)
#   dev/infra/ensure_deps.sh blas      the BLAS `make bench-sizes` runs PyTorch on (OpenBLAS's
#                                OpenMP build, libopenblas0-openmp)
# As root it installs what is missing (apt-get update, then apt-get install -y ...);
# otherwise it prints the exact command to run and fails.
set -u
missing=()
for need in "${@:-test}"; do
    case "$need" in
        test)
            [ -f /usr/include/doctest/doctest.h ] || missing+=(doctest-dev)
            [ -f /usr/include/boost/context/fiber.hpp ] \
                && ls /usr/lib/*/libboost_context.so >/dev/null 2>&1 \
                || missing+=(libboost-context-dev) ;;
        mpi) command -v mpicc >/dev/null 2>&1 && command -v mpirun >/dev/null 2>&1 \
                 || missing+=(libopenmpi-dev openmpi-bin) ;;
        gnuplot) command -v gnuplot >/dev/null 2>&1 || missing+=(gnuplot-nox) ;;
        fortunes) [ -f /usr/share/games/fortunes/wisdom ] || missing+=(fortunes) ;;
        blas) ls /usr/lib/*/openblas-openmp/libblas.so.3 >/dev/null 2>&1 || missing+=(libopenblas0-openmp) ;;
        *) echo "error: ensure_deps.sh does not know '$need' (valid: test, gnuplot, mpi, fortunes, blas)" >&2; exit 1 ;;
    esac
done
[ ${#missing[@]} -eq 0 ] && exit 0
if [ "$(id -u)" -eq 0 ]; then
    echo "installing ${missing[*]} ..."
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -q >/dev/null && apt-get install -y -q "${missing[@]}" >/dev/null \
        || { echo "error: apt-get install -y ${missing[*]} failed" >&2; exit 1; }
else
    echo "error: missing packages; run: sudo apt-get update && sudo apt-get install -y ${missing[*]}" >&2
    exit 1
fi
