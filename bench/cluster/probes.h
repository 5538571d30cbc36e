// What `bitpush-bench cluster` reads of its own process and host: resident memory, threads, open
// file descriptors, CPU time of the process and of one thread, the file-descriptor limit, and
// whether a loopback port is free. Linux only (/proc/self, pthread_getcpuclockid).
//
// Owned by the cluster benchmark's child mode. Thread-safety: plain functions, callable from any
// thread; each reads the process's state at the moment of the call.
#pragma once

#include <pthread.h>
#include <sys/types.h>

#include <cstdint>
#include <vector>

#include "common/status.h"

namespace bitpush::bench::cluster {

// Resident set size of the process, KiB (/proc/self/statm).
int64_t ResidentKib();
// Threads of the process (/proc/self/status), and open file descriptors (/proc/self/fd).
int64_t ThreadCount();
int64_t OpenFds();
// CPU seconds (user + system) of the whole process, and of `thread` (its CPU-time clock).
double ProcessCpuSeconds();
StatusOr<double> ThreadCpuSeconds(pthread_t thread);
// The kernel's ids of the process's threads now (/proc/self/task), and the CPU seconds of one
// (for threads the benchmark did not start itself: a transport's I/O threads).
std::vector<pid_t> ThreadIds();
StatusOr<double> TidCpuSeconds(pid_t tid);
// True when a listener could bind `port` of 127.0.0.1 now, as ZeroMQ binds it (SO_REUSEADDR:
// connections of an earlier run in TIME_WAIT do not count, another listener does).
bool LoopbackPortFree(int port);
// Raises RLIMIT_NOFILE's soft limit to its hard limit; returns the soft limit now in force.
StatusOr<int64_t> RaiseFdLimit();

}  // namespace bitpush::bench::cluster
