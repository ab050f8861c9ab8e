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
add_test(NAME "stage01: runs a small problem from the command line" COMMAND 01_cpu --seq 100 --dim 16 --reps 1)
set_tests_properties("stage01: runs a small problem from the command line" PROPERTIES
  PASS_REGULAR_EXPRESSION "01_cpu +fp32 .* ok")
