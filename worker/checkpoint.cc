#include "worker/checkpoint.h"

#include <fmt/format.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>

#include "common/logging.h"
#include "compressors/spec_registry.h"
#include "proto/bitpush/v1/checkpoint.pb.h"

namespace bitpush::worker {

namespace {

constexpr uint32_t kFormat = 1;

std::string FloatBytes(const std::vector<float>& v) {
  return std::string(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(float));
}

std::vector<float> Floats(const std::string& bytes) {
  std::vector<float> v(bytes.size() / sizeof(float));
  if (!v.empty()) std::memcpy(v.data(), bytes.data(), v.size() * sizeof(float));
  return v;
}

Status WriteWhole(const std::string& path, const std::string& bytes) {
  const std::string tmp = fmt::format("{}.tmp.{}", path, getpid());
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    out.flush();
    if (!out) return UnavailableError(fmt::format("SaveCheckpoint: cannot write {}", tmp));
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    std::remove(tmp.c_str());
    return UnavailableError(fmt::format("SaveCheckpoint: cannot rename {} to {}", tmp, path));
  }
  return Status::Ok();
}

StatusOr<std::string> ReadWhole(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return NotFoundError(fmt::format("LoadCheckpoint: cannot read {}", path));
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

Status Differs(const std::string& path, const std::string& field, const std::string& theirs,
               const std::string& ours) {
  return InvalidArgumentError(fmt::format(
      "LoadCheckpoint: {} does not fit this job: {} is {} in the checkpoint but {} here", path,
      field, theirs, ours));
}

}  // namespace

std::string CheckpointNodePath(const std::string& path, uint32_t rank) {
  return fmt::format("{}.node{}", path, rank);
}

Status SaveCheckpoint(Client& client, const std::vector<TensorId>& tensors,
                      const std::string& path) {
  BP_ASSIGN_OR_RETURN(std::vector<TensorCompression> plans, client.CompressionOf(tensors));
  v1::WorkerCheckpoint c;
  c.set_format(kFormat);
  c.set_node(client.rank());
  c.set_num_workers(client.num_workers());
  c.set_error_feedback(client.compression().error_feedback);
  for (size_t i = 0; i < tensors.size(); ++i) {
    const TensorCompression& plan = plans[i];
    v1::CheckpointTensor* t = c.add_tensors();
    t->set_name(plan.name);
    t->set_elements(plan.elements);
    t->set_dtype(static_cast<uint32_t>(plan.dtype));
    t->set_spec(compressors::CompressorSpecString(plan.config));
    BP_ASSIGN_OR_RETURN(std::vector<float> mine, client.ErrorFeedbackState(tensors[i]));
    t->set_worker_residual(FloatBytes(mine));
    StatusOr<uint64_t> rounds = client.TensorRounds(tensors[i]);
    if (rounds.ok()) {
      t->set_rounds(*rounds);
    } else if (rounds.status().code() != StatusCode::kUnimplemented) {  // daemon mode: 0
      return rounds.status().WithContext(
          fmt::format("SaveCheckpoint: the rounds of '{}'", plan.name));
    }
    if (client.rank() == 0) {
      StatusOr<std::vector<float>> servers = client.ServerErrorFeedbackState(tensors[i]);
      if (servers.status().code() == StatusCode::kUnimplemented) {
        BP_LOG_WARN("SaveCheckpoint: {}", servers.status().message());
      } else if (!servers.ok()) {
        return servers.status().WithContext(
            fmt::format("SaveCheckpoint: the servers' residual of '{}'", plan.name));
      } else {
        t->set_server_residual(FloatBytes(*servers));
      }
    }
  }
  BP_RETURN_IF_ERROR(WriteWhole(CheckpointNodePath(path, client.rank()), c.SerializeAsString()));
  return client.Barrier().WithContext("SaveCheckpoint: waiting for every worker's file");
}

Status LoadCheckpoint(Client& client, const std::vector<TensorId>& tensors,
                      const std::string& path) {
  const std::string file = CheckpointNodePath(path, client.rank());
  BP_ASSIGN_OR_RETURN(std::string bytes, ReadWhole(file));
  v1::WorkerCheckpoint c;
  if (!c.ParseFromString(bytes) || c.format() != kFormat) {
    return InvalidArgumentError(fmt::format(
        "LoadCheckpoint: {} is not a bitpush worker checkpoint of format {}", file, kFormat));
  }
  if (c.node() != client.rank()) {
    return Differs(file, "the node", std::to_string(c.node()), std::to_string(client.rank()));
  }
  if (c.num_workers() != client.num_workers()) {
    return Differs(file, "the number of workers", std::to_string(c.num_workers()),
                   std::to_string(client.num_workers()));
  }
  if (c.error_feedback() != client.compression().error_feedback) {
    return Differs(file, "compression.error_feedback", "'" + c.error_feedback() + "'",
                   "'" + client.compression().error_feedback + "'");
  }
  BP_ASSIGN_OR_RETURN(std::vector<TensorCompression> plans, client.CompressionOf(tensors));
  if (static_cast<size_t>(c.tensors_size()) != tensors.size()) {
    return Differs(file, "the number of tensors", std::to_string(c.tensors_size()),
                   std::to_string(tensors.size()));
  }
  for (size_t i = 0; i < tensors.size(); ++i) {
    const v1::CheckpointTensor& t = c.tensors(static_cast<int>(i));
    const TensorCompression& plan = plans[i];
    const std::string what = fmt::format("tensor #{} ('{}')", i, plan.name);
    const std::string spec = compressors::CompressorSpecString(plan.config);
    if (t.name() != plan.name)
      return Differs(file, fmt::format("tensor #{}", i), t.name(), plan.name);
    if (t.elements() != plan.elements || t.dtype() != static_cast<uint32_t>(plan.dtype)) {
      return Differs(
          file, "the size of " + what, fmt::format("{} x dtype {}", t.elements(), t.dtype()),
          fmt::format("{} x dtype {}", plan.elements, static_cast<uint32_t>(plan.dtype)));
    }
    if (t.spec() != spec) return Differs(file, "the compressor of " + what, t.spec(), spec);
  }
  for (size_t i = 0; i < tensors.size(); ++i) {
    const v1::CheckpointTensor& t = c.tensors(static_cast<int>(i));
    BP_RETURN_IF_ERROR(client.RestoreErrorFeedbackState(tensors[i], Floats(t.worker_residual()))
                           .WithContext("LoadCheckpoint"));
  }
  BP_RETURN_IF_ERROR(client.CommitDeclarations().WithContext("LoadCheckpoint"));
  for (size_t i = 0; i < tensors.size(); ++i) {
    const uint64_t rounds = c.tensors(static_cast<int>(i)).rounds();
    if (rounds == 0) continue;
    BP_RETURN_IF_ERROR(
        client.RestoreTensorRounds(tensors[i], rounds).WithContext("LoadCheckpoint"));
  }
  if (client.rank() == 0) {
    for (size_t i = 0; i < tensors.size(); ++i) {
      const v1::CheckpointTensor& t = c.tensors(static_cast<int>(i));
      if (t.server_residual().empty()) continue;
      BP_RETURN_IF_ERROR(
          client.RestoreServerErrorFeedbackState(tensors[i], Floats(t.server_residual()))
              .WithContext("LoadCheckpoint"));
    }
  }
  return client.Barrier().WithContext("LoadCheckpoint: waiting for every worker");
}

}  // namespace bitpush::worker
