// The command line of a tool that takes no arguments (the ceiling tools of stages 08 and 12).
#pragma once

#include <cstdio>
#include <cstring>

namespace fa {

// `--help` prints "usage: <tool> (no arguments)" and then `usage`, and answers 0; any other argument
// is refused in one line and answered 2, before the tool looks for a GPU (so a machine without one
// answers it too). -1 when there is no argument: the tool runs.
inline int answer_no_arguments(int argc, char** argv, const char* tool, const char* usage) {
  if (argc <= 1) return -1;
  if (std::strcmp(argv[1], "--help") == 0) {
    std::printf("usage: %s (no arguments)\n%s\n", tool, usage);
    return 0;
  }
  std::fprintf(stderr, "%s: takes no arguments, not '%s' (see --help)\n", tool, argv[1]);
  return 2;
}

}  // namespace fa
