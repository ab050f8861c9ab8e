# Stage 14's numerics, plain C++ with no GPU: the e4m3 codec, the quantization contract the kernels
# follow (fp8_numerics.hpp), CPU models of the FP8 and FP16 forward passes, and the accuracy study.

# With FA_EXERCISE naming it (14, 14_fp8 or all), the numerics build from the student copy in
# exercises/14_fp8/ (scripts/make_exercise 14: the e4m3 encoder), as cmake/Stage.cmake does for the
# stages of the registry.
set(numerics_dir ${CMAKE_CURRENT_SOURCE_DIR})
if(FA_EXERCISE STREQUAL "all" OR "14_fp8" IN_LIST FA_EXERCISE OR "14" IN_LIST FA_EXERCISE)
  set(numerics_dir ${FA_EXERCISE_DIR}/14_fp8)
  if(NOT EXISTS ${numerics_dir})
    message(FATAL_ERROR "FA_EXERCISE=${FA_EXERCISE}: there is no student copy in ${numerics_dir}; "
                        "make it with: scripts/make_exercise 14")
  endif()
  message(STATUS "14_fp8: building the student copy of the numerics in ${numerics_dir}")
endif()

add_library(fa_stage_14_fp8_numerics STATIC ${numerics_dir}/fp8_numerics.cpp)
target_include_directories(fa_stage_14_fp8_numerics PUBLIC ${numerics_dir})
target_link_libraries(fa_stage_14_fp8_numerics PUBLIC fa_common)
set_target_properties(fa_stage_14_fp8_numerics PROPERTIES POSITION_INDEPENDENT_CODE ON)
fa_target_warnings(fa_stage_14_fp8_numerics)

# bin/14_fp8_accuracy: the README's accuracy table (RMSE and max error against the FP64 reference).
add_executable(14_fp8_accuracy ${numerics_dir}/fp8_accuracy.cpp)
target_link_libraries(14_fp8_accuracy PRIVATE fa_stage_14_fp8_numerics CLI11::CLI11)
fa_target_warnings(14_fp8_accuracy)
