#!/usr/bin/env bash
# Runs every libFuzzer target of a fuzz build for a few seconds each, starting from seed
# corpora of valid payloads (for the ucx wire fuzzer: valid Active Messages from its
# encoders). Exits non-zero (and prints the reproducer path) on any crash.
# usage: run_fuzzers.sh <fuzz-build-dir> <seconds-per-target>
set -euo pipefail
build=${1:?fuzz build dir}
secs=${2:-4}
corpus="$build/corpus"
rm -rf "$corpus"
mkdir -p "$corpus"
"$build/bin/fuzz_make_seeds" "$corpus"
"$build/bin/fuzz_make_ucx_seeds" "$corpus/ucx_wire"
mkdir -p "$corpus/spec"
printf 'topk:ratio=0.001' > "$corpus/spec/a"
printf 'dithering:levels=3,partition=natural,norm=l2,seed=9' > "$corpus/spec/b"
printf 'randomk:k=5,unbiased=true' > "$corpus/spec/c"

# One fuzzer per core at a time (JOBS, default: the cores): each runs for `secs` on its own
# corpus directory and log; the results are reported in the targets' order.
jobs=${JOBS:-$(nproc)}
run_one() {
  local bin=$1 name dir
  name=$(basename "$bin")
  dir="$corpus/${name#fuzz_decode_}"
  [ "$name" = fuzz_spec ] && dir="$corpus/spec"
  [ "$name" = fuzz_ucx_wire ] && dir="$corpus/ucx_wire"
  mkdir -p "$dir" "$build/artifacts"
  if "$bin" -max_total_time="$secs" -rss_limit_mb=2048 -artifact_prefix="$build/artifacts/$name-" \
      "$dir" > "$build/$name.log" 2>&1; then
    echo ok > "$build/$name.result"
  else
    echo failed > "$build/$name.result"
  fi
}
bins=("$build"/bin/fuzz_decode_* "$build/bin/fuzz_spec" "$build/bin/fuzz_ucx_wire")
running=0
for bin in "${bins[@]}"; do
  rm -f "$build/$(basename "$bin").result"
  run_one "$bin" &
  running=$((running + 1))
  if [ "$running" -ge "$jobs" ]; then
    wait -n || true
    running=$((running - 1))
  fi
done
wait || true

failed=0
for bin in "${bins[@]}"; do
  name=$(basename "$bin")
  if [ "$(cat "$build/$name.result" 2>/dev/null)" = ok ]; then
    runs=$(grep -oE '^Done [0-9]+ runs' "$build/$name.log" | awk '{print $2}' || true)
    echo "fuzz: $name ok (${runs:-?} runs in ${secs}s)"
  else
    echo "fuzz: $name FAILED — log: $build/$name.log"; tail -30 "$build/$name.log"; failed=1
  fi
done
exit $failed
