#include "worker/compression_plan.h"

#include <fmt/format.h>

#include <algorithm>
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
  t.minimum = compressors::MinimumElements(config);
  if (!compressors::MethodCompresses(config.id())) {
    t.why = TensorCompression::Why::kSpecNone;
  } else if (!AboveCompressThreshold(elements, dtype, settings.min_compress_bytes)) {
    t.why = TensorCompression::Why::kBelowThreshold;
  } else if (settings.method_minimum && elements < t.minimum.elements) {
    t.why = TensorCompression::Why::kBelowMethodMinimum;
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

std::string_view WhyName(TensorCompression::Why why) {
  switch (why) {
    case TensorCompression::Why::kCompressed: return "compressed";
    case TensorCompression::Why::kSpecNone: return "spec none";
    case TensorCompression::Why::kBelowThreshold: return "below min_compress_bytes";
    case TensorCompression::Why::kBelowMethodMinimum: return "below the method's minimum";
  }
  return "unknown";
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

// The tensors below one method's minimum (one method, minimum and reason).
struct BelowMinimum {
  std::string method;
  compressors::ElementMinimum minimum;
  size_t tensors = 0;
  uint64_t bytes = 0;
  std::vector<std::string> names;  // the first kNamed, in declaration order
};
constexpr size_t kNamed = 3;

std::string Describe(const BelowMinimum& b) {
  std::string names;
  for (size_t i = 0; i < b.names.size(); ++i) {
    names += (i == 0                                                   ? ""
              : i + 1 == b.names.size() && b.tensors == b.names.size() ? " and "
                                                                       : ", ") +
             b.names[i];
  }
  if (b.tensors > b.names.size()) names += fmt::format(" and {} more", b.tensors - b.names.size());
  return fmt::format("{} ({}: {}) below {}'s minimum of {} elements ({})", Tensors(b.tensors),
                     Bytes(b.bytes), names, b.method, b.minimum.elements, b.minimum.why);
}

}  // namespace

std::string DescribeCompression(const std::vector<TensorCompression>& tensors,
                                uint64_t min_compress_bytes) {
  if (tensors.empty()) return "compression: no tensors declared";
  struct Count {
    size_t tensors = 0;
    uint64_t bytes = 0;
  };
  std::map<std::string, Count> by_spec;     // compressed, by spec
  std::vector<BelowMinimum> below_minimum;  // by method, minimum and reason, first seen first
  Count compressed, below, none, all;
  for (const TensorCompression& t : tensors) {
    Count* c = &none;
    if (t.compressed()) {
      c = &by_spec[t.requested];
      ++compressed.tensors;
      compressed.bytes += t.bytes;
    } else if (t.why == TensorCompression::Why::kBelowThreshold) {
      c = &below;
    } else if (t.why == TensorCompression::Why::kBelowMethodMinimum) {
      const std::string method = t.requested.substr(0, t.requested.find(':'));
      auto b = std::find_if(below_minimum.begin(), below_minimum.end(), [&](const BelowMinimum& x) {
        return x.method == method && x.minimum.elements == t.minimum.elements &&
               x.minimum.why == t.minimum.why;
      });
      if (b == below_minimum.end()) {
        b = below_minimum.insert(below_minimum.end(), BelowMinimum{method, t.minimum});
      }
      ++b->tensors;
      b->bytes += t.bytes;
      if (b->names.size() < kNamed) b->names.push_back(t.name);
      ++all.tensors;
      all.bytes += t.bytes;
      continue;
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
  for (const BelowMinimum& b : below_minimum) raw.push_back(Describe(b));
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
