#!/usr/bin/env bash
# carry.sh — what `make carry` runs: gathers into .carry/ (ignored by git) what `make gpu-check`
# needs on a GPU machine that has no network and none of Debian's packages:
#   .carry/doctest/          the doctest header (the GPU build of the agreement tests)
#   .carry/openmpi/usr/...   OpenMPI's programs, libraries, plugins and headers, with PMIx,
#                            hwloc and libevent (~18 MB), copied from this machine's Debian
#                            packages, so that build/train_cuda_mpi builds and
#                            `mpirun -np 1 build/train_cuda_mpi` runs there (the NCCL path)
#   .carry/openmpi/env.sh    sourced there: points PATH, LD_LIBRARY_PATH and OpenMPI's and
#                            PMIx's relocation variables at the copy, wherever it lands
#   .carry/ab/               only with a commit (make carry AB=commit): the files of cuda/,
#                            src/, dev/ and the Makefile as they were at that commit, those that
#                            differ from now (the model's orchestration in src/ goes with the
#                            kernels it calls, the benchmarks with the config and API of their
#                            time, and the Makefile with where dev/ kept them);
#                            gpu-check then also times the step (and the matmul and depth
#                            attention, where that commit has their benchmarks) built with
#                            them, a before/after on one GPU (its time is scarce, and the
#                            numbers of two different machines do not compare)
# Then name .carry in the device run's carry list. Installs what is missing here first
# (dev/infra/ensure_deps.sh: doctest, OpenMPI).
set -eu
cd "$(dirname "$0")/../.."
ab_commit=${1:-}
rm -rf .carry/ab
if [ -n "$ab_commit" ]; then
    if ! git rev-parse --verify --quiet "$ab_commit^{commit}" >/dev/null; then
        echo "error: carry: AB=$ab_commit is not a commit of this repository" >&2
        exit 1
    fi
    mkdir -p .carry/ab
    # --no-renames: a file moved since is also listed at its old path, where that commit has it
    git diff --no-renames --name-only "$ab_commit" -- cuda src dev Makefile | while read -r f; do
        if git cat-file -e "$ab_commit:$f" 2>/dev/null; then  # not a file added since
            mkdir -p ".carry/ab/$(dirname "$f")"
            git show "$ab_commit:$f" >".carry/ab/$f"
        fi
    done
    git log -1 --format='%h %s' "$ab_commit" >.carry/ab/COMMIT
    echo "carry: .carry/ab: $(find .carry/ab/cuda .carry/ab/src .carry/ab/dev .carry/ab/Makefile -type f 2>/dev/null | wc -l) files of cuda/, src/, dev/ and the Makefile as at $(cut -c1-60 .carry/ab/COMMIT)"
fi
dev/infra/ensure_deps.sh test mpi
rm -rf .carry/doctest .carry/openmpi
mkdir -p .carry/openmpi
cp -r /usr/include/doctest .carry/

# every file of the packages OpenMPI runs and builds with, minus documentation, Fortran, Java
# and static libraries
packages=(libopenmpi3 openmpi-bin openmpi-common libopenmpi-dev libpmix2 libhwloc15
          libevent-core-2.1-7 libevent-pthreads-2.1-7)
dpkg -L "${packages[@]}" | while read -r f; do
    if [ -f "$f" ] || [ -L "$f" ]; then echo "$f"; fi
done | grep -v -e /share/doc -e /share/man -e /share/lintian -e '\.a$' -e java -e fortran \
             -e /mpif -e _usempi -e libmpi_mpifh -e libompitrace >.carry/openmpi/files.txt
tar -cf - -T .carry/openmpi/files.txt 2>/dev/null | tar -xf - -C .carry/openmpi
# the names Debian gives through /etc/alternatives (absolute links that would not travel)
for tool in mpicc mpicxx mpirun mpiexec; do
    ln -sf "$tool.openmpi" ".carry/openmpi/usr/bin/$tool"
done

cat >.carry/openmpi/env.sh <<'EOF'
# source this: OpenMPI from .carry/openmpi (dev/infra/carry.sh), relocated to where it now is
carry_mpi=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/usr
export OPAL_PREFIX=$carry_mpi                                  # OpenMPI's install prefix
export PMIX_MCA_mca_base_component_path=$carry_mpi/lib/x86_64-linux-gnu/pmix2/lib/pmix
export PATH=$carry_mpi/bin:$PATH
export LD_LIBRARY_PATH=$carry_mpi/lib/x86_64-linux-gnu:$carry_mpi/lib/x86_64-linux-gnu/openmpi/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
EOF
echo "carry: .carry/doctest and .carry/openmpi ($(du -sh .carry | cut -f1) in all) ready" \
     "(name .carry in the device run's carry list)"
