#include "worker/compression_plan.h"

#include <fmt/format.h>

#include <map>
#include <utility>

#include "compressors/spec_registry.h"
#include "worker/partition.h"

namespace bitpush::worker {

StatusOr<TensorCompression> DecideCompression(const config::CompressionSettings& settings,
                                              const std::string& name, size_t elements, DType dtype,
                                              const std::string& spec) {
  const std::string& given = spec.empty() ? settings.SpecForTensor(name) : spec;
  BP_ASSIGN_OR_RETURN(v1::CompressorConfig config, compressors::ParseCompressorSpec(given));
  TensorCompression t;
  t.name = name;
  t.elements = elements;
  t.dtype = dtype;
  t.bytes = static_cast<uint64_t>(elements) * DTypeSize(dtype);
  t.requested = compressors::CompressorSpecString(config);
  if (!compressors::MethodCompresses(config.id())) {
    t.why = TensorCompression::Why::kSpecNone;
  } else if (!AboveCompressThreshold(elements, dtype, settings.min_compress_bytes)) {
    t.why = TensorCompression::Why::kBelowThreshold;
  } else {
    t.why = TensorCompression::Why::kCompressed;
  }
  if (t.compressed()) {
    t.config = std::move(config);
  } else {
    BP_ASSIGN_OR_RETURN(t.config, compressors::ParseCompressorSpec("none"));
  }
  return t;
}

namespace {

std::string Bytes(uint64_t b) {
  if (b < 1024) return fmt::format("{} B", b);
  if (b < (uint64_t{1} << 20)) return fmt::format("{:.1f} KiB", b / 1024.0);
  if (b < (uint64_t{1} << 30)) return fmt::format("{:.1f} MiB", b / 1048576.0);
  return fmt::format("{:.2f} GiB", b / 1073741824.0);
}

std::string Tensors(size_t n) {
  return fmt::format("{} tensor{}", n, n == 1 ? "" : "s");
}

}  // namespace

std::string DescribeCompression(const std::vector<TensorCompression>& tensors,
                                uint64_t min_compress_bytes) {
  if (tensors.empty()) return "compression: no tensors declared";
  struct Count {
    size_t tensors = 0;
    uint64_t bytes = 0;
  };
  std::map<std::string, Count> by_spec;  // compressed, by spec
  Count compressed, below, none, all;
  for (const TensorCompression& t : tensors) {
    Count* c = &none;
    if (t.compressed()) {
      c = &by_spec[t.requested];
      ++compressed.tensors;
      compressed.bytes += t.bytes;
    } else if (t.why == TensorCompression::Why::kBelowThreshold) {
      c = &below;
    }
    ++c->tensors;
    c->bytes += t.bytes;
    ++all.tensors;
    all.bytes += t.bytes;
  }
  std::string line = "compression: ";
  if (compressed.tensors == 0) {
    line += fmt::format("none of {} ({}) compressed", Tensors(all.tensors), Bytes(all.bytes));
  } else {
    bool first = true;
    for (const auto& [spec, c] : by_spec) {
      line += fmt::format("{}{} on {}", first ? "" : ", ", spec, c.tensors);
      first = false;
    }
    const double share = all.bytes == 0 ? 100.0 : 100.0 * compressed.bytes / all.bytes;
    line += fmt::format(" of {} ({} of {}, {:.1f}%)", Tensors(all.tensors), Bytes(compressed.bytes),
                        Bytes(all.bytes), share);
  }
  std::vector<std::string> raw;
  if (below.tensors != 0) {
    raw.push_back(fmt::format("{} ({}) below compression.min_compress_bytes={}",
                              Tensors(below.tensors), Bytes(below.bytes), min_compress_bytes));
  }
  if (none.tensors != 0) {
    raw.push_back(fmt::format("{} ({}) with spec none", Tensors(none.tensors), Bytes(none.bytes)));
  }
  if (!raw.empty()) {
    line += "; raw: " + raw[0];
    for (size_t i = 1; i < raw.size(); ++i) line += ", " + raw[i];
  }
  return line;
}

}  // namespace bitpush::worker
