// The key-to-server mapping: which server owns a key (a partition of a tensor).
//
// The scheduler puts one v1::KeyMapping into every Assignment; every worker and server then
// computes ServerForKey locally and identically — there is no per-key lookup at run time.
// Scheme SCHEME_MIX64_STRIPE (the one MakeKeyMapping gives): a key is (tensor << 32) |
// partition (worker/partition.h); server rank = (Mix64(tensor ^ seed) + partition) mod
// num_servers, with Mix64 the SplitMix64 finaliser of common/counter_rng.h. A tensor's
// partitions go round robin from a hashed first server, so every big tensor is split evenly
// (within one partition) over the servers, and small tensors spread by the hash. Nodes also
// understand SCHEME_MIX64_MOD (Mix64(key ^ seed) mod num_servers, every key hashed), which
// balances only on average: the 26 partitions of a 100 MiB tensor land 8 / 18 on two
// servers, and the busier server's link sets the round time. Changing a scheme or its constants
// changes where keys live: it needs a new Scheme value.
//
// Part of bitpush_config: the scheduler makes the mapping, workers and servers read it.
// Thread-safety: pure functions.
#pragma once

#include <cstdint>

#include "common/status.h"
#include "proto/bitpush/v1/control.pb.h"

namespace bitpush::config {

// The seed the scheduler distributes (fixed, so a cluster maps keys the same way every run).
inline constexpr uint64_t kDefaultKeyMappingSeed = 0x6269747075736821ull;  // "bitpush!"

// The mapping for `num_servers` servers (>= 1).
v1::KeyMapping MakeKeyMapping(uint32_t num_servers, uint64_t seed = kDefaultKeyMappingSeed);

// OK if `mapping` has a known scheme and at least one server; InvalidArgument otherwise.
// Nodes validate the mapping when the Assignment arrives.
Status ValidateKeyMapping(const v1::KeyMapping& mapping);

// The rank of the server that owns `key`. `mapping` must be valid (checked: aborts if not).
uint32_t ServerForKey(uint64_t key, const v1::KeyMapping& mapping);

}  // namespace bitpush::config
