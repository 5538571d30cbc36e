// Builds the unit tests' precompiled header (unit_test_pch.h); the object itself is unused.
#include "tests/harness/unit_test_pch.h"
