# bin/15_ring, stage 15's command line (stages/15_ring/main.cpp): its refusals, one line each with
# exit code 2 before any GPU is looked for, and without a GPU the one line and exit code 4. The
# tests hide the GPU (CUDA_VISIBLE_DEVICES empty), so that they check the same thing on any machine.
set(fa_ring $<TARGET_FILE:15_ring>)

add_test(NAME "stage15: bin/15_ring --help shows the ranks' flags and the exit codes" COMMAND 15_ring --help)
set_tests_properties("stage15: bin/15_ring --help shows the ranks' flags and the exit codes"
  PROPERTIES PASS_REGULAR_EXPRESSION "--gpus.*--loopback.*--backward-stage.*Exit codes: 0 ok")

function(fa_ring_refusal name pattern)
  set(test "stage15: bin/15_ring refuses ${name} in one line")
  add_test(NAME "${test}" COMMAND ${fa_expect_refusal} 2 "${pattern}" ${fa_ring} ${ARGN})
  set_tests_properties("${test}" PROPERTIES ENVIRONMENT "CUDA_VISIBLE_DEVICES=")
endfunction()
fa_ring_refusal("D = 0" "^15_ring: --dim: .*0.* \\(see --help\\)$" --loopback 2 --dim 0)
fa_ring_refusal("D = 257" "^15_ring: --dim: .*257.* \\(see --help\\)$" --loopback 2 --dim 257)
fa_ring_refusal("a word for N" "^15_ring: --seq: .*abc.* \\(see --help\\)$" --loopback 2 --seq abc)
fa_ring_refusal("an unknown flag" "^15_ring: .*--frobnicate.* \\(see --help\\)$" --loopback 2 --frobnicate)
fa_ring_refusal("both --gpus and --loopback" "^15_ring: .*excludes.* \\(see --help\\)$" --gpus 2 --loopback 2)
fa_ring_refusal("no ranks" "^15_ring: say how many ranks: --gpus P .* or --loopback P" --seq 64)
fa_ring_refusal("Hkv that does not divide Hq" "^15_ring: --kv-heads 3 does not divide --heads 4" --loopback 2 --heads 4
                --kv-heads 3)
fa_ring_refusal("N that the zigzag cannot split" "^15_ring: N = 100 is not a multiple of 2·P = 8" --loopback 4 --seq 100)

set(test "stage15: bin/15_ring without a GPU says so in one line, exit 4")
add_test(NAME "${test}" COMMAND ${fa_expect_refusal} 4 "^15_ring: .*GPU" ${fa_ring} --loopback 2 --seq 64)
set_tests_properties("${test}" PROPERTIES ENVIRONMENT "CUDA_VISIBLE_DEVICES=")
