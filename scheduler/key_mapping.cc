#include "scheduler/key_mapping.h"

#include "common/counter_rng.h"
#include "common/logging.h"
#include "fmt/format.h"

namespace bitpush::scheduler {

v1::KeyMapping MakeKeyMapping(uint32_t num_servers, uint64_t seed) {
  v1::KeyMapping m;
  m.set_scheme(v1::KeyMapping::SCHEME_MIX64_MOD);
  m.set_num_servers(num_servers);
  m.set_seed(seed);
  return m;
}

Status ValidateKeyMapping(const v1::KeyMapping& mapping) {
  if (mapping.scheme() != v1::KeyMapping::SCHEME_MIX64_MOD) {
    return InvalidArgumentError(
        fmt::format("key mapping: unknown scheme {} (this build knows SCHEME_MIX64_MOD = 1)",
                    static_cast<int>(mapping.scheme())));
  }
  if (mapping.num_servers() == 0) {
    return InvalidArgumentError("key mapping: num_servers is 0");
  }
  return Status::Ok();
}

uint32_t ServerForKey(uint64_t key, const v1::KeyMapping& mapping) {
  BP_CHECK(mapping.scheme() == v1::KeyMapping::SCHEME_MIX64_MOD && mapping.num_servers() > 0,
           "ServerForKey on an unvalidated key mapping (scheme {}, {} servers)",
           static_cast<int>(mapping.scheme()), mapping.num_servers());
  return static_cast<uint32_t>(Mix64(key ^ mapping.seed()) % mapping.num_servers());
}

}  // namespace bitpush::scheduler
