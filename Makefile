# bitpush — top-level commands. `make test` on a fresh machine installs the Debian packages,
# configures, builds and runs every test: the release tree's programs under the Python, attack,
# benchmark and build checks (`make release-checks`), the C++ unit tests in the ASan/UBSan and
# TSan trees, each fuzz target briefly, and the style checks (`make lint`).
.PHONY: all deps configure build test unit release-checks asan asan-build tsan tsan-build fuzz \
  bench demo lint clean config-docs

BUILD      ?= build
FUZZ_BUILD ?= build-fuzz
TSAN_BUILD ?= build-tsan
FUZZ_SECONDS ?= 4
JOBS       ?= $(shell nproc)
CMAKE_ARGS ?=
# The sanitizer trees keep -O2 and line tables (what their reports' stack traces need), not
# full debug info: a fifth of their compile time.
# The release tree (RelWithDebInfo) keeps -O2 and line tables plus function names (-g1:
# backtraces, perf annotate, addr2line), not variable locations: GCC compiles it in two thirds
# of the time of -g. CMAKE_ARGS='-DCMAKE_BUILD_TYPE=Debug' gives a tree for the debugger.
RELEASE_FLAGS = '-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O2 -g1 -DNDEBUG' \
  '-DCMAKE_C_FLAGS_RELWITHDEBINFO=-O2 -g1 -DNDEBUG'
# They are also unity builds (CMAKE_UNITY_BUILD: a library's sources compiled 8 to a file), a
# fifth less compile time: most of each object file is the same inline code of the standard
# library, spdlog, fmt and protobuf, compiled once per unity file instead of once per source. A
# source whose file-local names clash with another's is compiled on its own
# (SKIP_UNITY_BUILD_INCLUSION, or UNITY_BUILD OFF for a whole library, in its CMakeLists.txt);
# the release tree stays one object per source, so it and clang-tidy still see each file alone.
SANITIZER_FLAGS = '-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O2 -gline-tables-only -DNDEBUG' \
  '-DCMAKE_C_FLAGS_RELWITHDEBINFO=-O2 -gline-tables-only -DNDEBUG' -DCMAKE_UNITY_BUILD=ON

all: build

deps:
	./deploy/install-deps.sh

configure: deps
	cmake -S . -B $(BUILD) -G Ninja $(RELEASE_FLAGS) $(CMAKE_ARGS)

build: configure
	cmake --build $(BUILD) -j $(JOBS)

# Every test of the release tree, the C++ unit tests (target bitpush_unit_tests, not in `all`)
# included.
unit: build
	cmake --build $(BUILD) -j $(JOBS) --target bitpush_unit_tests
	ctest --test-dir $(BUILD) --output-on-failure -j $(JOBS)

# The release tree's tests other than the C++ unit tests (which `make test` runs in the two
# sanitizer trees): the Python suites, the attack suite, the benchmark contracts and the build
# checks, against the release programs.
release-checks: build
	ctest --test-dir $(BUILD) --output-on-failure -j $(JOBS) -LE unit

# A second tree built by clang with ASan + UBSan: the unit tests again, and the libFuzzer
# targets (one per decoder), each run for FUZZ_SECONDS from seed corpora of valid payloads.
# Only what those run is built (targets bitpush_unit_tests, which brings the daemons and test
# programs the unit tests start, and bitpush_fuzzers, tests/fuzz/CMakeLists.txt), not `all`.
asan-build: deps
	CC=clang CXX=clang++ cmake -S . -B $(FUZZ_BUILD) -G Ninja -DBITPUSH_FUZZ=ON \
	  -DBITPUSH_BUILD_BENCH=OFF -DBITPUSH_WITH_CUDA=OFF -DCMAKE_BUILD_TYPE=RelWithDebInfo \
	  $(SANITIZER_FLAGS)
	cmake --build $(FUZZ_BUILD) -j $(JOBS) --target bitpush_unit_tests bitpush_fuzzers

# The unit tests only: the build and docs checks (labels build, docs) ran in the release tree.
# tests/lsan.supp names the leaks LeakSanitizer may see inside uninstrumented libzmq.
asan: asan-build
	LSAN_OPTIONS="suppressions=$(CURDIR)/tests/lsan.supp print_suppressions=0" \
	  ctest --test-dir $(FUZZ_BUILD) --output-on-failure -j $(JOBS) -L unit

# A third tree built by clang with ThreadSanitizer: the unit tests (label `unit`) again, except
# those of code that starts no thread (label `single_threaded`), so a data race in the threads
# of the endpoint, scheduler, servers, engine or daemon fails CI. Only what those tests run is
# built (target bitpush_tsan_tests, tests/CMakeLists.txt).
# tests/tsan.supp names what TSan cannot see into (uninstrumented libzmq).
tsan-build: deps
	CC=clang CXX=clang++ cmake -S . -B $(TSAN_BUILD) -G Ninja -DBITPUSH_TSAN=ON \
	  -DBITPUSH_BUILD_BENCH=OFF -DBITPUSH_WITH_CUDA=OFF -DCMAKE_BUILD_TYPE=RelWithDebInfo \
	  $(SANITIZER_FLAGS)
	cmake --build $(TSAN_BUILD) -j $(JOBS) --target bitpush_tsan_tests

# The ucx transport's cases are left out here (GTEST_FILTER): UCX is an uninstrumented system
# library with its own async thread, spinlocks and fork/exit handlers that TSan reports as lock
# misuse; they run in the release and ASan trees.
tsan: tsan-build
	GTEST_FILTER='-*ucx*:*Ucx*' \
	TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1 suppressions=$(CURDIR)/tests/tsan.supp" \
	  ctest --test-dir $(TSAN_BUILD) --output-on-failure -j $(JOBS) -L unit -LE single_threaded

fuzz: asan-build
	JOBS=$(JOBS) ./tests/fuzz/run_fuzzers.sh $(FUZZ_BUILD) $(FUZZ_SECONDS)

test: release-checks asan fuzz tsan lint
	@echo "make test: release checks, unit tests (ASan/UBSan and TSan), fuzz targets and lint passed"

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

# The key tables of docs/config.md, regenerated from the knob table (config/cluster_knobs.cc);
# the ctest test config_docs fails while they disagree.
config-docs:
	test -f $(BUILD)/build.ninja || $(MAKE) configure
	cmake --build $(BUILD) --target bitpush-config-docs
	./$(BUILD)/bin/bitpush-config-docs update docs/config.md
	./$(BUILD)/bin/bitpush-config-docs update docs/security.md

# Style: clang-format (no changes allowed) and clang-tidy (.clang-tidy; any warning fails) over
# the C++ sources, JOBS files at a time. Needs the release tree's compile_commands.json.
# bench/peers/pslite_driver.cc is left out of clang-tidy: it builds only against a ps-lite checkout
# (bench/peers/README.md), so this tree has no compile command for it; so is
# optimizers/lans_cuda_stub.cc, built only where CUDA is not.
CLANG_TIDY ?= clang-tidy-22
# Our headers are checked where the sources above include them (anchored at this checkout:
# generated headers under the build trees are not).
LINT_TIDY_HEADER_DIRS = common|compressors|config|scheduler|server|worker|optimizers|bench|tests
LINT_TIDY_SOURCES = 'common/*.cc' 'compressors/*.cc' 'config/*.cc' 'scheduler/*.cc' 'server/*.cc' 'worker/*.cc' \
  'optimizers/*.cc' 'bench/*.cc' 'tests/harness/*.cc' ':(exclude)bench/peers/pslite_driver.cc' \
  ':(exclude)optimizers/lans_cuda_stub.cc'
lint: build
	git ls-files '*.cc' '*.h' '*.cu' | xargs clang-format --dry-run -Werror
	git ls-files $(LINT_TIDY_SOURCES) | xargs -P $(JOBS) -n 4 $(CLANG_TIDY) -p $(BUILD) --quiet \
	  --warnings-as-errors='*' --header-filter='^$(CURDIR)/($(LINT_TIDY_HEADER_DIRS))/'

# Installs the daemons, systemd units, sysusers.d file and examples (docs/deploy.md) under
# the configured prefix (CMAKE_ARGS=-DCMAKE_INSTALL_PREFIX=/usr; default /usr/local);
# DESTDIR=/tmp/stage make install stages it instead.
.PHONY: install
install: build
	cmake --install $(BUILD)

clean:
	rm -rf $(BUILD) $(FUZZ_BUILD) $(TSAN_BUILD)
