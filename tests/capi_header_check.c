/* Compiled as C99 by ctest ("capi: the header compiles as C"): api/fa_capi.h must stay a C
 * header, and its structs must have the layout it documents (the one ctypes mirrors), in C too. */
#include <stddef.h>

#include "fa_capi.h"

/* C99 has no _Static_assert: an array of negative size fails to compile. */
#define FA_CHECK(name, condition) typedef char fa_check_##name[(condition) ? 1 : -1]

FA_CHECK(problem_size, sizeof(fa_problem) == FA_PROBLEM_SIZE_V2);
FA_CHECK(problem_layout, offsetof(fa_problem, batch) == 8 && offsetof(fa_problem, q_heads) == 16 &&
                             offsetof(fa_problem, kv_heads) == 24 && offsetof(fa_problem, q_seq) == 32 &&
                             offsetof(fa_problem, kv_seq) == 40 && offsetof(fa_problem, dim) == 48 &&
                             offsetof(fa_problem, causal) == 56);
FA_CHECK(forward_args_size, sizeof(fa_forward_args) == FA_FORWARD_ARGS_SIZE_V2);
FA_CHECK(forward_args_layout, offsetof(fa_forward_args, problem) == 8 && offsetof(fa_forward_args, q) == 16 &&
                                  offsetof(fa_forward_args, k) == 24 && offsetof(fa_forward_args, v) == 32 &&
                                  offsetof(fa_forward_args, o) == 40 && offsetof(fa_forward_args, lse) == 48 &&
                                  offsetof(fa_forward_args, workspace) == 56 &&
                                  offsetof(fa_forward_args, stream) == 64);
FA_CHECK(backward_args_size, sizeof(fa_backward_args) == FA_BACKWARD_ARGS_SIZE_V4);
FA_CHECK(backward_args_layout,
         offsetof(fa_backward_args, problem) == 8 && offsetof(fa_backward_args, q) == 16 &&
             offsetof(fa_backward_args, k) == 24 && offsetof(fa_backward_args, v) == 32 &&
             offsetof(fa_backward_args, o) == 40 && offsetof(fa_backward_args, grad_o) == 48 &&
             offsetof(fa_backward_args, lse) == 56 && offsetof(fa_backward_args, grad_q) == 64 &&
             offsetof(fa_backward_args, grad_k) == 72 && offsetof(fa_backward_args, grad_v) == 80 &&
             offsetof(fa_backward_args, workspace) == 88 && offsetof(fa_backward_args, stream) == 96 &&
             offsetof(fa_backward_args, deterministic) == FA_BACKWARD_ARGS_SIZE_V2);

/* Every call, as a C caller writes it (not linked: -fsyntax-only). */
int fa_header_check(const void* q, const void* k, const void* v, void* o, float* lse, void* stream);
int fa_header_check(const void* q, const void* k, const void* v, void* o, float* lse, void* stream) {
  fa_problem problem;
  fa_forward_args args;
  fa_backward_args backward;
  fa_problem zeroed = {0};
  enum fa_status status;
  int64_t bytes;
  fa_init_problem(&problem);
  problem.batch = 1;
  problem.q_heads = 32;
  problem.kv_heads = 8;
  problem.q_seq = 16;
  problem.kv_seq = 4096;
  problem.dim = 128;
  problem.causal = 1;
  bytes = fa_workspace_bytes_v2("08_mma_registers", &problem, FA_PASS_FORWARD);
  fa_init_forward_args(&args);
  args.problem = &problem;
  args.q = q;
  args.k = k;
  args.v = v;
  args.o = o;
  args.lse = lse;
  args.stream = stream;
  status = (enum fa_status)fa_forward_v2("08_mma_registers", &args);
  fa_init_backward_args(&backward);
  backward.problem = &problem;
  backward.deterministic = 1;
  if (fa_backward_v2("08_mma_registers", &backward) != FA_UNSUPPORTED) return 1;
  if ((fa_stage_features("01_cpu") & (FA_FEATURE_GROUPED | FA_FEATURE_BACKWARD)) == 0) return 2;
  if (fa_stage_architecture("01_cpu") == NULL || fa_stage_kv_passes("01_cpu") < 0.0) return 3;
  if (fa_abi_version() != 4 || zeroed.size != 0) return 4;
  if (fa_workspace_bytes("04_online_softmax", 1, 16, 4096, 128, 0) != bytes) return 5;
  if (fa_forward("04_online_softmax", 1, 16, 4096, 128, 0, q, k, v, o, NULL, stream) != FA_OK) return 6;
  if (fa_stage_count() < 1 || fa_stage_id(0) == NULL || fa_stage_title("01_cpu") == NULL) return 7;
  if (fa_stage_backend("01_cpu") == NULL || fa_stage_precision("01_cpu") == NULL) return 8;
  if (fa_stage_source_hash("01_cpu") == NULL || fa_stage_max_dim("01_cpu") < 1) return 9;
  if (fa_stage_min_compute_capability("01_cpu") < 0 || fa_tolerance("fp16", 1.0) < 0.0) return 10;
  if (fa_last_error()[0] != '\0') return 11;
  return status;
}
