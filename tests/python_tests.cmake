# The Python package (python/fa_course) in ctest: its unit tests (schema formulas, CSV reading and
# writing, the ctypes declarations against stages/fa_capi.h, and the CPU stage through the C ABI),
# and the check that the stage executables write the CSV header of fa_course.schema. No GPU, no
# PyTorch, no NumPy: any Python 3.9+ runs them. Included from tests/CMakeLists.txt.
#
# FA_REQUIRE_LIB=1: a test that needs the built library or executable fails, instead of skipping,
# when it is missing; REQUIRED_FILES keeps ctest from running them before the targets are built.

if(NOT DEFINED Python3_EXECUTABLE AND EXISTS "${PROJECT_SOURCE_DIR}/.venv/bin/python")
  set(Python3_EXECUTABLE "${PROJECT_SOURCE_DIR}/.venv/bin/python")  # scripts/test.sh's venv, when there
endif()
find_package(Python3 3.9 COMPONENTS Interpreter)

if(NOT Python3_Interpreter_FOUND)
  message(WARNING "No Python 3.9+ interpreter: the fa_course package tests are not registered")
elseif(TARGET fa_capi AND TARGET 01_cpu)
  add_test(NAME "python: fa_course package"
    COMMAND ${Python3_EXECUTABLE} -m unittest discover -s ${PROJECT_SOURCE_DIR}/tests/python -t
            ${PROJECT_SOURCE_DIR}/tests/python)
  set_tests_properties("python: fa_course package" PROPERTIES
    ENVIRONMENT "FA_CAPI_LIB=$<TARGET_FILE:fa_capi>;FA_REQUIRE_LIB=1;PYTHONDONTWRITEBYTECODE=1"
    REQUIRED_FILES "$<TARGET_FILE:fa_capi>"
    # a test skipped inside would show as passed here: with FA_REQUIRE_LIB=1 nothing may skip
    FAIL_REGULAR_EXPRESSION "skipped=[1-9]")

  add_test(NAME "python: the stages' CSV header is fa_course.schema's"
    COMMAND ${Python3_EXECUTABLE} ${PROJECT_SOURCE_DIR}/tests/python/csv_header_check.py $<TARGET_FILE:01_cpu>)
  set_tests_properties("python: the stages' CSV header is fa_course.schema's" PROPERTIES
    ENVIRONMENT "FA_REQUIRE_LIB=1;PYTHONDONTWRITEBYTECODE=1"
    REQUIRED_FILES "$<TARGET_FILE:01_cpu>")
else()
  message(WARNING "fa_capi or 01_cpu is not a target here: the fa_course package tests are not registered")
endif()
