// The test runner's main, for Catch2 v2 and v3 alike.
#if __has_include(<catch2/catch_session.hpp>)
#include <catch2/catch_session.hpp>
#else
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>
#endif

int main(int argc, char** argv) {
  Catch::Session session;
  if (const int status = session.applyCommandLine(argc, argv); status != 0) return status;
  // --warn NoAssertions --warn NoTests, always: a test case that asserts nothing fails, and so
  // does a run whose name filter matches no test. (Catch2 v2 takes only one --warn on the
  // command line, so both are set here.)
  Catch::ConfigData& config = session.configData();
  config.warnings = static_cast<Catch::WarnAbout::What>(config.warnings | Catch::WarnAbout::NoAssertions |
                                                        Catch::WarnAbout::NoTests);
  return session.run();
}
