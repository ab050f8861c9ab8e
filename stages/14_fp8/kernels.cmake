# Stage 14's GPU kernels (sm_90a): the quantization pass (quantize.cu) and the FP8 wgmma forward
# (fp8_attention.cu), a library with the host API of fp8_attention.hpp. The quantization follows the
# contract of the numerics (fp8_numerics.hpp) and uses its host helpers (pad_dim, hadamard_scale).
if(NOT TARGET fa_stage_14_fp8_numerics)
  message(STATUS "14_fp8: the numerics library is missing (numerics.cmake): the kernels are not built")
  return()
endif()

add_library(fa_stage_14_fp8 STATIC ${CMAKE_CURRENT_SOURCE_DIR}/quantize.cu ${CMAKE_CURRENT_SOURCE_DIR}/fp8_attention.cu)
target_include_directories(fa_stage_14_fp8 PUBLIC ${CMAKE_CURRENT_SOURCE_DIR})
target_link_libraries(fa_stage_14_fp8 PUBLIC fa_common fa_stage_14_fp8_numerics)
# wgmma with e4m3, setmaxnreg: sm_90a alone; the host code declines every other GPU.
set_target_properties(fa_stage_14_fp8 PROPERTIES CUDA_ARCHITECTURES 90a CUDA_SEPARABLE_COMPILATION OFF
                                                 POSITION_INDEPENDENT_CODE ON)
fa_target_warnings(fa_stage_14_fp8)

# Stage 14 is no stage of the registry (fa_add_stage), so the structural tests find its sources
# through the property fa_add_stage would set (cmake/StructuralTest.cmake, fa_stage_ptx).
set_property(GLOBAL PROPERTY FA_STAGE_SOURCE_DIR_14_fp8 ${CMAKE_CURRENT_SOURCE_DIR})

# bin/14_fp8: the stage's command line (fp8_main.cpp), with the harness's flags so that
# scripts/gpu_suite.sh runs it as any GPU stage; its rows carry the source_hash of 14_fp8, generated
# at every build as cmake/Stage.cmake does for the stages of the registry.
set(fa_14_fp8_generated ${CMAKE_BINARY_DIR}/generated/14_fp8)
add_custom_target(fa_stage_14_fp8_hash
  COMMAND ${Python3_EXECUTABLE} ${FA_SOURCE_HASH_SCRIPT} --root ${PROJECT_SOURCE_DIR}
          --header ${fa_14_fp8_generated}/fa_source_hash.h --stage 14_fp8
          --nvcc-version ${CMAKE_CUDA_COMPILER_VERSION}
  BYPRODUCTS ${fa_14_fp8_generated}/fa_source_hash.h
  COMMENT "Source hash of 14_fp8")
add_executable(14_fp8 ${CMAKE_CURRENT_SOURCE_DIR}/fp8_main.cpp ${CMAKE_CURRENT_SOURCE_DIR}/fp8_walkthrough.cpp)
target_include_directories(14_fp8 PRIVATE ${fa_14_fp8_generated})
target_link_libraries(14_fp8 PRIVATE fa_stage_14_fp8 CLI11::CLI11)
add_dependencies(14_fp8 fa_stage_14_fp8_hash)
fa_target_warnings(14_fp8)
