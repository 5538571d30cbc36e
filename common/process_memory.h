// How a bitpush daemon's allocator treats the large buffers of the data path.
//
// Partitions of MiBs are allocated and freed every round: ZeroMQ allocates each received part,
// the sealed lanes allocate each sealed part, the engines allocate decompressed and summed
// buffers. glibc serves blocks above its mmap threshold with a fresh mmap and unmaps them at
// free(), and gives the top of the heap back beyond its trim threshold, so every round's buffers
// would fault in every page again; in a virtual machine the faults cost more than the copies
// they precede (docs/benchmarks.md "Page faults"). KeepLargeBuffersInProcess raises both
// thresholds, so freed buffers are reused: the process keeps what it once used at its peak.
//
// Called at the start of main() by the daemons (bitpush-server, bitpush-worker) and by
// bitpush-bench, whose worker processes stand for the node daemon. Never by the library on a
// training process's behalf: its allocator is the user's.
//
// Thread-safety: call before starting threads.
#pragma once

namespace bitpush {

// mallopt: blocks up to 32 MiB (glibc's largest mmap threshold) come from the heap, and the
// heap is trimmed only beyond 1 GiB of free memory at its top.
void KeepLargeBuffersInProcess();

}  // namespace bitpush
