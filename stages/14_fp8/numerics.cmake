# Stage 14's numerics, plain C++ with no GPU: the e4m3 codec, the quantization contract the kernels
# follow (fp8_numerics.hpp), CPU models of the FP8 and FP16 forward passes, and the accuracy study.
add_library(fa_stage_14_fp8_numerics STATIC ${CMAKE_CURRENT_SOURCE_DIR}/fp8_numerics.cpp)
target_include_directories(fa_stage_14_fp8_numerics PUBLIC ${CMAKE_CURRENT_SOURCE_DIR})
target_link_libraries(fa_stage_14_fp8_numerics PUBLIC fa_common)
set_target_properties(fa_stage_14_fp8_numerics PROPERTIES POSITION_INDEPENDENT_CODE ON)
fa_target_warnings(fa_stage_14_fp8_numerics)

# bin/14_fp8_accuracy: the README's accuracy table (RMSE and max error against the FP64 reference).
add_executable(14_fp8_accuracy ${CMAKE_CURRENT_SOURCE_DIR}/fp8_accuracy.cpp)
target_link_libraries(14_fp8_accuracy PRIVATE fa_stage_14_fp8_numerics CLI11::CLI11)
fa_target_warnings(14_fp8_accuracy)
