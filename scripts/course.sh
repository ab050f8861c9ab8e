#!/usr/bin/env bash
# The course's main job: builds if needed, then runs every stage on the same inputs and prints
# one table (stage, ms, TFLOP/s, speed-up over the previous stage, peak memory, max error).
# Arguments go to the progression (e.g. --seq 2048 --dim 128 --csv results.csv; --help).
set -euo pipefail
source "$(dirname "$0")/lib/setup.sh"

ensure_build_packages
ensure_cuda_toolkit
ensure_cmake_version
preset=${FA_PRESET:-$(choose_preset)}
configure_and_build "$preset" >/dev/null
binary_dir=$([ "$preset" = ci ] && echo build-ci || echo build)
exec "$repo_root/$binary_dir/bin/fa_course" "$@"
