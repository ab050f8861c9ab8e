// The test runner's main, for Catch2 v2 and v3 alike.
#include <type_traits>

#ifdef FA_CATCH2_V3
#include <catch2/catch_session.hpp>
#else
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>
#endif

namespace {

// "No test matched the filter" is WarnAbout::NoTests in Catch2 v2 and early v3, and
// WarnAbout::UnmatchedTestSpec in later v3.
template <typename Warn, typename = void>
struct NoTestsWarning {
  static constexpr auto value = Warn::UnmatchedTestSpec;
};
template <typename Warn>
struct NoTestsWarning<Warn, std::void_t<decltype(Warn::NoTests)>> {
  static constexpr auto value = Warn::NoTests;
};

}  // namespace

int main(int argc, char** argv) {
  Catch::Session session;
  if (const int status = session.applyCommandLine(argc, argv); status != 0) return status;
  // --warn NoAssertions --warn NoTests, always: a test case that asserts nothing fails, and so
  // does a run whose name filter matches no test. (Catch2 v2 takes only one --warn on the
  // command line, so both are set here.)
  Catch::ConfigData& config = session.configData();
  config.warnings = static_cast<Catch::WarnAbout::What>(config.warnings | Catch::WarnAbout::NoAssertions |
                                                        NoTestsWarning<Catch::WarnAbout>::value);
  return session.run();
}
