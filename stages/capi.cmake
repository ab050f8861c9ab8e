# The C ABI (fa_capi.h): every stage behind plain C functions in build/lib/libfa_capi.so, for
# Python's ctypes (scripts/compare_torch.py) and any other language. Included from
# stages/CMakeLists.txt after the fa_stages target exists.
#
# Only the fa_* functions are exported. -fvisibility=hidden covers fa_capi.cpp; the static
# libraries linked in (the stages, common/, the CUDA runtime) were compiled without it, so a
# version script hides everything else. The CUDA runtime is linked statically: the library then
# needs only the driver and does not clash with the libcudart a host process (PyTorch) loads.
add_library(fa_capi SHARED ${CMAKE_CURRENT_LIST_DIR}/fa_capi.cpp)
target_include_directories(fa_capi PUBLIC $<BUILD_INTERFACE:${CMAKE_CURRENT_LIST_DIR}>)
target_compile_definitions(fa_capi PRIVATE FA_CAPI_BUILDING)
target_link_libraries(fa_capi PRIVATE fa_stages)
set_target_properties(fa_capi PROPERTIES
  CXX_VISIBILITY_PRESET hidden
  VISIBILITY_INLINES_HIDDEN ON
  CUDA_RUNTIME_LIBRARY Static)

set(fa_capi_version_script ${CMAKE_CURRENT_BINARY_DIR}/fa_capi.map)
file(CONFIGURE OUTPUT ${fa_capi_version_script} CONTENT "{\n  global: fa_*;\n  local: *;\n};\n")
target_link_options(fa_capi PRIVATE "LINKER:--version-script=${fa_capi_version_script}" "LINKER:--no-undefined")
set_property(TARGET fa_capi APPEND PROPERTY LINK_DEPENDS ${fa_capi_version_script})
fa_target_warnings(fa_capi)

# `pip install python/` (scikit-build-core, python/pyproject.toml) builds this target alone and
# installs the library inside the package, beside fa_course/__init__.py.
if(SKBUILD)
  install(TARGETS fa_capi LIBRARY DESTINATION fa_course COMPONENT fa_course)
endif()
