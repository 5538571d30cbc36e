// The precompiled header of the unit tests (tests/CMakeLists.txt, target
// bitpush_unit_test_pch): what nearly every tests/unit/*_test.cc parses anyway, compiled once
// per build tree instead of once per test. Only headers whose meaning cannot depend on a test's
// own macros belong here; each test still includes what it uses.
#pragma once

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "common/status.h"
#include "proto/bitpush/v1/control.pb.h"
