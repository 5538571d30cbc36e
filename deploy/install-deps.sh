#!/usr/bin/env bash
# Installs every Debian package bitpush needs to build, test and run, non-interactively,
# and only what is missing. Idempotent: a second run installs nothing and says so.
# This script is the one place in the project that knows Debian package names.
set -euo pipefail

PACKAGES=(
  # toolchain
  build-essential cmake ninja-build pkg-config git
  clang lld libclang-rt-dev          # clang + libFuzzer/sanitizer runtimes (fuzz, ASan, TSan trees)
  clang-format clang-tidy-22         # make lint (clang-tidy 22 skips system headers: 2x faster)
  # libraries
  libzmq3-dev cppzmq-dev             # transport (ZeroMQ)
  libucx-dev                         # transport (UCX: the ucx backend, ucx:// addresses)
  libssl-dev                         # AES-256-GCM of the sealed lanes (security.mode curve)
  libprotobuf-dev protobuf-compiler  # wire messages
  libyaml-cpp-dev                    # cluster YAML
  libspdlog-dev libfmt-dev           # logging
  libhwloc-dev                       # CPU and NUMA pinning
  libmicrohttpd-dev                  # /metrics over HTTP (one polling thread, bounded connections)
  pybind11-dev python3-pybind11      # Python binding
  python3-pytest                     # Python tests
  python3-torch python3-numpy        # PyTorch 1.13 (CPU) for /usr/bin/python3: bitpush.torch
  python3-torchvision                # model layouts for the training benchmark (bench/model_layouts.py)
  python3-sklearn python3-tqdm       # examples: digits data set, progress bars
  python3-matplotlib                 # benchmark plots
  tmux                               # tests/python/test_top.py: `bitpush top` in a real terminal
  slurm-wlm munge                    # tests/python/test_slurm.py: a one-node slurmctld + slurmd
                                     # (munge authenticates them) for `bitpush launch --slurm`
  libgtest-dev libgmock-dev googletest  # unit tests
)

missing=()
for p in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if [ "${#missing[@]}" -eq 0 ]; then
  echo "install-deps: all ${#PACKAGES[@]} packages already installed; nothing to do"
  exit 0
fi

SUDO=""
if [ "$(id -u)" -ne 0 ]; then
  if command -v sudo >/dev/null 2>&1; then SUDO="sudo"; else
    echo "install-deps: need root (or sudo) to install: ${missing[*]}" >&2; exit 1
  fi
fi

echo "install-deps: installing ${#missing[@]} package(s): ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
log=$(mktemp /tmp/bitpush-install-deps.XXXXXX.log)
if ! { $SUDO apt-get update -qq && \
       $SUDO apt-get install -y -qq -o Dpkg::Use-Pty=0 --no-install-recommends "${missing[@]}"; } \
     > "$log" 2>&1; then
  echo "install-deps: apt-get failed; the last lines of $log:" >&2
  tail -20 "$log" >&2
  exit 1
fi
rm -f "$log"
echo "install-deps: installed: ${missing[*]}"
