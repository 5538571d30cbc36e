#!/bin/bash
# Checks that a binary parses compression specs without carrying compressor kernels: it must
# hold the spec registry (ParseCompressorSpec) and no symbol of bitpush_compressors (the
# Compressor implementations, the kernel registry, error-feedback state). Prints the kernel
# symbols it finds.
#
#   check_no_kernels.sh BINARY
set -u
bin=$1
syms=$(nm -C "$bin") || { echo "FAIL: nm could not read $bin"; exit 1; }
if ! grep -q "bitpush::compressors::ParseCompressorSpec" <<<"$syms"; then
  echo "FAIL: $bin has no bitpush::compressors::ParseCompressorSpec (stripped, or not the right binary?)"
  exit 1
fi
kernels=$(grep -E "bitpush::compressors::([A-Za-z0-9]*Compressor(Base)?::|CreateCompressor|k[A-Za-z0-9]+MethodKernels|FindMethodKernels|ResidualState|dithering::|DecodeSparseBody)" <<<"$syms")
if [ -n "$kernels" ]; then
  echo "FAIL: $bin links compressor kernels (bitpush_compressors); spec parsing must need only bitpush_compressor_specs:"
  echo "$kernels" | head -20
  exit 1
fi
echo "OK: $bin parses specs without compressor kernels"
