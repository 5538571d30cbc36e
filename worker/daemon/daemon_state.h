// The worker daemon's shared state: a training process's connection (Conn) and a tensor's
// declaration, gathering and in-flight state (TensorState). Private to the daemon's pieces
// (worker/daemon.cc and worker/daemon/*.cc); which thread may touch which field is said field
// by field, as in worker/daemon.h.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "worker/daemon.h"

namespace bitpush::worker {

struct Daemon::Conn {
  std::shared_ptr<ipc::Channel> channel;
  pid_t pid = 0;
  bool hello = false;
  uint32_t local_rank = 0;
  std::string who;           // "local rank 1 (pid 4711)" after Hello, "pid 4711" before
  int64_t hello_ns = 0;      // when its Hello was taken (trace::NowNs): its spans start later
  bool span_warned = false;  // a bad optimizer span of it was logged (the rest are dropped quietly)
  bool goodbye = false;
  bool dead = false;  // to be removed after this poll round
  uint32_t next_decl = 0;
  uint64_t next_barrier = 0;
  std::vector<uint64_t> next_round;  // per tensor
  std::map<std::string, std::shared_ptr<ipc::ShmSegment>> segments;
  // CUDA IPC mappings of the process's staging buffers, by handle bytes.
  std::map<std::string, std::shared_ptr<gpu::IpcMapping>> gpu_maps;
};

struct Daemon::TensorState {
  uint32_t index = 0;
  // Declaration (poll loop).
  v1::LocalDeclare first;
  std::string first_who;
  std::vector<std::shared_ptr<ipc::Channel>> waiting;  // declared, verdict not sent yet
  uint32_t declared = 0;
  bool decided = false;
  Status verdict;
  // Accepted tensors.
  TensorId engine_id;
  DType dtype = DType::kFloat32;
  size_t elements = 0;
  size_t bytes = 0;
  float scale = 1.0f;
  bool cuda = false;         // the GPU path (LocalDeclare.cuda)
  gpu::PinnedBuffer pinned;  // CUDA tensors: the fp16 sum / result in page-locked memory
  // The node's reduced input and the engine's output (aliased). Touched by the round and
  // completion threads only while in_flight.
  std::vector<uint8_t> buffer;
  Status error;  // sticky: a round failed while gathering (rounds out of step)
  // Gathering (poll loop).
  uint64_t round = 0;
  uint32_t handed = 0;
  std::vector<bool> present;
  std::vector<Slot> slots;
  std::chrono::steady_clock::time_point deadline;
  bool in_flight = false;
  uint64_t flight_round = 0;  // the round in_flight is about
  // Completion threads -> poll loop, guarded by mu_: every round below this one left the engine
  // (set before its Dones go out, so a process that got its Done finds the round ended even
  // before the poll loop took it from finished_).
  uint64_t rounds_ended = 0;
};

}  // namespace bitpush::worker
