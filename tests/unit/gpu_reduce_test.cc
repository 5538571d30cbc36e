// worker/gpu/gpu_reduce.h: the GPU half of the intra-node reduce.
//
// Three kinds of builds run this file:
//  - without CUDA/NCCL (e.g. -DBITPUSH_WITH_CUDA=OFF, the ASan tree): the stubs return
//    Unimplemented naming why (StubTest);
//  - with CUDA but no usable GPU (no driver, no device): the kernels' element conversions are
//    checked on the host against common/half.h, everything else skips printing GpuViability();
//  - with GPUs: casts bit for bit vs common/half.h, ReduceToHost vs a CPU fp16 sum, every
//    device's BroadcastFromHost result, the collectives, argument errors and a bounded join.
#include "worker/gpu/gpu_reduce.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <thread>
#include <vector>

#include "common/half.h"

#if BITPUSH_HAVE_CUDA && BITPUSH_HAVE_NCCL
#include <cuda_runtime.h>
#endif

namespace bitpush::worker::gpu {
namespace {

TEST(GpuReduceTest, OptionsAreValidated) {
  LocalGpuGroupOptions o;
  EXPECT_TRUE(o.Validate().ok());
  o.timeout = std::chrono::milliseconds(0);
  EXPECT_EQ(o.Validate().code(), StatusCode::kInvalidArgument);
  o = LocalGpuGroupOptions();
  o.root = -1;
  EXPECT_EQ(o.Validate().code(), StatusCode::kInvalidArgument);
}

TEST(GpuReduceTest, ViabilityNamesTheReason) {
  const Status v = GpuViability();
  std::printf("GpuViability(): %s\n", v.ToString().c_str());
  if (v.ok()) return;
  EXPECT_TRUE(v.code() == StatusCode::kUnavailable || v.code() == StatusCode::kUnimplemented)
      << v.ToString();
  EXPECT_NE(v.message().find("not viable"), std::string::npos) << v.ToString();
}

#if !(BITPUSH_HAVE_CUDA && BITPUSH_HAVE_NCCL)

TEST(GpuReduceStubTest, EveryEntryPointIsUnimplementedNamingWhy) {
  static_assert(!kGpuBuiltIn);
  auto expect_unimplemented = [](const Status& s, const char* what) {
    EXPECT_EQ(s.code(), StatusCode::kUnimplemented) << what << ": " << s.ToString();
    EXPECT_NE(s.message().find("built without"), std::string::npos) << s.ToString();
  };
  expect_unimplemented(GpuViability(), "GpuViability");
  expect_unimplemented(GpuDeviceCount().status(), "GpuDeviceCount");
  float f = 1.0f;
  uint16_t h = 0;
  expect_unimplemented(CastFloatToHalf(0, &f, &h, 1, nullptr), "CastFloatToHalf");
  expect_unimplemented(CastHalfToFloat(0, &h, &f, 1, nullptr), "CastHalfToFloat");
  expect_unimplemented(PinnedBuffer::Allocate(64).status(), "PinnedBuffer::Allocate");
  expect_unimplemented(LocalGpuGroup::NewGroupId().status(), "NewGroupId");
  expect_unimplemented(LocalGpuGroup::CreateForDevices({0}, {}).status(), "CreateForDevices");
  expect_unimplemented(LocalGpuGroup::CreateRank(GpuGroupId{}, 1, 0, 0, {}).status(), "CreateRank");
}

#else  // the CUDA + NCCL build

// Floats that exercise every rounding case of fp32 -> fp16: specials, the boundaries of the
// subnormal and overflow ranges, every fp16 value, the exact midpoints between adjacent fp16
// values (ties to even) and their fp32 neighbours, plus a stride through all fp32 bit
// patterns (NaN payloads included).
std::vector<float> CastSweep() {
  std::vector<float> v;
  for (uint32_t h = 0; h < 0x10000u; ++h) {
    const float f = HalfToFloat(static_cast<uint16_t>(h));
    v.push_back(f);
    if (std::isnan(f)) continue;
    const uint16_t next = static_cast<uint16_t>(h + 1);
    const float g = HalfToFloat(next);
    if ((h & 0x7FFFu) == 0x7FFFu || std::isnan(g) || std::isinf(f)) continue;
    const float mid = static_cast<float>((static_cast<double>(f) + g) / 2);  // exact in fp32
    v.push_back(mid);
    v.push_back(std::nextafter(mid, 0.0f));
    v.push_back(std::nextafter(mid, mid * 2));
  }
  for (uint64_t u = 0; u <= 0xFFFFFFFFull; u += 4099) v.push_back(BitsToFloat(uint32_t(u)));
  for (uint32_t u : {0x477FEFFFu, 0x477FF000u, 0x477FF001u, 0x38800000u, 0x387FFFFFu, 0x33000000u,
                     0x33000001u, 0x32FFFFFFu, 0x7F800000u, 0x7F800001u, 0x7FC00000u, 0x7FFFFFFFu,
                     0xFFC00001u, 0x80000000u}) {
    v.push_back(BitsToFloat(u));
    v.push_back(BitsToFloat(u | 0x80000000u));
  }
  return v;
}

// The kernels' per-element code, compiled for the host: runs without a GPU.
TEST(GpuReduceTest, KernelElementConversionsMatchHalfHOnTheHost) {
  for (uint32_t h = 0; h < 0x10000u; ++h) {
    const uint16_t x = static_cast<uint16_t>(h);
    ASSERT_EQ(FloatBits(internal::KernelHalfToFloatOnHost(x)), FloatBits(HalfToFloat(x)))
        << "half 0x" << std::hex << h;
  }
  for (float f : CastSweep()) {
    ASSERT_EQ(internal::KernelFloatToHalfOnHost(f), FloatToHalf(f))
        << "float bits 0x" << std::hex << FloatBits(f);
  }
}

#define SKIP_WITHOUT_GPU()                                     \
  do {                                                         \
    const Status viability = GpuViability();                   \
    if (!viability.ok()) GTEST_SKIP() << viability.ToString(); \
  } while (0)

#define ASSERT_CUDA(expr)                                                  \
  do {                                                                     \
    const cudaError_t e_ = (expr);                                         \
    ASSERT_EQ(e_, cudaSuccess) << #expr << ": " << cudaGetErrorString(e_); \
  } while (0)

// A device array owned by the test.
template <typename T>
class DeviceArray {
 public:
  DeviceArray(int device, size_t n) : device_(device), n_(n) {
    cudaSetDevice(device);
    if (cudaMalloc(&p_, std::max<size_t>(n, 1) * sizeof(T)) != cudaSuccess) p_ = nullptr;
  }
  ~DeviceArray() {
    cudaSetDevice(device_);
    cudaFree(p_);
  }
  DeviceArray(DeviceArray&& o) noexcept : device_(o.device_), n_(o.n_), p_(o.p_) { o.p_ = nullptr; }
  T* data() const { return static_cast<T*>(p_); }
  void Upload(const std::vector<T>& v) const {
    cudaSetDevice(device_);
    cudaMemcpy(p_, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice);
  }
  std::vector<T> Download() const {
    std::vector<T> v(n_);
    cudaSetDevice(device_);
    cudaMemcpy(v.data(), p_, n_ * sizeof(T), cudaMemcpyDeviceToHost);
    return v;
  }

 private:
  int device_;
  size_t n_;
  void* p_ = nullptr;
};

std::vector<int> AllDevices() {
  std::vector<int> d(static_cast<size_t>(GpuDeviceCount().value()));
  for (size_t i = 0; i < d.size(); ++i) d[i] = static_cast<int>(i);
  return d;
}

std::vector<float> Gradient(size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

// The fp16 sum NCCL computes, checked against the exact sum of the fp16-rounded inputs.
// Tolerance: NCCL adds in fp16, one rounding per addition, P-1 additions, in an order of its
// choosing; each rounding errs by at most half an fp16 ulp of the partial sum, i.e. at most
// 2^-11 * sum|h_d| in the normal range and 2^-25 in the subnormal one. So
//   |gpu - exact| <= (P - 1) * (2^-11 * sum_d |h_d| + 2^-25),
// and for P = 1 the result is the cast itself, exactly.
void ExpectFp16Sum(const std::vector<std::vector<float> >& inputs, const uint16_t* got, size_t n) {
  const size_t p = inputs.size();
  for (size_t i = 0; i < n; ++i) {
    double exact = 0, magnitude = 0;
    for (const auto& in : inputs) {
      const double h = HalfToFloat(FloatToHalf(in[i]));
      exact += h;
      magnitude += std::fabs(h);
    }
    const double tol = (p - 1) * (std::ldexp(magnitude, -11) + std::ldexp(1.0, -25));
    ASSERT_LE(std::fabs(HalfToFloat(got[i]) - exact), tol)
        << "element " << i << " of " << n << ", " << p << " device(s)";
  }
}

TEST(GpuReduceTest, CastsMatchHalfHBitForBit) {
  SKIP_WITHOUT_GPU();
  const std::vector<float> in = CastSweep();
  const size_t n = in.size();
  DeviceArray<float> f32(0, n), back(0, n);
  DeviceArray<uint16_t> f16(0, n);
  f32.Upload(in);
  ASSERT_TRUE(CastFloatToHalf(0, f32.data(), f16.data(), n, nullptr).ok());
  ASSERT_TRUE(CastHalfToFloat(0, f16.data(), back.data(), n, nullptr).ok());
  ASSERT_CUDA(cudaDeviceSynchronize());
  const std::vector<uint16_t> h = f16.Download();
  const std::vector<float> b = back.Download();
  for (size_t i = 0; i < n; ++i) {
    ASSERT_EQ(h[i], FloatToHalf(in[i])) << "float bits 0x" << std::hex << FloatBits(in[i]);
    ASSERT_EQ(FloatBits(b[i]), FloatBits(HalfToFloat(h[i]))) << "half 0x" << std::hex << h[i];
  }
  EXPECT_EQ(CastFloatToHalf(0, nullptr, f16.data(), 1, nullptr).code(),
            StatusCode::kInvalidArgument);
  EXPECT_TRUE(CastFloatToHalf(0, nullptr, nullptr, 0, nullptr).ok());
}

TEST(GpuReduceTest, ReduceToHostEqualsTheCpuFp16Sum) {
  SKIP_WITHOUT_GPU();
  const std::vector<int> devices = AllDevices();
  auto group = LocalGpuGroup::CreateForDevices(devices, {});
  ASSERT_TRUE(group.ok()) << group.status().ToString();
  ASSERT_EQ((*group)->root_slot(), 0);
  for (size_t n : {size_t{1}, size_t{1000}, (size_t{1} << 20) + 3}) {
    std::vector<std::vector<float> > inputs;
    std::vector<DeviceArray<float> > grads;
    std::vector<const float*> ptrs;
    for (size_t d = 0; d < devices.size(); ++d) {
      inputs.push_back(Gradient(n, 100 * n + d));
      grads.emplace_back(devices[d], n);
      grads.back().Upload(inputs.back());
      ptrs.push_back(grads.back().data());
    }
    auto host = PinnedBuffer::Allocate(n * sizeof(uint16_t));
    ASSERT_TRUE(host.ok()) << host.status().ToString();
    const Status s = (*group)->ReduceToHost(ptrs, n, &*host);
    ASSERT_TRUE(s.ok()) << s.ToString();
    ExpectFp16Sum(inputs, host->halfs(), n);
    for (size_t d = 0; d < devices.size(); ++d) {  // the callers' fp32 inputs are untouched
      ASSERT_EQ(grads[d].Download(), inputs[d]);
    }
  }
}

TEST(GpuReduceTest, BroadcastFromHostGivesEveryDeviceTheSameFp32) {
  SKIP_WITHOUT_GPU();
  const std::vector<int> devices = AllDevices();
  auto group = LocalGpuGroup::CreateForDevices(devices, {});
  ASSERT_TRUE(group.ok()) << group.status().ToString();
  const size_t n = (size_t{1} << 18) + 5;
  auto host = PinnedBuffer::Allocate(n * sizeof(uint16_t));
  ASSERT_TRUE(host.ok());
  const std::vector<float> values = Gradient(n, 7);
  for (size_t i = 0; i < n; ++i) host->halfs()[i] = FloatToHalf(values[i]);
  std::vector<DeviceArray<float> > outs;
  std::vector<float*> ptrs;
  for (int d : devices) {
    outs.emplace_back(d, n);
    ptrs.push_back(outs.back().data());
  }
  const Status s = (*group)->BroadcastFromHost(&*host, n, ptrs);
  ASSERT_TRUE(s.ok()) << s.ToString();
  for (size_t d = 0; d < devices.size(); ++d) {
    const std::vector<float> got = outs[d].Download();
    for (size_t i = 0; i < n; ++i) {
      ASSERT_EQ(FloatBits(got[i]), FloatBits(HalfToFloat(host->halfs()[i])))
          << "device " << devices[d] << " element " << i;
    }
  }
}

TEST(GpuReduceTest, AllReduceAndBroadcastFromRootOnFp16Buffers) {
  SKIP_WITHOUT_GPU();
  const std::vector<int> devices = AllDevices();
  auto group = LocalGpuGroup::CreateForDevices(devices, {});
  ASSERT_TRUE(group.ok()) << group.status().ToString();
  const size_t n = 4097;
  std::vector<std::vector<float> > inputs;
  std::vector<DeviceArray<uint16_t> > bufs;
  std::vector<uint16_t*> ptrs;
  for (size_t d = 0; d < devices.size(); ++d) {
    inputs.push_back(Gradient(n, 50 + d));
    std::vector<uint16_t> h(n);
    for (size_t i = 0; i < n; ++i) h[i] = FloatToHalf(inputs.back()[i]);
    bufs.emplace_back(devices[d], n);
    bufs.back().Upload(h);
    ptrs.push_back(bufs.back().data());
  }
  ASSERT_TRUE((*group)->AllReduce(ptrs, n).ok());
  const std::vector<uint16_t> first = bufs[0].Download();
  ExpectFp16Sum(inputs, first.data(), n);
  for (auto& b : bufs) EXPECT_EQ(b.Download(), first);

  std::vector<uint16_t> root_values(n);
  for (size_t i = 0; i < n; ++i) root_values[i] = static_cast<uint16_t>(i * 7);
  bufs[0].Upload(root_values);
  ASSERT_TRUE((*group)->BroadcastFromRoot(ptrs, n).ok());
  for (auto& b : bufs) EXPECT_EQ(b.Download(), root_values);

  ASSERT_TRUE((*group)->ReduceToRoot(ptrs, n).ok());
  const std::vector<uint16_t> reduced = bufs[0].Download();
  for (size_t i = 0; i < n; ++i) {
    const double exact = devices.size() * static_cast<double>(HalfToFloat(root_values[i]));
    ASSERT_LE(std::fabs(HalfToFloat(reduced[i]) - exact),
              (devices.size() - 1) * (std::ldexp(std::fabs(exact), -11) + std::ldexp(1.0, -25)))
        << i;
  }
}

// Mode (b), one rank per process, with ranks as threads: what the daemon's processes do.
TEST(GpuReduceTest, RanksAsThreadsReduceToHost) {
  SKIP_WITHOUT_GPU();
  const std::vector<int> devices = AllDevices();
  const int p = static_cast<int>(devices.size());
  auto id = LocalGpuGroup::NewGroupId();
  ASSERT_TRUE(id.ok()) << id.status().ToString();
  const size_t n = 65537;
  std::vector<std::vector<float> > inputs;
  for (int r = 0; r < p; ++r) inputs.push_back(Gradient(n, 900 + r));
  auto host = PinnedBuffer::Allocate(n * sizeof(uint16_t));
  ASSERT_TRUE(host.ok());
  std::vector<Status> results(p);
  std::vector<std::thread> threads;
  threads.reserve(p);
  for (int r = 0; r < p; ++r) {
    threads.emplace_back([&, r] {
      auto g = LocalGpuGroup::CreateRank(*id, p, r, devices[r], {});
      if (!g.ok()) {
        results[r] = g.status();
        return;
      }
      DeviceArray<float> grad(devices[r], n);
      grad.Upload(inputs[r]);
      const float* ptr = grad.data();
      results[r] =
          (*g)->ReduceToHost(Span<const float* const>(&ptr, 1), n, r == 0 ? &*host : nullptr);
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < p; ++r) ASSERT_TRUE(results[r].ok()) << r << ": " << results[r].ToString();
  ExpectFp16Sum(inputs, host->halfs(), n);
}

TEST(GpuReduceTest, BadArgumentsAreRefusedAndTheGroupStaysUsable) {
  SKIP_WITHOUT_GPU();
  const std::vector<int> devices = AllDevices();
  const int count = static_cast<int>(devices.size());
  EXPECT_EQ(LocalGpuGroup::CreateForDevices({count}, {}).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(LocalGpuGroup::CreateForDevices({0, 0}, {}).status().code(),
            StatusCode::kInvalidArgument);
  LocalGpuGroupOptions bad_root;
  bad_root.root = count;
  EXPECT_EQ(LocalGpuGroup::CreateForDevices(devices, bad_root).status().code(),
            StatusCode::kInvalidArgument);

  auto group = LocalGpuGroup::CreateForDevices(devices, {});
  ASSERT_TRUE(group.ok()) << group.status().ToString();
  const size_t n = 16;
  std::vector<DeviceArray<float> > grads;
  std::vector<const float*> ptrs;
  for (int d : devices) {
    grads.emplace_back(d, n);
    grads.back().Upload(std::vector<float>(n, 1.0f));
    ptrs.push_back(grads.back().data());
  }
  auto small = PinnedBuffer::Allocate(n);  // half of what n fp16 values need
  ASSERT_TRUE(small.ok());
  EXPECT_EQ((*group)->ReduceToHost(ptrs, n, &*small).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ((*group)->ReduceToHost(ptrs, n, nullptr).code(), StatusCode::kInvalidArgument);
  std::vector<const float*> too_few(ptrs.begin(), ptrs.end() - 1);
  EXPECT_EQ((*group)->ReduceToHost(too_few, n, &*small).code(), StatusCode::kInvalidArgument);
  std::vector<const float*> with_null = ptrs;
  with_null.back() = nullptr;
  auto host = PinnedBuffer::Allocate(n * sizeof(uint16_t));
  ASSERT_TRUE(host.ok());
  EXPECT_EQ((*group)->ReduceToHost(with_null, n, &*host).code(), StatusCode::kInvalidArgument);
  // None of those enqueued anything: the group still works.
  const Status s = (*group)->ReduceToHost(ptrs, n, &*host);
  ASSERT_TRUE(s.ok()) << s.ToString();
  for (size_t i = 0; i < n; ++i) EXPECT_EQ(HalfToFloat(host->halfs()[i]), float(devices.size()));
}

// A rank whose peers never join: creation returns Timeout naming the rank and device within
// the bound instead of hanging.
TEST(GpuReduceTest, JoinWithoutPeersTimesOutNamingTheRank) {
  SKIP_WITHOUT_GPU();
  auto id = LocalGpuGroup::NewGroupId();
  ASSERT_TRUE(id.ok()) << id.status().ToString();
  LocalGpuGroupOptions o;
  o.timeout = std::chrono::milliseconds(1500);
  const auto start = std::chrono::steady_clock::now();
  auto g = LocalGpuGroup::CreateRank(*id, /*nranks=*/2, /*rank=*/0, /*device=*/0, o);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  ASSERT_FALSE(g.ok());
  EXPECT_EQ(g.status().code(), StatusCode::kTimeout) << g.status().ToString();
  EXPECT_NE(g.status().message().find("rank 0 (device 0)"), std::string::npos)
      << g.status().ToString();
  EXPECT_LT(seconds, 1.5 + 10.0) << "abort took too long";
}

#endif  // BITPUSH_HAVE_CUDA && BITPUSH_HAVE_NCCL

}  // namespace
}  // namespace bitpush::worker::gpu
