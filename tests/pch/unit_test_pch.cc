// Builds the unit tests' precompiled header (unit_test_pch.h); the object itself is unused.
// Outside tests/harness/ on purpose: make lint's clang-tidy cannot read the GCC-built header.
#include "tests/pch/unit_test_pch.h"
