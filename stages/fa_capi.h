/* The course's stages behind plain C functions, for ctypes and any language with a C FFI.
 *
 * Build: the `fa_capi` target (build/lib/libfa_capi.so). Only the fa_* functions below are
 * exported; the CUDA runtime is linked in statically, so the library needs nothing but the
 * NVIDIA driver. Tensors are (batch, heads, seq, dim), contiguous, dim fastest, of the stage's
 * precision (fa_stage_precision: "fp32" float, "fp16" IEEE half, "bf16" bfloat16). CUDA stages
 * take device pointers and run asynchronously on `stream` (NULL: the legacy default stream);
 * the CPU stage takes host pointers and returns when O is written.
 *
 *   int64_t bytes = fa_workspace_bytes("04_online_softmax", 1, 16, 4096, 128, 0);
 *   ... allocate q, k, v, o and a workspace of `bytes` bytes (NULL when 0) ...
 *   if (fa_forward("04_online_softmax", 1, 16, 4096, 128, 0, q, k, v, o, ws, stream) != FA_OK)
 *     fprintf(stderr, "%s\n", fa_last_error());
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

enum fa_status {
  FA_OK = 0,
  FA_UNKNOWN_STAGE = 1,    /* no stage has that id */
  FA_INVALID_SHAPE = 2,    /* a size is zero, negative, absurd, or dim exceeds the stage's maximum */
  FA_UNSUPPORTED = 3,      /* valid, but not by this stage here: causal masking, a GPU too old */
  FA_CUDA_ERROR = 4,       /* the CUDA runtime reported an error (no device, a failed launch) */
  FA_INVALID_ARGUMENT = 5, /* a null pointer, a missing workspace, host memory for a CUDA stage */
  FA_INTERNAL_ERROR = 6    /* anything else; fa_last_error says what */
};

/* ---- Version 1: the square (B, H, N, D) forward pass, kept for existing callers --------------
 * Thin wrappers over the version 2 calls with q_heads = kv_heads = heads, q_seq = kv_seq = seq. */

/* Bytes of workspace fa_forward needs for this problem (0: none), or -1 for an unknown stage or
 * a shape the stage cannot run (fa_last_error says why). */
FA_CAPI_EXPORT int64_t fa_workspace_bytes(const char* stage_id, int64_t batch, int64_t heads, int64_t seq, int64_t dim,
                                          int causal);

/* O = softmax(Q K^T / sqrt(dim)) V. Returns an fa_status. `workspace` holds at least
 * fa_workspace_bytes(...) bytes, or is ignored when that is 0. `stream` is a cudaStream_t (a
 * PyTorch stream's .cuda_stream works: both share the device's primary context). */
FA_CAPI_EXPORT int fa_forward(const char* stage_id, int64_t batch, int64_t heads, int64_t seq, int64_t dim, int causal,
                              const void* q, const void* k, const void* v, void* o, void* workspace, void* stream);

/* ---- Version 2: general problems, the log-sum-exp, the backward pass -----------------------
 *
 * Every struct starts with its own size: set `size = sizeof(struct ...)` (FA_INIT_* below do).
 * The library reads only the fields a caller's size covers and takes defaults (0 / NULL) for the
 * rest, so fields can be added at the end without breaking callers built against an older header.
 * Q and O are (batch, q_heads, q_seq, dim); K and V (batch, kv_heads, kv_seq, dim); contiguous,
 * dim fastest. q_heads must be a multiple of kv_heads (query head h reads key/value head
 * h / (q_heads / kv_heads)). With `causal`, query i sees keys 0 .. i + kv_seq - q_seq (aligned to
 * the bottom-right corner, PyTorch's causal_lower_right); a row that sees no key gets O = 0 and
 * LSE = -inf. LSE is FP32, (batch, q_heads, q_seq), natural log of the softmax denominator of the
 * scaled scores. */

typedef struct fa_problem {
  uint32_t size; /* sizeof(fa_problem) */
  int64_t batch;
  int64_t q_heads;
  int64_t kv_heads;
  int64_t q_seq;
  int64_t kv_seq;
  int64_t dim;
  int32_t causal; /* 0 or 1 */
} fa_problem;

typedef struct fa_forward_args {
  uint32_t size; /* sizeof(fa_forward_args) */
  const fa_problem* problem;
  const void* q;
  const void* k;
  const void* v;
  void* o;
  float* lse; /* optional (NULL): the per-row log-sum-exp; needs FA_FEATURE_LSE */
  void* workspace;
  void* stream; /* a cudaStream_t; NULL: the legacy default stream */
} fa_forward_args;

typedef struct fa_backward_args {
  uint32_t size; /* sizeof(fa_backward_args) */
  const fa_problem* problem;
  const void* q;
  const void* k;
  const void* v;
  const void* o;
  const void* grad_o;
  const float* lse; /* the forward's log-sum-exp */
  void* grad_q;
  void* grad_k;
  void* grad_v;
  void* workspace;
  void* stream;
} fa_backward_args;

enum fa_pass { FA_PASS_FORWARD = 0, FA_PASS_BACKWARD = 1 };

/* What a stage takes beyond the square (B, H, N, D) forward pass (fa_stage_features). */
enum fa_feature {
  FA_FEATURE_CAUSAL = 1 << 0,
  FA_FEATURE_GROUPED = 1 << 1,     /* kv_heads < q_heads: grouped-query and multi-query attention */
  FA_FEATURE_RECTANGULAR = 1 << 2, /* q_seq != kv_seq */
  FA_FEATURE_LSE = 1 << 3,         /* writes the log-sum-exp when fa_forward_args.lse is set */
  FA_FEATURE_BACKWARD = 1 << 4     /* fa_backward_v2 */
};

/* Bytes of workspace the pass needs for this problem (0: none), or -1 when the stage is unknown or
 * does not take the problem (fa_last_error says why). */
FA_CAPI_EXPORT int64_t fa_workspace_bytes_v2(const char* stage_id, const fa_problem* problem, int pass);

/* O = softmax(Q K^T / sqrt(dim)) V, and the LSE when asked. Returns an fa_status: FA_UNSUPPORTED
 * with the reason in fa_last_error for a problem or feature the stage does not take. */
FA_CAPI_EXPORT int fa_forward_v2(const char* stage_id, const fa_forward_args* args);

/* dQ, dK, dV from Q, K, V, O, dO and the forward's LSE. FA_UNSUPPORTED for a stage without
 * FA_FEATURE_BACKWARD. */
FA_CAPI_EXPORT int fa_backward_v2(const char* stage_id, const fa_backward_args* args);

/* A bit set of enum fa_feature, or -1 for an unknown id. */
FA_CAPI_EXPORT int fa_stage_features(const char* stage_id);
/* "sm_80+", "sm_90a" (exactly that architecture), or "cpu"; NULL for an unknown id. */
FA_CAPI_EXPORT const char* fa_stage_architecture(const char* stage_id);
/* K/V reads per query tile the traffic model expects (1: FlashAttention's one pass); -1 unknown. */
FA_CAPI_EXPORT double fa_stage_kv_passes(const char* stage_id);
/* 2 for this header. */
FA_CAPI_EXPORT int fa_abi_version(void);

#define FA_INIT_PROBLEM(p)                 \
  do {                                     \
    memset(&(p), 0, sizeof(p));            \
    (p).size = (uint32_t)sizeof(p);        \
  } while (0)

/* ---- Stage facts ------------------------------------------------------------------------------ */

/* The stages in course order: ids "01_cpu", "02_naive_gpu", ... */
FA_CAPI_EXPORT int fa_stage_count(void);
/* The name fa_forward takes for stage `index`: the stage's folder name, or "folder/precision"
 * (e.g. "07_fp16_pipelined/bf16") for a stage's second descriptor in another precision. */
FA_CAPI_EXPORT const char* fa_stage_id(int index); /* NULL when out of range */

/* Facts about one stage; NULL (or -1) for an unknown id. Strings live as long as the library. */
FA_CAPI_EXPORT const char* fa_stage_title(const char* stage_id);
FA_CAPI_EXPORT const char* fa_stage_backend(const char* stage_id);     /* "cpu" or "cuda" */
FA_CAPI_EXPORT const char* fa_stage_precision(const char* stage_id);   /* "fp32", "fp16" or "bf16" */
FA_CAPI_EXPORT const char* fa_stage_source_hash(const char* stage_id); /* design.md's source_hash */
FA_CAPI_EXPORT int64_t fa_stage_max_dim(const char* stage_id);
FA_CAPI_EXPORT int fa_stage_min_compute_capability(const char* stage_id); /* 80 for sm_80; 0 for the CPU */

/* The largest max-abs error a correct stage of `precision` ("fp32", "fp16", "bf16") may show when
 * max|V| is `max_abs_v` (the harness's fa::tolerance), or -1 for an unknown precision. */
FA_CAPI_EXPORT double fa_tolerance(const char* precision, double max_abs_v);

/* What went wrong in this thread's latest fa_workspace_bytes or fa_forward call; "" after a
 * success. Valid until the thread's next call. */
FA_CAPI_EXPORT const char* fa_last_error(void);

#ifdef __cplusplus
}
#endif

#endif /* FA_CAPI_H */
