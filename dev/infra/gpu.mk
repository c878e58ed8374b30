# gpu.mk — included by the Makefile (which defines NVCC, NVCCFLAGS, the CUDA and CPU objects
# and the emulator's flags): what runs on a machine with a GPU. make gpu-check and the
# make carry it needs, the GPU agreement tests, the GPU benchmarks, and the depth attention's
# block shapes (DEPTH_SHAPES), which make gpu-check times on the GPU and make test checks
# under the emulator.

##@ On a GPU machine
# `make gpu-check`: on a machine with a GPU (and no network: nothing is installed), build
# everything with nvcc, then dev/infra/gpu_check.sh runs the GPU tests, compute-sanitizer,
# ./train against ./train_cuda, the NCCL path on one GPU, and the speed benchmarks, and prints
# a summary (OUT=DIR keeps the logs; BUDGET=seconds, 450 by default, counted from its start,
# build included, bounds the optional profiling and sweeps at its end; QUICK=1 leaves out the
# slowest and optional parts, to check a fix in less GPU time; SWEEP=1 keeps the size sweep
# with QUICK). Without a GPU it builds, says so in one line and exits 0.
# `make carry` first (dev/infra/carry.sh), on a machine with Debian's packages, copies
# doctest's header and OpenMPI into .carry/ to take along to one without them; gpu-check uses
# that OpenMPI when the machine has none (for build/train_cuda_mpi and its mpirun). `make
# carry AB=commit` also keeps cuda/, src/, dev/ and the Makefile as at that commit, and
# gpu-check times both (before/after).
.PHONY: gpu-check carry
gpu-check:  ## on a GPU: build with nvcc; GPU tests, sanitizers, speed [OUT= BUDGET= QUICK=1 SWEEP=1]
	@test -x $(NVCC) || { echo "gpu-check: no nvcc at $(NVCC) (the CUDA toolkit is needed)"; exit 1; }
	@bash -c 'export GPU_CHECK_START=$$(date +%s); \
	          if ! command -v $(MPICC) >/dev/null 2>&1 && [ -f .carry/openmpi/env.sh ]; then \
	              . .carry/openmpi/env.sh && echo "gpu-check: OpenMPI from .carry/openmpi"; fi; \
	          $(MAKE) --no-print-directory -j$$(nproc) all cuda build/test_cuda_gpu build/bench_cuda \
	              build/bench_gemm build/bench_depth build/bench_sizes_cuda $(if $(filter-out 0,$(QUICK)),,build/bench_attention) $(SHAPE_BINS) \
	              $$(command -v $(MPICC) >/dev/null 2>&1 && echo build/train_cuda_mpi) \
	          && GPU_CHECK_OUT=$(OUT) GPU_CHECK_BUDGET=$(BUDGET) DEPTH_SHAPES="$(DEPTH_SHAPES)" \
	             GPU_CHECK_QUICK=$(QUICK) GPU_CHECK_SWEEP=$(SWEEP) dev/infra/gpu_check.sh'

carry:  ## doctest and OpenMPI into .carry/, for a GPU machine without them [AB=commit]
	@dev/infra/carry.sh $(AB)

# the agreement tests on a real GPU: tests/cuda_test_{layers,depth,model,graph}.cpp compiled by nvcc
# (-x cu: against cuda_runtime.h instead of the emulator) with the CUDA and CPU objects.
# doctest comes from the system, or from .carry/ (make carry) on a machine without it.
CARRY_INCLUDE = $(if $(wildcard .carry/doctest/doctest.h),-I.carry)
build/gpu/%.o: tests/%.cpp $(CUDA_DEPS) tests/gradcheck.h
	@mkdir -p $(dir $@)
	$(NVCC) $(NVCCFLAGS) -Itests $(CARRY_INCLUDE) -Xcompiler -fopenmp -x cu -c $< -o $@

build/test_cuda_gpu: build/gpu/cuda_test_layers.o build/gpu/cuda_test_depth.o build/gpu/cuda_test_model.o build/gpu/cuda_test_graph.o build/gpu/cuda_test_main.o $(CUDA_OBJ) $(OBJ)
	$(NVCC) $^ -o $@ -Xcompiler -fopenmp $(LDLIBS) $(CUDA_LIBS)

# the GPU benchmarks (dev/bench/): the step per mode, and the matmul, the depth attention and
# the causal attention version by version
build/bench_cuda.o: dev/bench/bench_cuda.c dev/bench/bench_util.h cuda/model.cuh $(wildcard src/*.h)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -Icuda -c $< -o $@

build/bench_cuda: build/bench_cuda.o $(CUDA_OBJ) $(OBJ)
	$(NVCC) $^ -o $@ -Xcompiler -fopenmp $(LDLIBS) $(CUDA_LIBS)

# bench_sizes.c with ./train_cuda's step, compiled as CUDA C++ (it calls linear_forward_cuda)
build/bench_sizes_cuda.o: dev/bench/bench_sizes.c dev/bench/bench_util.h $(CUDA_DEPS)
	@mkdir -p $(dir $@)
	$(NVCC) $(NVCCFLAGS) -DBENCH_CUDA -Idev/bench -Xcompiler -fopenmp -x cu -c $< -o $@

build/bench_sizes_cuda: build/bench_sizes_cuda.o $(CUDA_OBJ) $(OBJ)
	$(NVCC) $^ -o $@ -Xcompiler -fopenmp $(LDLIBS) $(CUDA_LIBS)

build/bench_gemm: dev/bench/bench_gemm.cu dev/bench/bench_gpu.h $(CUDA_OBJ) $(CUDA_DEPS)
	$(NVCC) $(NVCCFLAGS) -Idev/bench $< $(CUDA_OBJ) $(OBJ) -o $@ -Xcompiler -fopenmp $(LDLIBS) $(CUDA_LIBS)

build/bench_depth: dev/bench/bench_depth.cu dev/bench/bench_util.h dev/bench/bench_gpu.h $(CUDA_OBJ) $(CUDA_DEPS)
	$(NVCC) $(NVCCFLAGS) -Idev/bench $< $(CUDA_OBJ) $(OBJ) -o $@ -Xcompiler -fopenmp $(LDLIBS) $(CUDA_LIBS)

build/bench_attention: dev/bench/bench_attention.cu dev/bench/bench_gpu.h $(CUDA_OBJ) $(CUDA_DEPS)
	$(NVCC) $(NVCCFLAGS) -Idev/bench $< $(CUDA_OBJ) $(OBJ) -o $@ -Xcompiler -fopenmp $(LDLIBS) $(CUDA_LIBS)

# The depth attention's block shape (cuda/depth_rows.cuh: DEPTH_ROWS rows of ROW_THREADS
# threads, each thread taking DEPTH_COLS of its columns at a time; 4x64x2 by default) is for a
# GPU to choose: make gpu-check also times the step (bench_cuda) and the depth kernels
# (bench_depth, which first checks them against the CPU) built with each shape
# ROWSxTHREADSxCOLS below, under build/shape/ROWSxTHREADSxCOLS/. The two files whose kernels
# take the shape (SHAPED_CUDA: the default operator's and the variants') are compiled with its
# -D values there, the rest as they are.
DEPTH_SHAPES   = 4x64x1 4x64x4 2x64x4 8x64x2 8x64x4 2x128x2
SHAPED_CUDA    = depth_attention depth_variants
SHAPE_BINS     = $(foreach s,$(DEPTH_SHAPES),build/shape/$s/bench_cuda build/shape/$s/bench_depth)
SHAPE_CUDA_OBJ = $(filter-out $(SHAPED_CUDA:%=build/cuda/%.o),$(CUDA_OBJ))
shape_flags    = $(foreach f,1 2 3,-D$(word $f,DEPTH_ROWS ROW_THREADS DEPTH_COLS)=$(word $f,$(subst x, ,$1)))
.PRECIOUS: build/shape/%/depth_attention.o build/shape/%/depth_variants.o \
           build/emu/shape/%/depth_attention.cu.o build/emu/shape/%/depth_variants.cu.o

# ... and `make test` runs the depth attention's agreement tests with each shape under the
# emulator (tests/run_all.sh), so that the kernels stay right for any shape
build/emu/shape/%/depth_attention.cu.o: cuda/depth_attention.cu $(CUDA_DEPS) tests/cuda_emu.h
	@mkdir -p $(dir $@)
	$(CXX) -O2 $(EMU_FLAGS) $(call shape_flags,$*) -x c++ -c $< -o $@

build/emu/shape/%/depth_variants.cu.o: cuda/depth_variants.cu $(CUDA_DEPS) tests/cuda_emu.h
	@mkdir -p $(dir $@)
	$(CXX) -O2 $(EMU_FLAGS) $(call shape_flags,$*) -x c++ -c $< -o $@

build/emu/shape/%/test_cuda_emu: build/emu/shape/%/depth_attention.cu.o build/emu/shape/%/depth_variants.cu.o \
                                 $(filter-out $(SHAPED_CUDA:%=build/emu/cuda/%.cu.o),$(EMU_OBJ)) $(OBJ)
	$(CXX) -fopenmp $^ -o $@ -lboost_context $(LDLIBS)

# ... and under AddressSanitizer with ASAN_SHAPE, the shape of the most column groups per
# thread (5 at C = 601), the last of them partial: no load or store past a row's end
ASAN_SHAPE = 8x32x4
build/emu_asan/shape/%/depth_attention.cu.o: cuda/depth_attention.cu $(CUDA_DEPS) tests/cuda_emu.h
	@mkdir -p $(dir $@)
	$(CXX) $(ASAN_FLAGS) -fsanitize-sections=cuda_emu_shared $(EMU_FLAGS) $(call shape_flags,$*) \
		-x c++ -c $< -o $@

build/emu_asan/shape/%/depth_variants.cu.o: cuda/depth_variants.cu $(CUDA_DEPS) tests/cuda_emu.h
	@mkdir -p $(dir $@)
	$(CXX) $(ASAN_FLAGS) -fsanitize-sections=cuda_emu_shared $(EMU_FLAGS) $(call shape_flags,$*) \
		-x c++ -c $< -o $@

build/emu_asan/shape/%/test_cuda_emu_asan: build/emu_asan/shape/%/depth_attention.cu.o \
                           build/emu_asan/shape/%/depth_variants.cu.o \
                           $(filter-out $(SHAPED_CUDA:%=build/emu_asan/cuda/%.cu.o),$(ASAN_OBJ))
	$(CXX) $(ASAN_FLAGS) -fopenmp $^ -o $@ -lboost_context $(LDLIBS)

build/shape/%/depth_attention.o: cuda/depth_attention.cu $(CUDA_DEPS)
	@mkdir -p $(dir $@)
	$(NVCC) $(NVCCFLAGS) $(call shape_flags,$*) -c $< -o $@

build/shape/%/depth_variants.o: cuda/depth_variants.cu $(CUDA_DEPS)
	@mkdir -p $(dir $@)
	$(NVCC) $(NVCCFLAGS) $(call shape_flags,$*) -c $< -o $@

build/shape/%/bench_cuda: build/bench_cuda.o build/shape/%/depth_attention.o build/shape/%/depth_variants.o \
                          $(SHAPE_CUDA_OBJ) $(OBJ)
	$(NVCC) $^ -o $@ -Xcompiler -fopenmp $(LDLIBS) $(CUDA_LIBS)

build/shape/%/bench_depth: dev/bench/bench_depth.cu dev/bench/bench_util.h dev/bench/bench_gpu.h \
                           build/shape/%/depth_attention.o build/shape/%/depth_variants.o \
                           $(SHAPE_CUDA_OBJ) $(CUDA_DEPS)
	$(NVCC) $(NVCCFLAGS) -Idev/bench $< $(SHAPED_CUDA:%=build/shape/$*/%.o) $(SHAPE_CUDA_OBJ) $(OBJ) \
		-o $@ -Xcompiler -fopenmp $(LDLIBS) $(CUDA_LIBS)
