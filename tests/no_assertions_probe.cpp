// A test case that asserts nothing. It is not part of the suite: ctest runs it expecting
// failure, which proves that --warn NoAssertions is in force.
#include "catch_compat.hpp"

TEST_CASE("probe: asserts nothing") {}
