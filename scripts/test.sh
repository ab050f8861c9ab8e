#!/usr/bin/env bash
# The tests: finds or installs what they need, configures, builds, and runs the whole suite:
# ctest, the exercise mechanism, then every notebook headless. Without a CUDA device the GPU
# tests report Skipped; with FA_REQUIRE_GPU=1 they fail instead.
set -euo pipefail
source "$(dirname "$0")/lib/setup.sh"

ensure_build_packages
ensure_cuda_toolkit
ensure_cmake_version
ensure_venv
preset=${FA_PRESET:-$(choose_preset)}
configure_and_build "$preset"
ctest --preset "$preset" -j "$(nproc)"
check_package_install "$preset"
"$repo_root/scripts/check_exercises.sh"
# The notebook kernel's warning that it talks to nbclient over local TCP is noise here.
"$repo_root/.venv/bin/python" "$repo_root/scripts/run_notebooks.py" \
  2> >(grep -v 'Kernel is running over TCP without encryption' >&2)
