// Whether a backward pass makes dQ bitwise the same from run to run (taught in stage 11's README,
// "Who owns what"; stage 13 orders its additions the same way). It is a choice of each call:
// the C ABI takes it from fa_backward_args.deterministic, a stage's executable from
// FA_DETERMINISTIC=1 in its environment. BackwardArgs (stage.hpp) belongs to the harness that
// measures every stage, so the choice reaches stages 11 and 13 as a setting of the calling thread
// for the length of one call (DeterministicBackward), never through the process environment.
#pragma once

#include <cstdlib>
#include <string_view>

namespace fa {

inline thread_local bool deterministic_backward_on_this_thread = false;

// Asks the backward passes this thread calls for their deterministic dQ (or not), until the object
// goes out of scope; the setting before it comes back then.
class DeterministicBackward {
 public:
  explicit DeterministicBackward(bool deterministic) : previous_(deterministic_backward_on_this_thread) {
    deterministic_backward_on_this_thread = deterministic;
  }
  ~DeterministicBackward() { deterministic_backward_on_this_thread = previous_; }
  DeterministicBackward(const DeterministicBackward&) = delete;
  DeterministicBackward& operator=(const DeterministicBackward&) = delete;

 private:
  bool previous_;
};

// What the backward pass called on this thread was asked for.
inline bool deterministic_backward() { return deterministic_backward_on_this_thread; }

// FA_DETERMINISTIC=1: how a stage's executable is asked for it (its generated main reads it once).
inline bool deterministic_backward_from_environment() {
  const char* value = std::getenv("FA_DETERMINISTIC");
  return value != nullptr && std::string_view(value) == "1";
}

}  // namespace fa
