// One include for Catch2 v2 (Debian 12: <catch2/catch.hpp>) and v3 (newer distributions).
// tests/CMakeLists.txt defines FA_CATCH2_V3 when CMake found Catch2 v3.
#pragma once

#ifdef FA_CATCH2_V3
#include <catch2/catch_approx.hpp>
#include <catch2/catch_test_macros.hpp>
#include <catch2/generators/catch_generators.hpp>
using Catch::Approx;
#else
#include <catch2/catch.hpp>
#endif
