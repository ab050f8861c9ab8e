#!/usr/bin/env bash
# Checks exercises, two ways.
#
#   scripts/check_exercises.sh 04 [05 ...]
#     Checks YOUR copy of a stage (exercises/04_online_softmax/, made by scripts/make_exercise 04):
#     builds it in place of the solution in build-exercise/ (that stage only, so it is quick after
#     the first time), runs the stage's tests with their failure messages, and ends with one
#     verdict line. Exit status: 0 PASSED (every test ran and passed); 1 FAILED (a test failed, or
#     the copy does not compile); 77 NOT CHECKED (the copy compiled, but its GPU tests could not
#     run here: no CUDA GPU, or one too old for the stage; run the same command on a GPU);
#     2 no such stage or no copy yet.
#
#   scripts/check_exercises.sh [BUILD_DIR]
#     The course's test of the exercise mechanism (scripts/test.sh, the GPU suite): makes a fresh
#     student copy of every stage in a temporary folder (never touching exercises/), builds them in
#     BUILD_DIR (default: exercise-check/ inside the course's build folder, build/ or build-ci/;
#     only the stages, their tests and their PTX, not the course around them), showing the build's
#     progress, and checks, one line per stage, that no untouched copy is reported
#     as passing: the CPU stage's copy fails, and so does every GPU stage's on a GPU (with
#     FA_REQUIRE_GPU=1 a GPU test that cannot run is a failure); without a GPU every GPU stage's
#     copy must be reported NOT CHECKED (or FAILED), never PASSED. FA_CMAKE_ARGS adds CMake
#     arguments (a generator, CMAKE_PREFIX_PATH).
set -euo pipefail
source "$(dirname "$0")/lib/setup.sh"

exercise_dir=${FA_EXERCISE_DIR:-$repo_root/exercises}
# Without a GPU one architecture is enough to prove that a copy builds.
no_gpu_architectures=(-DCMAKE_CUDA_ARCHITECTURES=90)

usage() { sed -n '2,/^set -euo/p' "$0" | sed -e '$d' -e 's/^# \{0,1\}//'; }

# The stage folder for "4", "04" or "04_online_softmax"; empty when there is none.
stage_id() {
  local number=${1%%_*}
  [[ $number =~ ^[0-9]{1,2}$ ]] || return 0
  number=$(printf '%02d' "$((10#$number))")
  local folder
  for folder in "$repo_root"/stages/"$number"_*/; do
    [ -d "$folder" ] && basename "$folder" && return 0
  done
  return 0
}

gpu_here() { [ "$(choose_preset)" = default ]; }

rule() { printf '%s\n' '!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!'; }

# Prints a ctest log for a student: every test's result line, the first lines of the messages of
# the first MAX failing tests (the guard "your copy ran on a GPU" is not one: it only says the copy could not run
# here), and none of ctest's own summary, which the verdict replaces.
show_test_lines() {
  local log=$1 max=$2 where=$3
  awk -v max="$max" -v where="$where" '
    /The following tests FAILED:|Errors while running CTest|tests passed, .* tests failed out of|^Total Test time/ { skip = 1 }
    skip { next }
    /^ *[0-9]+\/[0-9]+ Test +#/ {
      show = 0
      shown = 0
      if ($0 ~ /ran on a GPU, not only compiled/) {
        sub(/\*\*\*Failed/, "not run here")
      } else if ($0 !~ /Passed|Skipped/) {
        failed++
        if (failed <= max) show = 1
      }
      print
      next
    }
    show && /[^ ]/ {
      if (++shown <= 24) print
      else if (shown == 25) print "  ... (the rest of the messages of this test: " where "/Testing/Temporary/LastTest.log)"
    }
    END { if (failed > max) printf "(the messages of the other %d failing tests are in %s/Testing/Temporary/LastTest.log)\n", failed - max, where }
  ' "$log"
}

# Runs stage ID's tests in the configured BUILD folder and prints the verdict. With VERBOSE=1
# each test's result line shows as it runs, then the messages of the first three failing tests
# (every message stays in Testing/Temporary/LastTest.log). Returns 0, 1 or 77.
exercise_verdict() {
  local build=$1 id=$2 verbose=${3:-1}
  local number=${id:0:2}
  local log="$build/check-stage$number.log"
  local status=0
  local ctest=(ctest -R "^stage$number:" --output-on-failure --test-output-size-failed 1500 -j "$(nproc)")
  if [ "$verbose" = 1 ]; then
    echo "Running stage $number's tests (the whole log: ${log#"$repo_root"/})"
    (cd "$build" && "${ctest[@]}") >"$log" 2>&1 || status=$?
    show_test_lines "$log" 3 "${build#"$repo_root"/}"
  else
    (cd "$build" && "${ctest[@]}") >"$log" 2>&1 || status=$?
  fi
  local total skipped failed failures code_failures not_run
  total=$(grep -cE '^ *[0-9]+/[0-9]+ Test +#' "$log" || true)
  skipped=$(grep -c '\*\*\*Skipped' "$log" || true)
  # The failed tests, less the guard that fails only because the copy could not run on a GPU here;
  # of them, the compiled-code checks (named "stageNN: PTX ..." or "stageNN: SASS ..."): a copy
  # that fails those alone may compute the right values, but not by the stage's idea.
  failed=$(sed -n '/The following tests FAILED:/,$p' "$log" | grep -E '^\s+[0-9]+ - ' || true)
  failures=$(printf '%s' "$failed" | grep -vc 'ran on a GPU, not only compiled' || true)
  code_failures=$(printf '%s' "$failed" | grep -cE ' - stage[0-9]+: (PTX|SASS)' || true)
  not_run=$(printf '%s' "$failed" | grep -c 'ran on a GPU, not only compiled' || true)
  local where=${build#"$repo_root"/}
  local why="no CUDA GPU here"
  gpu_here && why="the GPU here cannot run this stage: see the skip messages above"
  echo
  rule
  if [ "$total" -eq 0 ]; then
    echo "FAILED: no tests of stage $number ran in $where/ (ctest exit status $status; $log)"
    rule
    return 1
  elif [ "$failures" -gt 0 ] || { [ "$status" -ne 0 ] && [ "$not_run" -eq 0 ]; }; then
    echo "FAILED: $failures of stage $number's $total tests fail with your copy of $id (the first ones' messages"
    echo "are above; all of them in $where/Testing/Temporary/LastTest.log)."
    [ "$skipped" -gt 0 ] && echo "(and $skipped GPU tests did not run: $why)"
    if [ "$failures" -gt 0 ] && [ "$code_failures" -eq "$failures" ]; then
      echo "Where it goes wrong: the compiled code, not the values. Each failing check above names the instruction it"
      echo "looks for and the file it searched ($where/ptx/$id/): your kernel does not yet use the stage's idea."
    elif [ "$id" = 11_backward ]; then
      echo "Where it first goes wrong: $where/bin/fa_course --walkthrough (the C++ backward's dQ, dK and dV of the"
      echo "N=4 fixture beside the exact values, with D_i, P and dS to check by hand). The C++ backward's tests run"
      echo "without a GPU, so fix those first; then the GPU kernel's: $where/bin/$id --walkthrough on a GPU."
    else
      echo "Where it first goes wrong: $where/bin/$id --walkthrough (the exact values beside your kernel's)"
    fi
    rule
    return 1
  elif [ "$skipped" -gt 0 ] || [ "$not_run" -gt 0 ]; then
    local ran=$((total - skipped - not_run))
    echo "NOT CHECKED: your $id was only COMPILED, its $skipped GPU tests did not run ($why): run scripts/check_exercises.sh $number on a machine with a CUDA GPU"
    [ "$ran" -gt 0 ] && echo "(the $ran tests that ran here, without a GPU, passed)"
    rule
    return 77
  fi
  echo "PASSED: all $total tests of stage $number ran and pass with your copy of $id."
  rule
  return 0
}

check_your_copies() {
  local ids=() argument id
  for argument in "$@"; do
    id=$(stage_id "$argument")
    if [ -z "$id" ]; then
      echo "check_exercises: there is no stage '$argument'; the stages are: $(ls "$repo_root/stages" | grep -E '^[0-9]{2}_' | tr '\n' ' ')" >&2
      exit 2
    fi
    if [ ! -d "$exercise_dir/$id" ]; then
      echo "check_exercises: there is no copy of $id in ${exercise_dir#"$repo_root"/}/ yet; make it with: scripts/make_exercise ${id:0:2}" >&2
      exit 2
    fi
    ids+=("$id")
  done
  ensure_build_packages
  ensure_cuda_toolkit
  ensure_cmake_version
  local build="$repo_root/build-exercise" only architectures=()
  only=$(IFS=';' && echo "${ids[*]}")
  gpu_here || architectures=("${no_gpu_architectures[@]}")
  mkdir -p "$build"
  echo "Building your copy of ${ids[*]} in place of the solution (exercises/ -> ${build#"$repo_root"/}/)"
  # shellcheck disable=SC2046
  if ! cmake -S "$repo_root" -B "$build" $(generator_args "$build") $(fa_cmake_launchers "$build") -DCMAKE_BUILD_TYPE=Release \
    -DFA_EXERCISE="$only" -DFA_ONLY_STAGES="$only" -DFA_EXERCISE_DIR="$exercise_dir" \
    "${architectures[@]}" "${fa_cmake_args[@]}" >"$build/configure.log" 2>&1; then
    tail -n 30 "$build/configure.log" >&2
    echo "check_exercises: configuring failed (${build#"$repo_root"/}/configure.log)" >&2
    exit 1
  fi
  # Stage 11's verdict points at fa_course --walkthrough: the one program that runs its C++ backward.
  local course=()
  [[ " ${ids[*]} " == *" 11_backward "* ]] && course=(fa_course)
  # shellcheck disable=SC2046
  if ! build_with_progress "$build" --target $(stage_targets "$build") "${course[@]}"; then
    echo
    rule
    echo "FAILED: your copy of ${ids[*]} does not compile (the compiler's messages are above)."
    rule
    exit 1
  fi
  local worst=0 status
  for id in "${ids[@]}"; do
    status=0
    exercise_verdict "$build" "$id" || status=$?
    if [ "$status" -eq 1 ] || { [ "$status" -eq 77 ] && [ "$worst" -eq 0 ]; }; then worst=$status; fi
  done
  exit "$worst"
}

# The targets of the stages and their tests in a configured BUILD folder: the stage libraries and
# executables (01_cpu, fa_stage_01_cpu, fa_read_ceiling ...), the stage test programs and the PTX
# of the structural tests; not the course, the C ABI or the common tests.
stage_targets() {
  local build=$1
  if [ -f "$build/build.ninja" ]; then
    ninja -C "$build" -t targets all | sed -n 's/^\([^:/]*\): phony$/\1/p'
  else
    cmake --build "$build" --target help | sed -n 's/^\.\.\. \([^ ]*\).*/\1/p'
  fi | grep -E '^([0-9][0-9]_[A-Za-z0-9_]+|fa_stage_[0-9][0-9]_[A-Za-z0-9_]+|fa_test_stage[0-9][0-9](_[a-z]+)?|ptx_.*|fa_[a-z_]+_ceiling)$' |
    grep -v '_hash$' | sort -u | tr '\n' ' '
}

check_mechanism() {
  local build=${1:-$(preset_binary_dir "$(choose_preset)")/exercise-check}
  local copies
  copies=$(mktemp -d)
  # shellcheck disable=SC2064
  trap "rm -rf '$copies'" EXIT
  local stages stage
  stages=$(ls "$repo_root/stages" | grep -E '^[0-9][0-9]_')
  for stage in $stages; do python3 "$repo_root/scripts/make_exercise" "$stage" --output "$copies" >/dev/null; done
  echo "Made an untouched student copy of every stage ($(echo "$stages" | wc -w) stages) in a temporary folder"
  local architectures=()
  gpu_here || architectures=("${no_gpu_architectures[@]}")
  mkdir -p "$build"
  # shellcheck disable=SC2046,SC2086
  cmake -S "$repo_root" -B "$build" $(generator_args "$build") $(fa_cmake_launchers "$build") -DCMAKE_BUILD_TYPE=Release -DFA_EXERCISE=all \
    -DFA_ONLY_STAGES= -DFA_EXERCISE_DIR="$copies" "${architectures[@]}" "${fa_cmake_args[@]}" ${FA_CMAKE_ARGS:-} \
    >"$build/configure.log" 2>&1 ||
    { tail -n 30 "$build/configure.log"; echo "check_exercises: configuring the student copies failed" >&2; exit 1; }
  # Only what the stages' verdicts run: each stage's library, executable(s), test program and PTX.
  local targets
  targets=$(stage_targets "$build")
  # shellcheck disable=SC2086
  build_with_progress "$build" --target $targets ||
    { echo "check_exercises: a student copy does not build" >&2; exit 1; }
  echo "every stage's student copy builds"

  local failed=0 status verdict
  for stage in $stages; do
    status=0
    verdict=$(exercise_verdict "$build" "$stage" 0) || status=$?
    verdict=$(printf '%s\n' "$verdict" | grep -m1 -E '^(PASSED|FAILED|NOT CHECKED)')
    case $status in
      1) echo "stage ${stage:0:2}: the untouched copy FAILS its tests, as it must" ;;
      77)
        if [ "${stage:0:2}" = 01 ] || [ "${FA_REQUIRE_GPU:-0}" = 1 ]; then
          echo "check_exercises: stage ${stage:0:2}'s GPU tests did not run: $verdict" >&2
          failed=1
        else
          echo "stage ${stage:0:2}: the untouched copy is reported NOT CHECKED (only compiled, no GPU to run it), never passed"
        fi
        ;;
      *)
        echo "check_exercises: the untouched student copy of $stage is reported as passing: the exercise checks nothing ($verdict)" >&2
        failed=1
        ;;
    esac
  done
  return $failed
}

case ${1:-} in
  -h | --help)
    usage
    exit 0
    ;;
esac
if [ $# -gt 0 ] && [[ $1 =~ ^[0-9]{1,2}(_.*)?$ ]]; then
  check_your_copies "$@"
elif [ $# -le 1 ]; then
  check_mechanism "$@"
else
  usage >&2
  exit 2
fi
