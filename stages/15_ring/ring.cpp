// Stage 15: the ring's schedule, forward and backward (ring.hpp). Plain C++: every call goes through
// the Ring interface, which queues it on a rank's GPU (or runs it on the CPU).
#include "ring.hpp"

#include <algorithm>
#include <array>

#include "fa/cuda_check.hpp"

namespace fa::ring {
namespace {

constexpr int64_t kAlignment = 256;  // every sub-buffer starts on a 256-byte boundary
int64_t aligned(int64_t bytes) { return (bytes + kAlignment - 1) / kAlignment * kAlignment; }
unsigned char* bytes_at(void* base, int64_t offset) { return static_cast<unsigned char*>(base) + offset; }

// The sizes one rank works with, from the whole problem and the partition.
struct Sizes {
  Partition partition;
  int64_t dim, element_bytes, q_heads, kv_heads;
  int64_t chunk, local_seq;
  int64_t q_rows;         // this rank's query rows, all heads
  int64_t q_bytes;        // Q (or O, dO) of this rank
  int64_t kv_bytes;       // K (or V) of one block
  int64_t kv_half_bytes;  // K (or V) of one chunk of a block
  int64_t grad_kv_bytes;  // dK (or dV) of one block in FP32

  Sizes(const Problem& problem, int ranks, int element_bytes_)
      : partition(ranks, problem.q_seq),
        dim(problem.dim),
        element_bytes(element_bytes_),
        q_heads(problem.q_heads_total()),
        kv_heads(problem.kv_heads_total()),
        chunk(partition.chunk),
        local_seq(partition.local_seq()),
        q_rows(q_heads * local_seq),
        q_bytes(aligned(q_rows * dim * element_bytes)),
        kv_bytes(aligned(kv_heads * local_seq * dim * element_bytes)),
        kv_half_bytes(aligned(kv_heads * chunk * dim * element_bytes)),
        grad_kv_bytes(aligned(kv_heads * local_seq * dim * static_cast<int64_t>(sizeof(float)))) {}

  RowBlock q_part(const HalfRows& rows) const { return {q_heads, local_seq, rows.first, rows.count}; }
  RowBlock kv_part(const HalfRows& rows) const { return {kv_heads, local_seq, rows.first, rows.count}; }
};

// The problem one step of one rank hands to the local stage: the queries and keys of its task.
Problem block_problem(const Problem& problem, const Sizes& sizes, const BlockTask& task) {
  Problem block = problem;
  block.q_seq = half_rows(task.queries, sizes.chunk).count;
  block.kv_seq = half_rows(task.keys, sizes.chunk).count;
  block.causal = task.causal;
  return block;
}

// The largest workspace the local stage asks for over the tasks of a pass.
int64_t largest_workspace(const StageDescriptor& stage, const Problem& problem, const Sizes& sizes, Pass pass) {
  int64_t bytes = 0;
  for (const BlockTask task : {BlockTask{Half::both, Half::both, problem.causal},
                               BlockTask{Half::both, Half::first, false}, BlockTask{Half::second, Half::both, false}}) {
    bytes = std::max(bytes, workspace_bytes(stage, block_problem(problem, sizes, task), pass));
  }
  return std::max<int64_t>(bytes, 1);
}

Status check(const Ring& ring, const Problem& problem, size_t shards) {
  if (const std::string why = ring_unsupported_reason(problem, ring.ranks()); !why.empty()) {
    return Status::unsupported(why);
  }
  if (shards != static_cast<size_t>(ring.ranks())) {
    return Status::unsupported("the ring needs one shard per rank");
  }
  return Status();
}

// A K/V block: K, then V.
struct Block {
  const void* k = nullptr;
  const void* v = nullptr;
};

// The block each rank holds while the next arrives: two buffers a rank, used in turn. Pass
// `pass_index` of the ring carries every rank's block in hand to the next rank's buffer
// pass_index % 2; returns the blocks each rank will hold then.
std::vector<Block> pass_blocks(Ring& ring, const Sizes& sizes, const std::vector<Block>& in_hand, int pass_index,
                               std::vector<std::vector<Transfer>>& transfers) {
  const int ranks = ring.ranks();
  std::vector<Block> arriving(ranks);
  for (int rank = 0; rank < ranks; ++rank) {
    const int next = (rank + 1) % ranks;
    void* spare = ring.scratch(next, Scratch::kv_spare, 4 * sizes.kv_bytes);
    unsigned char* k = bytes_at(spare, (pass_index % 2) * 2 * sizes.kv_bytes);
    arriving[next] = {k, k + sizes.kv_bytes};
    transfers[rank].push_back({in_hand[rank].k, k, sizes.kv_bytes});
    transfers[rank].push_back({in_hand[rank].v, k + sizes.kv_bytes, sizes.kv_bytes});
  }
  return arriving;
}

// The block's keys of `task`: the block itself, or its first chunk gathered into packed rows.
Status keys_of_task(Ring& ring, int rank, const Sizes& sizes, const BlockTask& task, Block& block) {
  if (task.keys == Half::both) return Status();
  unsigned char* half = static_cast<unsigned char*>(ring.scratch(rank, Scratch::keys_half, 2 * sizes.kv_half_bytes));
  const RowBlock part = sizes.kv_part(half_rows(task.keys, sizes.chunk));
  const int64_t row_bytes = sizes.dim * sizes.element_bytes;
  FA_STATUS_TRY(ring.gather(rank, half, block.k, part, row_bytes));
  FA_STATUS_TRY(ring.gather(rank, half + sizes.kv_half_bytes, block.v, part, row_bytes));
  block = {half, half + sizes.kv_half_bytes};
  return Status();
}

}  // namespace

Status ring_forward(Ring& ring, const Problem& problem, const std::vector<Shard>& shards) {
  FA_STATUS_TRY(check(ring, problem, shards.size()));
  const int ranks = ring.ranks();
  const Sizes sizes(problem, ranks, ring.element_bytes());
  const int64_t partial_bytes = aligned(ranks * sizes.q_rows * sizes.dim * static_cast<int64_t>(sizeof(float)));
  const int64_t workspace = largest_workspace(ring.forward_stage(), problem, sizes, Pass::forward);
  const RowBlock second_queries = sizes.q_part(half_rows(Half::second, sizes.chunk));

  // Buffers first (asking for one may replace it), then the second chunk of Q, which meets the blocks
  // of later ranks under the causal mask.
  struct RankBuffers {
    float *partial_out, *partial_lse;
    void *queries_half, *block_out, *workspace;
    float* block_lse;
  };
  std::vector<RankBuffers> buffers(ranks);
  std::vector<Block> in_hand(ranks);
  for (int rank = 0; rank < ranks; ++rank) {
    RankBuffers& b = buffers[rank];
    b.partial_out = static_cast<float*>(
        ring.scratch(rank, Scratch::partials, partial_bytes + aligned(ranks * sizes.q_rows * sizeof(float))));
    b.partial_lse = reinterpret_cast<float*>(bytes_at(b.partial_out, partial_bytes));
    b.queries_half = ring.scratch(rank, Scratch::queries_half, sizes.q_bytes);
    b.block_out = ring.scratch(rank, Scratch::block_out, sizes.q_bytes + aligned(sizes.q_rows * sizeof(float)));
    b.block_lse = reinterpret_cast<float*>(bytes_at(b.block_out, sizes.q_bytes));
    b.workspace = ring.scratch(rank, Scratch::stage_workspace, workspace);
    ring.scratch(rank, Scratch::kv_spare, 4 * sizes.kv_bytes);
    ring.scratch(rank, Scratch::keys_half, 2 * sizes.kv_half_bytes);
    in_hand[rank] = {shards[rank].k, shards[rank].v};
    if (problem.causal && ranks > 1) {
      FA_STATUS_TRY(ring.gather(rank, b.queries_half, shards[rank].q, second_queries, sizes.dim * sizes.element_bytes));
    }
  }

  int arrived = -1;  // the pass that brought the blocks in hand
  for (int step = 0; step < ranks; ++step) {
    if (step > 0) {
      for (int rank = 0; rank < ranks; ++rank) FA_STATUS_TRY(ring.wait_for_pass(rank, arrived));
    }
    // Send each block on before computing with it: the transfer runs while the stage computes.
    std::vector<Block> next = in_hand;
    if (step + 1 < ranks) {
      std::vector<std::vector<Transfer>> transfers(ranks);
      next = pass_blocks(ring, sizes, in_hand, step, transfers);
      FA_STATUS_TRY(ring.pass_to_next(transfers, &arrived));
    }
    for (int rank = 0; rank < ranks; ++rank) {
      const RankBuffers& b = buffers[rank];
      const BlockTask task = block_task(rank, block_source(rank, step, ranks), problem.causal);
      Block block = in_hand[rank];
      FA_STATUS_TRY(keys_of_task(ring, rank, sizes, task, block));
      ForwardArgs args;
      args.problem = block_problem(problem, sizes, task);
      args.q = task.queries == Half::both ? shards[rank].q : b.queries_half;
      args.k = block.k;
      args.v = block.v;
      args.o = b.block_out;
      args.lse = b.block_lse;
      args.workspace = b.workspace;
      FA_STATUS_TRY(ring.forward(rank, args));
      // This step's partial goes to slot `step`; the rows the task left out weigh nothing there.
      FA_STATUS_TRY(ring.store_partial(rank, b.partial_out + step * sizes.q_rows * sizes.dim,
                                       b.partial_lse + step * sizes.q_rows, b.block_out, b.block_lse,
                                       sizes.q_part(half_rows(task.queries, sizes.chunk)), sizes.dim));
    }
    in_hand = next;
  }
  // The identity's third use: the P partials of every row merge by their log-sum-exp.
  for (int rank = 0; rank < ranks; ++rank) {
    FA_STATUS_TRY(ring.merge(rank, buffers[rank].partial_out, buffers[rank].partial_lse, ranks, shards[rank].o,
                             shards[rank].lse, sizes.q_rows, sizes.dim));
  }
  return Status();
}

Status ring_backward(Ring& ring, const Problem& problem, const std::vector<Shard>& shards,
                     const std::vector<ShardGradients>& gradients) {
  FA_STATUS_TRY(check(ring, problem, shards.size()));
  if (gradients.size() != shards.size()) return Status::unsupported("the ring needs one gradient set per rank");
  const int ranks = ring.ranks();
  const Sizes sizes(problem, ranks, ring.element_bytes());
  const int64_t workspace = largest_workspace(ring.backward_stage(), problem, sizes, Pass::backward);
  const int64_t row_bytes = sizes.dim * sizes.element_bytes;
  const int64_t lse_bytes = aligned(sizes.q_rows * static_cast<int64_t>(sizeof(float)));
  const RowBlock second_queries = sizes.q_part(half_rows(Half::second, sizes.chunk));
  const RowBlock second_lse = second_queries;

  // Per rank: Q, O, dO and the LSE of its second chunk (causal), the FP32 dQ, two FP32 dK/dV
  // buffers (the one in hand and the one arriving), one block's dQ, dK, dV from the local stage.
  struct RankBuffers {
    unsigned char *queries_half, *block_grads, *grad_kv;
    float* grad_q;
    void* workspace;
  };
  std::vector<RankBuffers> buffers(ranks);
  std::vector<Block> in_hand(ranks);
  for (int rank = 0; rank < ranks; ++rank) {
    RankBuffers& b = buffers[rank];
    b.queries_half =
        static_cast<unsigned char*>(ring.scratch(rank, Scratch::queries_half, 3 * sizes.q_bytes + lse_bytes));
    b.block_grads =
        static_cast<unsigned char*>(ring.scratch(rank, Scratch::block_out, sizes.q_bytes + 2 * sizes.kv_bytes));
    b.grad_kv = static_cast<unsigned char*>(ring.scratch(rank, Scratch::grad_kv, 4 * sizes.grad_kv_bytes));
    b.grad_q = static_cast<float*>(
        ring.scratch(rank, Scratch::grad_q, aligned(sizes.q_rows * sizes.dim * static_cast<int64_t>(sizeof(float)))));
    b.workspace = ring.scratch(rank, Scratch::stage_workspace, workspace);
    ring.scratch(rank, Scratch::kv_spare, 4 * sizes.kv_bytes);
    ring.scratch(rank, Scratch::keys_half, 2 * sizes.kv_half_bytes);
    in_hand[rank] = {shards[rank].k, shards[rank].v};
    FA_STATUS_TRY(ring.zero(rank, b.grad_q, sizes.q_rows * sizes.dim * static_cast<int64_t>(sizeof(float))));
    FA_STATUS_TRY(ring.zero(rank, b.grad_kv, 2 * sizes.grad_kv_bytes));  // the own block's dK, dV start at 0
    if (problem.causal && ranks > 1) {
      FA_STATUS_TRY(ring.gather(rank, b.queries_half, shards[rank].q, second_queries, row_bytes));
      FA_STATUS_TRY(ring.gather(rank, b.queries_half + sizes.q_bytes, shards[rank].o, second_queries, row_bytes));
      FA_STATUS_TRY(
          ring.gather(rank, b.queries_half + 2 * sizes.q_bytes, gradients[rank].grad_o, second_queries, row_bytes));
      FA_STATUS_TRY(ring.gather(rank, b.queries_half + 3 * sizes.q_bytes, shards[rank].lse, second_lse,
                                static_cast<int64_t>(sizeof(float))));
    }
  }
  // dK and dV of the block in hand, in FP32: buffer `step % 2` of the pair.
  const auto grad_kv = [&](int rank, int buffer) {
    float* k = reinterpret_cast<float*>(buffers[rank].grad_kv + buffer * 2 * sizes.grad_kv_bytes);
    return std::array<float*, 2>{k,
                                 reinterpret_cast<float*>(reinterpret_cast<unsigned char*>(k) + sizes.grad_kv_bytes)};
  };

  int kv_arrived = -1;    // the pass that brought the K/V blocks in hand
  int grad_arrived = -1;  // the pass that brought their dK, dV so far
  for (int step = 0; step < ranks; ++step) {
    if (step > 0) {
      for (int rank = 0; rank < ranks; ++rank) FA_STATUS_TRY(ring.wait_for_pass(rank, kv_arrived));
    }
    std::vector<Block> next = in_hand;
    if (step + 1 < ranks) {
      std::vector<std::vector<Transfer>> transfers(ranks);
      next = pass_blocks(ring, sizes, in_hand, step, transfers);
      FA_STATUS_TRY(ring.pass_to_next(transfers, &kv_arrived));
    }
    for (int rank = 0; rank < ranks; ++rank) {
      const RankBuffers& b = buffers[rank];
      const BlockTask task = block_task(rank, block_source(rank, step, ranks), problem.causal);
      const bool all_queries = task.queries == Half::both;
      Block block = in_hand[rank];
      FA_STATUS_TRY(keys_of_task(ring, rank, sizes, task, block));
      BackwardArgs args;
      args.problem = block_problem(problem, sizes, task);
      args.q = all_queries ? shards[rank].q : b.queries_half;
      args.o = all_queries ? shards[rank].o : b.queries_half + sizes.q_bytes;
      args.grad_o = all_queries ? gradients[rank].grad_o : b.queries_half + 2 * sizes.q_bytes;
      args.lse = all_queries ? shards[rank].lse : reinterpret_cast<const float*>(b.queries_half + 3 * sizes.q_bytes);
      args.k = block.k;
      args.v = block.v;
      args.grad_q = b.block_grads;
      args.grad_k = b.block_grads + sizes.q_bytes;
      args.grad_v = b.block_grads + sizes.q_bytes + sizes.kv_bytes;
      args.workspace = b.workspace;
      FA_STATUS_TRY(ring.backward(rank, args));
      const RowBlock query_part = sizes.q_part(half_rows(task.queries, sizes.chunk));
      const RowBlock key_part = sizes.kv_part(half_rows(task.keys, sizes.chunk));
      FA_STATUS_TRY(ring.accumulate(rank, b.grad_q, args.grad_q, query_part, sizes.dim));
      // The block's dK, dV so far come from the rank before, which finished its step with them.
      if (step > 0) FA_STATUS_TRY(ring.wait_for_pass(rank, grad_arrived));
      const std::array<float*, 2> sums = grad_kv(rank, step % 2);
      FA_STATUS_TRY(ring.accumulate(rank, sums[0], args.grad_k, key_part, sizes.dim));
      FA_STATUS_TRY(ring.accumulate(rank, sums[1], args.grad_v, key_part, sizes.dim));
    }
    // dK, dV follow their block: to the next rank, and after the last step home to its owner.
    if (ranks > 1) {
      std::vector<std::vector<Transfer>> transfers(ranks);
      for (int rank = 0; rank < ranks; ++rank) {
        const std::array<float*, 2> sums = grad_kv(rank, step % 2);
        const std::array<float*, 2> arriving = grad_kv((rank + 1) % ranks, (step + 1) % 2);
        transfers[rank] = {{sums[0], arriving[0], sizes.grad_kv_bytes}, {sums[1], arriving[1], sizes.grad_kv_bytes}};
      }
      FA_STATUS_TRY(ring.pass_to_next(transfers, &grad_arrived));
    }
    in_hand = next;
  }
  const int home = ranks > 1 ? ranks % 2 : 0;  // the buffer the last pass filled
  const int64_t kv_elements = sizes.kv_heads * sizes.local_seq * sizes.dim;
  for (int rank = 0; rank < ranks; ++rank) {
    if (ranks > 1) FA_STATUS_TRY(ring.wait_for_pass(rank, grad_arrived));
    const std::array<float*, 2> sums = grad_kv(rank, home);
    FA_STATUS_TRY(ring.convert(rank, gradients[rank].grad_q, buffers[rank].grad_q, sizes.q_rows * sizes.dim));
    FA_STATUS_TRY(ring.convert(rank, gradients[rank].grad_k, sums[0], kv_elements));
    FA_STATUS_TRY(ring.convert(rank, gradients[rank].grad_v, sums[1], kv_elements));
  }
  return Status();
}

}  // namespace fa::ring
