/* The course's stages behind plain C functions, for ctypes and any language with a C FFI.
 *
 * Build: the `fa_capi` target (build/lib/libfa_capi.so). Only the fa_* functions below are
 * exported; the CUDA runtime is linked in statically, so the library needs nothing but the
 * NVIDIA driver. The header is C99 and C++ alike.
 *
 * Tensors are contiguous, row-major, dim fastest, of the stage's precision (fa_stage_precision:
 * "fp32" float, "fp16" IEEE half, "bf16" bfloat16). CUDA stages take device pointers on the current
 * device and run asynchronously on `stream` (NULL: the legacy default stream); the CPU stage takes
 * host pointers and returns when its outputs are written.
 *
 *   fa_problem problem;
 *   fa_forward_args args;
 *   fa_init_problem(&problem);              (zeroes the struct and sets problem.size)
 *   problem.batch = 1; problem.q_heads = 32; problem.kv_heads = 8;
 *   problem.q_seq = 16; problem.kv_seq = 4096; problem.dim = 128; problem.causal = 1;
 *   int64_t bytes = fa_workspace_bytes_v2("08_mma_registers", &problem, FA_PASS_FORWARD);
 *   ... allocate q, k, v, o, lse and a workspace of `bytes` bytes (NULL when 0) ...
 *   fa_init_forward_args(&args);
 *   args.problem = &problem; args.q = q; args.k = k; args.v = v; args.o = o; args.lse = lse;
 *   args.workspace = workspace; args.stream = stream;
 *   if (fa_forward_v2("08_mma_registers", &args) != FA_OK) fprintf(stderr, "%s\n", fa_last_error());
 *
 * ABI versions. Version 1 (fa_forward, fa_workspace_bytes) takes the square (B, H, N, D) problem
 * as plain arguments; it stays, as thin wrappers over version 2. Version 2 takes size-prefixed
 * structs. Version 3 adds the FP8 forward pass (fa_fp8_*, at the end), and changes nothing of
 * version 2. Version 4 (fa_abi_version() == 4) adds fa_backward_args.deterministic, past the end of
 * the version-2 struct. The layouts are natural alignment on a 64-bit platform (LP64, the
 * only kind CUDA supports); the struct declarations below are the layout, in this order:
 *
 *   fa_problem        64 bytes: size @0, batch @8, q_heads @16, kv_heads @24, q_seq @32,
 *                     kv_seq @40, dim @48, causal @56 (int32), 4 bytes of padding
 *   fa_forward_args   72 bytes: size @0, problem @8, q @16, k @24, v @32, o @40, lse @48,
 *                     workspace @56, stream @64
 *   fa_backward_args 112 bytes: size @0, problem @8, q @16, k @24, v @32, o @40, grad_o @48,
 *                     lse @56, grad_q @64, grad_k @72, grad_v @80, workspace @88, stream @96,
 *                     deterministic @104 (int32), 4 bytes of padding
 *   fa_fp8_quantize_args 112 bytes: size @0, problem @8, dtype @16, rotate @20, q @24, k @32, v @40,
 *                     q_fp8 @48, k_fp8 @56, v_fp8 @64, q_descale @72, k_descale @80, v_descale @88,
 *                     workspace @96, stream @104
 *   fa_fp8_forward_args 112 bytes: size @0, problem @8, out_dtype @16, v_layout @20, qk_dim @24,
 *                     q @32, k @40, v @48, q_descale @56, k_descale @64, v_descale @72, o @80,
 *                     lse @88, workspace @96, stream @104
 *
 * The size-prefix rule, the same for every struct:
 *   - `size` is the caller's sizeof of the struct (FFI callers: ctypes.sizeof of their mirror).
 *   - A size below the size of the version that brought the struct (FA_*_SIZE_V2, FA_*_SIZE_V3)
 *     is refused with FA_INVALID_ARGUMENT: the struct cannot hold the fields every caller must set
 *     (or `size` was never set).
 *   - A larger size (a caller built against a newer header) is taken: the library reads the
 *     fields it knows. The bytes past them must be zero (a later field's zero means "as before");
 *     a nonzero one asks for something this library does not know, and the call returns
 *     FA_UNSUPPORTED instead of silently ignoring it. So zero the whole struct before filling it
 *     (fa_init_* do; so does `= {0}` in C, `{}` in C++ and every ctypes.Structure).
 *   - Later versions add fields only at the end, past today's size (never in the padding), and
 *     give each a default of zero.
 */
#ifndef FA_CAPI_H
#define FA_CAPI_H

#include <stdint.h>
#include <string.h>

#if defined(FA_CAPI_BUILDING)
#define FA_CAPI_EXPORT __attribute__((visibility("default")))
#else
#define FA_CAPI_EXPORT
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* What every status-returning call returns; fa_last_error() says why when it is not FA_OK. */
enum fa_status {
  FA_OK = 0,
  FA_UNKNOWN_STAGE = 1,    /* no stage has that id */
  FA_INVALID_SHAPE = 2,    /* a size is < 1 or absurd, q_heads is not a multiple of kv_heads, or dim
                              exceeds the stage's maximum */
  FA_UNSUPPORTED = 3,      /* a valid request this stage (or this library) does not take: causal
                              masking, GQA, q_seq != kv_seq, the LSE or the backward pass on a stage
                              without them; a GPU of the wrong architecture; a nonzero field past
                              what this library knows */
  FA_CUDA_ERROR = 4,       /* the CUDA runtime reported an error (no device, a failed launch) */
  FA_INVALID_ARGUMENT = 5, /* a NULL pointer, a struct size too small, a missing workspace, host
                              memory for a CUDA stage (or device memory for the CPU stage) */
  FA_INTERNAL_ERROR = 6    /* anything else; fa_last_error says what */
};

/* ---- Version 2: general problems, the log-sum-exp, the backward pass -------------------------
 *
 * Q and O are (batch, q_heads, q_seq, dim); K and V are (batch, kv_heads, kv_seq, dim). q_heads
 * is a multiple of kv_heads: query head h reads key/value head h / (q_heads / kv_heads). With
 * `causal`, query row i sees keys 0 .. i + kv_seq - q_seq (aligned to the bottom-right corner,
 * PyTorch's causal_lower_right); a row that sees no key gets O = 0 and LSE = -inf. The scale is
 * 1 / sqrt(dim). LSE is FP32, (batch, q_heads, q_seq): the natural log of each row's softmax
 * denominator over the scaled scores. Which of these a stage takes: fa_stage_features. */

typedef struct fa_problem {
  uint32_t size; /* the caller's sizeof(fa_problem); see the size-prefix rule above */
  int64_t batch;
  int64_t q_heads;
  int64_t kv_heads;
  int64_t q_seq;
  int64_t kv_seq;
  int64_t dim;
  int32_t causal; /* 0: no mask; 1: causal, bottom-right aligned. Other values are refused. */
} fa_problem;

typedef struct fa_forward_args {
  uint32_t size; /* the caller's sizeof(fa_forward_args) */
  const fa_problem* problem;
  const void* q;
  const void* k;
  const void* v;
  void* o;
  float* lse;      /* optional (NULL: not written); needs FA_FEATURE_LSE */
  void* workspace; /* fa_workspace_bytes_v2(..., FA_PASS_FORWARD) bytes; may be NULL when that is 0 */
  void* stream;    /* a cudaStream_t; NULL: the legacy default stream. Ignored by the CPU stage. */
} fa_forward_args;

typedef struct fa_backward_args {
  uint32_t size; /* the caller's sizeof(fa_backward_args) */
  const fa_problem* problem;
  const void* q;
  const void* k;
  const void* v;
  const void* o;
  const void* grad_o;
  const float* lse; /* the forward's log-sum-exp (required) */
  void* grad_q;     /* shaped like q */
  void* grad_k;     /* shaped like k */
  void* grad_v;     /* shaped like v */
  void* workspace;  /* fa_workspace_bytes_v2(..., FA_PASS_BACKWARD) bytes; may be NULL when that is 0 */
  void* stream;
  /* Version 4. 1: dQ bitwise the same from run to run (stages 11 and 13 order its additions, at a
   * price their READMEs measure); 0 (a version-2 caller's size stops before it): the fastest order.
   * Other values are refused. */
  int32_t deterministic;
} fa_backward_args;

/* The version-2 sizes: the smallest `size` each struct may carry (LP64). */
#define FA_PROBLEM_SIZE_V2 64u
#define FA_FORWARD_ARGS_SIZE_V2 72u
#define FA_BACKWARD_ARGS_SIZE_V2 104u
#define FA_BACKWARD_ARGS_SIZE_V4 112u /* with `deterministic` */

/* Zero the struct and set its size: call these first, then fill in the fields. Inline, so they
 * exist only for C and C++ callers; FFI callers zero their struct and set size themselves. */
static inline void fa_init_problem(fa_problem* problem) {
  memset(problem, 0, sizeof(*problem));
  problem->size = (uint32_t)sizeof(*problem);
}
static inline void fa_init_forward_args(fa_forward_args* args) {
  memset(args, 0, sizeof(*args));
  args->size = (uint32_t)sizeof(*args);
}
static inline void fa_init_backward_args(fa_backward_args* args) {
  memset(args, 0, sizeof(*args));
  args->size = (uint32_t)sizeof(*args);
}

/* The pass fa_workspace_bytes_v2 sizes the workspace for. */
enum fa_pass { FA_PASS_FORWARD = 0, FA_PASS_BACKWARD = 1 };

/* What a stage takes beyond the square, unmasked (B, H, N, D) forward pass (fa_stage_features). */
enum fa_feature {
  FA_FEATURE_CAUSAL = 1 << 0,
  FA_FEATURE_GROUPED = 1 << 1,     /* kv_heads < q_heads: grouped-query and multi-query attention */
  FA_FEATURE_RECTANGULAR = 1 << 2, /* q_seq != kv_seq */
  FA_FEATURE_LSE = 1 << 3,         /* writes the log-sum-exp when fa_forward_args.lse is set */
  FA_FEATURE_BACKWARD = 1 << 4     /* fa_backward_v2 */
};

/* 4 for this header's library. */
FA_CAPI_EXPORT int fa_abi_version(void);

/* Bytes of workspace `pass` (an fa_pass) needs for this problem (0: none), or -1 when the stage is
 * unknown or does not take the problem in that pass (fa_last_error says why). Needs no GPU. */
FA_CAPI_EXPORT int64_t fa_workspace_bytes_v2(const char* stage_id, const fa_problem* problem, int pass);

/* O = softmax(Q K^T / sqrt(dim)) V, and the LSE when args->lse is set. Returns an fa_status. The
 * problem and the features are checked before any pointer or GPU, so a problem the stage does not
 * take is refused (FA_INVALID_SHAPE, FA_UNSUPPORTED) the same way on a machine without a GPU. */
FA_CAPI_EXPORT int fa_forward_v2(const char* stage_id, const fa_forward_args* args);

/* dQ, dK, dV from Q, K, V, O, dO and the forward's LSE. FA_UNSUPPORTED for a stage without
 * FA_FEATURE_BACKWARD. */
FA_CAPI_EXPORT int fa_backward_v2(const char* stage_id, const fa_backward_args* args);

/* A bit set of enum fa_feature, or -1 for an unknown id. */
FA_CAPI_EXPORT int fa_stage_features(const char* stage_id);
/* "sm_80+" (that compute capability or newer), "sm_90a" (exactly that architecture), or "cpu";
 * NULL for an unknown id. */
FA_CAPI_EXPORT const char* fa_stage_architecture(const char* stage_id);
/* K/V reads per query tile the traffic model expects (1: FlashAttention's one pass); -1 unknown. */
FA_CAPI_EXPORT double fa_stage_kv_passes(const char* stage_id);

/* ---- Version 1: the square (B, H, N, D) forward pass, kept for existing callers --------------
 * Thin wrappers over version 2 with q_heads = kv_heads = heads, q_seq = kv_seq = seq, no LSE. */

/* Bytes of workspace fa_forward needs for this problem (0: none), or -1 for an unknown stage or
 * a shape the stage cannot run (fa_last_error says why). */
FA_CAPI_EXPORT int64_t fa_workspace_bytes(const char* stage_id, int64_t batch, int64_t heads, int64_t seq, int64_t dim,
                                          int causal);

/* O = softmax(Q K^T / sqrt(dim)) V. Returns an fa_status. `workspace` holds at least
 * fa_workspace_bytes(...) bytes, or is ignored when that is 0. `stream` is a cudaStream_t (a
 * PyTorch stream's .cuda_stream works: both share the device's primary context). */
FA_CAPI_EXPORT int fa_forward(const char* stage_id, int64_t batch, int64_t heads, int64_t seq, int64_t dim, int causal,
                              const void* q, const void* k, const void* v, void* o, void* workspace, void* stream);

/* ---- Stage facts (every version) -------------------------------------------------------------- */

/* The stages in course order: ids "01_cpu", "02_naive_gpu", ... */
FA_CAPI_EXPORT int fa_stage_count(void);
/* The name the calls above take for stage `index`: the stage's folder name, or "folder/precision"
 * (e.g. "07_fp16_pipelined/bf16") for a stage's second descriptor in another precision. */
FA_CAPI_EXPORT const char* fa_stage_id(int index); /* NULL when out of range */

/* Facts about one stage; NULL (or -1) for an unknown id. Strings live as long as the library. */
FA_CAPI_EXPORT const char* fa_stage_title(const char* stage_id);
FA_CAPI_EXPORT const char* fa_stage_backend(const char* stage_id);     /* "cpu" or "cuda" */
FA_CAPI_EXPORT const char* fa_stage_precision(const char* stage_id);   /* "fp32", "fp16" or "bf16" */
FA_CAPI_EXPORT const char* fa_stage_source_hash(const char* stage_id); /* DESIGN.md's source_hash */
FA_CAPI_EXPORT int64_t fa_stage_max_dim(const char* stage_id);
/* 80 for a stage that needs sm_80 or newer, 90 for an sm_90a stage (fa_stage_architecture says
 * which rule), 0 for the CPU stage. */
FA_CAPI_EXPORT int fa_stage_min_compute_capability(const char* stage_id);

/* The largest max-abs error a correct stage of `precision` ("fp32", "fp16", "bf16") may show when
 * max|V| is `max_abs_v` (the harness's fa::tolerance), or -1 for an unknown precision. */
FA_CAPI_EXPORT double fa_tolerance(const char* precision, double max_abs_v);

/* What went wrong in this thread's latest fa_workspace_bytes*, fa_forward*, fa_backward_v2 or
 * fa_fp8_* call; "" after a success. Valid until the thread's next such call. The stage-fact calls
 * leave it as it is. */
FA_CAPI_EXPORT const char* fa_last_error(void);

/* ---- Version 3: FP8 (e4m3) attention, the forward pass of stage 14 --------------------------
 *
 * Stage 14 is no stage of the registry (fa_stage_id does not list it): these calls are its own.
 * Forward only (there is no FP8 backward pass), on an H100 or H200 alone (compute capability 9.0
 * exactly: FA_UNSUPPORTED on any other GPU, FA_CUDA_ERROR without one). The problem (fa_problem)
 * is the version-2 one: causal, grouped-query heads and q_seq != kv_seq as there, dim 1 .. 256, the
 * scale 1 / sqrt(dim); O is FP16 or BF16, the LSE FP32 as there. Not yet run on a GPU.
 *
 * Shapes, with Dpad = 64, 128 or 256 (the first that holds dim), Nk_pad = kv_seq rounded up to a
 * multiple of 16, Bq = ceil(q_seq / 128) and Bk = ceil(kv_seq / 128):
 *   q   e4m3 (batch, q_heads, q_seq, qk_dim)      q_descale float (batch, q_heads, Bq)
 *   k   e4m3 (batch, kv_heads, kv_seq, qk_dim)    k_descale float (batch, kv_heads, Bk)
 *   v   FA_FP8_V_ROWS:       e4m3 (batch, kv_heads, kv_seq, dim), v_descale (batch, kv_heads, dim)
 *       FA_FP8_V_TRANSPOSED: e4m3 (batch, kv_heads, Dpad, Nk_pad), v_descale (batch, kv_heads, Dpad):
 *       the kernel's V^T, each group of 16 keys permuted, as fa_fp8_quantize writes it
 * A value is descale * e4m3: Q's row i of head h uses q_descale[b][h][i / 128], K's key j
 * k_descale[b][g][j / 128], V's channel d v_descale[b][g][d]. So
 *   O = softmax((q_descale * Q)(k_descale * K)^T / sqrt(dim)) (V * v_descale).
 * qk_dim is dim or Dpad (rows padded with zeros, or rotated: Q and K may be multiplied by the same
 * orthogonal matrix, which leaves Q K^T as it is; fa_fp8_quantize rotates and writes rows of Dpad).
 * FlashAttention-3 takes one descale per (batch, kv head) for each of Q, K and V: repeat it over
 * the blocks (and over each kv head's query heads for Q, and over the channels for V).
 * Tensors are device pointers on the current device, contiguous; the e4m3 tensors and the workspace
 * (fa_fp8_workspace_bytes) start on 16- and 256-byte boundaries. Everything runs on `stream`. */

enum fa_dtype { FA_DTYPE_FP16 = 1, FA_DTYPE_BF16 = 2 };
enum fa_fp8_v_layout { FA_FP8_V_ROWS = 0, FA_FP8_V_TRANSPOSED = 1 };
/* The call fa_fp8_workspace_bytes sizes the workspace for. */
enum fa_fp8_call { FA_FP8_QUANTIZE = 0, FA_FP8_FORWARD = 1, FA_FP8_ATTENTION = 2 };

/* 16-bit Q, K, V to e4m3 and their descales: Q and K per block of 128 rows (rows of Dpad codes,
 * rotated when `rotate`), V per channel, written FA_FP8_V_TRANSPOSED. */
typedef struct fa_fp8_quantize_args {
  uint32_t size; /* the caller's sizeof(fa_fp8_quantize_args) */
  const fa_problem* problem;
  int32_t dtype;  /* fa_dtype of q, k and v */
  int32_t rotate; /* 1: rotate Q and K (a Hadamard transform) first, the accurate choice; 0: do not */
  const void* q;
  const void* k;
  const void* v;
  void* q_fp8; /* (batch, q_heads, q_seq, Dpad) */
  void* k_fp8; /* (batch, kv_heads, kv_seq, Dpad) */
  void* v_fp8; /* (batch, kv_heads, Dpad, Nk_pad) */
  float* q_descale;
  float* k_descale;
  float* v_descale; /* (batch, kv_heads, Dpad) */
  void* workspace;  /* fa_fp8_workspace_bytes(problem, FA_FP8_QUANTIZE) bytes */
  void* stream;
} fa_fp8_quantize_args;

/* The attention on e4m3 tensors with their descales. */
typedef struct fa_fp8_forward_args {
  uint32_t size; /* the caller's sizeof(fa_fp8_forward_args) */
  const fa_problem* problem;
  int32_t out_dtype; /* fa_dtype of o */
  int32_t v_layout;  /* fa_fp8_v_layout */
  int64_t qk_dim;    /* codes per row of q and k: dim (0 says the same) or Dpad */
  const void* q;
  const void* k;
  const void* v;
  const float* q_descale;
  const float* k_descale;
  const float* v_descale;
  void* o;         /* (batch, q_heads, q_seq, dim) */
  float* lse;      /* optional (NULL: not written) */
  void* workspace; /* fa_fp8_workspace_bytes(problem, FA_FP8_FORWARD) bytes; NULL is enough when
                      qk_dim is Dpad and v is FA_FP8_V_TRANSPOSED (nothing to rearrange) */
  void* stream;
} fa_fp8_forward_args;

#define FA_FP8_QUANTIZE_ARGS_SIZE_V3 112u
#define FA_FP8_FORWARD_ARGS_SIZE_V3 112u

static inline void fa_init_fp8_quantize_args(fa_fp8_quantize_args* args) {
  memset(args, 0, sizeof(*args));
  args->size = (uint32_t)sizeof(*args);
}
static inline void fa_init_fp8_forward_args(fa_fp8_forward_args* args) {
  memset(args, 0, sizeof(*args));
  args->size = (uint32_t)sizeof(*args);
}

/* Bytes of workspace `call` (an fa_fp8_call) needs for this problem, or -1 when it does not take
 * the problem (fa_last_error says why). Needs no GPU. */
FA_CAPI_EXPORT int64_t fa_fp8_workspace_bytes(const fa_problem* problem, int call);

/* Quantizes, as fa_fp8_quantize_args says. Returns an fa_status. */
FA_CAPI_EXPORT int fa_fp8_quantize(const fa_fp8_quantize_args* args);

/* O (and the LSE when args->lse is set) from e4m3 inputs. Returns an fa_status. */
FA_CAPI_EXPORT int fa_fp8_forward(const fa_fp8_forward_args* args);

/* Both in one call: 16-bit Q, K, V (`dtype`, an fa_dtype) in, O of that type out (the LSE when
 * args->lse is set), Q and K rotated when `rotate`; args->workspace holds
 * fa_fp8_workspace_bytes(problem, FA_FP8_ATTENTION) bytes. Returns an fa_status. */
FA_CAPI_EXPORT int fa_fp8_attention(const fa_forward_args* args, int dtype, int rotate);

#ifdef __cplusplus
}
#endif

#endif /* FA_CAPI_H */
