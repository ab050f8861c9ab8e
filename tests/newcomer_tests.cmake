# What a newcomer meets in the first hour, kept fixed: exit codes and one-line messages of the
# executables, the walkthrough's verdict with and without a GPU, the scripts' help and errors, one
# exercise command sequence everywhere, and, in an exercise build, a test that fails loudly where
# the student's GPU kernel was only compiled. Every test runs without a GPU (and with one).
#
# Included from tests/CMakeLists.txt. The checks that read files or look at a program's output run
# this same file as a script: cmake -DCHECK=<name> ... -P newcomer_tests.cmake.

# ---------------------------------------------------------------------------------------------
# Script mode: the checks.
# ---------------------------------------------------------------------------------------------
if(CMAKE_SCRIPT_MODE_FILE)
  function(fail)
    string(JOIN "" text ${ARGN})
    message(FATAL_ERROR "${text}")
  endfunction()

  # Runs PROGRAM with ARGS (a ;-list); sets code and output (stdout and stderr together).
  # ARGS: the program's arguments, separated by spaces.
  macro(run_program)
    separate_arguments(arguments UNIX_COMMAND "${ARGS}")
    execute_process(COMMAND ${PROGRAM} ${arguments} RESULT_VARIABLE code OUTPUT_VARIABLE output ERROR_VARIABLE output
                    TIMEOUT 600)
    message("${output}")
  endmacro()

  if(CHECK STREQUAL "no_gpu_line")
    # A GPU stage either runs (a GPU is here) or says in one line, exit code 4, what is missing,
    # in words that do not blame the driver of a machine that has none.
    run_program()
    if(code EQUAL 0)
      message("the stage ran: there is a GPU here that can run it")
    elseif(code EQUAL 4)
      string(STRIP "${output}" stripped)
      if(stripped MATCHES "\n")
        fail("exit code 4 but more than one line of output")
      endif()
      if(NOT stripped MATCHES "GPU|compute capability")
        fail("the line does not say that a GPU is what is missing")
      endif()
      if(stripped MATCHES "driver version is insufficient")
        fail("the line repeats the CUDA runtime's misleading 'driver version is insufficient'")
      endif()
    elseif(code EQUAL 1)
      fail("the stage ran and its output is wrong (exit code 1)")
    else()
      fail("exit code ${code}: wanted 0 (ran) or 4 (no GPU that can run it)")
    endif()

  elseif(CHECK STREQUAL "walkthrough")
    # --walkthrough of a GPU stage: on a GPU it agrees; without one it still prints S, the exact
    # per-tile state and final O, then says the stage itself needs a GPU, with exit code 4.
    run_program()
    if(code EQUAL 0)
      if(NOT output MATCHES "the stage agrees with the exact values")
        fail("exit code 0 without 'the stage agrees with the exact values'")
      endif()
    elseif(code EQUAL 4)
      foreach(expected "S = Q K\\^T" "tile 1 row 3  m" "Exact final O" "itself runs on a CUDA GPU")
        if(NOT output MATCHES "${expected}")
          fail("exit code 4, but the output lacks '${expected}'")
        endif()
      endforeach()
      if(output MATCHES "trace failed|driver version is insufficient")
        fail("the walkthrough reports a failure instead of the exact values")
      endif()
    elseif(code EQUAL 1)
      fail("the stage disagrees with the exact values (exit code 1): its values are printed beside them above")
    else()
      fail("exit code ${code}: wanted 0 (agrees) or 4 (no GPU: exact values only)")
    endif()

  elseif(CHECK STREQUAL "cmake_minimum")
    # CMakeLists.txt, CMakePresets.json and the scripts ask for the same CMake, and the presets'
    # schema version is one that CMake reads (version 5: CMake 3.24; 6: 3.25).
    file(READ ${ROOT}/CMakeLists.txt lists)
    string(REGEX MATCH "cmake_minimum_required\\(VERSION ([0-9]+\\.[0-9]+)" _ "${lists}")
    set(lists_minimum ${CMAKE_MATCH_1})
    file(READ ${ROOT}/scripts/lib/setup.sh setup)
    string(REGEX MATCH "fa_cmake_minimum=([0-9]+\\.[0-9]+)" _ "${setup}")
    set(scripts_minimum ${CMAKE_MATCH_1})
    file(READ ${ROOT}/CMakePresets.json presets)
    string(JSON schema GET "${presets}" version)
    string(JSON major GET "${presets}" cmakeMinimumRequired major)
    string(JSON minor GET "${presets}" cmakeMinimumRequired minor)
    set(presets_minimum ${major}.${minor})
    math(EXPR schema_minimum_minor "${schema} + 19")  # presets version v needs CMake 3.(v + 19) from v = 3
    set(schema_minimum 3.${schema_minimum_minor})
    message("CMakeLists.txt ${lists_minimum}, scripts ${scripts_minimum}, presets ${presets_minimum} "
            "(schema ${schema}, read from CMake ${schema_minimum})")
    if(NOT lists_minimum VERSION_EQUAL scripts_minimum OR NOT presets_minimum VERSION_EQUAL scripts_minimum)
      fail("the CMake minimums differ")
    endif()
    if(schema_minimum VERSION_GREATER scripts_minimum)
      fail("CMakePresets.json version ${schema} needs CMake ${schema_minimum}, newer than the ${scripts_minimum} "
           "the scripts accept")
    endif()

  elseif(CHECK STREQUAL "course_options")
    # scripts/course.sh lists fa_course's options for --help before the first build.
    file(READ ${ROOT}/scripts/course.sh script)
    string(REGEX MATCH "course_options=\"([^\"]*)\"" _ "${script}")
    string(REPLACE " " ";" listed "${CMAKE_MATCH_1}")
    if(NOT listed)
      fail("scripts/course.sh has no course_options list")
    endif()
    set(ARGS --help)
    run_program()
    string(REGEX MATCH "course_short_options=\"([^\"]*)\"" _ "${script}")
    string(REPLACE " " ";" short "${CMAKE_MATCH_1}")
    foreach(option IN LISTS listed short)
      if(NOT output MATCHES "${option}([ ,={]|\n)")
        fail("scripts/course.sh lists ${option}, which fa_course --help does not have")
      endif()
    endforeach()
    # And every option fa_course --help shows is listed: course.sh refuses the others before building.
    string(REGEX MATCHALL "(^|\n| |,)--?[A-Za-z][A-Za-z-]*" shown "${output}")
    foreach(option IN LISTS shown)
      string(REGEX REPLACE "^[\n ,]" "" option "${option}")
      list(FIND listed "${option}" at_long)
      list(FIND short "${option}" at_short)
      if(NOT option MATCHES "^(-h|--help)$" AND at_long EQUAL -1 AND at_short EQUAL -1)
        fail("fa_course --help shows ${option}, which scripts/course.sh does not list")
      endif()
    endforeach()

  elseif(CHECK STREQUAL "exercise_commands")
    # One exercise command sequence, the same in the README, every stage README's exercise section
    # and make_exercise's output; none of the old ones (a preset that builds elsewhere, a new
    # build folder, ctest without the failure messages).
    set(old_commands "cmake -B build -DFA_EXERCISE" "cmake --preset default -DFA_EXERCISE"
                     "cmake --preset ci -DFA_EXERCISE" "ctest --test-dir build -R stage")
    file(READ ${ROOT}/README.md readme)
    foreach(expected "scripts/make_exercise 04" "scripts/check_exercises.sh 04" "FA_REQUIRE_GPU=1")
      string(FIND "${readme}" "${expected}" at)
      if(at EQUAL -1)
        fail("README.md does not give '${expected}'")
      endif()
    endforeach()
    foreach(old IN LISTS old_commands)
      string(FIND "${readme}" "${old}" at)
      if(NOT at EQUAL -1)
        fail("README.md still gives '${old}'")
      endif()
    endforeach()
    file(READ ${ROOT}/scripts/make_exercise tool)
    string(FIND "${tool}" "scripts/check_exercises.sh {number}" at)
    if(at EQUAL -1)
      fail("scripts/make_exercise does not print 'scripts/check_exercises.sh NN'")
    endif()
    file(GLOB readmes ${ROOT}/stages/[0-9][0-9]_*/README.md)
    foreach(path IN LISTS readmes)
      get_filename_component(folder ${path} DIRECTORY)
      get_filename_component(stage ${folder} NAME)
      string(SUBSTRING ${stage} 0 2 number)
      file(READ ${path} text)
      string(FIND "${text}" "\n## Exercise" start)
      if(start EQUAL -1)
        message("${stage}: no exercise section")
        continue()
      endif()
      string(SUBSTRING "${text}" ${start} -1 section)
      string(SUBSTRING "${section}" 1 -1 rest)
      string(FIND "${rest}" "\n## " end)
      if(NOT end EQUAL -1)
        string(SUBSTRING "${rest}" 0 ${end} section)
      endif()
      foreach(expected "scripts/make_exercise ${number}" "scripts/check_exercises.sh ${number}")
        string(FIND "${section}" "${expected}" at)
        if(at EQUAL -1)
          fail("${stage}/README.md: its exercise section does not give '${expected}'")
        endif()
      endforeach()
      foreach(old IN LISTS old_commands)
        string(FIND "${section}" "${old}" at)
        if(NOT at EQUAL -1)
          fail("${stage}/README.md: its exercise section still gives '${old}'")
        endif()
      endforeach()
      message("${stage}: the exercise section gives the course's commands")
    endforeach()

  else()
    fail("newcomer_tests.cmake: unknown CHECK '${CHECK}'")
  endif()
  return()
endif()

# ---------------------------------------------------------------------------------------------
# Configure mode: the tests.
# ---------------------------------------------------------------------------------------------
set(fa_newcomer_script ${CMAKE_CURRENT_LIST_FILE})
set(fa_newcomer_refusal ${CMAKE_CURRENT_LIST_DIR}/expect_refusal.sh)
get_property(fa_newcomer_stage_ids GLOBAL PROPERTY FA_STAGE_IDS)

function(fa_newcomer_check name check)
  add_test(NAME "${name}" COMMAND ${CMAKE_COMMAND} -DCHECK=${check} -DROOT=${PROJECT_SOURCE_DIR} ${ARGN}
                                  -P ${fa_newcomer_script})
endfunction()

if(TARGET 01_cpu)
  add_test(NAME "stage01: a word where a number belongs is called not a whole number"
           COMMAND ${fa_newcomer_refusal} 2 "--seq: 'abc' is not a whole number" $<TARGET_FILE:01_cpu> --seq abc)
  add_test(NAME "stage01: a problem larger than host memory is refused as out of memory, in one line"
           COMMAND ${fa_newcomer_refusal} 3 "needs .* of host memory" $<TARGET_FILE:01_cpu> --heads 1048576)
  add_test(NAME "stage01: a problem that would take hours on the CPU is refused with the estimate"
           COMMAND ${fa_newcomer_refusal} 2 "would take about .* too long for the CPU stage" $<TARGET_FILE:01_cpu>
                   --seq 16777216 --dim 1)
  add_test(NAME "stage01: --reps 0 checks without timing and says so"
           COMMAND 01_cpu --seq 64 --dim 16 --reps 0)
  set_tests_properties("stage01: --reps 0 checks without timing and says so" PROPERTIES
    PASS_REGULAR_EXPRESSION "01_cpu +fp32 +- +- +- .* ok \\(not timed")
  add_test(NAME "stage01: the table shows the CPU stage's GFLOP/s, not 0.00 TFLOP/s"
           COMMAND 01_cpu --seq 512 --dim 64 --warmup 0 --reps 1)
  set_tests_properties("stage01: the table shows the CPU stage's GFLOP/s, not 0.00 TFLOP/s" PROPERTIES
    PASS_REGULAR_EXPRESSION "01_cpu +fp32 +[0-9.]+ +[0-9.]+ G " FAIL_REGULAR_EXPRESSION " 0\\.00 ")
  add_test(NAME "stage01: --help lists the exit codes" COMMAND 01_cpu --help)
  set_tests_properties("stage01: --help lists the exit codes" PROPERTIES
    PASS_REGULAR_EXPRESSION "Exit codes: 0 ok, 1 wrong output.*4 no CUDA GPU")
endif()

foreach(id IN LISTS fa_newcomer_stage_ids)
  string(SUBSTRING ${id} 0 2 number)
  if(number STREQUAL "01" OR NOT TARGET ${id})
    continue()
  endif()
  fa_newcomer_check("stage${number}: runs, or says in one line that it needs a GPU (exit code 4)" no_gpu_line
                    -DPROGRAM=$<TARGET_FILE:${id}> "-DARGS=--seq 64 --dim 32 --reps 1")
  fa_newcomer_check("stage${number}: --walkthrough agrees, or prints the exact values and needs a GPU" walkthrough
                    -DPROGRAM=$<TARGET_FILE:${id}> -DARGS=--walkthrough)
endforeach()

if(TARGET fa_course)
  add_test(NAME "common: fa_course --help describes the course, not one stage" COMMAND fa_course --help)
  set_tests_properties("common: fa_course --help describes the course, not one stage" PROPERTIES
    PASS_REGULAR_EXPRESSION "runs every stage on the same random inputs.*Default shape"
    FAIL_REGULAR_EXPRESSION "Runs one stage")
  add_test(NAME "common: fa_course runs and says plainly what this machine lacks" COMMAND fa_course)
  set_tests_properties("common: fa_course runs and says plainly what this machine lacks" PROPERTIES
    PASS_REGULAR_EXPRESSION "every stage on the same inputs.*01_cpu +fp32 .* ok"
    FAIL_REGULAR_EXPRESSION "driver version is insufficient| 0\\.00 " TIMEOUT 300)
  add_test(NAME "common: fa_course --walkthrough runs the fixture through every stage" COMMAND fa_course --walkthrough)
  set_tests_properties("common: fa_course --walkthrough runs the fixture through every stage" PROPERTIES
    PASS_REGULAR_EXPRESSION "Exact final O.*01_cpu +the stage agrees with the exact values at every K/V tile"
    FAIL_REGULAR_EXPRESSION "DISAGREES")
  if(TARGET 11_backward)
    # Stage 11's C++ backward, which no stage executable runs, in detail: where check_exercises.sh 11 points.
    set(name "common: fa_course --walkthrough shows the C++ backward's dQ, dK and dV beside the exact values")
    string(CONCAT pattern "11_backward/fp32, the backward pass in C\\+\\+.*dS = P.*dQ:\n  row 0 .* exact "
                          ".*11_backward/fp32 agrees with the exact values in dQ, dK and dV")
    add_test(NAME "${name}" COMMAND fa_course --walkthrough)
    set_tests_properties("${name}" PROPERTIES PASS_REGULAR_EXPRESSION "${pattern}" FAIL_REGULAR_EXPRESSION "DISAGREES")
  endif()
  fa_newcomer_check("common: scripts/course.sh lists fa_course's options before the first build" course_options
                    -DPROGRAM=$<TARGET_FILE:fa_course>)
endif()

# The scripts.
add_test(NAME "common: scripts/course.sh --help answers without building"
         COMMAND ${PROJECT_SOURCE_DIR}/scripts/course.sh --help)
set_tests_properties("common: scripts/course.sh --help answers without building" PROPERTIES
  PASS_REGULAR_EXPRESSION "scripts/course.sh \\[OPTIONS\\].*--walkthrough" FAIL_REGULAR_EXPRESSION "Building in"
  TIMEOUT 60)
add_test(NAME "common: scripts/course.sh refuses an option fa_course does not have, before building"
         COMMAND ${fa_newcomer_refusal} 2 "^course.sh: fa_course has no option --sequence " ${PROJECT_SOURCE_DIR}/scripts/course.sh
                 --seq 64 --sequence 64)
add_test(NAME "common: scripts/course.sh refuses an unknown short option, before building"
         COMMAND ${fa_newcomer_refusal} 2 "^course.sh: fa_course has no option -N " ${PROJECT_SOURCE_DIR}/scripts/course.sh -N 64)
add_test(NAME "common: scripts/gpu_suite.sh refuses a phase that does not exist, before any phase runs"
         COMMAND ${fa_newcomer_refusal} 2 "^gpu_suite.sh: there is no phase 'tset'; the phases are: .*build"
                 ${PROJECT_SOURCE_DIR}/scripts/gpu_suite.sh ${CMAKE_CURRENT_BINARY_DIR}/gpu_suite_refusal build tset)
add_test(NAME "common: scripts/gpu_suite.sh refuses FA_STAGES naming no stage, before any phase runs"
         COMMAND ${CMAKE_COMMAND} -E env FA_STAGES=10_overlapp ${fa_newcomer_refusal} 2
                 "^gpu_suite.sh: FA_STAGES names '10_overlapp', which is no stage folder"
                 ${PROJECT_SOURCE_DIR}/scripts/gpu_suite.sh ${CMAKE_CURRENT_BINARY_DIR}/gpu_suite_refusal build)
add_test(NAME "common: scripts/offline_deps.sh refuses an argument, before downloading"
         COMMAND ${fa_newcomer_refusal} 2 "^offline_deps.sh: takes no arguments" ${PROJECT_SOURCE_DIR}/scripts/offline_deps.sh --dry-run)
add_test(NAME "common: scripts/stage_diff --help prints its usage"
         COMMAND ${PROJECT_SOURCE_DIR}/scripts/stage_diff --help)
set_tests_properties("common: scripts/stage_diff --help prints its usage" PROPERTIES
  PASS_REGULAR_EXPRESSION "usage: scripts/stage_diff")
add_test(NAME "common: scripts/stage_diff names the stages when one does not exist"
         COMMAND ${fa_newcomer_refusal} 2 "no stage 77.*01_cpu" ${PROJECT_SOURCE_DIR}/scripts/stage_diff 77)
add_test(NAME "common: scripts/stage_diff asks for the file of a stage outside the registry"
         COMMAND ${fa_newcomer_refusal} 2 "14_fp8 is not a stage of the registry.*as in 14/fp8_attention.cu"
                 ${PROJECT_SOURCE_DIR}/scripts/stage_diff 10 14)
add_test(NAME "common: scripts/stage_diff refuses a file the stage does not have"
         COMMAND ${fa_newcomer_refusal} 2 "14_fp8 has no file overlap.cu"
                 ${PROJECT_SOURCE_DIR}/scripts/stage_diff 10 14/overlap.cu)
find_program(FA_GIT git)
if(FA_GIT)
  add_test(NAME "common: scripts/stage_diff 10 14/fp8_attention.cu diffs the file it names"
           COMMAND ${PROJECT_SOURCE_DIR}/scripts/stage_diff 10 14/fp8_attention.cu)
  set_tests_properties("common: scripts/stage_diff 10 14/fp8_attention.cu diffs the file it names" PROPERTIES
    PASS_REGULAR_EXPRESSION "stages/10_overlap/overlap.cu.*stages/14_fp8/fp8_attention.cu")
  add_test(NAME "common: scripts/stage_diff 3 4 shows what stage 04 changed"
           COMMAND ${PROJECT_SOURCE_DIR}/scripts/stage_diff 3 4)
  set_tests_properties("common: scripts/stage_diff 3 4 shows what stage 04 changed" PROPERTIES
    PASS_REGULAR_EXPRESSION "stages/03_tiled_smem/.*stages/04_online_softmax/")
  # The count it prints last is the diff's own: its lines that begin with + or - (not the file names).
  add_test(NAME "common: scripts/stage_diff 9 10 counts the lines its diff adds and removes"
           COMMAND sh -c [=[
out=$("$0" 9 10) || exit 1
lines=$(printf '%s\n' "$out" | grep -E '^[-+]' | grep -cvE '^(\+\+\+|---) ')
added=$(printf '%s\n' "$out" | grep -E '^\+' | grep -cvE '^\+\+\+ ')
printf '%s\n' "$out" | grep -qx "stage_diff: $lines lines changed ($added added, $((lines - added)) removed)" || {
  printf '%s\n' "$out" | grep '^stage_diff:'; echo "expected $lines lines, $added added"; exit 1; }
]=] ${PROJECT_SOURCE_DIR}/scripts/stage_diff)
endif()
add_test(NAME "common: scripts/make_exercise names the stages when one does not exist"
         COMMAND ${fa_newcomer_refusal} 2 "^make_exercise: there is no stage '77'; the stages are: 01_cpu"
                 ${PROJECT_SOURCE_DIR}/scripts/make_exercise 77)
add_test(NAME "common: scripts/make_exercise prints the command that checks the copy"
         COMMAND sh -c "rm -rf \"$1\" && python3 \"$0\" 4 --output \"$1\""
                 ${PROJECT_SOURCE_DIR}/scripts/make_exercise ${CMAKE_CURRENT_BINARY_DIR}/newcomer-exercise)
set_tests_properties("common: scripts/make_exercise prints the command that checks the copy" PROPERTIES
  PASS_REGULAR_EXPRESSION "04_online_softmax/online_softmax.cu: [0-9]+ exercise region.*scripts/check_exercises.sh 04")
add_test(NAME "common: scripts/check_exercises.sh says how to make a copy that is not there"
         COMMAND ${CMAKE_COMMAND} -E env FA_EXERCISE_DIR=${CMAKE_CURRENT_BINARY_DIR}/no-exercises
                 ${fa_newcomer_refusal} 2 "no copy of 04_online_softmax .* make it with: scripts/make_exercise 04"
                 ${PROJECT_SOURCE_DIR}/scripts/check_exercises.sh 04)
fa_newcomer_check("common: CMakeLists.txt, the presets and the scripts ask for the same CMake" cmake_minimum)
fa_newcomer_check("common: the README, every stage README and make_exercise give the same exercise commands"
                  exercise_commands)

# In an exercise build (FA_EXERCISE), a GPU stage built from the student's copy gets one more test,
# which fails where the copy cannot run: without it `ctest -R stage04` on a machine without a GPU
# says "100% tests passed" about a kernel that was only compiled. The CPU stage (01) runs everywhere:
# its own tests decide, and it gets no such test.
foreach(id IN LISTS fa_newcomer_stage_ids)
  get_property(source_dir GLOBAL PROPERTY FA_STAGE_SOURCE_DIR_${id})
  if(NOT TARGET ${id} OR NOT source_dir OR source_dir STREQUAL "${PROJECT_SOURCE_DIR}/stages/${id}"
     OR id STREQUAL "01_cpu")
    continue()
  endif()
  string(SUBSTRING ${id} 0 2 number)
  add_test(NAME "stage${number}: your copy ran on a GPU, not only compiled"
           COMMAND sh -c [=[
output=$("$0" --seq 16 --dim 16 --reps 0 --no-check 2>&1)
code=$?
if [ $code -eq 4 ]; then
  echo "NOT RUN: your copy of $1 was only compiled, so its GPU tests are skipped here ($output)."
  echo "Check it on a machine with a CUDA GPU: scripts/check_exercises.sh $2"
  exit 1
elif [ $code -ne 0 ]; then
  echo "your copy of $1 did not run (exit code $code): $output"
  exit 1
fi
echo "your copy of $1 runs here"]=] $<TARGET_FILE:${id}> ${id} ${number})
endforeach()

# The stage READMEs speak to the student, not about how the course was made: no run numbers of the
# GPU suite ("call 7"), no tracker issue ("issue 48", "the issue says"; an instruction's issue is
# fine), no "the bar", no shapes named after the documents they came from ("seed 001"): DESIGN.md
# names them "the standard sweep" and "the large-head shapes".
add_test(NAME "common: stage READMEs name no suite calls, issues, bars or seed documents"
         COMMAND sh -c [=[
found=$(grep -n -i -E '\bcalls? [0-9]|\bissue #?[0-9]+\b|\bissues #[0-9]+|\bthe issue (says|asks|wants|tracker)|\bthe bar\b|\bseed ?0|\bseed documents?\b|\bseed shapes?\b' "$0"/stages/*/README.md)
if [ -n "$found" ]; then echo "$found"; exit 1; fi
echo "no stage README names a suite call, an issue, a bar or a seed document"]=] ${PROJECT_SOURCE_DIR})

# The measured tables (plots/tables/, the README's headline table, the measured table of the stage READMEs
# in fa_course.bench.readme_tables) are generated from plots/data by one command; a data set changed
# without them, or a table edited by hand, fails here with the difference.
add_test(NAME "common: plots/tables and the READMEs' measured tables are what plots/data gives"
         COMMAND python3 ${PROJECT_SOURCE_DIR}/scripts/make_tables.py --check)

# Every stage README is a lesson read in one sitting (DESIGN.md): under 300 lines, an exercise
# section, a "Tried and dropped" list, the glossary linked; and no README names a run by its time
# of day ("the 11:18Z run") or a code hash ("source_hash 10ea438b6c147adb", "commit e83d1b5"): the
# generated tables in plots/tables/ state the date and code of their run once.
add_test(NAME "common: every stage README is a lesson under 300 lines, naming no run by its time or code hash"
         COMMAND sh -c [=[
status=0
for readme in "$0"/stages/[0-9][0-9]_*/README.md; do
  stage=$(basename "$(dirname "$readme")")
  lines=$(wc -l <"$readme")
  [ "$lines" -lt 300 ] || { echo "$stage/README.md: $lines lines (a lesson has fewer than 300)"; status=1; }
  for heading in '^## Exercise' '^## Tried and dropped'; do
    grep -q "$heading" "$readme" || { echo "$stage/README.md: no '${heading#^}' section"; status=1; }
  done
  grep -q 'GLOSSARY.md' "$readme" || { echo "$stage/README.md: does not link the glossary"; status=1; }
done
found=$(grep -n -E '\b[0-2]?[0-9]:[0-5][0-9] ?Z\b|\b[0-2][0-9]:[0-5][0-9] run\b|\brun of [0-2]?[0-9]:[0-5][0-9]\b|\b[0-9a-f]{16}\b|\bcommit [0-9a-f]{7,40}\b|\bsession [0-9]' \
  "$0"/README.md "$0"/stages/[0-9][0-9]_*/README.md)
if [ -n "$found" ]; then echo "$found"; echo "^ a run named by its time of day or a code hash"; status=1; fi
[ $status -eq 0 ] && echo "every stage README is under 300 lines, has its exercise and tried-and-dropped sections, links the glossary; no README names a run by its time or code hash"
exit $status]=] ${PROJECT_SOURCE_DIR})
