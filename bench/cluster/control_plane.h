// The control-plane cluster of `bitpush-bench cluster`: the real Scheduler on a thread of its
// own, and every server and worker on a thread of its own running the real SchedulerClient on
// an endpoint of its own (inproc, or zmq on 127.0.0.1), each endpoint wrapped in the test
// harness's FaultyTransport (tests/harness/faulty_transport.h) so one node can be made silent.
//
// RunControlPlane goes through five phases, each wait bounded and naming the nodes it still
// waited for when the bound passes:
//   1. register: every node thread starts, binds, Register()s (the production back-off);
//      register_s = the last registration - the last node thread's start; the process's RSS
//      growth since before the cluster, its threads and file descriptors, once all registered;
//   2. barriers: every node runs `barriers` GROUP_ALL barriers; each barrier's latency = the
//      last node released - the last node asking;
//   3. idle: heartbeats only for idle_s; the CPU time over it of the scheduler's Run thread,
//      of the threads its endpoint started (the zmq transport's), and of the whole process;
//   4. kill: the last worker goes silent (its messages dropped, as a hung process's);
//      kill_named_s = until the last other node's client reported that worker failed (the
//      scheduler's NodeFailed, SchedulerClientOptions::on_error);
//   5. teardown: the scheduler shuts the cluster down with that error, the nodes exit, the
//      threads are joined. A node that failed before the kill, or a verdict on another node,
//      is the run's error.
//
// Owned by the child mode of the cluster benchmark. Thread-safety: call from one thread; it
// starts and joins every thread it uses.
#pragma once

#include "bench/cluster/spec.h"
#include "common/status.h"

namespace bitpush::bench::cluster {

// Runs the control-plane cluster of `spec` (zmq ports from spec.first_port) and fills the
// control-plane fields of `figures`.
Status RunControlPlane(const ClusterSpec& spec, ClusterFigures* figures);

}  // namespace bitpush::bench::cluster
