# fa_add_structural_test(NAME <test name> STAGE <stage id> SOURCE <.cu file name> ARCH <sm number>
#                        PATTERN <regex> [PATTERN <regex> ...])
#
# Compiles a stage's kernel file (the student copy when FA_EXERCISE selects the stage) to PTX for one architecture at build time, and adds a test
# that fails unless every PATTERN occurs in it: the way CI, without a GPU, sees that a kernel
# uses the idea of its stage (DESIGN.md, "Tests").
#
# fa_add_spill_test(NAME <test name> STAGE <stage id> SOURCE <.cu file name> ARCH <sm number>)
#
# Assembles the same PTX with ptxas -v and fails unless every kernel in it reports 0 bytes of
# spill stores and loads: for a stage that keeps its working set in registers.
#
# fa_add_sass_test(NAME <test name> STAGE <stage id> SOURCE <.cu file name> ARCH <sm number>
#                  SCRIPT <python script> [ARGS <more arguments>...])
#
# Assembles the same PTX and runs SCRIPT on it (--ptxas, --ptx, --arch, --root, then ARGS): for a
# stage whose idea shows only in the machine code ptxas makes of it (the script reads the SASS with
# cuobjdump).
set(FA_GREP_SCRIPT ${CMAKE_CURRENT_LIST_DIR}/GrepFile.cmake)
set(FA_NO_SPILLS_SCRIPT ${CMAKE_CURRENT_LIST_DIR}/NoSpills.cmake)

# Sets <out_var> to the PTX file of STAGE/SOURCE for sm_ARCH, adding the rule that builds it once;
# to "" when the stage is not part of this build (FA_ONLY_STAGES).
function(fa_stage_ptx out_var stage source arch)
  set(${out_var} "" PARENT_SCOPE)
  get_property(source_dir GLOBAL PROPERTY FA_STAGE_SOURCE_DIR_${stage})
  if(NOT source_dir)
    return()
  endif()
  get_filename_component(base ${source} NAME_WE)
  set(ptx ${CMAKE_BINARY_DIR}/ptx/${stage}/${base}.sm_${arch}.ptx)
  if(NOT TARGET ptx_${stage}_${base}_${arch})
    file(MAKE_DIRECTORY ${CMAKE_BINARY_DIR}/ptx/${stage})  # Makefile generators do not make it
    add_custom_command(OUTPUT ${ptx}
      COMMAND ${CMAKE_CUDA_COMPILER} -ptx -std=c++17 -arch=sm_${arch} --expt-relaxed-constexpr
              -I${PROJECT_SOURCE_DIR}/common/include -I${CMAKE_BINARY_DIR}/generated/${stage}
              -I${CMAKE_BINARY_DIR}/generated/registry -I${source_dir}
              ${source_dir}/${source} -o ${ptx}
      DEPENDS ${source_dir}/${source} fa_stage_${stage}
      COMMENT "PTX of ${stage}/${base} for sm_${arch}")
    add_custom_target(ptx_${stage}_${base}_${arch} ALL DEPENDS ${ptx})
  endif()
  set(${out_var} ${ptx} PARENT_SCOPE)
endfunction()

function(fa_add_structural_test)
  cmake_parse_arguments(PARSE_ARGV 0 ARG "" "NAME;STAGE;SOURCE;ARCH" "PATTERN")
  fa_stage_ptx(ptx ${ARG_STAGE} ${ARG_SOURCE} ${ARG_ARCH})
  if(ptx)
    add_test(NAME "${ARG_NAME}" COMMAND ${CMAKE_COMMAND} -DFILE=${ptx} "-DPATTERNS=${ARG_PATTERN}" -P ${FA_GREP_SCRIPT})
  endif()
endfunction()

function(fa_add_spill_test)
  cmake_parse_arguments(PARSE_ARGV 0 ARG "" "NAME;STAGE;SOURCE;ARCH" "")
  fa_stage_ptx(ptx ${ARG_STAGE} ${ARG_SOURCE} ${ARG_ARCH})
  if(ptx)
    get_filename_component(cuda_bin ${CMAKE_CUDA_COMPILER} DIRECTORY)
    find_program(FA_PTXAS ptxas HINTS ${cuda_bin} REQUIRED)
    add_test(NAME "${ARG_NAME}"
             COMMAND ${CMAKE_COMMAND} -DPTXAS=${FA_PTXAS} -DFILE=${ptx} -DARCH=${ARG_ARCH} -P ${FA_NO_SPILLS_SCRIPT})
  endif()
endfunction()

function(fa_add_sass_test)
  cmake_parse_arguments(PARSE_ARGV 0 ARG "" "NAME;STAGE;SOURCE;ARCH;SCRIPT" "ARGS")
  fa_stage_ptx(ptx ${ARG_STAGE} ${ARG_SOURCE} ${ARG_ARCH})
  if(ptx)
    get_filename_component(cuda_bin ${CMAKE_CUDA_COMPILER} DIRECTORY)
    find_program(FA_PTXAS ptxas HINTS ${cuda_bin} REQUIRED)
    find_package(Python3 COMPONENTS Interpreter REQUIRED)
    add_test(NAME "${ARG_NAME}"
             COMMAND ${Python3_EXECUTABLE} ${ARG_SCRIPT} --ptxas ${FA_PTXAS} --ptx ${ptx} --arch ${ARG_ARCH}
                     --root ${PROJECT_SOURCE_DIR} ${ARG_ARGS})
  endif()
endfunction()
