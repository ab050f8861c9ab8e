// Stage 12's host-side rule: how many blocks share the keys of one K/V head, and the workspace their
// partial results need. Plain C++ (no GPU), so the tests check the rule anywhere.
#pragma once

#include <cstdint>

#include "fa/problem.hpp"

namespace fa::stages::split_kv {

// Query rows per block: the rows of all query heads of a group, packed (Hq/Hkv · Nq of them).
constexpr int64_t kTileRows = 64;
// A chunk of keys is a whole number of K/V tiles (64 keys, or 32 at D = 256) and never shorter
// than kMinChunkKeys: shorter chunks would write more partial output than they read keys.
constexpr int64_t kChunkAlign = 64;
constexpr int64_t kMinChunkKeys = 256;
constexpr int64_t kMaxSplits = 128;
// The blocks that fit on one SM at D = 128 (112 KB of shared memory each on an H100 or H200): the
// split aims at this many blocks per SM.
constexpr int64_t kBlocksPerSm = 2;
// The workspace is sized for a GPU of up to this many SMs (an H200 has 132), so that it depends on
// the problem alone.
constexpr int kMaxSmCount = 256;

// A head with a full tile of its own query rows (prefill) gains nothing from packing or splitting:
// stage 08's kernel runs it unchanged.
inline bool hands_to_stage08(const Problem& problem) { return problem.q_seq >= kTileRows; }

struct KeySplit {
  int64_t splits = 1;      // blocks per (K/V head, row tile)
  int64_t chunk_keys = 0;  // keys per block, a multiple of kChunkAlign (the last chunk may be short)
};

// With base = B·Hkv·ceil(Hq/Hkv·Nq / 64) blocks (one per row tile of a group), as many splits as fit
// in one wave of kBlocksPerSm blocks per SM: floor(kBlocksPerSm·SMs / base), at least 1 (the base
// blocks alone fill more than half the GPU's slots), at most kMaxSplits, chunks of at least
// kMinChunkKeys keys.
KeySplit plan_split(const Problem& problem, int sm_count);

// FP32 partial outputs (splits × B·Hq·Nq × D) and their log-sum-exps (splits × B·Hq·Nq) when the
// largest GPU (kMaxSmCount) would split; 0 otherwise.
int64_t workspace_bytes(const Problem& problem, Pass pass);

}  // namespace fa::stages::split_kv
