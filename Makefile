# bitpush — top-level commands. `make test` on a fresh machine installs the Debian packages,
# configures, builds and runs every test (unit tests via ctest, then each fuzz target briefly).
.PHONY: all deps configure build test unit fuzz bench demo clean

BUILD      ?= build
FUZZ_BUILD ?= build-fuzz
FUZZ_SECONDS ?= 4
JOBS       ?= $(shell nproc)
CMAKE_ARGS ?=

all: build

deps:
	./deploy/install-deps.sh

configure: deps
	cmake -S . -B $(BUILD) -G Ninja $(CMAKE_ARGS)

build: configure
	cmake --build $(BUILD) -j $(JOBS)

unit: build
	ctest --test-dir $(BUILD) --output-on-failure -j $(JOBS)

# libFuzzer targets (clang, ASan + UBSan): build, write seed corpora, run each for FUZZ_SECONDS.
fuzz: deps
	CC=clang CXX=clang++ cmake -S . -B $(FUZZ_BUILD) -G Ninja -DBITPUSH_FUZZ=ON \
	  -DBITPUSH_WITH_CUDA=OFF -DCMAKE_BUILD_TYPE=RelWithDebInfo
	cmake --build $(FUZZ_BUILD) -j $(JOBS)
	./tests/fuzz/run_fuzzers.sh $(FUZZ_BUILD) $(FUZZ_SECONDS)

test: unit fuzz
	@echo "make test: unit tests and fuzz targets passed"

bench: build
	./$(BUILD)/bin/bitpush-bench compressors

demo:
	@echo "make demo (a local cluster training a model) arrives with the launcher issue;"
	@echo "today: 'make test' builds and tests, 'make bench' measures the compressors."
	@exit 1

clean:
	rm -rf $(BUILD) $(FUZZ_BUILD)
