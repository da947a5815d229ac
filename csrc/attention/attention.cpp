// The tiled driver: work split, key blocks and chunks, where the kernels read the cache
// rows from, prefetching, the online softmax state and its merges. See attention.hpp for
// the contract and the canonical order every query follows; kernels.hpp for the kernels.
//
// A task is a set of query rows that share one KV head: (a block of query positions) x
// (a range of that group's heads), rows ordered query-major, so their causal key counts
// never decrease from one row to the next. For each key block the task computes the scores
// of all its rows, updates each row's softmax state and accumulates the values. A task of
// few rows (decode: one GQA group) has the kernels read the key and value rows straight
// from the cache, converting as they load, with a software prefetch a fixed distance ahead
// in the same stream; a task of many rows (prefill) converts each block's rows into an F32
// tile once for all of them (in place for an F32 cache). Conversion is exact, so the bits
// are the same either way.
//
// Prefill (several queries): one task per (query block, KV head, head range), each running
// its chunks in order and merging every chunk into the running state; the blocks with the
// most keys go first so the team ends together. Decode (one query): one task per (chunk,
// head range) running every KV head in order (so a thread reads each position's K and V,
// all heads, as one stream: the cache is [position][head][dim]) once the context has
// enough chunks for the team, else per (chunk, KV head, head range); the partials stored,
// then merged in chunk order; waves of kWaveChunks chunks bound the memory of the partials.
#include "attention/attention.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "attention/kernels.hpp"
#include "common/errors.hpp"
#include "threadpool/threadpool.hpp"

namespace colibri::attn {
namespace {

constexpr int64_t kMaxTaskRows = 64;  // query rows (positions x heads) per task
constexpr int64_t kWaveChunks = 32;   // decode: chunk partials held at once
constexpr int64_t kAlign = 16;        // floats (64 bytes) between working buffers
constexpr int64_t kInlineMergeFloats = 1 << 16;  // decode merges this small run on the caller
// Rows read straight from the cache: each kernel pass asks for the row this many positions
// ahead (SmolLM2 decode: 16 x 3 heads x 128 bytes of K or V in flight per stream).
constexpr int64_t kPrefetchAhead = 16;
// Tasks of at most this many query rows read the cache rows in place (the kernels share
// each row load among up to 4 rows); larger ones convert a block into an F32 tile once.
constexpr int64_t kFusedRows = 8;
// Decode runs every KV head of a chunk in one task once there are this many chunks per
// thread (enough to balance the team without splitting the heads).
constexpr int64_t kAllHeadsChunksPerThread = 4;
// Several queries: at least this many tasks per thread where the queries allow it.
constexpr int64_t kTasksPerThread = 4;
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

int64_t round_up(int64_t n, int64_t a) { return (n + a - 1) / a * a; }
int64_t div_up(int64_t n, int64_t a) { return (n + a - 1) / a; }

// How the rows of one KV head are split into tasks.
struct Split {
  int64_t heads_per_task;    // query heads of the group per task
  int64_t head_tiles;        // tasks per group and query block
  int64_t queries_per_task;  // query positions per task (prefill)
  int64_t max_rows;          // rows of the largest task
};

Split split_for(const Problem& p, int threads) {
  Split s;
  s.heads_per_task = std::min(p.group, kMaxTaskRows);
  s.head_tiles = div_up(p.group, s.heads_per_task);
  s.queries_per_task = p.key_index ? 1 : std::max<int64_t>(1, kMaxTaskRows / s.heads_per_task);
  // A few queries (a speculative verify: 2-17) in blocks of kMaxTaskRows rows would give
  // one task per KV head (SmolLM2: 3 for 2 threads, one idle a third of the time): cut
  // them into blocks small enough for kTasksPerThread tasks per thread. Each task reads
  // the keys once more, which costs less than an idle thread.
  const int64_t per_qblock = p.n_kv_heads * s.head_tiles;
  const int64_t want_qblocks = div_up(kTasksPerThread * std::max(threads, 1), per_qblock);
  s.queries_per_task = std::min(s.queries_per_task, std::max<int64_t>(1, div_up(p.n_queries, want_qblocks)));
  s.max_rows = s.heads_per_task * s.queries_per_task;
  return s;
}

// One thread's working memory, carved from the workspace.
struct ThreadMem {
  float* ktile;  // kBlockKeys x dk
  float* vtile;  // kBlockKeys x dv
  float* q;      // rows x dk, the task's query rows packed
  float* s;      // rows x kBlockKeys scores, then probabilities
  float* alpha;  // rows
  float* pm;     // rows: the chunk's partial state (max, sum, weighted values)
  float* pl;
  float* po;     // rows x dv
  float* am;     // rows: the running state over the chunks so far
  float* al;
  float* ao;     // rows x dv
};

int64_t thread_floats(int64_t rows, int64_t dk, int64_t dv) {
  return round_up(kBlockKeys * dk, kAlign) + round_up(kBlockKeys * dv, kAlign) + round_up(rows * dk, kAlign) +
         round_up(rows * kBlockKeys, kAlign) + 5 * round_up(rows, kAlign) + 2 * round_up(rows * dv, kAlign);
}

ThreadMem carve(float* base, int64_t rows, int64_t dk, int64_t dv) {
  ThreadMem m;
  auto take = [&base](int64_t n) {
    float* p = base;
    base += round_up(n, kAlign);
    return p;
  };
  m.ktile = take(kBlockKeys * dk);
  m.vtile = take(kBlockKeys * dv);
  m.q = take(rows * dk);
  m.s = take(rows * kBlockKeys);
  m.alpha = take(rows);
  m.pm = take(rows);
  m.pl = take(rows);
  m.po = take(rows * dv);
  m.am = take(rows);
  m.al = take(rows);
  m.ao = take(rows * dv);
  return m;
}

// The keys one task attends to, by key index: position i (causal) or key_index[i] (sparse).
struct Keys {
  const int32_t* index;  // nullptr: causal
  int64_t position(int64_t i) const { return index ? index[i] : i; }
};

// Rows [i0, i1) of one side for the kernels. Straight from the cache where the kernels can
// read them in place (causal keys: evenly spaced rows) and either the cache is F32 or the
// task has few query rows (decode: converting a row on each of its few passes costs less
// than a round trip through a tile, and the row is read once from memory); otherwise
// converted into the F32 tile once for all the task's rows (prefill, sparse keys).
// prefetch_span: bytes from this head's row start to prefetch ahead of use, per position
// (0: none).
Rows rows_for(const KvSide& side, int64_t head, int64_t dim, const Keys& keys, int64_t i0, int64_t i1, float* tile,
              bool fused, int64_t prefetch_span) {
  const auto* base = static_cast<const unsigned char*>(side.data) + static_cast<std::size_t>(head) * side.head_stride;
  if (!keys.index && (fused || side.type == DType::F32)) {
    Rows r{side.type, base + side.slot(i0) * side.pos_stride, static_cast<int64_t>(side.pos_stride)};
    r.prefetch = prefetch_span > 0 ? kPrefetchAhead : 0;
    r.row_bytes = prefetch_span;
    return r;
  }
  const DequantizeRowFn dequantize = kernels(side.type).dequantize_row;
  for (int64_t i = i0; i < i1; ++i)
    dequantize(base + side.slot(keys.position(i)) * side.pos_stride, tile + (i - i0) * dim, dim);
  return Rows{DType::F32, reinterpret_cast<const unsigned char*>(tile), dim * static_cast<int64_t>(sizeof(float))};
}

// Asks for rows [i0, i1) of one side ahead of use, a chunk at a time, where the rows go
// through a tile (the direct path prefetches inside the kernels).
void prefetch_rows(const KvSide& side, int64_t head, int64_t dim, const Keys& keys, int64_t i0, int64_t i1) {
  const auto* base = static_cast<const unsigned char*>(side.data) + static_cast<std::size_t>(head) * side.head_stride;
  const std::size_t bytes = row_bytes(side.type, dim);
  for (int64_t i = i0; i < i1; ++i) {
    const unsigned char* row = base + side.slot(keys.position(i)) * side.pos_stride;
    for (std::size_t off = 0; off < bytes; off += 64) __builtin_prefetch(row + off, 0, 2);
  }
}

// Everything one task needs besides its thread memory.
struct TaskRows {
  int64_t head;          // KV head
  int64_t n_rows;
  const int64_t* limit;  // per row: keys seen (key-index space), non-decreasing
  const int64_t* start;  // per row: its first key (a sliding window's; else 0), non-decreasing
  Keys keys;
  // Per position, the bytes of K (and of V) to prefetch from this head's row on, for
  // rows read straight from the cache: this head's row, or every head's (the whole
  // position) when the task runs the KV heads in order and this is the first.
  int64_t k_span = 0, v_span = 0;
};

// Rows [first, end) of a task: those that see a key of a chunk.
struct RowRange {
  int64_t first, end;
};

// The partial softmax state of chunk c for the task's rows that see a key of it, left in
// m.pm / m.pl / m.po (other rows are untouched) and returned. A row sees keys
// [start, limit); both bounds are non-decreasing over the rows, so the rows that see a
// key of a chunk or block are a contiguous range, and a row's blocks are the same ones
// (those holding a key it sees) whatever the task.
RowRange chunk_partial(const Kernels& kr, const Problem& p, const TaskRows& t, int64_t c, ThreadMem& m) {
  const int64_t c0 = c * kChunkKeys, n = t.n_rows, last = t.limit[n - 1];
  const bool v_in_k = p.v.data == p.k.data && p.v.pos_stride == p.k.pos_stride &&
                      p.v.head_stride == p.k.head_stride && p.v.type == p.k.type;
  int64_t first = 0, end = n;
  while (first < n && t.limit[first] <= c0) ++first;
  while (end > first && t.start[end - 1] >= c0 + kChunkKeys) --end;
  const bool fused = end - first <= kFusedRows;
  if (!fused) {
    prefetch_rows(p.k, t.head, p.dk, t.keys, c0, std::min(c0 + kChunkKeys, last));
    if (!v_in_k) prefetch_rows(p.v, t.head, p.dv, t.keys, c0, std::min(c0 + kChunkKeys, last));
  }
  for (int64_t r = first; r < end; ++r) {
    m.pm[r] = kNegInf;
    m.pl[r] = 0.0f;
    std::fill(m.po + r * p.dv, m.po + (r + 1) * p.dv, 0.0f);
  }
  for (int64_t b0 = c0; b0 < std::min(c0 + kChunkKeys, last); b0 += kBlockKeys) {
    const int64_t b1 = std::min(b0 + kBlockKeys, last);
    int64_t ra = first, rb = end;  // the rows that see a key of this block
    while (rb > ra && t.start[rb - 1] >= b1) --rb;
    while (ra < rb && t.limit[ra] <= b0) ++ra;
    if (ra >= rb) continue;  // outside every row's window
    const Rows kt = rows_for(p.k, t.head, p.dk, t.keys, b0, b1, m.ktile, fused, t.k_span);
    // MLA: the values are the first dv elements of the key rows (same bytes for F32, F16
    // and BF16; Q8_0 rows are whole blocks, so a prefix of blocks).
    const Rows vt = v_in_k ? kt : rows_for(p.v, t.head, p.dv, t.keys, b0, b1, m.vtile, fused, t.v_span);
    float* s = m.s + ra * kBlockKeys;
    kr.scores(m.q + ra * p.dk, p.dk, rb - ra, kt, b1 - b0, p.dk, p.scale, s, kBlockKeys);
    for (int64_t r = ra; r < rb; ++r) {
      float* sr = m.s + r * kBlockKeys;
      std::fill(sr, sr + (std::max(t.start[r], b0) - b0), kNegInf);  // before the window
      std::fill(sr + (std::min(t.limit[r], b1) - b0), sr + kBlockKeys, kNegInf);
      m.alpha[r] = kr.softmax_block(sr, &m.pm[r], &m.pl[r]);
    }
    // Values: every row's keys in order. Rows share the keys up to the smallest count; the
    // rows that see more continue where the previous ones stopped (a staircase on the
    // causal diagonal), which is the same sequence of operations per row. Keys before a
    // row's window are in it with probability 0 (the same in every task).
    int64_t done = std::min(t.limit[ra], b1) - b0;
    kr.pv(m.po + ra * p.dv, p.dv, rb - ra, s, kBlockKeys, m.alpha + ra, vt, done, p.dv);
    for (int64_t r = ra + 1; r < rb; ++r) {
      const int64_t upto = std::min(t.limit[r], b1) - b0;
      if (upto <= done) continue;
      Rows rest = vt;
      rest.data += done * vt.stride;
      kr.pv(m.po + r * p.dv, p.dv, rb - r, m.s + r * kBlockKeys + done, kBlockKeys, nullptr, rest, upto - done, p.dv);
      done = upto;
    }
  }
  return RowRange{first, end};
}

// (m, l, o) <- merge of the running state with a chunk's partial (pm, pl, po).
void merge(float* m, float* l, float* o, float pm, float pl, const float* po, int64_t dv) {
  const float mx = *m > pm ? *m : pm;
  const float sa = std::exp(*m - mx), sb = std::exp(pm - mx);  // sa = 0 for the empty state
  *l = *l * sa + pl * sb;
  for (int64_t i = 0; i < dv; ++i) o[i] = o[i] * sa + po[i] * sb;
  *m = mx;
}

// out = o / l, with the head's attention sink (if any) added to the denominator: its
// exp(sink - m) at the state's max m (the same as merging a state (sink, 1, 0) last).
void finalize(const float* o, float l, float m, const float* sink, int64_t dv, float* out) {
  if (sink) l += std::exp(*sink - m);
  for (int64_t i = 0; i < dv; ++i) out[i] = o[i] / l;
}

const float* sink_of(const Problem& p, int64_t h) { return p.sinks ? p.sinks + h : nullptr; }

const float* q_row(const Problem& p, int64_t t, int64_t h) { return p.q + t * p.q_stride + h * p.q_head_stride; }
float* out_row(const Problem& p, int64_t t, int64_t h) { return p.out + t * p.out_stride + h * p.out_head_stride; }

int64_t causal_keys(const Problem& p, int64_t t) {
  return p.key_index ? p.key_offsets[t + 1] - p.key_offsets[t] : p.pos0 + t + 1;
}

// The first key query t sees: the start of its sliding window, else 0.
int64_t first_key(const Problem& p, int64_t t) {
  return p.window > 0 ? std::max<int64_t>(0, p.pos0 + t + 1 - p.window) : 0;
}

// Several queries: each task runs its rows' chunks in order, merging as it goes.
void run_prefill(ThreadPool& pool, const Kernels& kr, const Problem& p, const Split& sp, float* ws,
                 int64_t per_thread) {
  const int64_t n_qblocks = div_up(p.n_queries, sp.queries_per_task);
  const int64_t per_qblock = p.n_kv_heads * sp.head_tiles;
  pool.parallel_for(n_qblocks * per_qblock, 1, [&](int64_t begin, int64_t end, int thread) {
    ThreadMem m = carve(ws + thread * per_thread, sp.max_rows, p.dk, p.dv);
    int64_t limit[kMaxTaskRows], start[kMaxTaskRows];
    for (int64_t task = begin; task < end; ++task) {
      const int64_t qb = n_qblocks - 1 - task / per_qblock;  // the longest blocks first
      const int64_t g = (task % per_qblock) / sp.head_tiles, ht = task % sp.head_tiles;
      const int64_t t0 = qb * sp.queries_per_task, t1 = std::min(p.n_queries, t0 + sp.queries_per_task);
      const int64_t h0 = ht * sp.heads_per_task, h1 = std::min(p.group, h0 + sp.heads_per_task);
      const int64_t nh = h1 - h0, n = (t1 - t0) * nh;
      for (int64_t r = 0; r < n; ++r) {
        const int64_t t = t0 + r / nh, h = g * p.group + h0 + r % nh;
        limit[r] = causal_keys(p, t);
        start[r] = first_key(p, t);
        std::copy(q_row(p, t, h), q_row(p, t, h) + p.dk, m.q + r * p.dk);
        m.am[r] = kNegInf;
        m.al[r] = 0.0f;
        std::fill(m.ao + r * p.dv, m.ao + (r + 1) * p.dv, 0.0f);
      }
      const TaskRows rows{g, n, limit, start, Keys{p.key_index ? p.key_index + p.key_offsets[t0] : nullptr},
                          static_cast<int64_t>(row_bytes(p.k.type, p.dk)),
                          static_cast<int64_t>(row_bytes(p.v.type, p.dv))};
      for (int64_t c = start[0] / kChunkKeys; c * kChunkKeys < limit[n - 1]; ++c) {
        const RowRange seen = chunk_partial(kr, p, rows, c, m);
        for (int64_t r = seen.first; r < seen.end; ++r)
          merge(&m.am[r], &m.al[r], m.ao + r * p.dv, m.pm[r], m.pl[r], m.po + r * p.dv, p.dv);
      }
      for (int64_t r = 0; r < n; ++r) {
        const int64_t h = g * p.group + h0 + r % nh;
        finalize(m.ao + r * p.dv, m.al[r], m.am[r], sink_of(p, h), p.dv, out_row(p, t0 + r / nh, h));
      }
    }
  });
}

// One query: the chunks of every (KV head, head range) in parallel, then merged in order.
void run_decode(ThreadPool& pool, const Kernels& kr, const Problem& p, const Split& sp, float* ws,
                int64_t per_thread, float* shared) {
  const int64_t n_keys = causal_keys(p, 0), n_chunks = div_up(n_keys, kChunkKeys);
  const int64_t key0 = first_key(p, 0), chunk0 = key0 / kChunkKeys;  // the window's first
  const int64_t heads = p.n_kv_heads * p.group, state = p.dv + 2;  // per head: o, m, l
  float* acc = shared;                    // heads x state: the running state
  float* partials = shared + heads * state;  // kWaveChunks x heads x state
  for (int64_t h = 0; h < heads; ++h) {
    float* a = acc + h * state;
    std::fill(a, a + p.dv, 0.0f);
    a[p.dv] = kNegInf;
    a[p.dv + 1] = 0.0f;
  }
  const Keys keys{p.key_index ? p.key_index + p.key_offsets[0] : nullptr};
  // A long context runs every KV head of a chunk in one task, in order, so the thread
  // reads each position's K and V rows (all heads, contiguous) as one stream; a short one
  // splits the heads too, to give every thread work.
  const int64_t task_heads = n_chunks - chunk0 >= kAllHeadsChunksPerThread * pool.size() ? p.n_kv_heads : 1;
  const int64_t per_chunk = p.n_kv_heads / task_heads * sp.head_tiles;
  const auto k_row = static_cast<int64_t>(row_bytes(p.k.type, p.dk));
  const auto v_row = static_cast<int64_t>(row_bytes(p.v.type, p.dv));
  const int64_t k_all = static_cast<int64_t>(p.k.head_stride) * (p.n_kv_heads - 1) + k_row;
  const int64_t v_all = static_cast<int64_t>(p.v.head_stride) * (p.n_kv_heads - 1) + v_row;
  for (int64_t w0 = chunk0; w0 < n_chunks; w0 += kWaveChunks) {
    const int64_t w1 = std::min(n_chunks, w0 + kWaveChunks);
    pool.parallel_for((w1 - w0) * per_chunk, 1, [&](int64_t begin, int64_t end, int thread) {
      ThreadMem m = carve(ws + thread * per_thread, sp.max_rows, p.dk, p.dv);
      int64_t limit[kMaxTaskRows], start[kMaxTaskRows];
      for (int64_t task = begin; task < end; ++task) {
        const int64_t c = w0 + task / per_chunk, ht = task % sp.head_tiles;
        const int64_t h0 = ht * sp.heads_per_task, n = std::min(p.group, h0 + sp.heads_per_task) - h0;
        const int64_t g0 = (task % per_chunk) / sp.head_tiles * task_heads;
        for (int64_t g = g0; g < g0 + task_heads; ++g) {
          for (int64_t r = 0; r < n; ++r) {
            limit[r] = n_keys;
            start[r] = key0;
            std::copy(q_row(p, 0, g * p.group + h0 + r), q_row(p, 0, g * p.group + h0 + r) + p.dk, m.q + r * p.dk);
          }
          TaskRows rows{g, n, limit, start, keys, k_row, v_row};
          if (task_heads > 1) {  // the first head asks for the whole positions, the rest find them
            rows.k_span = g == 0 ? k_all : 0;
            rows.v_span = g == 0 ? v_all : 0;
          }
          chunk_partial(kr, p, rows, c, m);
          for (int64_t r = 0; r < n; ++r) {
            float* out = partials + ((c - w0) * heads + g * p.group + h0 + r) * state;
            std::copy(m.po + r * p.dv, m.po + (r + 1) * p.dv, out);
            out[p.dv] = m.pm[r];
            out[p.dv + 1] = m.pl[r];
          }
        }
      }
    });
    auto merge_heads = [&](int64_t begin, int64_t end, int) {
      for (int64_t h = begin; h < end; ++h) {
        float* a = acc + h * state;
        for (int64_t c = w0; c < w1; ++c) {
          const float* part = partials + ((c - w0) * heads + h) * state;
          merge(&a[p.dv], &a[p.dv + 1], a, part[p.dv], part[p.dv + 1], part, p.dv);
        }
      }
    };
    // A small merge (SmolLM2 at 8k: 9 heads x 32 chunks x 64) costs less than a region.
    if (heads * (w1 - w0) * p.dv <= kInlineMergeFloats)
      merge_heads(0, heads, 0);
    else
      pool.parallel_for(heads, 0, merge_heads);
  }
  for (int64_t h = 0; h < heads; ++h) {
    const float* a = acc + h * state;
    finalize(a, a[p.dv + 1], a[p.dv], sink_of(p, h), p.dv, out_row(p, 0, h));
  }
}

void check(const Problem& p) {
  auto bad = [](const std::string& what) { fail(ErrorKind::InvalidArgument, "attention: " + what); };
  if (p.n_queries < 0 || p.n_kv_heads <= 0 || p.group <= 0 || p.dk <= 0 || p.dv <= 0)
    bad("n_kv_heads, group, dk and dv must be > 0");
  if (!p.q || !p.out || !p.k.data || !p.v.data) bad("null query, output, key or value pointer");
  for (const KvSide* side : {&p.k, &p.v}) {
    const int64_t dim = side == &p.k ? p.dk : p.dv;
    if (side->type != DType::F32 && side->type != DType::F16 && side->type != DType::BF16 &&
        side->type != DType::Q8_0)
      bad("KV type " + dtype_name(side->type) + " is not supported (F32, F16, BF16, Q8_0)");
    row_bytes(side->type, dim);  // throws unless dim is whole blocks
    if (side->type == DType::F32 && side->pos_stride % sizeof(float) != 0) bad("F32 rows must be float-aligned");
  }
  if (p.v.data == p.k.data && p.dv > p.dk) bad("values inside the key rows need dv <= dk");
  if (p.window < 0) bad("the sliding window must be >= 0 (0: none)");
  if (p.window > 0 && p.key_index) bad("a sliding window needs causal keys, not a sparse key list");
  for (const KvSide* side : {&p.k, &p.v}) {
    if (side->ring < 0 || side->ring % kBlockKeys != 0) bad("a KV ring must be a multiple of kBlockKeys positions");
    if (side->ring > 0 && p.key_index) bad("a KV ring needs causal keys, not a sparse key list");
    // Every query's window (or, without one, every key) must still be in the ring.
    if (side->ring > 0 && (p.window <= 0 || p.window + p.n_queries - 1 > side->ring))
      bad("a KV ring of " + std::to_string(side->ring) + " positions cannot hold the windows of " +
          std::to_string(p.n_queries) + " queries");
  }
  if (!p.key_index) {
    if (p.pos0 < 0) bad("pos0 must be >= 0");
    return;
  }
  if (!p.key_offsets) bad("a sparse key list needs key_offsets");
  for (int64_t t = 0; t < p.n_queries; ++t) {
    const int64_t a = p.key_offsets[t], b = p.key_offsets[t + 1];
    if (a < 0 || b <= a) bad("query " + std::to_string(t) + " has no keys (key_offsets must increase)");
    for (int64_t i = a; i < b; ++i) {
      const int32_t j = p.key_index[i];
      if (j < 0 || j >= p.n_positions || (i > a && j <= p.key_index[i - 1]))
        bad("query " + std::to_string(t) + ": key positions must be ascending and in [0, " +
            std::to_string(p.n_positions) + ")");
    }
  }
}

}  // namespace

std::size_t workspace_floats(int64_t n_heads, int64_t dk, int64_t dv, int64_t threads) {
  const int64_t shared = round_up((kWaveChunks + 1) * n_heads * (dv + 2), kAlign);
  return static_cast<std::size_t>(shared + threads * round_up(thread_floats(kMaxTaskRows, dk, dv), kAlign));
}

void run_with(ThreadPool& pool, const Problem& p, std::vector<float>& workspace, Isa isa) {
  const Kernels* kr = kernels_for(isa);
  if (!kr) fail(ErrorKind::Unsupported, std::string("attention kernels for ") + isa_name(isa) + " are not available");
  check(p);
  if (p.n_queries == 0) return;
  const Split sp = split_for(p, pool.size());
  const int64_t per_thread = round_up(thread_floats(sp.max_rows, p.dk, p.dv), kAlign);
  const int64_t heads = p.n_kv_heads * p.group;
  const int64_t shared = p.n_queries == 1 ? round_up((kWaveChunks + 1) * heads * (p.dv + 2), kAlign) : 0;
  const auto need = static_cast<std::size_t>(shared + pool.size() * per_thread);
  if (workspace.size() < need) workspace.resize(need);
  float* threads = workspace.data() + shared;
  if (p.n_queries == 1)
    run_decode(pool, *kr, p, sp, threads, per_thread, workspace.data());
  else
    run_prefill(pool, *kr, p, sp, threads, per_thread);
}

void run(ThreadPool& pool, const Problem& p, std::vector<float>& workspace) {
  run_with(pool, p, workspace, best_kernels().isa);
}

}  // namespace colibri::attn
