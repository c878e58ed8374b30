# attnres.c — `make train` trains the default model, `make test` runs every test.
CC      ?= gcc
CXX     ?= g++
CFLAGS  ?= -O3 -march=native
CFLAGS  += -std=c11 -fopenmp -Wall -Wextra -Wno-unused-parameter -Isrc -Idata
CXXFLAGS ?= -O2 -march=native
CXXFLAGS += -std=c++17 -fopenmp -Wall -Wextra -Isrc -Idata -Itests
LDLIBS  = -lm

SRC_C   = $(wildcard src/*.c) $(wildcard data/*.c)
OBJ     = $(patsubst %.c,build/%.o,$(SRC_C))
TEST_CPP = $(wildcard tests/test_*.cpp)
TEST_OBJ = $(patsubst %.cpp,build/%.o,$(TEST_CPP))

.PHONY: all train test bench asan clean deps
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

check_state: dev/check_state.c $(OBJ)
	$(CC) $(CFLAGS) dev/check_state.c $(OBJ) -o $@ $(LDLIBS)

test_attnres: $(TEST_OBJ) $(OBJ)
	$(CXX) $(CXXFLAGS) $(TEST_OBJ) $(OBJ) -o $@ $(LDLIBS)

clean:
	rm -rf build train check_state test_attnres train_cuda test_cuda_emu
