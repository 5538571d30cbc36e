#include "common/process_memory.h"

#include <malloc.h>

namespace bitpush {

void KeepLargeBuffersInProcess() {
  mallopt(M_MMAP_THRESHOLD, 32 << 20);
  mallopt(M_TRIM_THRESHOLD, 1 << 30);
}

}  // namespace bitpush
