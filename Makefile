# bitpush — top-level commands. `make test` on a fresh machine installs the Debian packages,
# configures, builds and runs every test (unit tests via ctest, then each fuzz target briefly).
.PHONY: all deps configure build test unit asan asan-build fuzz bench demo lint clean

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

# A second tree built by clang with ASan + UBSan: the unit tests again, and the libFuzzer
# targets (one per decoder), each run for FUZZ_SECONDS from seed corpora of valid payloads.
asan-build: deps
	CC=clang CXX=clang++ cmake -S . -B $(FUZZ_BUILD) -G Ninja -DBITPUSH_FUZZ=ON \
	  -DBITPUSH_BUILD_BENCH=OFF -DBITPUSH_WITH_CUDA=OFF -DCMAKE_BUILD_TYPE=RelWithDebInfo
	cmake --build $(FUZZ_BUILD) -j $(JOBS)

asan: asan-build
	ctest --test-dir $(FUZZ_BUILD) --output-on-failure -j $(JOBS)

fuzz: asan-build
	./tests/fuzz/run_fuzzers.sh $(FUZZ_BUILD) $(FUZZ_SECONDS)

test: unit asan fuzz
	@echo "make test: unit tests (release and ASan/UBSan) and fuzz targets passed"

bench: build
	./$(BUILD)/bin/bitpush-bench compressors

# A local cluster (deploy/examples/local.yaml: scheduler, 2 servers, 2 worker nodes on
# 127.0.0.1, onebit + error feedback) training the digits MLP with CLAN through the launcher
# (docs/launch.md); rank 0 prints the summary: test accuracy, steps, wall time, bytes pushed
# vs fp32.
# Only what the demo runs is built (the daemons and the Python package; `make test` builds the
# rest), so a bare machine gets to training sooner.
DEMO_TARGETS = bitpush-scheduler bitpush-server bitpush-worker bitpush_python
demo: configure
	cmake --build $(BUILD) -j $(JOBS) --target $(DEMO_TARGETS)
	./$(BUILD)/bin/bitpush launch --config deploy/examples/local.yaml -- \
	  /usr/bin/python3 examples/train_digits.py --optimizer clan --compression onebit --epochs 40

# Style: clang-format (no changes allowed) and clang-tidy (.clang-tidy) over the C++ sources.
lint: configure
	git ls-files '*.cc' '*.h' | xargs clang-format --dry-run -Werror
	git ls-files 'common/*.cc' 'compressors/*.cc' 'scheduler/*.cc' 'server/*.cc' 'worker/*.cc' 'bench/*.cc' \
	  'tests/harness/*.cc' \
	  | xargs clang-tidy -p $(BUILD) --quiet

# Installs the daemons, systemd units, sysusers.d file and examples (docs/deploy.md) under
# the configured prefix (CMAKE_ARGS=-DCMAKE_INSTALL_PREFIX=/usr; default /usr/local);
# DESTDIR=/tmp/stage make install stages it instead.
.PHONY: install
install: build
	cmake --install $(BUILD)

clean:
	rm -rf $(BUILD) $(FUZZ_BUILD)
