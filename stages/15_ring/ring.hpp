// Stage 15: ring attention. One process drives P ranks (GPUs, or virtual ranks for the tests); each
// holds two chunks of the sequence (ring_schedule.hpp) and, step by step, the K/V block of another
// rank. At every step each rank sends the block in hand to the next rank while it computes on it
// with a local stage; the partial (O, LSE) of the P steps merge by their log-sum-exp (stage 12's
// merge). The backward pass walks the same ring: dK and dV travel with their blocks and come home
// summed.
//
// The schedule (ring_forward, ring_backward) is plain C++ over the Ring interface below, so the same
// code runs on GPUs over NCCL, on one GPU through a loopback (P virtual ranks) and on the CPU.
#pragma once

#include <cstdint>
#include <vector>

#include "fa/stage.hpp"
#include "ring_schedule.hpp"

namespace fa::ring {

// Rows of a local tensor, `heads` heads of `head_rows` rows of `row_bytes` each; a part of them is
// rows [first, first + count) of every head.
struct RowBlock {
  int64_t heads = 0;
  int64_t head_rows = 0;
  int64_t first = 0;
  int64_t count = 0;
};

// What one rank sends to the next in a pass: `bytes` from `send` (on this rank) into `receive` (on
// the next rank).
struct Transfer {
  const void* send = nullptr;
  void* receive = nullptr;
  int64_t bytes = 0;
};

// The scratch buffers the schedule asks a rank for, by purpose.
enum class Scratch {
  kv_spare,        // the K/V block arriving while the one in hand is used
  grad_kv_spare,   // the FP32 dK/dV arriving
  grad_kv,         // the FP32 dK/dV of the block in hand
  grad_q,          // the FP32 dQ of this rank's queries
  partials,        // P partial (O, LSE) in FP32, one slot a step
  queries_half,    // the second chunk of Q (and of O, dO, LSE for the backward)
  keys_half,       // the first chunk of the block's K and V
  block_out,       // one block's O (or dQ, dK, dV) in the element type
  stage_workspace  // the local stage's workspace
};

// The ranks as the schedule sees them. Every call applies to one rank, in that rank's memory and
// order of work: on a GPU the calls of a rank are queued on its compute stream, and passes on a
// stream of their own. Calls return at once; `synchronize` waits for everything queued.
class Ring {
 public:
  virtual ~Ring() = default;
  virtual int ranks() const = 0;
  virtual int element_bytes() const = 0;                      // of Q, K, V, O and the gradients
  virtual const StageDescriptor& forward_stage() const = 0;   // writes O and the LSE of one block
  virtual const StageDescriptor& backward_stage() const = 0;  // dQ, dK, dV of one block

  // A buffer of at least `bytes`, kept from call to call (grown when a larger one is asked for).
  virtual void* scratch(int rank, Scratch purpose, int64_t bytes) = 0;
  virtual Status zero(int rank, void* data, int64_t bytes) = 0;
  // The rows `part` of `from` (rows of `row_bytes`) into `to`, packed: count rows a head.
  virtual Status gather(int rank, void* to, const void* from, const RowBlock& part, int64_t row_bytes) = 0;
  virtual Status forward(int rank, const ForwardArgs& args) = 0;
  virtual Status backward(int rank, const BackwardArgs& args) = 0;
  // Slot (FP32 rows of `dim` and their log2-sum-exp) from one block's O (element type, packed rows
  // `part.count` a head) and LSE (natural log): the rows of `part` from them, every other row of the
  // slot O = 0 and LSE = -inf (a partial that weighs nothing).
  virtual Status store_partial(int rank, float* slot_out, float* slot_lse, const void* block_out,
                               const float* block_lse, const RowBlock& part, int64_t dim) = 0;
  // O (element type) and the LSE (natural log) of `rows` rows from `slots` partials, slot s of row r
  // at s · rows + r: O = Σ 2^(LSE_s − M) O_s / Σ 2^(LSE_s − M), M = max LSE_s.
  virtual Status merge(int rank, const float* partial_out, const float* partial_lse, int slots, void* out, float* lse,
                       int64_t rows, int64_t dim) = 0;
  // sum (FP32) += block (element type, packed rows) on the rows of `part`.
  virtual Status accumulate(int rank, float* sum, const void* block, const RowBlock& part, int64_t dim) = 0;
  // to (element type) = from (FP32).
  virtual Status convert(int rank, void* to, const float* from, int64_t elements) = 0;

  // Every rank r sends transfers[r] to rank r + 1 (mod P) and receives transfers[r - 1], on its pass
  // stream, after the work queued on its compute stream so far. Returns the pass's number.
  virtual Status pass_to_next(const std::vector<std::vector<Transfer>>& transfers, int* pass) = 0;
  // The rank's compute stream waits until pass `pass` has arrived.
  virtual Status wait_for_pass(int rank, int pass) = 0;
  virtual Status synchronize() = 0;
};

// One rank's shard (local layout: (B, H, 2·chunk, D), ring_schedule.hpp), in that rank's memory.
struct Shard {
  const void* q = nullptr;
  const void* k = nullptr;
  const void* v = nullptr;
  void* o = nullptr;
  float* lse = nullptr;  // (B, Hq, 2·chunk), natural log
};

struct ShardGradients {
  const void* grad_o = nullptr;
  void* grad_q = nullptr;
  void* grad_k = nullptr;
  void* grad_v = nullptr;
};

// O and LSE of every shard for the whole-sequence `problem` (Nq = Nk, a multiple of 2·P). Queued;
// call ring.synchronize() before reading.
Status ring_forward(Ring& ring, const Problem& problem, const std::vector<Shard>& shards);

// dQ, dK, dV of every shard, from the O and LSE that ring_forward wrote.
Status ring_backward(Ring& ring, const Problem& problem, const std::vector<Shard>& shards,
                     const std::vector<ShardGradients>& gradients);

}  // namespace fa::ring
