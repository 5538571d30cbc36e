// Writes seed corpora for the decoder fuzzers: valid payloads of several sizes and dtypes.
// usage: fuzz_make_seeds <corpus-root>   (creates <root>/<name>/seed_*)
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "common/vector_ops.h"
#include "compressors/registry.h"

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s <corpus-root>\n", argv[0]);
    return 2;
  }
  const std::pair<const char*, const char*> kTargets[] = {
      {"none", "none"},
      {"fp16", "fp16"},
      {"bf16", "bf16"},
      {"onebit", "onebit"},
      {"topk", "topk:ratio=0.01"},
      {"randomk", "randomk:ratio=0.03125,unbiased=true,seed=7"},
      {"dithering_linear", "dithering:levels=15,partition=linear,norm=max"},
      {"dithering_natural", "dithering:levels=3,partition=natural,norm=max"},
      {"loco", "loco:block=64,pull=fp16"},
      {"sdp4bit", "sdp4bit"},
      {"separate", "separate:ratio=4,block=64"},
      {"binsgdm", "binsgdm"},
  };
  std::mt19937 rng(1);
  std::normal_distribution<float> dist;
  for (const auto& [name, spec] : kTargets) {
    const std::filesystem::path dir = std::filesystem::path(argv[1]) / name;
    std::filesystem::create_directories(dir);
    auto c = std::move(bitpush::compressors::CreateCompressor(spec)).value();
    int k = 0;
    for (size_t n : {1u, 7u, 64u, 100u, 333u}) {
      for (bitpush::DType dt :
           {bitpush::DType::kFloat32, bitpush::DType::kFloat16, bitpush::DType::kBFloat16}) {
        std::vector<float> x(n);
        for (float& v : x) v = dist(rng);
        std::vector<uint16_t> h(n);
        if (dt != bitpush::DType::kFloat32) {
          bitpush::ConvertFromFloat(x.data(), bitpush::TensorView(h.data(), n, dt),
                                    bitpush::IsaLevel::kScalar);
        }
        const bitpush::ConstTensorView view = dt == bitpush::DType::kFloat32
                                                  ? bitpush::ConstTensorView(x.data(), n)
                                                  : bitpush::ConstTensorView(h.data(), n, dt);
        std::vector<uint8_t> out(c->MaxCompressedBytes(n, dt));
        auto r = c->Compress(view, {1, 1}, {out.data(), out.size()});
        if (!r.ok()) return 1;
        std::ofstream(dir / ("seed_" + std::to_string(k++)), std::ios::binary)
            .write(reinterpret_cast<const char*>(out.data()), static_cast<std::streamsize>(*r));
      }
    }
  }
  return 0;
}
