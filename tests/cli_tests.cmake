# The stage executables themselves: bad command lines exit non-zero; the walkthrough agrees.
function(fa_add_rejection_test stage number name)
  add_test(NAME "stage${number}: command line rejects ${name}" COMMAND ${stage} ${ARGN})
  set_tests_properties("stage${number}: command line rejects ${name}" PROPERTIES WILL_FAIL TRUE)
endfunction()

fa_add_rejection_test(01_cpu 01 "N = 0" --seq 0)
fa_add_rejection_test(01_cpu 01 "D = 0" --dim 0)
fa_add_rejection_test(01_cpu 01 "a negative batch" --batch -3)
fa_add_rejection_test(01_cpu 01 "an absurd N" --seq 1000000000000)
fa_add_rejection_test(01_cpu 01 "D beyond the stage's largest" --dim 257)
fa_add_rejection_test(01_cpu 01 "an unknown flag" --frobnicate)

add_test(NAME "stage01: --walkthrough prints the exact values and agrees" COMMAND 01_cpu --walkthrough)
set_tests_properties("stage01: --walkthrough prints the exact values and agrees" PROPERTIES
  PASS_REGULAR_EXPRESSION "after K/V tile 1.*the stage agrees with the exact values")
# Stage 11's walkthrough goes on to the backward pass: on a GPU the kernel's dQ, dK and dV beside the
# exact values; without one the exact values (D_i, P, dS, the gradients) and the command that shows
# the C++ backward's beside them. Either way it never disagrees.
if(TARGET 11_backward)
  set(name "stage11: --walkthrough shows the backward's exact D_i, P, dS, dQ, dK and dV and the stage's own")
  add_test(NAME "${name}" COMMAND 11_backward --walkthrough)
  set_tests_properties("${name}" PROPERTIES
    PASS_REGULAR_EXPRESSION
      "D_i = rowsum.*P = exp.*dS = P.*dV:.*(and in dQ, dK and dV|fa_course --walkthrough shows its dQ, dK and dV)"
    FAIL_REGULAR_EXPRESSION "DISAGREES")
endif()
add_test(NAME "stage01: runs a small problem from the command line" COMMAND 01_cpu --seq 100 --dim 16 --reps 1)
set_tests_properties("stage01: runs a small problem from the command line" PROPERTIES
  PASS_REGULAR_EXPRESSION "01_cpu +fp32 .* ok")

# General shapes from the command line: stage 01 takes grouped-query heads, Nq != Nk and the
# log-sum-exp; the stages that predate them refuse each with one line and exit code 2 (bad input),
# on any machine: the refusal comes before any GPU is touched.
add_test(NAME "stage01: runs grouped-query, Nq != Nk, causal, with the log-sum-exp"
         COMMAND 01_cpu --heads 8 --kv-heads 2 --seq 37 --seq-k 101 --dim 16 --causal --lse --reps 1)
set_tests_properties("stage01: runs grouped-query, Nq != Nk, causal, with the log-sum-exp" PROPERTIES
  PASS_REGULAR_EXPRESSION "B=1 Hq=8 Hkv=2 Nq=37 Nk=101 D=16 causal.*01_cpu +fp32 .* ok")
set(fa_expect_refusal ${CMAKE_CURRENT_SOURCE_DIR}/expect_refusal.sh)
foreach(id IN LISTS stage_ids)
  string(SUBSTRING ${id} 0 2 number)
  if(number STRLESS "02" OR number STRGREATER "07")
    continue()
  endif()
  add_test(NAME "stage${number}: command line refuses grouped-query heads in one line"
           COMMAND ${fa_expect_refusal} 2 "stage ${id} takes only Hkv = Hq" $<TARGET_FILE:${id}> --heads 4 --kv-heads 2)
  add_test(NAME "stage${number}: command line refuses Nq != Nk in one line"
           COMMAND ${fa_expect_refusal} 2 "stage ${id} takes only Nq = Nk" $<TARGET_FILE:${id}> --seq 64 --seq-k 128)
  add_test(NAME "stage${number}: command line refuses the log-sum-exp in one line"
           COMMAND ${fa_expect_refusal} 2 "stage ${id} does not write the log-sum-exp" $<TARGET_FILE:${id}> --lse)
endforeach()

# The two ceiling tools take no arguments: one is refused in a line with exit code 2 before the GPU is
# looked for (a machine without one answers it too), and --help prints the usage.
set(ceiling_stages 08 12)
set(ceiling_tools fa_mma_ceiling fa_read_ceiling)
foreach(number tool IN ZIP_LISTS ceiling_stages ceiling_tools)
  if(TARGET ${tool})
    add_test(NAME "stage${number}: ${tool} refuses an argument in one line, before looking for a GPU"
             COMMAND ${fa_expect_refusal} 2 "^${tool}: takes no arguments, not '--bogus'" $<TARGET_FILE:${tool}> --bogus)
    add_test(NAME "stage${number}: ${tool} --help prints its usage" COMMAND ${tool} --help)
    set_tests_properties("stage${number}: ${tool} --help prints its usage" PROPERTIES
      PASS_REGULAR_EXPRESSION "^usage: ${tool}")
  endif()
endforeach()

# Stage 12's read ceiling runs and prints its one row; the tool itself fails (exit 6) on a rate
# above the memory's peak, which only a timing error could give. Exit 4 (no CUDA device, or one
# older than sm_80) is a skip.
if(TARGET fa_read_ceiling)
  add_test(NAME "stage12: fa_read_ceiling prints a read bandwidth under the memory's peak" COMMAND fa_read_ceiling)
  set_tests_properties("stage12: fa_read_ceiling prints a read bandwidth under the memory's peak" PROPERTIES
    PASS_REGULAR_EXPRESSION "^read_bandwidth,[0-9.e+]+,GB/s" SKIP_RETURN_CODE 4)
endif()
