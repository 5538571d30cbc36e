#!/usr/bin/env bash
# Builds dmlc/ps-lite from a checkout and our driver (bench/peers/pslite_driver.cc) against it,
# for `bitpush-bench pushpull --peer pslite --pslite-dir PSLITE_DIR` (bench/peers/README.md).
#
# usage: bench/peers/build-pslite-driver.sh PSLITE_DIR [OUT_DIR]
#   OUT_DIR defaults to PSLITE_DIR/bitpush-peer; it receives gen/ (meta.pb.*), obj/, libps.a and
#   bitpush-pslite-driver. The checkout itself is only read.
#
# Nothing is downloaded: instead of ps-lite's Makefile (which fetches protobuf and zeromq) or its
# CMakeLists (which can fetch zeromq), this compiles ps-lite's four sources directly against the
# system's libzmq and protobuf (Debian: libzmq3-dev libprotobuf-dev protobuf-compiler):
#   protoc --cpp_out=OUT/gen src/meta.proto
#   c++ -O3 -fPIC -pthread -I include -I src -I OUT/gen -c src/{customer,postoffice,van}.cc
#   c++ ... -c OUT/gen/meta.pb.cc; ar rcs OUT/libps.a ...
#   c++ -O3 -std=c++17 -I include -I OUT/gen pslite_driver.cc OUT/libps.a -lprotobuf -lzmq -pthread
# libps.a is rebuilt when missing or older than a ps-lite source; the driver when missing or older
# than its source or libps.a. Honours CXX (default c++) and JOBS (parallel compiles, default 2).
set -euo pipefail

if [[ $# -lt 1 || $# -gt 2 ]]; then
  echo "usage: $0 PSLITE_DIR [OUT_DIR]" >&2
  exit 2
fi
pslite=$(cd "$1" && pwd)
out=${2:-$pslite/bitpush-peer}
here=$(cd "$(dirname "$0")" && pwd)
cxx=${CXX:-c++}
jobs=${JOBS:-2}

for f in include/ps/ps.h src/meta.proto src/customer.cc src/postoffice.cc src/van.cc; do
  if [[ ! -f $pslite/$f ]]; then
    echo "$0: $pslite is not a ps-lite checkout (no $f); see bench/peers/README.md" >&2
    exit 1
  fi
done
missing=()
command -v protoc >/dev/null || missing+=("protoc (protobuf-compiler)")
command -v "$cxx" >/dev/null || missing+=("a C++ compiler ($cxx)")
echo '#include <zmq.h>' | "$cxx" -E -x c++ - >/dev/null 2>&1 || missing+=("zmq.h (libzmq3-dev)")
echo '#include <google/protobuf/message_lite.h>' | "$cxx" -E -x c++ - >/dev/null 2>&1 ||
  missing+=("protobuf headers (libprotobuf-dev)")
if [[ ${#missing[@]} -gt 0 ]]; then
  echo "$0: missing: ${missing[*]}" >&2
  exit 1
fi

mkdir -p "$out/gen" "$out/obj"
lib=$out/libps.a
newer_source=$(find "$pslite/src" "$pslite/include" -newer "$lib" -type f 2>/dev/null | head -1 ||
  true)
if [[ ! -f $lib || -n $newer_source ]]; then
  echo "building ps-lite from $pslite into $out" >&2
  protoc --cpp_out="$out/gen" --proto_path="$pslite/src" "$pslite/src/meta.proto"
  flags=(-std=c++14 -O3 -fPIC -pthread -DNDEBUG -w -I "$pslite/include" -I "$pslite/src"
    -I "$out/gen")
  pids=()
  for src in "$pslite/src/customer.cc" "$pslite/src/postoffice.cc" "$pslite/src/van.cc" \
    "$out/gen/meta.pb.cc"; do
    obj=$out/obj/$(basename "${src%.cc}").o
    "$cxx" "${flags[@]}" -c "$src" -o "$obj" &
    pids+=($!)
    if [[ ${#pids[@]} -ge $jobs ]]; then
      wait "${pids[0]}"
      pids=("${pids[@]:1}")
    fi
  done
  for pid in "${pids[@]}"; do wait "$pid"; done
  rm -f "$lib"
  ar rcs "$lib" "$out"/obj/*.o
fi

driver=$out/bitpush-pslite-driver
if [[ ! -x $driver || $here/pslite_driver.cc -nt $driver || $lib -nt $driver ]]; then
  echo "building $driver" >&2
  "$cxx" -std=c++17 -O3 -pthread -DNDEBUG -Wall -Wextra -isystem "$pslite/include" -isystem "$out/gen" \
    "$here/pslite_driver.cc" "$lib" -lprotobuf -lzmq -pthread -o "$driver"
fi
echo "$driver"
