#include "config/key_mapping.h"

#include "common/counter_rng.h"
#include "common/logging.h"
#include "fmt/format.h"

namespace bitpush::config {

v1::KeyMapping MakeKeyMapping(uint32_t num_servers, uint64_t seed) {
  v1::KeyMapping m;
  m.set_scheme(v1::KeyMapping::SCHEME_MIX64_STRIPE);
  m.set_num_servers(num_servers);
  m.set_seed(seed);
  return m;
}

Status ValidateKeyMapping(const v1::KeyMapping& mapping) {
  if (mapping.scheme() != v1::KeyMapping::SCHEME_MIX64_MOD &&
      mapping.scheme() != v1::KeyMapping::SCHEME_MIX64_STRIPE) {
    return InvalidArgumentError(
        fmt::format("key mapping: unknown scheme {} (this build knows SCHEME_MIX64_MOD = 1 and "
                    "SCHEME_MIX64_STRIPE = 2)",
                    static_cast<int>(mapping.scheme())));
  }
  if (mapping.num_servers() == 0) {
    return InvalidArgumentError("key mapping: num_servers is 0");
  }
  return Status::Ok();
}

uint32_t ServerForKey(uint64_t key, const v1::KeyMapping& mapping) {
  BP_CHECK(ValidateKeyMapping(mapping).ok(),
           "ServerForKey on an unvalidated key mapping (scheme {}, {} servers)",
           static_cast<int>(mapping.scheme()), mapping.num_servers());
  const uint64_t n = mapping.num_servers();
  if (mapping.scheme() == v1::KeyMapping::SCHEME_MIX64_MOD) {
    return static_cast<uint32_t>(Mix64(key ^ mapping.seed()) % n);
  }
  const uint64_t tensor = key >> 32;
  const uint64_t partition = key & 0xffffffffull;
  return static_cast<uint32_t>((Mix64(tensor ^ mapping.seed()) % n + partition % n) % n);
}

}  // namespace bitpush::config
