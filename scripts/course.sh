#!/usr/bin/env bash
# The course's main job: builds if needed, then runs every stage on the same inputs and prints
# one table (stage, ms, FLOP/s, speed-up over the stage before, peak memory, max error).
# Arguments go to the progression, fa_course (e.g. --seq 4096 --csv results.csv; --help).
set -euo pipefail
source "$(dirname "$0")/lib/setup.sh"

# The options of fa_course (api/course_main.cpp, common/src/cli.cpp), for --help before the
# first build and to refuse an unknown one before building; a test checks that the two lists are
# fa_course's, no more and no fewer.
course_options="--batch --heads --kv-heads --seq --seq-k --dim --causal --lse --pass --check-kv-heads --seed --warmup --reps --check --no-check --check-rows --walkthrough --csv"
course_short_options="-b -H -n -d"

help() {
  cat <<EOF
scripts/course.sh [OPTIONS]: the FlashAttention course in one table.

Builds the course if needed (the first build takes several minutes and shows its progress), then
runs every stage on the same random inputs, checks each against the double CPU reference and
prints ms, FLOP/s, the speed-up over the stage before, peak memory and the error.

The table has two parts. The forward progression (01-10): on a GPU the GPU stages run at
(B, H, N, D) = (4, 16, 2048, 128), a shape that fills the GPU, and the CPU stage at
(1, 1, 2048, 128), marked as smaller; the speed-up is over the stage before. Then the stages that
are not the next step of it, each at the shape it exists for: the backward passes (11, and 13 on an
H100 or H200) at the same shape, and decoding (12) at Hq = 32, Hkv = 8, Nq = 4, Nk = 65536,
D = 128, beside stage 08 on the same step (its speed-up is over stage 08). Without a GPU the CPU
stages run and the GPU stages are listed as needing one. --walkthrough runs the N=4 fixture through
every stage instead.

EOF
  local binary
  binary="$(preset_binary_dir "${FA_PRESET:-$(choose_preset)}")/bin/fa_course"
  if [ -x "$binary" ]; then
    "$binary" --help
  else
    echo "Options (each described, with its default, once the course is built): $course_options"
  fi
}

for argument in "$@"; do
  case $argument in
    -h | --help)
      help
      exit 0
      ;;
  esac
done
# An option fa_course does not have is refused now, not after the first build (minutes). Values are
# left to fa_course, which says what is wrong with them; a negative number is a value.
for argument in "$@"; do
  case $argument in
    --*) name=${argument%%=*} known=" $course_options " ;;
    -[0-9]* | -) continue ;;
    -*) name=${argument:0:2} known=" $course_short_options " ;;
    *) continue ;;
  esac
  if [[ $known != *" $name "* ]]; then
    echo "course.sh: fa_course has no option $name (see scripts/course.sh --help)" >&2
    exit 2
  fi
done

ensure_build_packages
ensure_cuda_toolkit
ensure_cmake_version
preset=${FA_PRESET:-$(choose_preset)}
configure_and_build "$preset"
echo
exec "$(preset_binary_dir "$preset")/bin/fa_course" "$@"
