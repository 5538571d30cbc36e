#!/usr/bin/env bash
# Checks the BITPUSH_WITH_CUDA switch: OFF and AUTO-without-a-toolkit configure with
# BITPUSH_HAVE_CUDA 0 in the generated header; ON without a toolkit is a configure error that
# names the option; a bad value is an error. (ON/AUTO with the real toolkit is what the main
# build does wherever /usr/local/cuda exists.)
# usage: check_cuda_switch.sh <source-dir> <scratch-dir>
set -u
src=${1:?source dir}
scratch=${2:?scratch dir}
rm -rf "$scratch"
mkdir -p "$scratch"
fail() { echo "FAIL: $*"; exit 1; }
configure() {  # name, extra args...
  local name=$1; shift
  cmake -S "$src" -B "$scratch/$name" -G Ninja -DBITPUSH_BUILD_TESTS=OFF -DBITPUSH_BUILD_BENCH=OFF \
    "$@" > "$scratch/$name.log" 2>&1
}
header() { grep -E "^#define BITPUSH_HAVE_CUDA" "$scratch/$1/generated/bitpush/config.h"; }

configure off -DBITPUSH_WITH_CUDA=OFF || fail "OFF did not configure: $(tail -5 "$scratch/off.log")"
[ "$(header off)" = "#define BITPUSH_HAVE_CUDA 0" ] || fail "OFF: $(header off)"

configure auto_missing -DBITPUSH_WITH_CUDA=AUTO -DBITPUSH_CUDA_ROOT=/nonexistent/cuda ||
  fail "AUTO without CUDA did not configure: $(tail -5 "$scratch/auto_missing.log")"
[ "$(header auto_missing)" = "#define BITPUSH_HAVE_CUDA 0" ] || fail "AUTO: $(header auto_missing)"

if configure on_missing -DBITPUSH_WITH_CUDA=ON -DBITPUSH_CUDA_ROOT=/nonexistent/cuda; then
  fail "ON without CUDA configured"
fi
grep -q "BITPUSH_WITH_CUDA=ON but no CUDA toolkit was found" "$scratch/on_missing.log" ||
  fail "ON without CUDA: message not found: $(tail -5 "$scratch/on_missing.log")"

if configure bogus -DBITPUSH_WITH_CUDA=maybe; then fail "BITPUSH_WITH_CUDA=maybe configured"; fi
grep -q "must be AUTO, ON or OFF" "$scratch/bogus.log" || fail "bad value: message not found"

rm -rf "$scratch"
echo "1 passed, 0 failed: the CUDA switch (OFF, AUTO without CUDA, ON without CUDA, bad value)"
