// Attention kernels: softmax(scale * Q K^T) V over a KV cache, for every attention kind
// (GQA, MQA, MLA absorbed and expanded, and with DSA's sparse key selection).
//
//   out[t, h, :] = sum_j softmax_j(scale * q[t, h, :] . K[g, key_j, :dk]) * V[g, key_j, :dv]
//
// for query t < n_queries, query head h = g * group + i (i < group) of KV head g, over the
// keys query t sees: positions [0, pos0 + t + 1) (causal), the last `window` of them (a
// sliding window), or the ascending list of positions key_index[key_offsets[t] ..
// key_offsets[t + 1]) (DSA's top-k indexer). An attention sink per head adds a term to the
// softmax's denominator only (gpt-oss).
//
// Shapes are the caller's: the key (and query) dim dk may differ from the value dim dv
// (MLA: 576 / 512 absorbed, 192 / 128 expanded), group is 1..n (MHA 1, GQA 2-16, MLA's
// absorbed decode: every head on one KV "head"), scale is the caller's (1/sqrt(dk), YaRN's
// mscale^2 / sqrt(dk), ...). Keys and values are rows of a KV cache at its storage type
// (F32, F16, BF16 or Q8_0); the values may be a prefix of the key rows (MLA's latent):
// give v.data == k.data, the same strides, dv <= dk.
//
// How it runs (attention/attention.cpp):
//  - every query head of a KV group is processed together, so each key and value row is
//    read (and converted to F32) once per group and block, not once per head; decode
//    reads the rows straight from the cache (conversion fused into the kernels' loads,
//    software prefetch a fixed distance ahead), prefill through an F32 tile per block;
//  - online (streaming) softmax over blocks of kBlockKeys keys, in chunks of kChunkKeys:
//    no n_keys-long score buffer per head;
//  - prefill is tiled over queries (a block of query positions x the group's heads) and
//    keys; key blocks past a query block's last position are skipped (causal);
//  - decode (one query) splits the keys into chunks of kChunkKeys, computes each chunk's
//    partial softmax state in parallel and merges the partials in chunk order.
//
// Determinism (docs/architecture.md): a query's result is defined by one canonical order,
// whatever the batch, the work split or the team size: keys are taken in fixed blocks of
// kBlockKeys at absolute key indices (multiples of kBlockKeys), each chunk of kChunkKeys
// starts from an empty softmax state, and chunk partials are merged into the running state
// in chunk order; a sliding window skips the blocks and chunks that hold none of a query's
// keys and masks the rest (the sink joins at the end, from the merged state). Prefill and
// decode both follow it, so a prompt processed as one batch,
// token by token or in any chunking gives bit-identical outputs, for any number of threads.
// (Bits differ between ISAs; each SIMD version agrees with the scalar reference to float
// rounding, tested.)
#pragma once
#include <cstddef>
#include <cstdint>
#include <vector>

#include "quant/dtype.hpp"
#include "quant/kernels.hpp"

namespace colibri {

class ThreadPool;

namespace attn {

constexpr int64_t kBlockKeys = 64;    // keys per softmax block (the unit of the online update)
constexpr int64_t kChunkKeys = 256;   // keys per chunk: the unit of decode's parallel split
static_assert(kChunkKeys % kBlockKeys == 0, "a chunk is a whole number of blocks");

// One side (keys or values) of a KV cache: the row of KV head g at key position j starts at
// data + j * pos_stride + g * head_stride bytes and holds dk (keys) or dv (values) elements
// of `type` (Q8_0: the row is whole 32-element blocks, so dk / dv must be multiples of 32).
struct KvSide {
  DType type = DType::F32;
  const void* data = nullptr;
  std::size_t pos_stride = 0;   // bytes between positions
  std::size_t head_stride = 0;  // bytes between KV heads within a position
  // A ring of `ring` positions (0: none): position j's rows live at slot j % ring, so only
  // the last `ring` positions are held (a sliding-window layer's cache, kv_cache.hpp). A
  // multiple of kBlockKeys, so a block of keys never wraps; causal keys only.
  int64_t ring = 0;
  std::size_t slot(int64_t j) const { return static_cast<std::size_t>(ring > 0 ? j % ring : j); }
};

struct Problem {
  int64_t n_queries = 0;   // query positions
  int64_t n_kv_heads = 0;  // KV heads (groups)
  int64_t group = 1;       // query heads per KV head
  int64_t dk = 0;          // query / key dim
  int64_t dv = 0;          // value / output dim
  float scale = 1.0f;      // softmax scale, applied to q . k

  // Query head h of query t: dk floats at q + t * q_stride + h * q_head_stride.
  const float* q = nullptr;
  int64_t q_stride = 0, q_head_stride = 0;
  // Output head h of query t: dv floats at out + t * out_stride + h * out_head_stride.
  float* out = nullptr;
  int64_t out_stride = 0, out_head_stride = 0;

  KvSide k, v;

  // Causal (key_index == nullptr): query t sees key positions [0, pos0 + t + 1); those
  // rows must be written. Sparse: query t sees the positions key_index[key_offsets[t] ..
  // key_offsets[t + 1]), ascending, each in [0, n_positions), at least one per query.
  int64_t pos0 = 0;
  const int32_t* key_index = nullptr;
  const int64_t* key_offsets = nullptr;  // n_queries + 1 entries
  int64_t n_positions = 0;               // sparse: rows available (bounds check)

  // Sliding window (causal keys only): query t, at position pos0 + t, sees only the
  // `window` positions [pos0 + t + 1 - window, pos0 + t], its own included (transformers'
  // convention). 0: no window. The rows before the window may be gone (a ring, KvSide):
  // blocks partly before a window read whatever their slots hold, then mask it.
  int64_t window = 0;
  // Attention sinks: a learned logit per query head (n_kv_heads * group entries, head
  // h = g * group + i) that joins each softmax's denominator and weighs no value:
  // out = sum_j exp(s_j - m) v_j / (exp(sink_h - m) + sum_j exp(s_j - m)). nullptr: none.
  const float* sinks = nullptr;
};

// Runs the problem on the pool (or inline when called from inside a region). `workspace`
// is grown as needed (workspace_floats). Throws Error(InvalidArgument) for inconsistent
// shapes or a sparse list that is out of range or not ascending.
void run(ThreadPool& pool, const Problem& p, std::vector<float>& workspace);
// Same with the kernels of one ISA (tests compare each with the reference); throws
// Error(Unsupported) when the ISA is not available on this CPU.
void run_with(ThreadPool& pool, const Problem& p, std::vector<float>& workspace, Isa isa);

// Floats of working memory run() grows `workspace` to, at most, for n_heads query heads
// of dims dk / dv and a team of `threads` (colibri.engine.budget mirrors it; a test compares).
std::size_t workspace_floats(int64_t n_heads, int64_t dk, int64_t dv, int64_t threads);

// The naive reference: per query head, all scores, a two-pass softmax and the weighted sum
// of values, accumulated in double. Slow; for tests.
void reference(const Problem& p);

}  // namespace attn
}  // namespace colibri
