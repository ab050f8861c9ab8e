# DESIGN.md's source_hash (scripts/source_hash.py) ignores comments and whitespace but no token, and
# the data folders under plots/data/ are coherent (python/fa_course/bench/data.py). Included from
# tests/CMakeLists.txt; the same file, run with cmake -P, is the body of the first test, which works
# on a copy of stages/<stage> and common/ in the build tree, never on the source tree.
# Both need only Python 3's standard library (no GPU, no pandas).

if(NOT CMAKE_SCRIPT_MODE_FILE)
  find_package(Python3 COMPONENTS Interpreter REQUIRED)
  add_test(NAME "common: source_hash ignores comments and whitespace, not tokens"
    COMMAND ${CMAKE_COMMAND} -DPYTHON=${Python3_EXECUTABLE} -DROOT=${PROJECT_SOURCE_DIR}
            -DWORK=${CMAKE_CURRENT_BINARY_DIR}/source_hash_test -DSTAGE=04_online_softmax
            -P ${CMAKE_CURRENT_LIST_FILE})
  add_test(NAME "common: every data folder under plots/data has one file per kind and no duplicate key"
    COMMAND ${Python3_EXECUTABLE} -m fa_course.bench.data check --all ${PROJECT_SOURCE_DIR}/plots/data)
  set_tests_properties("common: every data folder under plots/data has one file per kind and no duplicate key"
    PROPERTIES ENVIRONMENT "PYTHONPATH=${PROJECT_SOURCE_DIR}/python;PYTHONDONTWRITEBYTECODE=1")
  # The include closure source_hash.py computes holds every file the compiler read for a stage
  # (Ninja's record of the compiler's dependency files): run after the build, as ctest is.
  add_test(NAME "common: source_hash covers every file the compiler read for each stage"
    COMMAND ${Python3_EXECUTABLE} ${PROJECT_SOURCE_DIR}/scripts/source_hash.py --check-build ${CMAKE_BINARY_DIR})
  # scripts/restamp (tests/restamp): the machine-code comparison on tiny kernels, the chain of
  # restamps, the method hashes.
  set(restamp_python ${Python3_EXECUTABLE})
  if(EXISTS "${PROJECT_SOURCE_DIR}/.venv/bin/python")
    set(restamp_python "${PROJECT_SOURCE_DIR}/.venv/bin/python")  # pip's cuobjdump, when the toolkit has none
  endif()
  add_test(NAME "restamp: machine code compared, restamps chained, methods hashed"
    COMMAND ${restamp_python} -m unittest discover -s ${PROJECT_SOURCE_DIR}/tests/restamp -t ${PROJECT_SOURCE_DIR}/tests/restamp)
  # The headline GPU's restamps that lead to this tree: their SASS digests recomputed from this
  # build's stage libraries (the same nvcc; the cubins for the restamp's architecture). A build of
  # some stages (FA_ONLY_STAGES) verifies those it built.
  set(restamp_stages "")
  if(FA_ONLY_STAGES)
    file(GLOB restamp_folders LIST_DIRECTORIES true RELATIVE ${PROJECT_SOURCE_DIR}/stages
         ${PROJECT_SOURCE_DIR}/stages/[0-9][0-9]_*)
    foreach(folder IN LISTS restamp_folders)
      if(TARGET fa_stage_${folder})
        list(APPEND restamp_stages ${folder})
      endif()
    endforeach()
    list(PREPEND restamp_stages --stages)
  endif()
  add_test(NAME "restamp: the NVIDIA_H200 restamps to this tree have this build's SASS"
    COMMAND ${restamp_python} ${PROJECT_SOURCE_DIR}/scripts/restamp --verify ${PROJECT_SOURCE_DIR}/plots/data/NVIDIA_H200
            --build ${CMAKE_BINARY_DIR} ${restamp_stages})
  set_tests_properties("restamp: machine code compared, restamps chained, methods hashed"
    "restamp: the NVIDIA_H200 restamps to this tree have this build's SASS"
    PROPERTIES ENVIRONMENT "PYTHONPATH=${PROJECT_SOURCE_DIR}/python;PYTHONDONTWRITEBYTECODE=1;CUDACXX=${CMAKE_CUDA_COMPILER}")
  return()
endif()

# ---- the test body (cmake -P) ----
foreach(variable PYTHON ROOT WORK STAGE)
  if(NOT DEFINED ${variable})
    message(FATAL_ERROR "source_hash test: -D${variable}=... is missing")
  endif()
endforeach()
set(tree ${WORK}/tree)
file(REMOVE_RECURSE ${WORK})
file(MAKE_DIRECTORY ${tree}/stages)
file(COPY ${ROOT}/stages/${STAGE} DESTINATION ${tree}/stages)
file(COPY ${ROOT}/common DESTINATION ${tree})
foreach(flag_file CMakeLists.txt CMakePresets.json cmake/CudaArchitectures.cmake cmake/Warnings.cmake
                  cmake/Stage.cmake cmake/stage_main.cpp.in stages/CMakeLists.txt stages/stages.hpp.in)
  get_filename_component(folder ${tree}/${flag_file} DIRECTORY)
  file(COPY ${ROOT}/${flag_file} DESTINATION ${folder})  # what sets the stage's flags (FLAG_FILES)
endforeach()
# The methods' files (fa_course.bench.source_hash METHODS), at their paths, as the script lists them.
foreach(method cpp torch)
  execute_process(COMMAND ${PYTHON} ${ROOT}/scripts/source_hash.py --root ${ROOT} --method ${method} --files
    OUTPUT_VARIABLE method_files RESULT_VARIABLE status OUTPUT_STRIP_TRAILING_WHITESPACE)
  if(NOT status EQUAL 0)
    message(FATAL_ERROR "source_hash.py --method ${method} --files failed (${status})")
  endif()
  string(REPLACE "\n" ";" method_files "${method_files}")
  foreach(relative IN LISTS method_files)
    get_filename_component(folder ${tree}/${relative} DIRECTORY)
    file(COPY ${ROOT}/${relative} DESTINATION ${folder})
  endforeach()
endforeach()

# hash(<out> <args...>): the script's output for the copy.
function(hash out)
  execute_process(COMMAND ${PYTHON} ${ROOT}/scripts/source_hash.py --root ${tree} ${ARGN}
    OUTPUT_VARIABLE value ERROR_VARIABLE error RESULT_VARIABLE status OUTPUT_STRIP_TRAILING_WHITESPACE)
  if(NOT status EQUAL 0 OR NOT value MATCHES "^[0-9a-f]+$")
    message(FATAL_ERROR "source_hash.py ${ARGN} failed (${status}): ${error}${value}")
  endif()
  set(${out} ${value} PARENT_SCOPE)
endfunction()

# expect(<same|different> <what>): the hash of the copy now against the one at the start; then the
# copy is put back as it was.
function(expect relation what)
  hash(stage_now ${STAGE})
  hash(tree_now --tree)
  if(relation STREQUAL "same" AND NOT (stage_now STREQUAL base AND tree_now STREQUAL base_tree))
    message(SEND_ERROR "FAILED: ${what} changed the hash (${base} -> ${stage_now}, tree ${base_tree} -> ${tree_now})")
  elseif(relation STREQUAL "different" AND (stage_now STREQUAL base OR tree_now STREQUAL base_tree))
    message(SEND_ERROR "FAILED: ${what} left the hash at ${stage_now} (tree ${tree_now})")
  else()
    message(STATUS "ok: ${what}: ${relation} hash (${stage_now})")
  endif()
endfunction()

file(GLOB kernel_files ${tree}/stages/${STAGE}/*.cu ${tree}/stages/${STAGE}/*.cpp)
list(SORT kernel_files)
list(GET kernel_files 0 kernel)
set(cmake_file ${tree}/stages/${STAGE}/CMakeLists.txt)
# a header of the stage's include closure (every stage includes fa/stage.hpp), and one outside it
set(header ${tree}/common/include/fa/stage.hpp)
set(outside ${tree}/common/include/fa/kernel/wgmma.cuh)
file(READ ${outside} original_outside)
foreach(role kernel cmake_file header)
  file(READ ${${role}} original_${role})
endforeach()
macro(restore)
  foreach(role kernel cmake_file header)
    file(WRITE ${${role}} "${original_${role}}")
  endforeach()
endmacro()

hash(base ${STAGE})
hash(base_tree --tree)
if(NOT base MATCHES "^[0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f]$")
  message(FATAL_ERROR "the hash is not 16 hex digits: ${base}")
endif()
execute_process(COMMAND ${PYTHON} ${ROOT}/scripts/source_hash.py --root ${ROOT} ${STAGE}
  OUTPUT_VARIABLE real OUTPUT_STRIP_TRAILING_WHITESPACE)
if(NOT real STREQUAL base)
  message(SEND_ERROR "FAILED: the copy hashes to ${base}, the source tree to ${real}")
endif()

# (a) What must not change the hash.
set(text "${original_kernel}")
file(WRITE ${kernel} "// A corrected comment, /* with \"quotes\" */ and 'an apostrophe'\n${text}\n/* a block\n   comment */\n")
expect(same "comments added to ${STAGE}'s kernel file")
restore()
string(REPLACE "\n" "\n\t  " reindented "${text}")
string(REPLACE ";" " ;  " reindented "${reindented}")
string(REPLACE "\n" "\r\n" reindented "${reindented}")
file(WRITE ${kernel} "${reindented}")
expect(same "the kernel file reindented, spaces before every ';', CRLF line ends")
restore()
file(WRITE ${cmake_file} "# a comment\n#[[ a bracket\n comment ]]\n${original_cmake_file}\n   # another\n")
expect(same "comments and blank lines in the stage's CMakeLists.txt")
restore()
file(WRITE ${header} "${original_header}\n// a comment in common/\n")
expect(same "a comment in ${header}")
restore()
expect(same "the copy put back")
# A header the stage does not include: not the stage's code (the tree's hash still sees it).
file(WRITE ${outside} "${original_outside}\nnamespace fa { int probe_outside; }\n")
hash(stage_now ${STAGE})
hash(tree_now --tree)
if(NOT stage_now STREQUAL base OR tree_now STREQUAL base_tree)
  message(SEND_ERROR "FAILED: a header outside ${STAGE}'s include closure: stage ${base} -> ${stage_now}, tree ${base_tree} -> ${tree_now}")
else()
  message(STATUS "ok: a header outside the stage's include closure leaves its hash")
endif()
file(WRITE ${outside} "${original_outside}")
# Another nvcc is other code.
hash(other_nvcc ${STAGE} --nvcc-version 99.0.0)
if(other_nvcc STREQUAL base)
  message(SEND_ERROR "FAILED: another nvcc version left the hash at ${base}")
endif()

# (b) What must change it.
file(WRITE ${kernel} "${original_kernel}\nint fa_source_hash_probe;\n")
expect(different "a declaration added to the kernel file")
file(WRITE ${kernel} "${original_kernel}\nint fa_source_hash_probe = 1;\n")
hash(one ${STAGE})
file(WRITE ${kernel} "${original_kernel}\nint fa_source_hash_probe = 2;\n")
hash(two ${STAGE})
if(one STREQUAL two)
  message(SEND_ERROR "FAILED: 1 -> 2 left the hash unchanged")
endif()
# Literals are code: what looks like a comment inside one is kept, and so is its whitespace.
file(WRITE ${kernel} "${original_kernel}\nconst char* fa_probe = \"a // b /* c */\";\n")
hash(one ${STAGE})
file(WRITE ${kernel} "${original_kernel}\nconst char* fa_probe = \"a // b /* d */\";\n")
hash(two ${STAGE})
file(WRITE ${kernel} "${original_kernel}\nconst char* fa_probe = \"a  // b /* d */\";\n")
hash(three ${STAGE})
if(one STREQUAL two OR two STREQUAL three)
  message(SEND_ERROR "FAILED: a change inside a string literal left the hash unchanged (${one} ${two} ${three})")
endif()
restore()
file(WRITE ${cmake_file} "${original_cmake_file}\nset(FA_PROBE \"# not a comment\")\n")
expect(different "a command added to the stage's CMakeLists.txt")
restore()
file(WRITE ${header} "${original_header}\nnamespace fa { int probe; }\n")
expect(different "a declaration added to common/")
restore()

# A stage that links another stage's library carries that stage's code in its hash (stage 12 runs
# stage 08's kernel at prefill shapes): a dependent stage made in the copy changes hash with ${STAGE}.
set(dependent ${tree}/stages/99_dependent)
file(MAKE_DIRECTORY ${dependent})
file(WRITE ${dependent}/CMakeLists.txt "# links fa_stage_00_not_a_library in a comment only\n"
  "target_link_libraries(fa_stage_99_dependent PUBLIC\n  fa_stage_${STAGE})\n")
hash(dependent_before 99_dependent)
file(WRITE ${kernel} "${original_kernel}\nint fa_source_hash_probe;\n")
hash(dependent_after 99_dependent)
restore()
if(dependent_before STREQUAL dependent_after)
  message(SEND_ERROR "FAILED: a change in ${STAGE} left the hash of a stage that links it at ${dependent_before}")
else()
  message(STATUS "ok: a stage that links ${STAGE} changes hash with it")
endif()
file(REMOVE_RECURSE ${dependent})

# The header CMake includes: written with the hash, and not rewritten when it has not changed.
set(output ${WORK}/generated/fa_source_hash.h)
execute_process(COMMAND ${PYTHON} ${ROOT}/scripts/source_hash.py --root ${tree} --header ${output} --stage ${STAGE}
  RESULT_VARIABLE status)
file(READ ${output} content)
if(NOT status EQUAL 0 OR NOT content MATCHES "#define FA_SOURCE_HASH \"${base}\"")
  message(SEND_ERROR "FAILED: --header wrote: ${content}")
endif()
file(TIMESTAMP ${output} first "%s")
execute_process(COMMAND ${CMAKE_COMMAND} -E sleep 1.1)
execute_process(COMMAND ${PYTHON} ${ROOT}/scripts/source_hash.py --root ${tree} --header ${output} --stage ${STAGE})
file(TIMESTAMP ${output} second "%s")
if(NOT first STREQUAL second)
  message(SEND_ERROR "FAILED: --header rewrote an unchanged header (a needless rebuild)")
endif()
file(REMOVE_RECURSE ${WORK})
