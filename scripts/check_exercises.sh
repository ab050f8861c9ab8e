#!/usr/bin/env bash
# Tests the exercise mechanism: makes a fresh student copy of every stage (in a temporary
# folder, never touching exercises/), builds them all in place of the solutions, and checks
# that each stage's tests fail on its untouched copy. The solutions passing is the normal suite.
#   scripts/check_exercises.sh [BUILD_DIR]
# FA_CMAKE_ARGS adds CMake arguments (a generator, CMAKE_PREFIX_PATH). Without a GPU only the CPU stage's tests can run (the GPU tests are skipped), so there the
# check is that every copy builds and stage 01's copy fails; with FA_REQUIRE_GPU=1 on a GPU
# machine every stage's copy must fail.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$repo/build-exercises}
copies=$(mktemp -d)
trap 'rm -rf "$copies"' EXIT

stages=$(ls "$repo/stages" | grep -E '^[0-9][0-9]_')
for stage in $stages; do python3 "$repo/scripts/make_exercise" "$stage" --output "$copies" >/dev/null; done
# Without a GPU, one architecture is enough to prove that every copy builds.
architectures=()
nvidia-smi -L >/dev/null 2>&1 || architectures=(-DCMAKE_CUDA_ARCHITECTURES=90)
# shellcheck disable=SC2086
cmake -S "$repo" -B "$build" -DFA_EXERCISE=all -DFA_EXERCISE_DIR="$copies" "${architectures[@]}" ${FA_CMAKE_ARGS:-} >/dev/null
cmake --build "$build" -j "$(nproc)" >"$build/exercise-build.log" 2>&1 ||
  { tail -n 30 "$build/exercise-build.log"; echo "check_exercises: a student copy does not build" >&2; exit 1; }
echo "every stage's student copy builds"

check=${FA_REQUIRE_GPU:+$stages}
check=${check:-01_cpu}
failed=0
for stage in $check; do
  number=${stage:0:2}
  if (cd "$build" && ctest -R "^stage$number:" >/dev/null 2>&1); then
    echo "check_exercises: the untouched student copy of $stage passes its tests: the exercise checks nothing" >&2
    failed=1
  else
    echo "stage $number: the untouched student copy fails its tests, as it must"
  fi
done
exit $failed
