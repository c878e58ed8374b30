# attnres.c — `make train` trains the default model, `make test` runs the essential tests (a
# few minutes), `make check` runs every test (what CI runs), `make help` lists every target. This file reads top to bottom: what a learner runs first (train, test,
# bench, gradcheck), then the tools (sanitizers, studies, experiments), data parallel, CUDA;
# what only a GPU machine runs (gpu-check, carry, the GPU benchmarks and the depth attention's
# block shapes) is in dev/infra/gpu.mk, included at the end. dev/README.md says what each
# tool under dev/ is. A `## ` after a target is its line in `make help`.
CC      ?= gcc
CXX     ?= g++
# CFLAGS and CXXFLAGS may be set on the command line (make CFLAGS=-O2); what the build needs
# is added to them either way (`override`).
CFLAGS  ?= -O3 -march=native
# -fno-trapping-math: no program here reads the floating-point exception flags, and with
# them kept, gcc may not compute both sides of a select, so a loop that calls
# expf_vectorizable (the softmax, SwiGLU) stays scalar on AVX2 (AVX-512's masks vectorise it
# either way); the values are the same bits with or without it. -fno-math-errno: nothing
# reads errno either, and with it kept a loop with sqrtf (AdamW, RMSNorm) stays scalar, as
# sqrtf must set it on a negative input; vectorised, each square root is the same
# correctly rounded value. -Wno-missing-field-initializers:
# a ModelConfig written positionally ({V, d, L, H, G, F, S}) leaves the variant switches
# after S at 0, the default model, on purpose
override CFLAGS += -std=c11 -fopenmp -fno-trapping-math -fno-math-errno -Wall -Wextra -Wno-unused-parameter \
                   -Wno-missing-field-initializers -Isrc -Idata
# the tests' own files are built at -O1: most of a test's time goes to compiling it (doctest's
# macros), while what it calls, the product's objects, is built with CFLAGS
CXXFLAGS ?= -O1 -march=native
override CXXFLAGS += -std=c++17 -fopenmp -Wall -Wextra -Wno-missing-field-initializers -Isrc \
                     -Idata -Itests
LDLIBS  = -lm

SRC_C   = $(wildcard src/*.c) $(wildcard data/*.c)
OBJ     = $(patsubst %.c,build/%.o,$(SRC_C))
TEST_CPP = $(wildcard tests/test_*.cpp)
TEST_OBJ = $(patsubst %.cpp,build/%.o,$(TEST_CPP))

##@ Train, test, bench, gradcheck
.PHONY: all train test bench gradcheck help
all: build/train check_state  ## build ./train and ./check_state (the default target)
	@cp build/train train

train: build/train  ## (re)build ./train and train the default model
	@cp build/train train
	./train

# `make test`: install what is missing (doctest, boost.context), build, then run the essential
# suites (tests/run_all.sh test): the unit tests (every layer's finite differences, the whole
# model in each mode, the command line), every parity state file, gradcheck, the docs' limits
# and one emulator pass of the CUDA kernels. `make check` (what CI runs) runs those and the
# rest: the emulator's other thread order and block shapes, AddressSanitizer + UBSan (the
# safetensors fuzz, the emulated kernels), ./train_cuda's step emulated, data parallel over
# MPI, and, where nvcc is, every CUDA file compiled for the GPU and the GPU tests where there
# is one. DEPTH_SHAPES, ASAN_SHAPE and SHAPE_BINS: dev/infra/gpu.mk.
TEST_BINS  = all test_attnres build/gradcheck build/scaling_fit build/shape_fit build/bench_sizes test_cuda_emu
CHECK_BINS = $(TEST_BINS) build/asan/test_safetensors test_cuda_emu_asan build/emu/train_cuda \
             build/train_mpi build/emu/train_cuda_mpi build/compare_checkpoints \
             $(foreach s,$(DEPTH_SHAPES),build/emu/shape/$s/test_cuda_emu) \
             build/emu_asan/shape/$(ASAN_SHAPE)/test_cuda_emu_asan \
             $(if $(wildcard $(NVCC)),cuda_check cuda build/test_cuda_gpu build/bench_cuda build/bench_gemm \
                                      build/bench_depth build/bench_attention build/train_cuda_mpi $(SHAPE_BINS))
.PHONY: check test-one
test:  ## install what is missing, build, run the essential tests (a few minutes on 2 cores)
	@dev/infra/ensure_deps.sh
	@$(MAKE) --no-print-directory -j2 $(TEST_BINS)
	@tests/run_all.sh test

check:  ## what CI runs: make test's suites and all the rest (sanitizers, MPI, emulator orders)
	@dev/infra/ensure_deps.sh test mpi
	@$(MAKE) --no-print-directory -j2 $(CHECK_BINS)
	@DEPTH_SHAPES="$(DEPTH_SHAPES)" ASAN_SHAPE=$(ASAN_SHAPE) tests/run_all.sh check

# `make test-one NAME="a test case name"`: install what is missing, build the suite with the
# programs its cases run (a shell check: what its group needs), and run exactly that
# doctest case or shell check, commas and all (tests/test_one.sh); exit 2 when nothing has
# that name. `make test-one LIST=1` lists every name. NAME and LIST are data: they reach the
# script unexpanded ($(value)), through its environment, never through make's expansion or
# a shell's command line, so no quote, $(...) or backtick in them runs.
unexport NAME LIST
test-one: export TEST_ONE_NAME = $(value NAME)
test-one: export TEST_ONE_LIST = $(value LIST)
test-one:  ## run one test case or shell check by its exact name: NAME="..." (LIST=1 lists them)
	@dev/infra/ensure_deps.sh
	@if [ -n "$$TEST_ONE_LIST" ]; then tests/test_one.sh --list; else tests/test_one.sh "$$TEST_ONE_NAME"; fi

bench: build/bench build/bench_linear  ## ms/step and tokens/s per mode, then the matmul's GFLOP/s
	./build/bench
	./build/bench_linear

# `make bench-sizes`: the step per mode at several widths, depths and contexts, its share of
# the matmul's rate, and PyTorch eager (dev/bench/bench_pytorch.py) beside each size
# (dev/bench/bench_sizes.sh; SIZES="d,L,T ..." or SIZES=all for the whole grid; PyTorch runs on
# OpenBLAS's OpenMP build, installed when missing, or with TORCH_BLAS=DIR the libblas.so.3 in DIR;
# where OpenBLAS takes a CPU with AVX-512 or AVX2 for a generic core, with OPENBLAS_CORETYPE set
# to SkylakeX or Haswell, and the core named beside the ratio)
# `make bench-attention`: the CPU attention that saves its (B,H,T,T) probabilities
# (dev/bench/attention_v1_materialised.c) beside src/attention.c's, T = 128 .. 16384: ms and the
# bytes each keeps for the backward (dev/bench/bench_attention_cpu.c; seconds)
.PHONY: bench-attention
bench-attention: build/bench_attention_cpu  ## the CPU attention, materialised against flash-style: ms, bytes kept
	./build/bench_attention_cpu

.PHONY: bench-sizes
bench-sizes: build/bench_sizes  ## ms/step, GFLOP/s, share of the matmul rate as d, L, T grow, PyTorch beside [SIZES=]
	@SIZES="$(SIZES)" TORCH_BLAS="$(TORCH_BLAS)" dev/bench/bench_sizes.sh

# `make bench-context`: the bench model's step as the context grows, T = 128 .. 4096 (1024
# tokens a step, then B = 1: T tokens), ms/step, ms a token and memory (what attnres.c's
# model allocates, PyTorch's peak resident), PyTorch beside (dev/bench/bench_sizes.sh, ROUNDS=3 unless given); then the
# attention alone, materialised against flash-style (make bench-attention)
.PHONY: bench-context
bench-context: build/bench_sizes build/bench_attention_cpu  ## the step and its memory as T grows to 4096, PyTorch beside; the attention alone
	@SIZES="256,8,128 256,8,512 256,8,1024 256,8,2048 256,8,4096" TORCH_BLAS="$(TORCH_BLAS)" \
		ROUNDS="$(or $(ROUNDS),3)" dev/bench/bench_sizes.sh
	./build/bench_attention_cpu

# `make gradcheck`: every layer's backward and the whole model's against finite differences,
# one table (dev/check/gradcheck.c); ./build/gradcheck rmsnorm attention checks only those layers.
gradcheck: build/gradcheck  ## every layer's backward and the whole model's against finite differences
	./build/gradcheck

# the `## ` text beside each target, in the order of the makefiles; `##@` lines head a group
help:  ## this list: every target, one line each
	@awk 'BEGIN { FS = ":.*## "; print "make TARGET, one of:" } \
	      /^##@ / { printf "\n%s:\n", substr($$0, 5) } \
	      /^[A-Za-z0-9_-]+:.*## / { printf "  %-19s %s\n", $$1, $$2 }' $(MAKEFILE_LIST)

.PHONY: clean
clean:  ## remove build/ and the programs built in the top folder
	rm -rf build train check_state test_attnres train_cuda test_cuda_emu test_cuda_emu_asan train_mpi train_cuda_mpi

# ---- how they are built -----------------------------------------------------------------
build/%.o: %.c $(wildcard src/*.h data/*.h)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -c $< -o $@

build/tests/%.o: tests/%.cpp $(wildcard src/*.h data/*.h tests/*.h)
	@mkdir -p $(dir $@)
	$(CXX) $(CXXFLAGS) -c $< -o $@

build/train: train.c $(OBJ)
	$(CC) $(CFLAGS) train.c $(OBJ) -o $@ $(LDLIBS)

check_state: dev/check/check_state.c $(OBJ)  ## ./check_state FILE: parity with a PyTorch state file
	$(CC) $(CFLAGS) dev/check/check_state.c $(OBJ) -o $@ $(LDLIBS)

test_attnres: $(TEST_OBJ) $(OBJ)  ## ./test_attnres: the unit tests (doctest; make test runs them)
	$(CXX) $(CXXFLAGS) $(TEST_OBJ) $(OBJ) -o $@ $(LDLIBS)

build/bench: dev/bench/bench.c dev/bench/bench_util.h $(OBJ)
	$(CC) $(CFLAGS) dev/bench/bench.c $(OBJ) -o $@ $(LDLIBS)

build/bench_sizes: dev/bench/bench_sizes.c dev/bench/bench_util.h $(OBJ)
	$(CC) $(CFLAGS) dev/bench/bench_sizes.c $(OBJ) -o $@ $(LDLIBS)

build/bench_attention_cpu: dev/bench/bench_attention_cpu.c dev/bench/attention_v1_materialised.c build/src/attention.o build/src/threads.o
	$(CC) $(CFLAGS) dev/bench/bench_attention_cpu.c dev/bench/attention_v1_materialised.c build/src/attention.o build/src/threads.o -o $@ $(LDLIBS)

build/bench_linear: dev/bench/bench_linear.c build/src/linear.o
	$(CC) $(CFLAGS) dev/bench/bench_linear.c build/src/linear.o -o $@ $(LDLIBS)

build/gradcheck: dev/check/gradcheck.c dev/bench/bench_util.h $(OBJ)
	$(CC) $(CFLAGS) dev/check/gradcheck.c $(OBJ) -o $@ $(LDLIBS)

build/compare_checkpoints: dev/check/compare_checkpoints.c src/util.h
	$(CC) $(CFLAGS) $< -o $@ $(LDLIBS)

# tests/test_bench.cpp includes dev/bench/bench_util.h (the statistics make bench reports)
build/tests/test_bench.o build/asan/tests/test_bench.o: dev/bench/bench_util.h

##@ Sanitizers and studies
# `make asan`: the unit tests and the trainer under AddressSanitizer + UBSan; the CLI tests
# then exercise the sanitized ./train on every bad input.
.PHONY: asan mutants check-state-study torch-roundtrip
ASAN_FLAGS = -O1 -g -fno-omit-frame-pointer -fsanitize=address,undefined -fno-sanitize-recover=all
SAN_OBJ = $(patsubst %.c,build/asan/%.o,$(SRC_C))
SAN_TEST_OBJ = $(patsubst %.cpp,build/asan/%.o,$(TEST_CPP))
build/asan/%.o: %.c $(wildcard src/*.h data/*.h)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(ASAN_FLAGS) -c $< -o $@
build/asan/tests/%.o: tests/%.cpp $(wildcard src/*.h data/*.h tests/*.h)
	@mkdir -p $(dir $@)
	$(CXX) $(CXXFLAGS) $(ASAN_FLAGS) -c $< -o $@
build/asan/train: train.c $(SAN_OBJ)
	$(CC) $(CFLAGS) $(ASAN_FLAGS) train.c $(SAN_OBJ) -o $@ $(LDLIBS)
build/asan/test_attnres: $(SAN_TEST_OBJ) $(SAN_OBJ)
	$(CXX) $(CXXFLAGS) $(ASAN_FLAGS) $(SAN_TEST_OBJ) $(SAN_OBJ) -o $@ $(LDLIBS)
# the safetensors reader's tests alone (its fuzz of truncations and byte flips), which make
# test runs under AddressSanitizer + UBSan: the sanitized objects are built for the emulated
# CUDA suite's ASan run anyway
build/asan/test_safetensors: build/asan/tests/test_safetensors.o build/asan/tests/test_main.o $(SAN_OBJ)
	$(CXX) $(CXXFLAGS) $(ASAN_FLAGS) $^ -o $@ $(LDLIBS)
asan:  ## the unit tests and the CLI tests on ./train under AddressSanitizer + UBSan
	@dev/infra/ensure_deps.sh
	@$(MAKE) --no-print-directory build/asan/train build/asan/test_attnres
	ATTNRES_TRAIN=build/asan/train ./build/asan/test_attnres

# `make mutants`: drop one term of one backward at a time, run its tests, name the survivors
# (dev/check/mutants.py; MUTANTS_FLAGS="--files rmsnorm.c --fail-on-survivor" to narrow it;
# MUTANTS_FLAGS=--cuda: the same, barriers included, to the CUDA kernels under the emulator;
# "--cuda --shape 4x64x4" with another of the depth attention's DEPTH_SHAPES).
mutants:  ## drop one term of a backward at a time; its tests must fail (MUTANTS_FLAGS=...)
	@dev/infra/ensure_deps.sh
	python3 dev/check/mutants.py $(MUTANTS_FLAGS)

# `make check-state-study`: check_state's tolerance on 100 random configs, and five one-term
# bugs it must still catch (dev/check/check_state_study.py; needs Debian's python3-torch;
# STUDY_FLAGS="--count 200 --seed 0" for the calibration configs).
check-state-study: check_state  ## check_state's tolerance on random configs, and bugs it must catch
	/usr/bin/python3 dev/check/check_state_study.py $(STUDY_FLAGS)

# `make torch-roundtrip`: the safetensors round trip through PyTorch, whole: every mode and
# variant trained on text and reversal, exported, loaded in PyTorch (dev/load_safetensors.py),
# its logits checked by check_state and its greedy tokens against ./train --sample; a random
# init written from PyTorch, imported, its first loss against PyTorch's (needs Debian's
# python3-torch; ROUNDTRIP_FLAGS=--quick for 5 models).
torch-roundtrip: all  ## safetensors to PyTorch and back: logits, greedy tokens, first loss
	/usr/bin/python3 dev/load_safetensors.py selftest
	/usr/bin/python3 dev/load_safetensors.py roundtrip $(ROUNDTRIP_FLAGS)

##@ Experiments (charts need gnuplot, installed when missing)
# `make plots RUN="dir1 [dir2 ...]" [OUT=dir]`: PNG charts of runs trained with
# `./train --diagnostics DIR` (dev/experiments/plots.sh); `make plots TRACE=trace.csv
# [OUT=dir] [STEP=n]`: the schedule of `./train_mpi --pipeline P --pipeline-trace trace.csv`,
# one row per stage (dev/experiments/pipeline_timeline.sh). `make compare`: none, full and
# block AttnRes on one task with one budget over 3 seeds, a table and the charts
# (dev/experiments/compare.sh). `make ablate [TEXT=file] [OUT=dir]`: the paper's ablation
# table (Table 4) at toy scale, on English text (Debian's fortunes, installed when missing,
# or TEXT) and on reversal (dev/experiments/ablate.sh; 11-12 min on 2 cores).
# `make scaling [TPP=20] [QUICK=1] [OPT=adamw] [DEVICE=cuda]`: the paper's Table 2 and its
# fits in miniature: none, block, full and mhc at 4 sizes, 2 seeds, Muon + WSD, loss = A·C^−α
# per mode and the compute multipliers (dev/experiments/scaling.sh, docs/scaling.md; on 2
# cores ≤ 45 min, QUICK=1 ≤ 12 min; TPP=20, 20 tokens a parameter: ≤ 60 min, QUICK=1
# ≤ 15 min). `make shape [QUICK=1]`: the paper's best shape at toy scale: none, block and
# full at 5 depths of one parameter count and one token budget, each mode's best depth with
# a bootstrap over the seeds (dev/experiments/shape.sh, docs/shape.md; ≤ 45 min, QUICK=1
# ≤ 10 min).
.PHONY: plots compare ablate scaling shape
plots:  ## PNG charts of --diagnostics runs: RUN="dir1 [dir2 ...]" [OUT=dir]; a pipeline's timeline: TRACE=file.csv
	@dev/infra/ensure_deps.sh gnuplot
	@test -n "$(RUN)$(TRACE)" || { echo 'usage: make plots RUN="dir1 [dir2 ...]" [OUT=dir], or make plots TRACE=trace.csv [OUT=dir] [STEP=n]' >&2; exit 1; }
	$(if $(RUN),dev/experiments/plots.sh $(if $(OUT),-o $(OUT)) $(RUN))
	$(if $(TRACE),dev/experiments/pipeline_timeline.sh $(TRACE) $(or $(OUT),$(patsubst %/,%,$(dir $(TRACE))))/timeline.png $(STEP))

compare: all  ## none, full and block AttnRes, one task, 3 seeds: a table, charts [OUT=dir]
	@dev/infra/ensure_deps.sh gnuplot
	dev/experiments/compare.sh $(OUT)

ablate: all  ## the paper's ablation table at toy scale [TEXT=file] [OUT=dir]
	@dev/infra/ensure_deps.sh gnuplot $(if $(TEXT),,fortunes)
	TEXT="$(TEXT)" dev/experiments/ablate.sh $(OUT)

scaling: all build/scaling_fit $(if $(filter cuda,$(DEVICE)),cuda)  ## loss = A·C^−α per mode, 4 sizes: compute multipliers [TPP=20] [QUICK=1] [OPT=adamw] [DEVICE=cuda]
	@dev/infra/ensure_deps.sh gnuplot $(if $(TEXT),,fortunes)
	TPP="$(TPP)" QUICK="$(QUICK)" OPT="$(OPT)" DEVICE="$(DEVICE)" TEXT="$(TEXT)" dev/experiments/scaling.sh $(OUT)

shape: all build/shape_fit  ## none, block, full at 5 depths of one size: each mode's best depth [QUICK=1] [TEXT=file] [OUT=dir]
	@dev/infra/ensure_deps.sh gnuplot $(if $(TEXT),,fortunes)
	QUICK="$(QUICK)" TEXT="$(TEXT)" dev/experiments/shape.sh $(OUT)

build/scaling_fit: dev/experiments/scaling_fit.c dev/experiments/sweep_runs.c dev/experiments/sweep_runs.h src/rng.h
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(filter %.c,$^) -o $@ -lm

build/shape_fit: dev/experiments/shape_fit.c dev/experiments/sweep_runs.c dev/experiments/sweep_runs.h src/rng.h
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(filter %.c,$^) -o $@ -lm

##@ Data parallel over MPI
# ./train_mpi: the same train.c with distributed.c built by mpicc -DATTNRES_MPI (OpenMPI),
# for data-parallel runs, `mpirun -np W ./train_mpi [flags]`. `make train-mpi` builds it
# (installing OpenMPI when it is missing); ./train never links MPI.
.PHONY: train-mpi bench-mpi
MPICC ?= mpicc
MPI_OBJ = build/mpi/distributed.o $(filter-out build/src/distributed.o,$(OBJ))
build/mpi/distributed.o: src/distributed.c $(wildcard src/*.h)
	@mkdir -p $(dir $@)
	$(MPICC) $(CFLAGS) -DATTNRES_MPI -c $< -o $@

build/train_mpi: train.c $(MPI_OBJ)
	$(MPICC) $(CFLAGS) -DATTNRES_MPI train.c $(MPI_OBJ) -o $@ $(LDLIBS)

train-mpi:  ## ./train_mpi for mpirun -np W processes (./train_cuda_mpi too where nvcc is)
	@dev/infra/ensure_deps.sh mpi
	@$(MAKE) --no-print-directory build/train_mpi $(if $(wildcard $(NVCC)),build/train_cuda_mpi)
	@cp build/train_mpi train_mpi
	$(if $(wildcard $(NVCC)),@cp build/train_cuda_mpi train_cuda_mpi)

# `make bench-pipeline`: 1 process against a 2-stage pipeline, V = 1 and 2, the cache on and
# off: ms/step, the bytes the stages send, the bubble (dev/bench/bench_pipeline.sh)
.PHONY: bench-pipeline
bench-pipeline:  ## a 2-stage pipeline (V = 1, 2; cache on, off) against 1 process: ms/step, bytes, bubble
	@dev/infra/ensure_deps.sh mpi
	@$(MAKE) --no-print-directory build/train_mpi all
	@dev/bench/bench_pipeline.sh

# `make bench-mpi`: 2 processes x 1 thread against 1 process x 2 threads
# (dev/bench/bench_mpi.sh)
bench-mpi:  ## 2 MPI processes x 1 thread against 1 process x 2 threads
	@dev/infra/ensure_deps.sh mpi
	@$(MAKE) --no-print-directory build/train_mpi all
	@dev/bench/bench_mpi.sh

##@ CUDA
# cuda/*.cu mirrors src/*.c kernel for kernel. `make cuda_check` compiles every file with nvcc
# for sm_80 and sm_90, warnings (ptxas: double precision, spills, local memory) as errors.
# Without a GPU the kernels are tested by compiling the same files as C++ against
# tests/cuda_emu.h, which runs every CUDA thread as a fiber (boost.context), and comparing them
# with the CPU layers: `make test_cuda` runs that suite in both thread orders and under ASan.
.PHONY: cuda cuda_check test_cuda
NVCC       ?= /usr/local/cuda/bin/nvcc
# machine code for sm_80 (A100) and sm_90 (H100, H200), and compute_90 PTX that the driver
# compiles for any newer GPU
NVCCFLAGS  = -O3 -std=c++17 -gencode arch=compute_80,code=sm_80 -gencode arch=compute_90,code=sm_90 \
             -gencode arch=compute_90,code=compute_90 \
             -Werror all-warnings -Xptxas -warn-double-usage,-warn-spills,-warn-lmem-usage \
             -Xcompiler -Wall,-Wextra,-Werror,-Wno-missing-field-initializers -Isrc -Icuda
# cuBLAS (./train_cuda --cublas, the reference matmul) from the toolkit, found at run time
# through the toolkit's library folder
CUDA_LIBS  = -lcublas -Xlinker -rpath=$(abspath $(dir $(NVCC))../lib64)
# the kernels and the model; cuda/trainer.cu, the GPU programs' step, is linked by them alone
# (build/train_cuda below)
CUDA_SRC   = $(filter-out cuda/trainer.cu,$(wildcard cuda/*.cu))
CUDA_DEPS  = $(wildcard cuda/*.cuh) src/layers.h src/model.h src/util.h
CUDA_OBJ   = $(patsubst %.cu,build/%.o,$(CUDA_SRC))
EMU_FLAGS  = -std=c++17 -g -Wall -Wextra -Werror -Wno-unknown-pragmas -Wno-missing-field-initializers -Itests -Icuda -Isrc -Idata
EMU_TESTS  = $(wildcard tests/cuda_test_*.cpp)
EMU_OBJ    = $(patsubst %,build/emu/%.o,$(CUDA_SRC) $(EMU_TESTS))
ASAN_OBJ   = $(patsubst %,build/emu_asan/%.o,$(CUDA_SRC) $(EMU_TESTS)) $(SAN_OBJ)

cuda_check: $(CUDA_OBJ) build/cuda/trainer.o  ## compile every CUDA file with nvcc (sm_80, sm_90), warnings as errors

# `make cuda`: ./train_cuda, the same train.c (same flags) with its training step on the GPU:
# cuda/trainer.cu in place of src/trainer.c, linked by nvcc with the CUDA objects and the CPU
# objects (evaluation, checkpoints), cudart linked statically.
cuda: build/train_cuda  ## ./train_cuda: ./train with its training step on the GPU (needs nvcc)
	@cp build/train_cuda train_cuda

build/train_cuda.o: train.c $(wildcard src/*.h data/*.h)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -c train.c -o $@

# the GPU programs' step is cuda/trainer.cu, the mirror of src/trainer.c, in place of its
# object; the same object with MPI or without, as the distributed objects linked decide that
GPU_HOST_OBJ = $(filter-out build/src/trainer.o,$(OBJ))
build/cuda/trainer.o build/emu/cuda/trainer.cu.o: src/trainer.h src/distributed.h src/options.h

build/train_cuda: build/train_cuda.o build/cuda/trainer.o $(CUDA_OBJ) $(GPU_HOST_OBJ)
	$(NVCC) $^ -o $@ -Xcompiler -fopenmp $(LDLIBS) $(CUDA_LIBS)

# ./train_cuda_mpi: ./train_cuda with data parallel over GPUs (`mpirun -np W`, one process
# per GPU): MPI starts the processes and hands them NCCL's id, NCCL (in the CUDA toolkit)
# moves the gradients and parameters on the GPUs' streams. make train-mpi builds it where
# nvcc is.
MPI_LINK = $(shell $(MPICC) --showme:link 2>/dev/null)
build/cuda_mpi/distributed.o: cuda/distributed.cu $(CUDA_DEPS) src/distributed.h
	@mkdir -p $(dir $@)
	$(NVCC) $(NVCCFLAGS) -DATTNRES_MPI -c $< -o $@

build/train_cuda_mpi.o: train.c $(wildcard src/*.h data/*.h)
	@mkdir -p $(dir $@)
	$(MPICC) $(CFLAGS) -DATTNRES_MPI -c train.c -o $@

build/train_cuda_mpi: build/train_cuda_mpi.o build/cuda/trainer.o build/cuda_mpi/distributed.o \
                      $(filter-out build/cuda/distributed.o,$(CUDA_OBJ)) \
                      $(filter-out build/src/trainer.o,$(MPI_OBJ))
	$(NVCC) $^ -o $@ -Xcompiler -fopenmp $(LDLIBS) $(CUDA_LIBS) -lnccl $(MPI_LINK)

# the same with the emulated kernels (and, with no NCCL there, one process): the trainer's
# sharded GPU step, checked against ./train by tests/run_all.sh without a GPU
build/emu/train_cuda_mpi: build/train_cuda_mpi.o build/emu/cuda/trainer.cu.o \
                          $(filter build/emu/cuda/%,$(EMU_OBJ)) $(filter-out build/src/trainer.o,$(MPI_OBJ))
	$(CXX) -fopenmp $^ -o $@ -lboost_context $(LDLIBS) $(MPI_LINK)

build/cuda/%.o: cuda/%.cu $(CUDA_DEPS)
	@mkdir -p $(dir $@)
	$(NVCC) $(NVCCFLAGS) -c $< -o $@

build/emu/%.cu.o: %.cu $(CUDA_DEPS) tests/cuda_emu.h
	@mkdir -p $(dir $@)
	$(CXX) -O2 $(EMU_FLAGS) -x c++ -c $< -o $@

build/emu/%.cpp.o: %.cpp $(CUDA_DEPS) $(wildcard tests/*.h)
	@mkdir -p $(dir $@)
	$(CXX) -O1 $(EMU_FLAGS) -c $< -o $@

test_cuda_emu: $(EMU_OBJ) $(OBJ)  ## ./test_cuda_emu: the CUDA kernels and model against the CPU, emulated
	$(CXX) -fopenmp $(EMU_OBJ) $(OBJ) -o $@ -lboost_context $(LDLIBS)

# ./train_cuda's object with the emulated kernels: tests/run_all.sh checks that the trainer's
# device path prints what ./train prints, without a GPU
build/emu/train_cuda: build/train_cuda.o build/emu/cuda/trainer.cu.o $(filter build/emu/cuda/%,$(EMU_OBJ)) \
                      $(GPU_HOST_OBJ)
	$(CXX) -fopenmp $^ -o $@ -lboost_context $(LDLIBS)

# the same suite under AddressSanitizer and UBSan, linked with the sanitized CPU layers of
# `make asan` ($(SAN_OBJ)); -fsanitize-sections puts red zones between the __shared__ arrays
build/emu_asan/%.cu.o: %.cu $(CUDA_DEPS) tests/cuda_emu.h
	@mkdir -p $(dir $@)
	$(CXX) $(ASAN_FLAGS) -fsanitize-sections=cuda_emu_shared $(EMU_FLAGS) -x c++ -c $< -o $@

build/emu_asan/%.cpp.o: %.cpp $(CUDA_DEPS) $(wildcard tests/*.h)
	@mkdir -p $(dir $@)
	$(CXX) $(ASAN_FLAGS) -fsanitize-sections=cuda_emu_shared $(EMU_FLAGS) -c $< -o $@

test_cuda_emu_asan: $(ASAN_OBJ)  ## ./test_cuda_emu_asan: the same under AddressSanitizer + UBSan
	$(CXX) $(ASAN_FLAGS) -fopenmp $(ASAN_OBJ) -o $@ -lboost_context $(LDLIBS)

# nvcc proves the kernels compile for the GPU wherever it is installed
test_cuda: test_cuda_emu test_cuda_emu_asan $(if $(wildcard $(NVCC)),cuda_check)  ## the emulated CUDA suite, both thread orders and under ASan
	CUDA_EMU_ORDER=forward ./test_cuda_emu
	CUDA_EMU_ORDER=reverse ./test_cuda_emu
	CUDA_EMU_ORDER=reverse ./test_cuda_emu_asan

include dev/infra/gpu.mk
