#!/usr/bin/env bash
# The tests, in six phases that each say what they do and how long they took:
#   1. setup: finds or installs what the build needs (Catch2, CLI11, CMake, the Python venv);
#   2. build: configures and builds the course once (build-ci/ without a GPU, build/ with one);
#   3. ctest: every test of that build;
#   4. the package: python/'s wheel built, installed in a fresh venv and imported (build-wheel/);
#   5. the exercise mechanism: every stage's untouched student copy must fail (or, without a GPU,
#      be reported NOT CHECKED), built in <build>/exercise-check/ (only the stages and their tests);
#   6. every notebook, headless.
# Without a CUDA device the GPU tests report Skipped; with FA_REQUIRE_GPU=1 they fail instead.
set -euo pipefail
source "$(dirname "$0")/lib/setup.sh"
FA_PHASES=6
trap phase_summary EXIT

phase "Setup: Catch2, CLI11, the CUDA toolkit, CMake, the Python venv"
ensure_build_packages
ensure_cuda_toolkit
ensure_cmake_version
ensure_venv
preset=${FA_PRESET:-$(choose_preset)}
build_dir=$(preset_binary_dir "$preset")

phase "Build: the course, $preset preset, in ${build_dir#"$repo_root"/}/"
configure_and_build "$preset"

phase "ctest: every test of ${build_dir#"$repo_root"/}/ ($(nproc) at a time)"
ctest --preset "$preset" -j "$(nproc)"

phase "Package: the wheel of python/, built and installed as a user installs it, imported outside the repository"
check_package_install "$preset"

phase "Exercise mechanism: each stage's untouched student copy, in ${build_dir#"$repo_root"/}/exercise-check/"
"$repo_root/scripts/check_exercises.sh" "$build_dir/exercise-check"

phase "Notebooks: every notebook in notebooks/, headless (figures into ${build_dir#"$repo_root"/}/plots/)"
# The figures go to the build folder: the committed ones in plots/ stay as they are (git status shows
# a student's own work only). The notebook kernel's warning that it talks to nbclient over local TCP
# is noise here.
"$repo_root/.venv/bin/python" "$repo_root/scripts/run_notebooks.py" --plots "$build_dir/plots" \
  2> >(grep -v 'Kernel is running over TCP without encryption' >&2)
