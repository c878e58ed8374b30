# attnres.c — `make train` trains the default model, `make test` runs every test.
CC      ?= gcc
CXX     ?= g++
# CFLAGS and CXXFLAGS may be set on the command line (make CFLAGS=-O2); what the build needs
# is added to them either way (`override`).
CFLAGS  ?= -O3 -march=native
# -fno-trapping-math: no program here reads the floating-point exception flags, and with
# them kept, gcc may not compute both sides of a select, so a loop that calls
# expf_vectorizable (the softmax, SwiGLU) stays scalar on AVX2 (AVX-512's masks vectorise it
# either way); the values are the same bits with or without it. -Wno-missing-field-initializers:
# a ModelConfig written positionally ({V, d, L, H, G, F, S}) leaves the variant switches
# after S at 0, the default model, on purpose
override CFLAGS += -std=c11 -fopenmp -fno-trapping-math -Wall -Wextra -Wno-unused-parameter \
                   -Wno-missing-field-initializers -Isrc -Idata
CXXFLAGS ?= -O2 -march=native
override CXXFLAGS += -std=c++17 -fopenmp -Wall -Wextra -Wno-missing-field-initializers -Isrc \
                     -Idata -Itests
LDLIBS  = -lm

SRC_C   = $(wildcard src/*.c) $(wildcard data/*.c)
OBJ     = $(patsubst %.c,build/%.o,$(SRC_C))
TEST_CPP = $(wildcard tests/test_*.cpp)
TEST_OBJ = $(patsubst %.cpp,build/%.o,$(TEST_CPP))

.PHONY: all train test bench gradcheck asan clean deps
# ./train is the trainer; `make train` (re)builds it and trains the default model.
all: build/train check_state
	@cp build/train train

build/%.o: %.c $(wildcard src/*.h data/*.h)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -c $< -o $@

build/tests/%.o: tests/%.cpp $(wildcard src/*.h data/*.h tests/*.h)
	@mkdir -p $(dir $@)
	$(CXX) $(CXXFLAGS) -c $< -o $@

build/train: train.c $(OBJ)
	$(CC) $(CFLAGS) train.c $(OBJ) -o $@ $(LDLIBS)

train: build/train
	@cp build/train train
	./train

# ./train_mpi: the same train.c with distributed.c built by mpicc -DATTNRES_MPI (OpenMPI),
# for data-parallel runs, `mpirun -np P ./train_mpi [flags]`. `make train-mpi` builds it
# (installing OpenMPI when it is missing); ./train never links MPI.
MPICC ?= mpicc
MPI_OBJ = build/mpi/distributed.o $(filter-out build/src/distributed.o,$(OBJ))
build/mpi/distributed.o: src/distributed.c $(wildcard src/*.h)
	@mkdir -p $(dir $@)
	$(MPICC) $(CFLAGS) -DATTNRES_MPI -c $< -o $@

build/train_mpi: train.c $(MPI_OBJ)
	$(MPICC) $(CFLAGS) -DATTNRES_MPI train.c $(MPI_OBJ) -o $@ $(LDLIBS)

.PHONY: train-mpi
train-mpi:
	@dev/ensure_deps.sh mpi
	@$(MAKE) --no-print-directory build/train_mpi $(if $(wildcard $(NVCC)),build/train_cuda_mpi)
	@cp build/train_mpi train_mpi
	$(if $(wildcard $(NVCC)),@cp build/train_cuda_mpi train_cuda_mpi)

# `make bench-mpi`: 2 processes x 1 thread against 1 process x 2 threads (dev/bench_mpi.sh)
.PHONY: bench-mpi
bench-mpi:
	@dev/ensure_deps.sh mpi
	@$(MAKE) --no-print-directory build/train_mpi all
	@dev/bench_mpi.sh

build/compare_checkpoints: dev/compare_checkpoints.c src/util.h
	$(CC) $(CFLAGS) $< -o $@ $(LDLIBS)

check_state: dev/check_state.c $(OBJ)
	$(CC) $(CFLAGS) dev/check_state.c $(OBJ) -o $@ $(LDLIBS)

test_attnres: $(TEST_OBJ) $(OBJ)
	$(CXX) $(CXXFLAGS) $(TEST_OBJ) $(OBJ) -o $@ $(LDLIBS)

# `make bench`: ms/step and tokens/s per residual mode, then the matmul's GFLOP/s.
bench: build/bench build/bench_linear
	./build/bench
	./build/bench_linear

build/bench: dev/bench.c dev/bench_util.h $(OBJ)
	$(CC) $(CFLAGS) dev/bench.c $(OBJ) -o $@ $(LDLIBS)

build/bench_linear: dev/bench_linear.c build/src/linear.o
	$(CC) $(CFLAGS) dev/bench_linear.c build/src/linear.o -o $@ $(LDLIBS)

# `make gradcheck`: every layer's backward and the whole model's against finite differences,
# one table (dev/gradcheck.c); ./build/gradcheck rmsnorm attention checks only those layers.
gradcheck: build/gradcheck
	./build/gradcheck

build/gradcheck: dev/gradcheck.c dev/bench_util.h $(OBJ)
	$(CC) $(CFLAGS) dev/gradcheck.c $(OBJ) -o $@ $(LDLIBS)

# `make asan`: the unit tests and the trainer under AddressSanitizer + UBSan; the CLI tests
# then exercise the sanitized ./train on every bad input.
SAN_OBJ = $(patsubst %.c,build/asan/%.o,$(SRC_C))
SAN_TEST_OBJ = $(patsubst %.cpp,build/asan/%.o,$(TEST_CPP))
build/asan/%.o: %.c $(wildcard src/*.h data/*.h)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(ASAN_FLAGS) -c $< -o $@
build/asan/tests/%.o: tests/%.cpp $(wildcard src/*.h data/*.h tests/*.h)
	@mkdir -p $(dir $@)
	$(CXX) $(CXXFLAGS) $(ASAN_FLAGS) -c $< -o $@
# tests/test_bench.cpp includes dev/bench_util.h (the statistics make bench reports)
build/tests/test_bench.o build/asan/tests/test_bench.o: dev/bench_util.h
build/asan/train: train.c $(SAN_OBJ)
	$(CC) $(CFLAGS) $(ASAN_FLAGS) train.c $(SAN_OBJ) -o $@ $(LDLIBS)
build/asan/test_attnres: $(SAN_TEST_OBJ) $(SAN_OBJ)
	$(CXX) $(CXXFLAGS) $(ASAN_FLAGS) $(SAN_TEST_OBJ) $(SAN_OBJ) -o $@ $(LDLIBS)
asan:
	@dev/ensure_deps.sh
	@$(MAKE) --no-print-directory build/asan/train build/asan/test_attnres
	ATTNRES_TRAIN=build/asan/train ./build/asan/test_attnres

# `make mutants`: drop one term of one backward at a time, run its tests, name the survivors
# (dev/mutants.py; MUTANTS_FLAGS="--files rmsnorm.c --fail-on-survivor" to narrow it;
# MUTANTS_FLAGS=--cuda: the same, barriers included, to the CUDA kernels under the emulator;
# "--cuda --shape 4x64x4" with another of the depth attention's DEPTH_SHAPES).
.PHONY: mutants
mutants:
	@dev/ensure_deps.sh
	python3 dev/mutants.py $(MUTANTS_FLAGS)

# `make check-state-study`: check_state's tolerance on 100 random configs, and five one-term
# bugs it must still catch (dev/check_state_study.py; needs Debian's python3-torch;
# STUDY_FLAGS="--count 200 --seed 0" for the calibration configs).
.PHONY: check-state-study
check-state-study: check_state
	/usr/bin/python3 dev/check_state_study.py $(STUDY_FLAGS)

# `make test`: install what is missing (doctest, boost.context), build, run every suite.
# With nvcc present the CUDA kernels are also compiled for the GPU (cuda_check), and so are
# ./train_cuda (cuda) and the GPU build of the whole-model test, which tests/run_all.sh runs
# where there is a GPU.
TEST_BINS = all test_attnres build/gradcheck test_cuda_emu test_cuda_emu_asan build/emu/train_cuda \
            build/train_mpi build/emu/train_cuda_mpi build/compare_checkpoints \
            $(foreach s,$(DEPTH_SHAPES),build/emu/shape/$s/test_cuda_emu) \
            build/emu_asan/shape/$(ASAN_SHAPE)/test_cuda_emu_asan
test:
	@dev/ensure_deps.sh
	@$(MAKE) --no-print-directory -j2 $(TEST_BINS) \
		$(if $(wildcard $(NVCC)),cuda_check cuda build/test_cuda_gpu build/bench_cuda build/bench_gemm build/bench_depth \
		                         build/bench_attention build/train_cuda_mpi $(SHAPE_BINS))
	@DEPTH_SHAPES="$(DEPTH_SHAPES)" ASAN_SHAPE=$(ASAN_SHAPE) tests/run_all.sh

# `make plots RUN="dir1 [dir2 ...]" [OUT=dir]`: PNG charts of runs trained with
# `./train --diagnostics DIR` (dev/plots.sh). `make compare`: none, full and block AttnRes
# on one task with one budget over 3 seeds, a table and the charts (dev/compare.sh).
# `make ablate [TEXT=file] [OUT=dir]`: the paper's ablation table (Table 4) at toy scale, on
# English text (Debian's fortunes, installed when missing, or TEXT) and on reversal
# (dev/ablate.sh; 11-12 min on 2 cores).
.PHONY: plots compare ablate
plots:
	@dev/ensure_deps.sh gnuplot
	@test -n "$(RUN)" || { echo 'usage: make plots RUN="dir1 [dir2 ...]" [OUT=dir]' >&2; exit 1; }
	dev/plots.sh $(if $(OUT),-o $(OUT)) $(RUN)

compare: all
	@dev/ensure_deps.sh gnuplot
	dev/compare.sh $(OUT)

ablate: all
	@dev/ensure_deps.sh gnuplot $(if $(TEXT),,fortunes)
	TEXT="$(TEXT)" dev/ablate.sh $(OUT)

clean:
	rm -rf build train check_state test_attnres train_cuda test_cuda_emu test_cuda_emu_asan

# ---- CUDA ----
# cuda/*.cu mirrors src/*.c kernel for kernel. `make cuda_check` compiles every file with nvcc
# for sm_80 and sm_90, warnings (ptxas: double precision, spills, local memory) as errors.
# Without a GPU the kernels are tested by compiling the same files as C++ against
# tests/cuda_emu.h, which runs every CUDA thread as a fiber (boost.context), and comparing them
# with the CPU layers: `make test_cuda` runs that suite in both thread orders and under ASan.
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
CUDA_SRC   = $(wildcard cuda/*.cu)
CUDA_DEPS  = $(wildcard cuda/*.cuh) src/layers.h src/model.h src/util.h
CUDA_OBJ   = $(patsubst %.cu,build/%.o,$(CUDA_SRC))
EMU_FLAGS  = -std=c++17 -g -Wall -Wextra -Werror -Wno-unknown-pragmas -Wno-missing-field-initializers -Itests -Icuda -Isrc -Idata
EMU_TESTS  = $(wildcard tests/cuda_test_*.cpp)
EMU_OBJ    = $(patsubst %,build/emu/%.o,$(CUDA_SRC) $(EMU_TESTS))
ASAN_FLAGS = -O1 -g -fno-omit-frame-pointer -fsanitize=address,undefined -fno-sanitize-recover=all
ASAN_OBJ   = $(patsubst %,build/emu_asan/%.o,$(CUDA_SRC) $(EMU_TESTS)) $(SAN_OBJ)

.PHONY: cuda cuda_check test_cuda
cuda_check: $(CUDA_OBJ)

# `make cuda`: ./train_cuda, the same train.c (same flags) with its training step on the GPU
# (cuda/model.cu): src/trainer.c compiled by $(CC) with -DATTNRES_CUDA, linked by nvcc with
# the CUDA objects and the CPU objects (evaluation, checkpoints), cudart linked statically.
cuda: build/train_cuda
	@cp build/train_cuda train_cuda

build/train_cuda.o: train.c $(wildcard src/*.h data/*.h)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -c train.c -o $@

# src/trainer.c, where the step runs, is compiled again with -DATTNRES_CUDA for the GPU
# trainers, in place of its CPU object
GPU_HOST_OBJ = $(filter-out build/src/trainer.o,$(OBJ))
build/trainer_cuda.o: src/trainer.c cuda/model.cuh cuda/distributed.cuh $(wildcard src/*.h)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -DATTNRES_CUDA -Icuda -c $< -o $@

build/train_cuda: build/train_cuda.o build/trainer_cuda.o $(CUDA_OBJ) $(GPU_HOST_OBJ)
	$(NVCC) $^ -o $@ -Xcompiler -fopenmp $(LDLIBS) $(CUDA_LIBS)

# ./train_cuda_mpi: ./train_cuda with data parallel over GPUs (`mpirun -np P`, one process
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

build/trainer_cuda_mpi.o: src/trainer.c cuda/model.cuh cuda/distributed.cuh $(wildcard src/*.h)
	@mkdir -p $(dir $@)
	$(MPICC) $(CFLAGS) -DATTNRES_CUDA -DATTNRES_MPI -Icuda -c $< -o $@

build/train_cuda_mpi: build/train_cuda_mpi.o build/trainer_cuda_mpi.o build/cuda_mpi/distributed.o \
                      $(filter-out build/cuda/distributed.o,$(CUDA_OBJ)) \
                      $(filter-out build/src/trainer.o,$(MPI_OBJ))
	$(NVCC) $^ -o $@ -Xcompiler -fopenmp $(LDLIBS) $(CUDA_LIBS) -lnccl $(MPI_LINK)

# the same with the emulated kernels (and, with no NCCL there, one process): the trainer's
# sharded GPU step, checked against ./train by tests/run_all.sh without a GPU
build/emu/train_cuda_mpi: build/train_cuda_mpi.o build/trainer_cuda_mpi.o \
                          $(filter build/emu/cuda/%,$(EMU_OBJ)) $(filter-out build/src/trainer.o,$(MPI_OBJ))
	$(CXX) -fopenmp $^ -o $@ -lboost_context $(LDLIBS) $(MPI_LINK)

# the agreement tests on a real GPU: tests/cuda_test_{layers,model}.cpp compiled by nvcc
# (-x cu: against cuda_runtime.h instead of the emulator) with the CUDA and CPU objects.
# doctest comes from the system, or from .carry/ (make carry) on a machine without it.
CARRY_INCLUDE = $(if $(wildcard .carry/doctest/doctest.h),-I.carry)
build/gpu/%.o: tests/%.cpp $(CUDA_DEPS) tests/gradcheck.h
	@mkdir -p $(dir $@)
	$(NVCC) $(NVCCFLAGS) -Itests $(CARRY_INCLUDE) -Xcompiler -fopenmp -x cu -c $< -o $@

build/test_cuda_gpu: build/gpu/cuda_test_layers.o build/gpu/cuda_test_model.o build/gpu/cuda_test_main.o $(CUDA_OBJ) $(OBJ)
	$(NVCC) $^ -o $@ -Xcompiler -fopenmp $(LDLIBS) $(CUDA_LIBS)

build/cuda/%.o: cuda/%.cu $(CUDA_DEPS)
	@mkdir -p $(dir $@)
	$(NVCC) $(NVCCFLAGS) -c $< -o $@

build/emu/%.cu.o: %.cu $(CUDA_DEPS) tests/cuda_emu.h
	@mkdir -p $(dir $@)
	$(CXX) -O2 $(EMU_FLAGS) -x c++ -c $< -o $@

build/emu/%.cpp.o: %.cpp $(CUDA_DEPS) $(wildcard tests/*.h)
	@mkdir -p $(dir $@)
	$(CXX) -O2 $(EMU_FLAGS) -c $< -o $@

test_cuda_emu: $(EMU_OBJ) $(OBJ)
	$(CXX) -fopenmp $(EMU_OBJ) $(OBJ) -o $@ -lboost_context $(LDLIBS)

# ./train_cuda's object with the emulated kernels: tests/run_all.sh checks that the trainer's
# device path prints what ./train prints, without a GPU
build/emu/train_cuda: build/train_cuda.o build/trainer_cuda.o $(filter build/emu/cuda/%,$(EMU_OBJ)) \
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

test_cuda_emu_asan: $(ASAN_OBJ)
	$(CXX) $(ASAN_FLAGS) -fopenmp $(ASAN_OBJ) -o $@ -lboost_context $(LDLIBS)

# `make gpu-check`: on a machine with a GPU (and no network: nothing is installed), build
# everything with nvcc, then dev/gpu_check.sh runs the GPU tests, compute-sanitizer, ./train
# against ./train_cuda, the NCCL path on one GPU, and the speed benchmarks, and prints a
# summary (OUT=DIR keeps the logs; BUDGET=seconds, 450 by default, counted from its start,
# build included, bounds the optional profiling and sweeps at its end; QUICK=1 leaves out the
# slowest and optional parts, to check a fix in less GPU time). Without a GPU it builds, says
# so in one line and exits 0.
# `make carry` first (dev/carry.sh), on a machine with Debian's packages, copies doctest's
# header and OpenMPI into .carry/ to take along to one without them; gpu-check uses that
# OpenMPI when the machine has none (for build/train_cuda_mpi and its mpirun). `make carry
# AB=commit` also keeps cuda/, src/ and dev/ as at that commit, and gpu-check times both
# (before/after).
.PHONY: gpu-check carry
gpu-check:
	@test -x $(NVCC) || { echo "gpu-check: no nvcc at $(NVCC) (the CUDA toolkit is needed)"; exit 1; }
	@bash -c 'export GPU_CHECK_START=$$(date +%s); \
	          if ! command -v $(MPICC) >/dev/null 2>&1 && [ -f .carry/openmpi/env.sh ]; then \
	              . .carry/openmpi/env.sh && echo "gpu-check: OpenMPI from .carry/openmpi"; fi; \
	          $(MAKE) --no-print-directory -j$$(nproc) all cuda build/test_cuda_gpu build/bench_cuda \
	              build/bench_gemm build/bench_depth $(if $(filter-out 0,$(QUICK)),,build/bench_attention) $(SHAPE_BINS) \
	              $$(command -v $(MPICC) >/dev/null 2>&1 && echo build/train_cuda_mpi) \
	          && GPU_CHECK_OUT=$(OUT) GPU_CHECK_BUDGET=$(BUDGET) DEPTH_SHAPES="$(DEPTH_SHAPES)" \
	             GPU_CHECK_QUICK=$(QUICK) dev/gpu_check.sh'

carry:
	@dev/carry.sh $(AB)

build/bench_cuda.o: dev/bench_cuda.c dev/bench_util.h cuda/model.cuh $(wildcard src/*.h)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -Icuda -c $< -o $@

build/bench_cuda: build/bench_cuda.o $(CUDA_OBJ) $(OBJ)
	$(NVCC) $^ -o $@ -Xcompiler -fopenmp $(LDLIBS) $(CUDA_LIBS)

build/bench_gemm: dev/bench_gemm.cu dev/bench_gpu.h $(CUDA_OBJ) $(CUDA_DEPS)
	$(NVCC) $(NVCCFLAGS) -Idev $< $(CUDA_OBJ) $(OBJ) -o $@ -Xcompiler -fopenmp $(LDLIBS) $(CUDA_LIBS)

build/bench_depth: dev/bench_depth.cu dev/bench_util.h dev/bench_gpu.h $(CUDA_OBJ) $(CUDA_DEPS)
	$(NVCC) $(NVCCFLAGS) -Idev $< $(CUDA_OBJ) $(OBJ) -o $@ -Xcompiler -fopenmp $(LDLIBS) $(CUDA_LIBS)

build/bench_attention: dev/bench_attention.cu dev/bench_gpu.h $(CUDA_OBJ) $(CUDA_DEPS)
	$(NVCC) $(NVCCFLAGS) -Idev $< $(CUDA_OBJ) $(OBJ) -o $@ -Xcompiler -fopenmp $(LDLIBS) $(CUDA_LIBS)

# The depth attention's block shape (cuda/depth_attention.cu: DEPTH_ROWS rows of ROW_THREADS
# threads, each thread taking DEPTH_COLS of its columns at a time; 4x64x2 by default) is for a
# GPU to choose: make gpu-check also times the step (bench_cuda) and the depth kernels
# (bench_depth, which first checks them against the CPU) built with each shape
# ROWSxTHREADSxCOLS below, under build/shape/ROWSxTHREADSxCOLS/.
DEPTH_SHAPES   = 4x64x1 4x64x4 2x64x4 8x64x2 8x64x4 2x128x2
SHAPE_BINS     = $(foreach s,$(DEPTH_SHAPES),build/shape/$s/bench_cuda build/shape/$s/bench_depth)
SHAPE_CUDA_OBJ = $(filter-out build/cuda/depth_attention.o,$(CUDA_OBJ))
shape_flags    = $(foreach f,1 2 3,-D$(word $f,DEPTH_ROWS ROW_THREADS DEPTH_COLS)=$(word $f,$(subst x, ,$1)))
.PRECIOUS: build/shape/%/depth_attention.o build/emu/shape/%/depth_attention.cu.o

# ... and `make test` runs the depth attention's agreement tests with each shape under the
# emulator (tests/run_all.sh), so that the kernels stay right for any shape
build/emu/shape/%/depth_attention.cu.o: cuda/depth_attention.cu $(CUDA_DEPS) tests/cuda_emu.h
	@mkdir -p $(dir $@)
	$(CXX) -O2 $(EMU_FLAGS) $(call shape_flags,$*) -x c++ -c $< -o $@

build/emu/shape/%/test_cuda_emu: build/emu/shape/%/depth_attention.cu.o \
                                 $(filter-out build/emu/cuda/depth_attention.cu.o,$(EMU_OBJ)) $(OBJ)
	$(CXX) -fopenmp $^ -o $@ -lboost_context $(LDLIBS)

# ... and under AddressSanitizer with ASAN_SHAPE, the shape of the most column groups per
# thread (5 at C = 601), the last of them partial: no load or store past a row's end
ASAN_SHAPE = 8x32x4
build/emu_asan/shape/%/depth_attention.cu.o: cuda/depth_attention.cu $(CUDA_DEPS) tests/cuda_emu.h
	@mkdir -p $(dir $@)
	$(CXX) $(ASAN_FLAGS) -fsanitize-sections=cuda_emu_shared $(EMU_FLAGS) $(call shape_flags,$*) \
		-x c++ -c $< -o $@

build/emu_asan/shape/%/test_cuda_emu_asan: build/emu_asan/shape/%/depth_attention.cu.o \
                           $(filter-out build/emu_asan/cuda/depth_attention.cu.o,$(ASAN_OBJ))
	$(CXX) $(ASAN_FLAGS) -fopenmp $^ -o $@ -lboost_context $(LDLIBS)

build/shape/%/depth_attention.o: cuda/depth_attention.cu $(CUDA_DEPS)
	@mkdir -p $(dir $@)
	$(NVCC) $(NVCCFLAGS) $(call shape_flags,$*) -c $< -o $@

build/shape/%/bench_cuda: build/bench_cuda.o build/shape/%/depth_attention.o $(SHAPE_CUDA_OBJ) $(OBJ)
	$(NVCC) $^ -o $@ -Xcompiler -fopenmp $(LDLIBS) $(CUDA_LIBS)

build/shape/%/bench_depth: dev/bench_depth.cu dev/bench_util.h dev/bench_gpu.h \
                           build/shape/%/depth_attention.o $(SHAPE_CUDA_OBJ) $(CUDA_DEPS)
	$(NVCC) $(NVCCFLAGS) -Idev $< build/shape/$*/depth_attention.o $(SHAPE_CUDA_OBJ) $(OBJ) -o $@ \
		-Xcompiler -fopenmp $(LDLIBS) $(CUDA_LIBS)

# nvcc proves the kernels compile for the GPU wherever it is installed
test_cuda: test_cuda_emu test_cuda_emu_asan $(if $(wildcard $(NVCC)),cuda_check)
	CUDA_EMU_ORDER=forward ./test_cuda_emu
	CUDA_EMU_ORDER=reverse ./test_cuda_emu
	CUDA_EMU_ORDER=reverse ./test_cuda_emu_asan
