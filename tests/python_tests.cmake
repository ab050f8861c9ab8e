# The Python package (python/fa_course) in ctest: its unit tests (schema formulas, CSV reading and
# writing, the ctypes declarations against api/fa_capi.h, the CPU stage through the C ABI, the
# choice of stages for the PyTorch op), and the check that the stage executables write the CSV
# header of fa_course.bench.schema. No GPU, no PyTorch, no NumPy: any Python 3.9+ runs them. Then the
# PyTorch op's tests (pytest), which skip without PyTorch. Included from tests/CMakeLists.txt.
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

  add_test(NAME "python: the stages' CSV header is fa_course.bench.schema's"
    COMMAND ${Python3_EXECUTABLE} ${PROJECT_SOURCE_DIR}/tests/python/csv_header_check.py $<TARGET_FILE:01_cpu>)
  set_tests_properties("python: the stages' CSV header is fa_course.bench.schema's" PROPERTIES
    ENVIRONMENT "FA_REQUIRE_LIB=1;PYTHONDONTWRITEBYTECODE=1"
    REQUIRED_FILES "$<TARGET_FILE:01_cpu>")

  # fa_course.ops, the op for PyTorch (tests/torch/test_op.py, under pytest through tests/torch/run.py):
  # on the CPU stages with PyTorch alone, and on the GPU stages. Exit code 77 is ctest's "skipped"
  # (no PyTorch or pytest, no GPU, no backward stage, or a test inside skipped: the reason is
  # printed); FA_REQUIRE_GPU=1 in the environment (the GPU suite) makes that a failure. The
  # interpreter is the first of Python3_EXECUTABLE (.venv, which CI keeps free of PyTorch) and the
  # `python3` on PATH that imports both torch and pytest ($FA_TORCH_PYTHON chooses one).
  if(NOT FA_TORCH_PYTHON)
    find_program(FA_PATH_PYTHON3 NAMES python3 NO_CACHE)
    foreach(candidate IN ITEMS "${Python3_EXECUTABLE}" "${FA_PATH_PYTHON3}")
      if(candidate AND NOT FA_TORCH_PYTHON)
        execute_process(COMMAND ${candidate} -c "import torch, pytest" RESULT_VARIABLE imports_torch
                        OUTPUT_QUIET ERROR_QUIET)
        if(imports_torch EQUAL 0)
          set(FA_TORCH_PYTHON "${candidate}")
        endif()
      endif()
    endforeach()
    if(NOT FA_TORCH_PYTHON)
      set(FA_TORCH_PYTHON "${Python3_EXECUTABLE}")  # the tests say what is missing and skip
    endif()
  endif()
  # where python/CMakeLists.txt built the C++ autograd node, the tests check that the op runs it
  set(node_built "")
  if(TARGET fa_torch_node)
    set(node_built "FA_TORCH_NODE_BUILT=$<TARGET_FILE:fa_torch_node>;")
  endif()
  foreach(mode IN ITEMS cpu gpu fp8)
    set(name "python: fa_course.ops (PyTorch custom op) on the ${mode} stages")
    if(mode STREQUAL "fp8")
      set(name "python: fa_course.fp8 (FP8 forward, stage 14; its GPU tests need an H100 or H200)")
    endif()
    add_test(NAME "${name}" COMMAND ${FA_TORCH_PYTHON} ${PROJECT_SOURCE_DIR}/tests/torch/run.py ${mode})
    set_tests_properties("${name}" PROPERTIES
      ENVIRONMENT "${node_built}FA_CAPI_LIB=$<TARGET_FILE:fa_capi>;PYTHONDONTWRITEBYTECODE=1"
      REQUIRED_FILES "$<TARGET_FILE:fa_capi>"
      SKIP_RETURN_CODE 77
      TIMEOUT 600)
  endforeach()
else()
  message(WARNING "fa_capi or 01_cpu is not a target here: the fa_course package tests are not registered")
endif()

# The data set of the GPU whose rows the course README's headline table shows (scripts/make_tables.py,
# HEADLINE_GPU): its rows of the torch, torch_graph, memory and fp8 kinds must have been measured from
# this tree's code or carried to it by a restamp (`stale`, DESIGN.md "Results CSV"), so a refactor
# that changes what produced them cannot land without a restamp or a new measurement. The results
# kind (the bench phase, the longest) is left out: its rows may follow a change by a session, and
# `stale` lists them until then.
if(Python3_Interpreter_FOUND)
  add_test(NAME "data: the H200 rows of the headline kinds are current or restamped (torch, torch_graph, memory, fp8)"
    COMMAND ${Python3_EXECUTABLE} -m fa_course.bench.data stale ${PROJECT_SOURCE_DIR}/plots/data/NVIDIA_H200
            --fail --brief --kinds torch torch_graph memory fp8)
  set_tests_properties("data: the H200 rows of the headline kinds are current or restamped (torch, torch_graph, memory, fp8)"
    PROPERTIES ENVIRONMENT "PYTHONPATH=${PROJECT_SOURCE_DIR}/python;PYTHONDONTWRITEBYTECODE=1")
endif()
