#include "config/node_trace.h"

#include <cstdlib>
#include <string>
#include <utility>

namespace bitpush::config {

StatusOr<std::unique_ptr<trace::Recorder>> OpenNodeTrace(const ClusterConfig& config,
                                                         const std::string& role, uint32_t rank,
                                                         const std::string& process) {
  trace::RecorderOptions o;
  o.dir = config.trace.dir;
  // `bitpush launch --timeline DIR` sets it for every process it starts.
  if (const char* env = std::getenv("BITPUSH_TRACE_DIR"); env != nullptr && *env != '\0') {
    o.dir = env;
  }
  if (o.dir.empty()) return std::unique_ptr<trace::Recorder>();
  BP_ASSIGN_OR_RETURN(o.steps, trace::StepFilter::Parse(config.trace.steps));
  o.buffer_spans = config.trace.buffer_spans;
  o.role = role;
  o.process = process;
  BP_ASSIGN_OR_RETURN(std::unique_ptr<trace::Recorder> recorder, trace::Recorder::Open(o));
  recorder->SetRank(rank);
  return recorder;
}

}  // namespace bitpush::config
