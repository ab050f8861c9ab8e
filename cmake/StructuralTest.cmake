# fa_add_structural_test(NAME <test name> STAGE <stage id> SOURCE <.cu file name> ARCH <sm number>
#                        PATTERN <regex> [PATTERN <regex> ...])
#
# Compiles a stage's kernel file (the student copy when FA_EXERCISE selects the stage) to PTX for one architecture at build time, and adds a test
# that fails unless every PATTERN occurs in it: the way CI, without a GPU, sees that a kernel
# uses the idea of its stage (design.md, "Tests").
set(FA_GREP_SCRIPT ${CMAKE_CURRENT_LIST_DIR}/GrepFile.cmake)

function(fa_add_structural_test)
  cmake_parse_arguments(PARSE_ARGV 0 ARG "" "NAME;STAGE;SOURCE;ARCH" "PATTERN")
  get_property(source_dir GLOBAL PROPERTY FA_STAGE_SOURCE_DIR_${ARG_STAGE})
  if(NOT source_dir)
    return()  # the stage is not part of this build (FA_ONLY_STAGES)
  endif()
  set(source ${source_dir}/${ARG_SOURCE})
  get_filename_component(base ${ARG_SOURCE} NAME_WE)
  set(ptx ${CMAKE_BINARY_DIR}/ptx/${ARG_STAGE}/${base}.sm_${ARG_ARCH}.ptx)
  if(NOT TARGET ptx_${ARG_STAGE}_${base}_${ARG_ARCH})
    file(MAKE_DIRECTORY ${CMAKE_BINARY_DIR}/ptx/${ARG_STAGE})  # Makefile generators do not make it
    add_custom_command(OUTPUT ${ptx}
      COMMAND ${CMAKE_CUDA_COMPILER} -ptx -std=c++17 -arch=sm_${ARG_ARCH} --expt-relaxed-constexpr
              -I${PROJECT_SOURCE_DIR}/common/include -I${CMAKE_BINARY_DIR}/generated/${ARG_STAGE}
              -I${CMAKE_BINARY_DIR}/generated/registry -I${source_dir}
              ${source} -o ${ptx}
      DEPENDS ${source} fa_stage_${ARG_STAGE}
      COMMENT "PTX of ${ARG_STAGE}/${base} for sm_${ARG_ARCH}")
    add_custom_target(ptx_${ARG_STAGE}_${base}_${ARG_ARCH} ALL DEPENDS ${ptx})
  endif()
  add_test(NAME "${ARG_NAME}" COMMAND ${CMAKE_COMMAND} -DFILE=${ptx} "-DPATTERNS=${ARG_PATTERN}" -P ${FA_GREP_SCRIPT})
endfunction()
