// bitpush-test-trainer: one training process of a node, a worker::Client in daemon mode
// talking to the node's bitpush-worker (tests/unit/daemon_test.cc):
//
//   bitpush-test-trainer --config cluster.yaml --node N --local-rank R --local-size P
//                        --socket PATH --iters K [--pause-ms M] [--elements-delta D]
//                        [--hello-major V] [--barrier D] [--gpu 1] [--late-declare 1]
//
// Declares three tensors ("grad.big", kBigElements fp32, the cluster's compressor;
// "grad.small", fp32 below any sensible min_compress_bytes; "grad.half", fp16: reduced in fp32
// and rounded once by the daemon, cast back once after the pull), then for K iterations push_pulls
// both with deterministic inputs (process (N, R), tensor t, round r) and compares every output BIT
// FOR BIT with a reference computed here from the same functions the system uses, in the same
// order: per node, the daemon's local reduce (LocalReduceKernel over the node's P inputs in
// local-rank order, scale 1/P); then per partition (key, round) the worker compressor with the
// worker residual of that node, the server's fp32 DecompressAdd in node-rank order, x 1/W, the
// server compressor with the server residual, decompress (paper 001 Algorithms 3 and 4; the
// same order as pushpull_e2e_test's reference).
//
// --elements-delta D declares grad.big with D more elements (a declaration difference);
// --barrier D enters Client::Barrier D ms after every iteration, printing "entering barrier K at T"
// and "barrier K ok at T" (T = CLOCK_MONOTONIC in microseconds, comparable across processes);
// --late-declare 1 declares only grad.big up front and each other tensor right after the
// previous one's first push_pull was posted (the lazy first-use declaration of bitpush.torch),
// so declarations and first rounds interleave on the daemon;
// --gpu 1 is the GPU path instead: one fp32 CUDA tensor "grad.gpu" (TensorOptions::cuda) in
// device memory on GPU (local rank mod device count), K rounds, each result checked against the
// exact average of all processes' inputs within fp16 tolerance (the node's inputs are cast to
// fp16 and summed in fp16 by NCCL, the result travels back in fp16): |got - want| <= 4e-3 x
// (max |input|) per element; needs compression `none`. Without a usable GPU the daemon refuses
// the declaration and the trainer prints "error: iteration 0: <the daemon's reason>" (exit 3).
// --hello-major V only connects, sends a Hello of protocol version V.0 and prints the verdict.
// --ef-check 1 reads every tensor's worker error-feedback residual through
// Client::ErrorFeedbackState after every iteration and compares it BIT FOR BIT with this node's
// residual in the reference (empty for a tensor that keeps none); it also checks that a read while
// its own push_pull is pending is FailedPrecondition, and that a restore of the wrong size is
// InvalidArgument. --ef-restore-at K (with --ef-check) then, after iteration K's check and a
// barrier, restores every tensor: local rank 0 gives 0.5 x the node's residual, the others give
// 1000.0 everywhere (checked, never applied: local rank 0's restore is the node's); every
// trainer's reference halves every node's residual, so the later rounds match only if exactly
// local rank 0's restore took effect.
// --ef-probe 1 speaks the local protocol itself (raw frames, this process is local rank R of
// the node): it declares and pushes the same tensors and inputs as a Client trainer, sends
// malformed and ill-timed LocalErrorFeedback requests and checks each refusal's message (unknown
// tensor, wrong-sized slice, another process's segment, a slice outside its segment, a lying
// segment size, too many values, values for a tensor that keeps none, a read while its own
// round is being gathered and while the round is in the engine), then reads the residual after
// each round and compares it bit for bit with the reference. Prints "check NAME ok" per check.
// Output lines (prefix "trainer N.R: "): "iteration K ok", "FAIL <check>: <why>" (exit 4), "error:
// iteration K: <status>" (exit 3), "MISMATCH ..." (exit 4), "refused: <status>" (exit 5), "done"
// (exit 0).
#include <fmt/format.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "common/vector_ops.h"
#include "compressors/error_feedback.h"
#include "compressors/registry.h"
#include "config/cluster_config.h"
#include "tests/harness/reference_model.h"
#include "tests/unit/test_util.h"
#include "worker/client.h"
#include "worker/gpu/device_memory.h"
#include "worker/gpu/gpu_reduce.h"
#include "worker/ipc/local_protocol.h"
#include "worker/ipc/shm_segment.h"
#include "worker/local_reduce.h"
#include "worker/partition.h"

namespace {

using namespace bitpush;

constexpr size_t kBigElements = 30000;
constexpr size_t kSmallElements = 200;
constexpr size_t kHalfElements = 3000;  // fp16: 6000 bytes, compressed above 4096

std::string g_prefix;

void Say(const std::string& line) {
  std::printf("%s%s\n", g_prefix.c_str(), line.c_str());
  std::fflush(stdout);
}

// The input of process (node, local_rank), tensor t, round r, as raw bytes of `dtype`.
std::vector<uint8_t> Input(uint32_t node, uint32_t local_rank, size_t t, uint64_t r, size_t n,
                           DType dtype) {
  return testing::ReferenceInput(node * 16ull + local_rank + 1, t, r, n, dtype);
}

// The reference of one tensor across all nodes (tests/harness/reference_model.h; see the file
// comment). The cluster's options are valid (the trainer loaded them), so Create cannot fail.
testing::ReferenceTensor Reference(const config::ClusterConfig& c, uint32_t index, size_t elements,
                                   DType dtype, uint32_t nodes, uint32_t local_size) {
  testing::ReferenceTensorOptions o;
  o.spec = c.compression.spec;
  o.error_feedback = c.compression.error_feedback;
  o.min_compress_bytes = c.compression.min_compress_bytes;
  o.partition_bytes = c.compression.partition_bytes;
  o.index = index;
  o.elements = elements;
  o.dtype = dtype;
  o.nodes = nodes;
  o.local_size = local_size;
  StatusOr<testing::ReferenceTensor> made = testing::ReferenceTensor::Create(o);
  if (!made.ok()) {
    Say("error: reference: " + made.status().ToString());
    std::exit(3);
  }
  return std::move(made).value();
}

int HelloOnly(const std::string& socket, uint32_t major, uint32_t local_rank, uint32_t local_size) {
  auto ch = worker::ipc::Channel::Connect(socket, std::chrono::seconds(10));
  if (!ch.ok()) {
    Say("error: " + ch.status().ToString());
    return 3;
  }
  v1::LocalMessage m;
  *m.mutable_hello() = worker::ipc::MakeHello(local_rank, local_size);
  m.mutable_hello()->mutable_version()->set_major(major);
  Status s = worker::ipc::SendLocalMessage(**ch, m);
  if (s.ok()) {
    auto reply = worker::ipc::ReceiveLocalMessage(**ch, std::chrono::seconds(10));
    s = reply.ok() ? worker::ipc::HelloReplyStatus(reply->hello_reply(), local_rank)
                   : reply.status();
  }
  Say(s.ok() ? "accepted" : "refused: " + s.ToString());
  return s.ok() ? 0 : 5;
}

bool SameBits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() &&
         (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
}

// Tensors every non-GPU trainer declares (see the file comment).
const std::vector<std::string> kNames = {"grad.big", "grad.small", "grad.half"};
const std::vector<size_t> kSizes = {kBigElements, kSmallElements, kHalfElements};
const std::vector<DType> kDTypes = {DType::kFloat32, DType::kFloat32, DType::kFloat16};

// The --ef-probe mode (see the file comment).
class EfProbe {
 public:
  EfProbe(const config::ClusterConfig& c, uint32_t node, uint32_t local_rank, uint32_t local_size)
      : config_(c), node_(node), local_rank_(local_rank), local_size_(local_size) {}

  int Run(const std::string& socket, long iters) {
    auto ch = worker::ipc::Channel::Connect(socket, std::chrono::seconds(10));
    if (!ch.ok()) return Fail("connect", ch.status().ToString());
    ch_ = std::move(ch).value();
    v1::LocalMessage hello;
    *hello.mutable_hello() = worker::ipc::MakeHello(local_rank_, local_size_);
    if (!Send(hello)) return 4;
    StatusOr<v1::LocalMessage> reply = Next();
    if (!reply.ok() || !reply->has_hello_reply() ||
        reply->hello_reply().refusal() != v1::LocalHelloReply::REFUSAL_NONE) {
      return Fail("hello", reply.ok() ? reply->DebugString() : reply.status().ToString());
    }
    const uint32_t nodes = static_cast<uint32_t>(config_.workers.size());
    for (size_t t = 0; t < kNames.size(); ++t) {
      v1::LocalMessage m;
      v1::LocalDeclare* d = m.mutable_declare();
      d->set_index(static_cast<uint32_t>(t));
      d->set_name(kNames[t]);
      d->set_elements(kSizes[t]);
      d->set_dtype(static_cast<uint32_t>(kDTypes[t]));
      if (!Send(m)) return 4;
      refs_.push_back(
          Reference(config_, static_cast<uint32_t>(t), kSizes[t], kDTypes[t], nodes, local_size_));
      auto seg = worker::ipc::ShmSegment::Create(kSizes[t] * DTypeSize(kDTypes[t]));
      auto ef = worker::ipc::ShmSegment::Create(kSizes[t] * sizeof(float));
      if (!seg.ok() || !ef.ok()) return Fail("segments", "cannot create");
      data_.push_back(std::move(seg).value());
      ef_.push_back(std::move(ef).value());
    }
    for (size_t t = 0; t < kNames.size(); ++t) {
      StatusOr<v1::LocalMessage> m = Next();
      if (!m.ok() || !m->has_declare_reply() || m->declare_reply().status_code() != 0) {
        return Fail("declare", m.ok() ? m->DebugString() : m.status().ToString());
      }
    }
    if (!Malformed()) return 4;
    for (long it = 0; it < iters; ++it) {
      if (!Round(static_cast<uint64_t>(it), nodes)) return 4;
      Say("iteration " + std::to_string(it) + " ok");
    }
    if (!saw_gathering_ || !saw_engine_) {
      return Fail("in-flight refusals", fmt::format("saw the gathering refusal: {}, the engine "
                                                    "refusal: {}",
                                                    saw_gathering_, saw_engine_));
    }
    v1::LocalMessage bye;
    bye.mutable_goodbye();
    (void)worker::ipc::SendLocalMessage(*ch_, bye);
    Say("done");
    return 0;
  }

 private:
  int Fail(const std::string& check, const std::string& why) {
    Say("FAIL " + check + ": " + why);
    return 4;
  }
  bool Send(const v1::LocalMessage& m) {
    const Status s = worker::ipc::SendLocalMessage(*ch_, m);
    if (!s.ok()) Fail("send", s.ToString());
    return s.ok();
  }
  // The next message; push_pull Dones go to done_.
  StatusOr<v1::LocalMessage> Next() {
    for (;;) {
      StatusOr<v1::LocalMessage> m =
          worker::ipc::ReceiveLocalMessage(*ch_, std::chrono::seconds(20));
      if (m.ok() && m->has_push_pull_done()) {
        done_.push_back(m->push_pull_done());
        continue;
      }
      return m;
    }
  }
  v1::ShmSlice EfSlice(size_t t) const {
    v1::ShmSlice s;
    s.set_segment(ef_[t].name());
    s.set_segment_bytes(ef_[t].size());
    s.set_offset(0);
    s.set_bytes(ef_[t].size());
    return s;
  }
  // One LocalErrorFeedback exchange.
  StatusOr<v1::LocalErrorFeedbackDone> Ask(uint32_t tensor, bool restore, uint64_t values,
                                           const v1::ShmSlice& slice) {
    v1::LocalMessage m;
    v1::LocalErrorFeedback* e = m.mutable_error_feedback();
    const uint64_t seq = seq_++;
    e->set_seq(seq);
    e->set_tensor(tensor);
    e->set_restore(restore);
    e->set_values(values);
    *e->mutable_slice() = slice;
    BP_RETURN_IF_ERROR(worker::ipc::SendLocalMessage(*ch_, m));
    BP_ASSIGN_OR_RETURN(v1::LocalMessage r, Next());
    if (!r.has_error_feedback_done() || r.error_feedback_done().seq() != seq) {
      return DataLossError("unexpected answer: " + r.ShortDebugString());
    }
    return r.error_feedback_done();
  }
  // A request the daemon must refuse with `code` and a message containing `text`.
  bool ExpectRefused(const std::string& check, uint32_t tensor, bool restore, uint64_t values,
                     const v1::ShmSlice& slice, StatusCode code, const std::string& text) {
    StatusOr<v1::LocalErrorFeedbackDone> d = Ask(tensor, restore, values, slice);
    if (!d.ok()) return Fail(check, d.status().ToString()) == 0;
    if (d->status_code() != static_cast<uint32_t>(code) ||
        d->message().find(text) == std::string::npos) {
      return Fail(check, fmt::format("wanted {} containing '{}', got code {}: {}",
                                     StatusCodeName(code), text, d->status_code(), d->message())) ==
             0;
    }
    Say("check " + check + " ok: " + d->message());
    return true;
  }
  bool Malformed() {
    v1::ShmSlice s = EfSlice(0);
    s.set_segment_bytes(s.segment_bytes() + 4096);  // lies about the segment's size
    s.set_bytes(kBigElements * sizeof(float));
    bool ok =
        ExpectRefused("lying segment size", 0, false, 0, s, StatusCode::kDataLoss, ef_[0].name());
    ok = ok && ExpectRefused("unknown tensor", 7, false, 0, EfSlice(0), StatusCode::kNotFound,
                             "tensor #7");
    s = EfSlice(0);
    s.set_bytes(s.bytes() - 4);
    ok = ok && ExpectRefused("wrong size", 0, false, 0, s, StatusCode::kInvalidArgument,
                             fmt::format("{} bytes, the tensor has {}", s.bytes(), s.bytes() + 4));
    s = EfSlice(0);
    s.set_segment(fmt::format("/bitpush-{}-{}-0", getuid(), getppid()));
    ok = ok && ExpectRefused("foreign segment", 0, false, 0, s, StatusCode::kInvalidArgument,
                             fmt::format("belongs to pid {}", getppid()));
    s = EfSlice(0);
    s.set_offset(8);
    ok = ok && ExpectRefused("outside its segment", 0, false, 0, s, StatusCode::kInvalidArgument,
                             "outside segment");
    ok = ok &&
         ExpectRefused(
             "too many values", 0, true, kBigElements + 1, EfSlice(0), StatusCode::kInvalidArgument,
             fmt::format("{} values given, the tensor has {}", kBigElements + 1, kBigElements));
    ok = ok && ExpectRefused("too few values", 0, true, 5, EfSlice(0), StatusCode::kInvalidArgument,
                             fmt::format("5 values given, the tensor has {}", kBigElements));
    ok = ok && ExpectRefused("keeps none", 1, true, kSmallElements, EfSlice(1),
                             StatusCode::kInvalidArgument, "keeps no worker residual");
    return ok && Compare(0, "before round 0") && Compare(1, "before round 0");
  }
  // Reads tensor t's residual and compares it with the reference's.
  bool Compare(size_t t, const std::string& when) {
    StatusOr<v1::LocalErrorFeedbackDone> d = Ask(static_cast<uint32_t>(t), false, 0, EfSlice(t));
    const std::string check = "read " + kNames[t] + " " + when;
    if (!d.ok()) return Fail(check, d.status().ToString()) == 0;
    if (d->status_code() != 0) return Fail(check, d->message()) == 0;
    const float* f = static_cast<const float*>(ef_[t].data());
    const std::vector<float> got(f, f + d->values());
    if (!SameBits(got, refs_[t].WorkerResidual(node_))) {
      return Fail(check, fmt::format("{} values differ from the reference's {}", got.size(),
                                     refs_[t].WorkerResidual(node_).size())) == 0;
    }
    Say(fmt::format("check {} ok: {} values", check, got.size()));
    return true;
  }
  bool Round(uint64_t r, uint32_t nodes) {
    for (size_t t = 0; t < kNames.size(); ++t) {
      const std::vector<uint8_t> in = Input(node_, local_rank_, t, r, kSizes[t], kDTypes[t]);
      std::memcpy(data_[t].data(), in.data(), in.size());
      v1::LocalMessage m;
      v1::LocalPushPull* p = m.mutable_push_pull();
      p->set_tensor(static_cast<uint32_t>(t));
      p->set_round(r);
      v1::ShmSlice* s = p->mutable_input();
      s->set_segment(data_[t].name());
      s->set_segment_bytes(data_[t].size());
      s->set_offset(0);
      s->set_bytes(in.size());
      *p->mutable_output() = *s;
      if (!Send(m)) return false;
    }
    // Poll grad.big's residual: refused while the round is gathered or in the engine; allowed
    // once the engine is done with it (possibly just before its Done reaches this process).
    const std::string gathering = fmt::format("its push_pull of round {} is in flight", r);
    const std::string in_engine = fmt::format("round {} of it is in flight", r);
    for (;;) {
      StatusOr<v1::LocalErrorFeedbackDone> d = Ask(0, false, 0, EfSlice(0));
      if (!d.ok()) return Fail("read during round", d.status().ToString()) == 0;
      if (d->status_code() == 0) break;
      if (d->status_code() != static_cast<uint32_t>(StatusCode::kFailedPrecondition) ||
          d->message().find("'grad.big'") == std::string::npos) {
        return Fail("read during round",
                    fmt::format("code {}: {}", d->status_code(), d->message())) == 0;
      }
      if (d->message().find(gathering) != std::string::npos) {
        if (!saw_gathering_) Say("check refused while gathering ok: " + d->message());
        saw_gathering_ = true;
      } else if (d->message().find(in_engine) != std::string::npos) {
        if (!saw_engine_) Say("check refused while in the engine ok: " + d->message());
        saw_engine_ = true;
      } else {
        return Fail("read during round", d->message()) == 0;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    while (done_.size() < kNames.size()) {
      StatusOr<v1::LocalMessage> m =
          worker::ipc::ReceiveLocalMessage(*ch_, std::chrono::seconds(20));
      if (!m.ok() || !m->has_push_pull_done()) {
        return Fail("round " + std::to_string(r),
                    m.ok() ? m->ShortDebugString() : m.status().ToString()) == 0;
      }
      done_.push_back(m->push_pull_done());
    }
    for (const v1::LocalPushPullDone& d : done_) {
      if (d.status_code() != 0 || d.round() != r) {
        return Fail("round " + std::to_string(r), d.ShortDebugString()) == 0;
      }
    }
    done_.clear();
    for (size_t t = 0; t < kNames.size(); ++t) {
      std::vector<std::vector<std::vector<uint8_t>>> all(nodes);
      for (uint32_t w = 0; w < nodes; ++w) {
        for (uint32_t p = 0; p < local_size_; ++p) {
          all[w].push_back(Input(w, p, t, r, kSizes[t], kDTypes[t]));
        }
      }
      StatusOr<std::vector<uint8_t>> want = refs_[t].Round(all);
      if (!want.ok()) return Fail("round " + std::to_string(r), want.status().ToString()) == 0;
      if (std::memcmp(want->data(), data_[t].data(), want->size()) != 0) {
        return Fail("round " + std::to_string(r), "result of " + kNames[t] + " differs") == 0;
      }
    }
    return Compare(0, "after round " + std::to_string(r)) &&
           Compare(2, "after round " + std::to_string(r));
  }
  const config::ClusterConfig& config_;
  uint32_t node_, local_rank_, local_size_;
  std::unique_ptr<worker::ipc::Channel> ch_;
  std::vector<testing::ReferenceTensor> refs_;
  std::vector<worker::ipc::ShmSegment> data_, ef_;
  std::vector<v1::LocalPushPullDone> done_;
  uint64_t seq_ = 0;
  bool saw_gathering_ = false, saw_engine_ = false;
};

// The --gpu mode (see the file comment).
int GpuTrainer(worker::Client& client, uint32_t node, uint32_t local_rank, uint32_t local_size,
               uint32_t nodes, long iters) {
  constexpr size_t kElements = 30000;
  worker::TensorOptions o;
  o.cuda = true;
  auto id = client.Declare("grad.gpu", kElements, DType::kFloat32, o);
  if (!id.ok()) {
    Say("error: declare: " + id.status().ToString());
    return 3;
  }
  const Status committed = client.CommitDeclarations();
  if (!committed.ok()) {
    Say("error: iteration 0: " + committed.ToString());
    return 3;
  }
  StatusOr<int> devices = worker::gpu::GpuDeviceCount();
  if (!devices.ok() || *devices == 0) {
    Say("error: iteration 0: no GPU in the training process");
    return 3;
  }
  const int device = static_cast<int>(local_rank) % *devices;
  auto buf = worker::gpu::DeviceBuffer::Allocate(device, kElements * sizeof(float));
  if (!buf.ok()) {
    Say("error: iteration 0: " + buf.status().ToString());
    return 3;
  }
  for (long it = 0; it < iters; ++it) {
    const std::vector<uint8_t> in = Input(node, local_rank, 0, it, kElements, DType::kFloat32);
    Status s = worker::gpu::CopyDeviceMemory(device, buf->data(), in.data(), in.size());
    if (s.ok()) {
      s = client
              .PushPull(*id, ConstTensorView(buf->data(), kElements, DType::kFloat32),
                        TensorView(buf->data(), kElements, DType::kFloat32))
              .Wait();
    }
    std::vector<float> got(kElements);
    if (s.ok()) s = worker::gpu::CopyDeviceMemory(device, got.data(), buf->data(), in.size());
    if (!s.ok()) {
      Say("error: iteration " + std::to_string(it) + ": " + s.ToString());
      return 3;
    }
    std::vector<double> want(kElements, 0.0);
    double max_abs = 0;
    for (uint32_t w = 0; w < nodes; ++w) {
      for (uint32_t p = 0; p < local_size; ++p) {
        const std::vector<uint8_t> x = Input(w, p, 0, it, kElements, DType::kFloat32);
        const float* f = reinterpret_cast<const float*>(x.data());
        for (size_t i = 0; i < kElements; ++i) {
          want[i] += f[i] / static_cast<double>(nodes * local_size);
          max_abs = std::max(max_abs, static_cast<double>(std::fabs(f[i])));
        }
      }
    }
    for (size_t i = 0; i < kElements; ++i) {
      if (!(std::fabs(got[i] - want[i]) <= 4e-3 * max_abs)) {
        Say("MISMATCH tensor 'grad.gpu' round " + std::to_string(it) + " element " +
            std::to_string(i) + ": " + std::to_string(got[i]) + " vs " + std::to_string(want[i]));
        return 4;
      }
    }
    Say("iteration " + std::to_string(it) + " ok");
  }
  const Status s = client.Shutdown(std::chrono::seconds(30));
  if (!s.ok()) {
    Say("error: shutdown: " + s.ToString());
    return 3;
  }
  Say("done");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::string config_path;
  std::string socket;
  long node = 0, local_rank = 0, local_size = 1, iters = 1, pause_ms = 0, delta = 0;
  long hello_major = -1;
  long barrier = -1;
  long gpu = 0;
  long late = 0;
  long ef_check = 0, ef_restore_at = -1, ef_probe = 0;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    const std::string v = argv[i + 1];
    if (a == "--config") {
      config_path = v;
    } else if (a == "--socket") {
      socket = v;
    } else {
      const long x = std::strtol(v.c_str(), nullptr, 10);
      if (a == "--node")
        node = x;
      else if (a == "--local-rank")
        local_rank = x;
      else if (a == "--local-size")
        local_size = x;
      else if (a == "--iters")
        iters = x;
      else if (a == "--pause-ms")
        pause_ms = x;
      else if (a == "--elements-delta")
        delta = x;
      else if (a == "--hello-major")
        hello_major = x;
      else if (a == "--barrier")
        barrier = x;
      else if (a == "--gpu")
        gpu = x;
      else if (a == "--late-declare")
        late = x;
      else if (a == "--ef-check")
        ef_check = x;
      else if (a == "--ef-restore-at")
        ef_restore_at = x;
      else if (a == "--ef-probe")
        ef_probe = x;
      else {
        std::fprintf(stderr, "bitpush-test-trainer: unknown argument %s\n", a.c_str());
        return 2;
      }
    }
  }
  g_prefix = "trainer " + std::to_string(node) + "." + std::to_string(local_rank) + ": ";
  if (hello_major >= 0) {
    return HelloOnly(socket, static_cast<uint32_t>(hello_major), static_cast<uint32_t>(local_rank),
                     static_cast<uint32_t>(local_size));
  }
  StatusOr<config::ClusterConfig> config = config::LoadClusterConfig(config_path);
  if (!config.ok()) {
    Say("error: " + config.status().ToString());
    return 2;
  }
  if (ef_probe != 0) {
    return EfProbe(*config, static_cast<uint32_t>(node), static_cast<uint32_t>(local_rank),
                   static_cast<uint32_t>(local_size))
        .Run(socket, iters);
  }
  worker::ClientOptions o;
  o.cluster = *config;
  o.rank = static_cast<uint32_t>(node);
  o.mode = worker::ClientMode::kDaemon;
  o.daemon_socket = socket;
  o.local_rank = static_cast<uint32_t>(local_rank);
  o.local_size = static_cast<uint32_t>(local_size);
  auto client = worker::Client::Create(o);
  if (!client.ok()) {
    Say("refused: " + client.status().ToString());
    return 5;
  }
  const uint32_t nodes = static_cast<uint32_t>(config->workers.size());
  if (gpu != 0) {
    return GpuTrainer(**client, static_cast<uint32_t>(node), static_cast<uint32_t>(local_rank),
                      static_cast<uint32_t>(local_size), nodes, iters);
  }
  std::vector<size_t> sizes = kSizes;
  sizes[0] += static_cast<size_t>(delta);
  const std::vector<DType>& dtypes = kDTypes;
  const std::vector<std::string>& names = kNames;
  std::vector<worker::TensorId> ids;
  std::vector<testing::ReferenceTensor> refs;
  auto declare = [&](size_t t) {
    auto id = (*client)->Declare(names[t], sizes[t], dtypes[t], worker::TensorOptions{});
    if (!id.ok()) {
      Say("error: declare: " + id.status().ToString());
      return false;
    }
    ids[t] = *id;
    return true;
  };
  ids.resize(sizes.size());
  for (size_t t = 0; t < sizes.size(); ++t) {
    if ((late == 0 || t == 0) && !declare(t)) return 3;
    refs.push_back(Reference(*config, static_cast<uint32_t>(t), sizes[t], dtypes[t], nodes,
                             static_cast<uint32_t>(local_size)));
  }
  if (late == 0) {
    const Status committed = (*client)->CommitDeclarations();
    if (!committed.ok()) {
      Say("error: iteration 0: " + committed.ToString());
      return 3;
    }
  }
  for (long it = 0; it < iters; ++it) {
    if (pause_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(pause_ms));
    std::vector<std::vector<uint8_t>> in(sizes.size()), out(sizes.size());
    std::vector<worker::PushPullHandle> handles;
    for (size_t t = 0; t < sizes.size(); ++t) {
      in[t] = Input(static_cast<uint32_t>(node), static_cast<uint32_t>(local_rank), t, it, sizes[t],
                    dtypes[t]);
      out[t].assign(in[t].size(), 0);
      if (late != 0 && it == 0 && t > 0 && !declare(t)) return 3;
      handles.push_back((*client)->PushPull(ids[t],
                                            ConstTensorView(in[t].data(), sizes[t], dtypes[t]),
                                            TensorView(out[t].data(), sizes[t], dtypes[t])));
    }
    if (ef_check != 0) {
      // The client's own rule: not while a push_pull of the tensor is in flight.
      StatusOr<std::vector<float>> early = (*client)->ErrorFeedbackState(ids[0]);
      // (Allowed only when that push_pull already completed.)
      const bool refused = !early.ok() &&
                           early.status().code() == StatusCode::kFailedPrecondition &&
                           early.status().message().find("in flight") != std::string::npos;
      if (!refused && !(early.ok() && handles[0].Ready())) {
        Say("FAIL read while pending: " +
            (early.ok() ? std::string("allowed") : early.status().ToString()));
        return 4;
      }
    }
    for (size_t t = 0; t < sizes.size(); ++t) {
      const Status s = handles[t].Wait();
      if (!s.ok()) {
        Say("error: iteration " + std::to_string(it) + ": " + s.ToString());
        return 3;
      }
    }
    for (size_t t = 0; t < sizes.size(); ++t) {
      std::vector<std::vector<std::vector<uint8_t>>> all(nodes);
      for (uint32_t w = 0; w < nodes; ++w) {
        for (uint32_t p = 0; p < static_cast<uint32_t>(local_size); ++p) {
          all[w].push_back(Input(w, p, t, it, sizes[t], dtypes[t]));
        }
      }
      StatusOr<std::vector<uint8_t>> want = refs[t].Round(all);
      if (!want.ok()) {
        Say("error: reference: " + want.status().ToString());
        return 3;
      }
      const size_t esz = DTypeSize(dtypes[t]);
      for (size_t i = 0; i < sizes[t]; ++i) {
        if (std::memcmp(&(*want)[i * esz], &out[t][i * esz], esz) != 0) {
          Say("MISMATCH tensor '" + names[t] + "' round " + std::to_string(it) + " element " +
              std::to_string(i) + " differs from the reference");
          return 4;
        }
      }
    }
    Say("iteration " + std::to_string(it) + " ok");
    for (size_t t = 0; ef_check != 0 && t < sizes.size(); ++t) {
      StatusOr<std::vector<float>> got = (*client)->ErrorFeedbackState(ids[t]);
      const std::vector<float> want = refs[t].WorkerResidual(static_cast<uint32_t>(node));
      if (!got.ok() || !SameBits(*got, want)) {
        Say("FAIL residual of " + names[t] + " after iteration " + std::to_string(it) + ": " +
            (got.ok() ? std::to_string(got->size()) + " values differ from the reference's " +
                            std::to_string(want.size())
                      : got.status().ToString()));
        return 4;
      }
      Say("residual of " + names[t] + " ok (" + std::to_string(want.size()) + " values)");
    }
    if (ef_check != 0 && it == ef_restore_at) {
      // Every process has read this round's residual before anyone restores.
      const Status b = (*client)->Barrier();
      if (!b.ok()) {
        Say("error: barrier before the restore: " + b.ToString());
        return 3;
      }
      for (size_t t = 0; t < sizes.size(); ++t) {
        std::vector<float> mine = refs[t].WorkerResidual(static_cast<uint32_t>(node));
        const std::vector<float> junk(mine.empty() ? 3 : mine.size() - 1, 1.0f);
        const Status wrong = (*client)->RestoreErrorFeedbackState(ids[t], junk);
        if (wrong.code() != StatusCode::kInvalidArgument) {
          Say("FAIL restore of the wrong size of " + names[t] + ": " + wrong.ToString());
          return 4;
        }
        for (float& v : mine) v = local_rank == 0 ? v * 0.5f : 1000.0f;
        const Status s = (*client)->RestoreErrorFeedbackState(ids[t], mine);
        if (!s.ok()) {
          Say("FAIL restore of " + names[t] + ": " + s.ToString());
          return 4;
        }
        for (uint32_t w = 0; w < nodes; ++w) {
          std::vector<float> half = refs[t].WorkerResidual(w);
          for (float& v : half) v *= 0.5f;
          const Status restored = refs[t].RestoreWorkerResidual(w, half);
          if (!restored.ok()) {
            Say("error: reference: " + restored.ToString());
            return 3;
          }
        }
      }
      Say("restored after iteration " + std::to_string(it));
    }
    if (barrier >= 0) {
      std::this_thread::sleep_for(std::chrono::milliseconds(barrier));
      auto now_us = [] {
        timespec ts{};
        clock_gettime(CLOCK_MONOTONIC, &ts);
        return std::to_string(static_cast<long long>(ts.tv_sec) * 1000000 + ts.tv_nsec / 1000);
      };
      Say("entering barrier " + std::to_string(it) + " at " + now_us());
      const Status b = (*client)->Barrier();
      if (!b.ok()) {
        Say("error: barrier " + std::to_string(it) + ": " + b.ToString());
        return 3;
      }
      Say("barrier " + std::to_string(it) + " ok at " + now_us());
    }
  }
  const Status s = (*client)->Shutdown(std::chrono::seconds(30));
  if (!s.ok()) {
    Say("error: shutdown: " + s.ToString());
    return 3;
  }
  Say("done");
  return 0;
}
