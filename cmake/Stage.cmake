# fa_add_stage(ID <folder> FACTORY <name> [<name> ...] SOURCES <files...>)
#
# A stage folder holds its kernel source(s), ending in the stage's descriptor
# `fa::StageDescriptor fa::stages::<FACTORY>()`, a README and a CMakeLists.txt that calls this.
# A stage with several descriptors (one per precision, say) names each factory; the executable
# runs the first, and the course and the C ABI see them all. It builds:
#   fa_stage_<ID>   a library with the stage (linked by tests, the course and the C ABI)
#   <ID>            the stage's executable (bin/<ID>), the shared command line of common/
# and generates <fa_source_hash.h> with FA_SOURCE_HASH, the source_hash of DESIGN.md's results CSV
# (scripts/source_hash.py: the stage's include closure, the stages it links, its CMake flags, this
# nvcc's version and the timing methods; comments and whitespace ignored), recomputed at every
# build so a binary always reports the code it was built from.
#
# With FA_EXERCISE naming the stage (04, 04_online_softmax, or "all"), the stage is built from
# the student copy in exercises/<ID>/ (made by scripts/make_exercise) instead of the solution.
set(FA_EXERCISE "" CACHE STRING "Stages built from the student copy in exercises/ (e.g. 04 or 04_online_softmax; all)")
set(FA_EXERCISE_DIR ${PROJECT_SOURCE_DIR}/exercises CACHE PATH "Where the student copies live")
# The one source_hash script, shared with the GPU suite and the data tools (Python 3, stdlib only).
find_package(Python3 COMPONENTS Interpreter REQUIRED)
set(FA_SOURCE_HASH_SCRIPT ${PROJECT_SOURCE_DIR}/scripts/source_hash.py)
set(FA_STAGE_MAIN_TEMPLATE ${CMAKE_CURRENT_LIST_DIR}/stage_main.cpp.in)

function(fa_add_stage)
  cmake_parse_arguments(PARSE_ARGV 0 ARG "" "ID" "FACTORY;SOURCES")
  set(library fa_stage_${ARG_ID})
  set(generated ${CMAKE_BINARY_DIR}/generated/${ARG_ID})

  add_custom_target(${library}_hash
    COMMAND ${Python3_EXECUTABLE} ${FA_SOURCE_HASH_SCRIPT} --root ${PROJECT_SOURCE_DIR}
            --header ${generated}/fa_source_hash.h --stage ${ARG_ID}
            --nvcc-version ${CMAKE_CUDA_COMPILER_VERSION}
    BYPRODUCTS ${generated}/fa_source_hash.h
    COMMENT "Source hash of ${ARG_ID}")

  set(source_dir ${CMAKE_CURRENT_SOURCE_DIR})
  string(SUBSTRING ${ARG_ID} 0 2 number)
  if(FA_EXERCISE STREQUAL "all" OR ARG_ID IN_LIST FA_EXERCISE OR number IN_LIST FA_EXERCISE)
    set(source_dir ${FA_EXERCISE_DIR}/${ARG_ID})
    if(NOT EXISTS ${source_dir})
      message(FATAL_ERROR "FA_EXERCISE=${FA_EXERCISE}: there is no student copy in ${source_dir}; "
                          "make it with: scripts/make_exercise ${number}")
    endif()
    message(STATUS "${ARG_ID}: building the student copy in ${source_dir}")
  endif()
  list(TRANSFORM ARG_SOURCES PREPEND ${source_dir}/)
  set_property(GLOBAL PROPERTY FA_STAGE_SOURCE_DIR_${ARG_ID} ${source_dir})

  add_library(${library} STATIC ${ARG_SOURCES})
  target_include_directories(${library} PRIVATE ${generated} ${source_dir})
  target_link_libraries(${library} PUBLIC fa_common)
  set_target_properties(${library} PROPERTIES CUDA_SEPARABLE_COMPILATION OFF POSITION_INDEPENDENT_CODE ON)
  add_dependencies(${library} ${library}_hash)
  fa_target_warnings(${library})

  list(GET ARG_FACTORY 0 FA_STAGE_FACTORY)  # the executable runs the first descriptor
  configure_file(${FA_STAGE_MAIN_TEMPLATE} ${generated}/main.cpp @ONLY)
  add_executable(${ARG_ID} ${generated}/main.cpp)
  target_link_libraries(${ARG_ID} PRIVATE ${library} fa_stages_header)
  fa_target_warnings(${ARG_ID})

  set_property(GLOBAL APPEND PROPERTY FA_STAGE_IDS ${ARG_ID})
  set_property(GLOBAL APPEND PROPERTY FA_STAGE_FACTORIES ${ARG_FACTORY})  # all of them go to the registry
endfunction()
