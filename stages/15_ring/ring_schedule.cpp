// Stage 15's schedule: the zigzag partition and what each step computes (ring_schedule.hpp).
#include "ring_schedule.hpp"

namespace fa::ring {

std::string ring_unsupported_reason(const Problem& problem, int ranks) {
  if (ranks < 1) return "the ring needs at least one rank";
  if (problem.q_seq != problem.kv_seq) return "the ring takes Nq = Nk (one sequence split across the ranks)";
  if (problem.q_seq % (2 * ranks) != 0) {
    return "N = " + std::to_string(problem.q_seq) + " is not a multiple of 2·P = " + std::to_string(2 * ranks) +
           " (the zigzag gives each of the P ranks two chunks of equal length)";
  }
  return "";
}

BlockTask block_task(int rank, int source, bool causal) {
  BlockTask task{Half::both, Half::both, causal && source == rank};  // the own block: the local mask
  // EXERCISE BEGIN: the zigzag's two rules: which keys of an earlier rank's block, which queries for a later one
  if (causal && source < rank) task.keys = Half::first;
  if (causal && source > rank) task.queries = Half::second;
  // EXERCISE END
  return task;
}

HalfRows half_rows(Half half, int64_t chunk) {
  switch (half) {
    case Half::first:
      return {0, chunk};
    case Half::second:
      return {chunk, chunk};
    case Half::both:
      break;
  }
  return {0, 2 * chunk};
}

std::vector<float> shard(const std::vector<float>& whole, const Partition& partition, int rank, int64_t heads,
                         int64_t width) {
  const int64_t seq = 2 * partition.ranks * partition.chunk;
  const int64_t local_seq = partition.local_seq();
  std::vector<float> local(static_cast<size_t>(heads * local_seq * width));
  for (int64_t head = 0; head < heads; ++head) {
    for (int64_t i = 0; i < local_seq; ++i) {
      const int64_t from = (head * seq + partition.global_position(rank, i)) * width;
      const int64_t to = (head * local_seq + i) * width;
      for (int64_t d = 0; d < width; ++d) local[to + d] = whole[from + d];
    }
  }
  return local;
}

void unshard(const std::vector<float>& local, const Partition& partition, int rank, int64_t heads, int64_t width,
             std::vector<float>& whole) {
  const int64_t seq = 2 * partition.ranks * partition.chunk;
  const int64_t local_seq = partition.local_seq();
  for (int64_t head = 0; head < heads; ++head) {
    for (int64_t i = 0; i < local_seq; ++i) {
      const int64_t to = (head * seq + partition.global_position(rank, i)) * width;
      const int64_t from = (head * local_seq + i) * width;
      for (int64_t d = 0; d < width; ++d) whole[to + d] = local[from + d];
    }
  }
}

}  // namespace fa::ring
