# bin/14_fp8, stage 14's command line (stages/14_fp8/fp8_main.cpp): the harness's flags with their
# meanings, its refusals and exit codes, and the argument lists scripts/gpu_suite.sh builds for a
# forward stage. Most tests hide the GPU (CUDA_VISIBLE_DEVICES empty), so that they check the same
# thing on any machine: a command line that parses and validates gets as far as "no CUDA GPU" (exit
# 4) and stops there. The last two run the kernel on an H100 or H200 and are skipped (exit 4) elsewhere.
set(fa_fp8 $<TARGET_FILE:14_fp8>)
set(fa_no_gpu "CUDA_VISIBLE_DEVICES=")
set(fa_fp8_no_gpu_line "^14_fp8: this stage runs on an H100 or H200 \\(sm_90\\), and there is no CUDA GPU here: ")

add_test(NAME "stage14: bin/14_fp8 --help shows the shared flags, --precision, --rotate and the exit codes"
         COMMAND 14_fp8 --help)
set_tests_properties("stage14: bin/14_fp8 --help shows the shared flags, --precision, --rotate and the exit codes"
  PROPERTIES PASS_REGULAR_EXPRESSION "--kv-heads.*--check-rows.*--precision fp16\\|bf16.*--rotate, --no-rotate.*default: on.*Exit codes: 0 ok")

# Bad input: one line, exit code 2, before any GPU is looked for.
function(fa_fp8_refusal name pattern)
  add_test(NAME "stage14: bin/14_fp8 refuses ${name} in one line" COMMAND ${fa_expect_refusal} 2 "${pattern}" ${fa_fp8} ${ARGN})
endfunction()
fa_fp8_refusal("D = 0" "^14_fp8: --dim: 0 is out of range: D goes from 1 to 256" --dim 0)
fa_fp8_refusal("D = 257" "^14_fp8: --dim: 257 is out of range: D goes from 1 to 256" --dim 257)
fa_fp8_refusal("N = 0" "^14_fp8: --seq: 0 is out of range" --seq 0)
fa_fp8_refusal("Nk = 0" "^14_fp8: --seq-k: 0 is out of range" --seq-k 0)
fa_fp8_refusal("Hkv that does not divide Hq" "^14_fp8: --kv-heads 3 does not divide --heads 4" --heads 4 --kv-heads 3)
fa_fp8_refusal("an FP32 precision" "^14_fp8: --precision: fp32 not in" --precision fp32)
fa_fp8_refusal("an unknown flag" "^14_fp8: .*--frobnicate" --frobnicate)
fa_fp8_refusal("the backward pass" "^stage 14_fp8 has no backward pass" --pass bwd)
fa_fp8_refusal("an absurd problem" "^stage 14_fp8/bf16 refuses: " --precision bf16 --batch 1048576 --heads 1048576)

# bin/14_fp8_accuracy (the README's accuracy table, on the CPU) refuses a bad command line alike.
function(fa_fp8_accuracy_refusal name pattern)
  add_test(NAME "stage14: bin/14_fp8_accuracy refuses ${name} in one line"
           COMMAND ${fa_expect_refusal} 2 "${pattern}" $<TARGET_FILE:14_fp8_accuracy> ${ARGN})
endfunction()
fa_fp8_accuracy_refusal("N = 0" "^14_fp8_accuracy: --seq: .*0.* \\(see --help\\)$" --seq 0)
fa_fp8_accuracy_refusal("an unknown flag" "^14_fp8_accuracy: .*--frobnicate.* \\(see --help\\)$" --frobnicate)

# No GPU: the one line and exit code 4, for a plain call and for every argument list of
# scripts/gpu_suite.sh for a forward stage: phase_sanitize's shapes (with D = 256, the stage's widest
# bucket), run_point's (bench, causal, grouped- and multi-query), phase_memory's up to N = 2^20.
set(fa_fp8_suite_calls
  "plain|"
  "sanitize D=72|--batch 2 --heads 1 --seq 150 --dim 72 --warmup 0 --reps 1"
  "sanitize D=128|--batch 1 --heads 2 --seq 70 --dim 128 --warmup 0 --reps 1"
  "sanitize causal|--batch 1 --heads 2 --seq 150 --dim 64 --causal --warmup 0 --reps 1"
  "sanitize D=256|--batch 1 --heads 2 --seq 150 --dim 256 --causal --warmup 0 --reps 1"
  "sanitize D=200|--batch 2 --heads 1 --seq 70 --dim 200 --warmup 0 --reps 1"
  "bench|--batch 32 --heads 16 --seq 512 --dim 128 --warmup 3 --reps 10 --check-rows 64 --csv stage14_cli.csv"
  "bench causal|--batch 1 --heads 16 --seq 16384 --dim 128 --warmup 1 --reps 3 --check-rows 64 --csv stage14_cli.csv --causal"
  "bench grouped-query|--batch 1 --heads 32 --seq 4096 --dim 128 --warmup 3 --reps 10 --check-rows 64 --csv stage14_cli.csv --kv-heads 8"
  "bench N=2^17|--batch 1 --heads 1 --seq 131072 --dim 64 --warmup 1 --reps 3 --check-rows 64 --csv stage14_cli.csv"
  "memory N=2^20|--batch 1 --heads 1 --seq 1048576 --dim 128 --warmup 0 --reps 0 --check-rows 8 --csv stage14_cli.csv"
  "BF16, no rotation, LSE|--precision bf16 --no-rotate --lse --seq 300 --seq-k 77")
foreach(call IN LISTS fa_fp8_suite_calls)
  string(REPLACE "|" ";" parts "${call}")
  list(GET parts 0 name)
  list(LENGTH parts count)
  set(args "")
  if(count GREATER 1)
    list(GET parts 1 args)
    separate_arguments(args UNIX_COMMAND "${args}")
  endif()
  set(test "stage14: bin/14_fp8 without a GPU says so in one line, exit 4 (${name})")
  add_test(NAME "${test}" COMMAND ${fa_expect_refusal} 4 "${fa_fp8_no_gpu_line}" ${fa_fp8} ${args})
  set_tests_properties("${test}" PROPERTIES ENVIRONMENT "${fa_no_gpu}")
endforeach()

# A run that cannot start still leaves its row in the CSV, as the harness's: the results header, the
# stage (14_fp8/bf16 for BF16), the shape, `unsupported` and the source_hash of 14_fp8.
set(test "stage14: bin/14_fp8 without a GPU writes an unsupported row with the stage's source_hash")
add_test(NAME "${test}" COMMAND sh -c
  "rm -f stage14_row.csv; \"$0\" --seq 64 --csv stage14_row.csv; \"$0\" --precision bf16 --csv stage14_row.csv; cat stage14_row.csv"
  ${fa_fp8})
set_tests_properties("${test}" PROPERTIES ENVIRONMENT "${fa_no_gpu}"
  PASS_REGULAR_EXPRESSION
    "stage,gpu,B,Hq,Hkv,Nq,Nk,D,dtype,causal,pass,ms_median,ms_min,tflops,gbps,peak_bytes,max_abs_err,rel_l2_err,status,source_hash,note\n14_fp8,cpu,1,1,1,64,64,64,fp16,0,fwd,[^\n]*,unsupported,[0-9a-f]+,[^\n]*\n14_fp8/bf16,cpu,1,1,1,1024,1024,64,bf16,0,fwd,[^\n]*,unsupported,[0-9a-f]+,")

set(test "stage14: bin/14_fp8 --walkthrough without a GPU prints Q, K, V as e4m3 holds them and the CPU FP8 model's O")
add_test(NAME "${test}" COMMAND 14_fp8 --walkthrough)
set_tests_properties("${test}" PROPERTIES ENVIRONMENT "${fa_no_gpu}"
  PASS_REGULAR_EXPRESSION "V:.*row 3:.*Final O: exact \\(double\\), the CPU FP8 model; .*O\\[3\\]\\[1\\] +exact .*The kernel needs an H100 or H200")

# On an H100 or H200: the walkthrough's kernel agrees with the CPU model, and a small general shape
# runs, passes its check and prints the three timed rows. Skipped (exit 4) without one.
set(test "stage14: bin/14_fp8 --walkthrough runs the kernel beside the CPU FP8 model (sm_90)")
add_test(NAME "${test}" COMMAND 14_fp8 --walkthrough)
set_tests_properties("${test}" PROPERTIES SKIP_RETURN_CODE 4 FAIL_REGULAR_EXPRESSION "DISAGREES")
foreach(precision fp16 bf16)
  set(test "stage14: bin/14_fp8 checks and times grouped-query, causal, Nq != Nk, D = 100 with the LSE (${precision}, sm_90)")
  add_test(NAME "${test}" COMMAND 14_fp8 --precision ${precision} --batch 2 --heads 4 --kv-heads 2 --seq 200 --seq-k 333
                                  --dim 100 --causal --lse --warmup 1 --reps 2)
  set_tests_properties("${test}" PROPERTIES SKIP_RETURN_CODE 4)
endforeach()
