// One include for Catch2 v2 (Debian 12: <catch2/catch.hpp>) and v3 (newer distributions).
#pragma once

#if __has_include(<catch2/catch_test_macros.hpp>)
#include <catch2/catch_approx.hpp>
#include <catch2/catch_test_macros.hpp>
#include <catch2/generators/catch_generators.hpp>
#define FA_CATCH_VERSION 3
using Catch::Approx;
#else
#include <catch2/catch.hpp>
#define FA_CATCH_VERSION 2
#endif
