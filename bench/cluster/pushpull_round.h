// The push/pull cluster of `bitpush-bench cluster`: the real Scheduler, Servers and worker
// Clients (embedded engines) of the run's shape as threads of this process, over the run's
// transport, after the control-plane cluster has gone.
//
// Every worker declares one tensor of pushpull_floats x S floats, uncompressed and cut into
// partitions of pushpull_floats floats (compression.partition_bytes = raw_partition_bytes), so
// the key mapping (SCHEME_MIX64_STRIPE: a tensor's partitions round robin over the servers)
// puts exactly one partition on every server: a round is one small push from every worker to
// every server and one reply back. One warm-up round (it also commits the declarations through
// server 0) and `pushpull_rounds` timed rounds, each started after the workers' barrier; a
// round's time runs from the first worker's PushPull to the last worker's result, and every
// result is checked against the average of the workers' inputs. One engine thread per server
// and one compression thread per worker, unpinned (numa off): the machine's cores are shared by
// every node anyway.
//
// Over zmq every worker-server pair has two connections in this one process (both ends, each
// with its ZeroMQ sockets and monitors): when the file descriptors that takes (estimated from the
// control-plane cluster's count per endpoint and per connection) do not fit RLIMIT_NOFILE, the
// rounds are not run and pushpull_skipped says why.
//
// Every wait is bounded (startup_timeout, op_timeout 60 s, the clean shutdown); on the first
// failure the scheduler is stopped, which ends every node's pending call, and that failure,
// naming the node, is the run's error.
//
// Owned by the child mode of the cluster benchmark. Thread-safety: call from one thread.
#pragma once

#include <cstdint>

#include "bench/cluster/spec.h"
#include "common/status.h"

namespace bitpush::bench::cluster {

// Runs the push/pull cluster of `spec` (zmq ports from spec.first_port + nodes + 1) and fills
// the pushpull_* fields of `figures`; zmq: first checks that the file descriptors it takes (from
// the control-plane cluster's fds_per_endpoint and fds_per_connection in `figures`) fit
// `fd_limit` (RLIMIT_NOFILE).
Status RunPushPullRounds(const ClusterSpec& spec, int64_t fd_limit, ClusterFigures* figures);

}  // namespace bitpush::bench::cluster
