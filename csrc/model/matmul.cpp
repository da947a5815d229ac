// Threaded matmul over the kernel table. See matmul.hpp for the contract.
//
// Work split: the weight rows (of all weights in a matmul_multi) form one index space that
// the pool hands out in chunks. A chunk computes its rows for every token, so each output
// element has exactly one owner and one fixed arithmetic (the kernel's vec_dot): no
// cross-thread reductions, bit-identical results for any team size.
//
// Decode (n_tokens == 1) is memory-bound, and the kernels prefetch the rows ahead of the ones
// they compute. So each member gets ONE contiguous range (the rows split evenly): a thread's
// prefetches then land in rows it will read itself, and a range starts cold only once per
// region. Measured on the 2-core Zen 4 host (SmolLM2-shaped Q4_1 matrices, 2 threads): 8
// dynamic chunks per member ran 0.65-1.4x of one thread, one range per member 1.3-2.0x. If
// a member is late, the pool's dynamic claiming lets another take its range. Matrices under
// 2 * kMinChunkBytes run on the caller alone (no region).
// Prefill (n_tokens > 1): within a chunk, each weight row is loaded once and dotted with a
// tile of activation rows that stays in L2 (kActTileBytes), instead of streaming the whole
// matrix once per token. Types with a tile kernel (quant/dot_tiles.hpp) also decode each
// weight block once per tile of tokens, with the same per-(row, token) arithmetic.
#include "model/matmul.hpp"

#include <algorithm>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "common/errors.hpp"
#include "model/gpu_linear.hpp"
#include "quant/dot_tiles.hpp"
#include "quant/lane_pack.hpp"
#include "threadpool/threadpool.hpp"

namespace colibri {
namespace {

constexpr std::size_t kMinChunkBytes = 16 * 1024;   // weight bytes per member's range, at least
constexpr int64_t kRowGroup = kLaneRows;            // rows per kernel pass (vec_dot_rows)
constexpr std::size_t kActTileBytes = 256 * 1024;   // activation rows reused per weight tile (L2)
constexpr std::size_t kWeightTileBytes = 16 * 1024;  // weight rows reused per activation row (L1)
constexpr int64_t kParallelQuantizeTokens = 8;      // quantize activations in parallel from here

struct Job {
  VecDotRowsFn dot_rows;
  DotTileFn tile;  // rows x tokens in one pass (quant/dot_tiles.hpp), or nullptr
  std::size_t tile_weight_bytes;  // weight bytes per tile call
  const unsigned char* w;
  std::size_t w_row_bytes;
  const unsigned char* act;  // n_tokens rows of act_row_bytes
  std::size_t act_row_bytes;
  float* y;
  int64_t rows;
  int64_t first;  // index of row 0 in the combined row space
  const BlockScales* scales = nullptr;  // F8_E4M3: the weight's block scales (then fp8 is used)
  Fp8DotRowsFn fp8 = nullptr;
  // Row-lane weights (WeightView::lanes) whose kernels cannot read them: rows are unpacked
  // into a per-thread buffer (kUnpackRows at a time) for dot_rows and tile.
  DType type = DType::F32;
  bool lanes = false;   // the weight is row-lane
  bool unpack = false;  // ... and its kernels read rows

  // Rows [r, r + nrows) against one activation row.
  void dot(int64_t cols, int64_t r, int64_t nrows, const unsigned char* a, float* out) const {
    const unsigned char* wr = w + static_cast<std::size_t>(r) * w_row_bytes;
    if (scales)
      fp8(cols, wr, w_row_bytes, nrows, r, *scales, reinterpret_cast<const float*>(a), out);
    else if (unpack)
      for (int64_t u = 0; u < nrows; u += kUnpackRows) {
        const int64_t m = std::min(kUnpackRows, nrows - u);
        dot_rows(cols, unpacked(cols, r + u, m), w_row_bytes, m, a, out + u);
      }
    else
      dot_rows(cols, wr, w_row_bytes, nrows, a, out);
  }
  // Rows [r, r + nrows) in the ordinary layout, in this thread's buffer.
  const unsigned char* unpacked(int64_t cols, int64_t r, int64_t nrows) const {
    thread_local std::vector<unsigned char> buf;
    buf.resize(static_cast<std::size_t>(nrows) * w_row_bytes);
    unpack_lane_rows(type, w, cols, r, nrows, buf.data());
    return buf.data();
  }
  static constexpr int64_t kUnpackRows = 64;
};

void check_weight(const WeightView& w, const char* what) {
  if (w.rows < 0 || w.cols <= 0)
    fail(ErrorKind::InvalidArgument, std::string(what) + ": bad shape [" + std::to_string(w.rows) + ", " +
                                         std::to_string(w.cols) + "]");
  row_bytes(w.type, w.cols);  // throws unless cols is a whole number of blocks
  if (w.type == DType::F8_E4M3 && (!w.scales.data || w.scales.block_rows <= 0 || w.scales.block_cols <= 0))
    fail(ErrorKind::InvalidArgument, std::string(what) + ": an F8_E4M3 weight needs its block scales");
  if (w.rows > 0 && !w.data) fail(ErrorKind::InvalidArgument, std::string(what) + ": null weight data");
  if (w.lanes && (!lane_packable(w.type) || w.rows % kLaneRows != 0))
    fail(ErrorKind::InvalidArgument, std::string(what) + ": a row-lane " + dtype_name(w.type) + " weight of " +
                                         std::to_string(w.rows) + " rows (needs Q4_1 / Q8_0, rows a multiple of 8)");
}

// Rows [r0, r1) of one job for all n_tokens.
void run_rows(const Job& j, int64_t r0, int64_t r1, int64_t n_tokens, int64_t cols) {
  if (n_tokens == 1) {
    j.dot(cols, r0, r1 - r0, j.act, j.y + r0);
    return;
  }
  // Row tiles small enough to stay in L1/L2 while a tile of activation rows passes by.
  const std::size_t tile_bytes = j.tile && !j.scales ? j.tile_weight_bytes : kWeightTileBytes;
  // (whole groups of kLaneRows for row-lane weights, whose tiles start at a group)
  const int64_t row_unit = j.lanes ? kLaneRows : 4;
  const int64_t row_tile =
      std::max<int64_t>(row_unit, static_cast<int64_t>(tile_bytes / j.w_row_bytes) / row_unit * row_unit);
  const int64_t tok_tile = std::max<int64_t>(1, static_cast<int64_t>(kActTileBytes / j.act_row_bytes));
  for (int64_t t0 = 0; t0 < n_tokens; t0 += tok_tile) {
    const int64_t t1 = std::min(n_tokens, t0 + tok_tile);
    for (int64_t ra = r0; ra < r1; ra += row_tile) {
      const int64_t rb = std::min(r1, ra + row_tile);
      if (j.tile && !j.scales) {  // each weight block decoded once for the whole tile of tokens
        const unsigned char* wt =
            j.unpack ? j.unpacked(cols, ra, rb - ra) : j.w + static_cast<std::size_t>(ra) * j.w_row_bytes;
        j.tile(cols, wt, j.w_row_bytes, rb - ra, j.act + static_cast<std::size_t>(t0) * j.act_row_bytes,
               j.act_row_bytes, t1 - t0, j.y + t0 * j.rows + ra, static_cast<std::size_t>(j.rows));
        continue;
      }
      for (int64_t t = t0; t < t1; ++t)
        j.dot(cols, ra, rb - ra, j.act + static_cast<std::size_t>(t) * j.act_row_bytes, j.y + t * j.rows + ra);
    }
  }
}

// One matmul's work: rows [begin, end) of the combined row space of all jobs.
struct Region {
  const Job* jobs;
  int n_jobs;
  int64_t n_tokens;
  int64_t cols;
  void run(int64_t begin, int64_t end) const {
    for (int i = 0; i < n_jobs; ++i) {  // the jobs whose rows intersect [begin, end)
      const Job& j = jobs[i];
      const int64_t r0 = std::max(begin, j.first) - j.first;
      const int64_t r1 = std::min(end, j.first + j.rows) - j.first;
      if (r0 < r1) run_rows(j, r0, r1, n_tokens, cols);
    }
  }
};

// Quantizes n_tokens rows of x into dst with k's activation quantizer.
void quantize_rows(ThreadPool& pool, const TypeKernels& k, const float* x, int64_t n_tokens, int64_t cols,
                   unsigned char* dst, std::size_t act_row_bytes) {
  auto body = [&](int64_t t0, int64_t t1, int) {
    for (int64_t t = t0; t < t1; ++t) k.quantize_act(x + t * cols, dst + t * act_row_bytes, cols);
  };
  if (n_tokens >= kParallelQuantizeTokens && pool.size() > 1)
    pool.parallel_for(n_tokens, 0, body);
  else
    body(0, n_tokens, 0);
}

void run(ThreadPool& pool, const TypeKernels* const* ks, const WeightView* weights, float* const* outputs,
         int n_weights, const float* x, int64_t n_tokens, ScratchBuffer& scratch) {
  if (n_weights <= 0) return;
  if (n_tokens < 0) fail(ErrorKind::InvalidArgument, "matmul: negative token count");
  const int64_t cols = weights[0].cols;
  int64_t total_rows = 0;
  std::size_t total_bytes = 0;
  for (int i = 0; i < n_weights; ++i) {
    check_weight(weights[i], "matmul");
    if (weights[i].cols != cols)
      fail(ErrorKind::InvalidArgument, "matmul_multi: all weights need the same number of columns (" +
                                           std::to_string(cols) + " vs " + std::to_string(weights[i].cols) + ")");
    if (!ks[i]->vec_dot_rows)
      fail(ErrorKind::Unsupported, "matmul: " + dtype_name(weights[i].type) + " is not a weight type");
    if (weights[i].rows > 0 && n_tokens > 0 && !outputs[i])
      fail(ErrorKind::InvalidArgument, "matmul: null output");
    total_rows += weights[i].rows;
    total_bytes += static_cast<std::size_t>(weights[i].rows) * row_bytes(weights[i].type, cols);
  }
  if (total_rows == 0 || n_tokens == 0) return;
  if (!x) fail(ErrorKind::InvalidArgument, "matmul: null input");

  // Quantize the input once per distinct activation type (F32 activations are x itself).
  DType act_types[8];
  const unsigned char* act_data[8];
  int n_act = 0;
  std::size_t scratch_bytes = 0;
  for (int i = 0; i < n_weights; ++i) {
    const DType a = ks[i]->act_type;
    if (a == DType::F32 || std::find(act_types, act_types + n_act, a) != act_types + n_act) continue;
    if (n_act == 8) fail(ErrorKind::Internal, "matmul_multi: too many activation types");
    act_types[n_act++] = a;
    scratch_bytes += (static_cast<std::size_t>(n_tokens) * row_bytes(a, cols) + 63) / 64 * 64;
  }
  unsigned char* buf = n_act ? static_cast<unsigned char*>(scratch.get(scratch_bytes)) : nullptr;
  for (int a = 0; a < n_act; ++a) {
    const TypeKernels* k = nullptr;
    for (int i = 0; i < n_weights && !k; ++i)
      if (ks[i]->act_type == act_types[a]) k = ks[i];
    const std::size_t arb = row_bytes(act_types[a], cols);
    quantize_rows(pool, *k, x, n_tokens, cols, buf, arb);
    act_data[a] = buf;
    buf += (static_cast<std::size_t>(n_tokens) * arb + 63) / 64 * 64;
  }

  Job jobs_small[16];
  std::unique_ptr<Job[]> jobs_big;
  Job* jobs = jobs_small;
  if (n_weights > 16) {
    jobs_big.reset(new Job[n_weights]);
    jobs = jobs_big.get();
  }
  int64_t first = 0;
  for (int i = 0; i < n_weights; ++i) {
    const DType a = ks[i]->act_type;
    const unsigned char* act = reinterpret_cast<const unsigned char*>(x);
    if (a != DType::F32) act = act_data[std::find(act_types, act_types + n_act, a) - act_types];
    const DotTile* tile = dot_tile_for(*ks[i]);
    // A row-lane weight starts at a group in the combined row space, so that the chunks (a
    // multiple of kRowGroup = kLaneRows rows) start at its groups too; the gap is no one's.
    if (weights[i].lanes) first = (first + kLaneRows - 1) / kLaneRows * kLaneRows;
    jobs[i] = Job{ks[i]->vec_dot_rows,
                  tile ? tile->tile : nullptr,
                  tile && tile->weight_tile_bytes ? tile->weight_tile_bytes : kWeightTileBytes,
                  static_cast<const unsigned char*>(weights[i].data),
                  row_bytes(weights[i].type, cols),
                  act,
                  row_bytes(a, cols),
                  outputs[i],
                  weights[i].rows,
                  first};
    if (weights[i].type == DType::F8_E4M3) {
      jobs[i].scales = &weights[i].scales;
      jobs[i].fp8 = fp8_dot_rows_for(*ks[i]);
    }
    if (weights[i].lanes) {
      jobs[i].type = weights[i].type;
      jobs[i].lanes = true;
      if (tile && tile->packed_rows && tile->packed_tile) {
        jobs[i].dot_rows = tile->packed_rows;
        jobs[i].tile = tile->packed_tile;
      } else {
        jobs[i].unpack = true;
      }
    }
    first += weights[i].rows;
  }
  const int64_t row_space = first;  // total_rows and the gaps before row-lane weights

  // One range per member (see the top of the file), never under kMinChunkBytes, and a
  // multiple of kRowGroup so the kernels' row groups stay whole.
  const std::size_t avg_row_bytes = std::max<std::size_t>(1, total_bytes / static_cast<std::size_t>(total_rows));
  const int64_t min_rows = static_cast<int64_t>((kMinChunkBytes + avg_row_bytes - 1) / avg_row_bytes);
  const int64_t team = pool.size();
  int64_t grain = std::max<int64_t>(min_rows, (row_space + team - 1) / team);
  grain = (grain + kRowGroup - 1) / kRowGroup * kRowGroup;

  // The region's closure captures one pointer, so std::function needs no allocation.
  const Region region{jobs, n_weights, n_tokens, cols};
  auto body = [&region](int64_t begin, int64_t end, int) { region.run(begin, end); };
  if (team == 1 || row_space <= grain)
    region.run(0, row_space);  // one chunk: skip the parallel region entirely
  else
    pool.parallel_for(row_space, grain, body);
}

}  // namespace

void* ScratchBuffer::get(std::size_t bytes) {
  if (bytes > capacity_ || !data_) {
    const std::size_t cap = std::max<std::size_t>({bytes, capacity_ + capacity_ / 2, 4096});
    data_ = aligned_alloc_array<unsigned char>(cap, 64);
    capacity_ = cap;
  }
  return data_.get();
}

void matmul_with(ThreadPool& pool, const TypeKernels& k, const WeightView& w, const float* x, int64_t n_tokens,
                 float* y, ScratchBuffer& scratch) {
  if (k.type != w.type)
    fail(ErrorKind::InvalidArgument, "matmul: kernels for " + dtype_name(k.type) + " given a " +
                                         dtype_name(w.type) + " weight");
  const TypeKernels* ks[1] = {&k};
  float* outs[1] = {y};
  run(pool, ks, &w, outs, 1, x, n_tokens, scratch);
}

void matmul(ThreadPool& pool, const WeightView& w, const float* x, int64_t n_tokens, float* y,
            ScratchBuffer& scratch, ActPrecision precision) {
  if (w.gpu != nullptr) return gpu_matmul(*w.gpu, w, x, n_tokens, y);  // EngineConfig(device="gpu")
  matmul_with(pool, kernels(w.type, precision), w, x, n_tokens, y, scratch);
}

void matmul_multi(ThreadPool& pool, const WeightView* weights, float* const* outputs, int n_weights,
                  const float* x, int64_t n_tokens, ScratchBuffer& scratch, ActPrecision precision) {
  if (n_weights <= 0) return;
  if (std::any_of(weights, weights + n_weights, [](const WeightView& w) { return w.gpu != nullptr; })) {
    // Weights on a GPU are computed there, one after the other; the rest share one region.
    std::vector<WeightView> cpu;
    std::vector<float*> cpu_out;
    for (int i = 0; i < n_weights; ++i) {
      if (weights[i].gpu != nullptr) {
        gpu_matmul(*weights[i].gpu, weights[i], x, n_tokens, outputs[i]);
      } else {
        cpu.push_back(weights[i]);
        cpu_out.push_back(outputs[i]);
      }
    }
    matmul_multi(pool, cpu.data(), cpu_out.data(), static_cast<int>(cpu.size()), x, n_tokens, scratch, precision);
    return;
  }
  const TypeKernels* small[16];
  std::unique_ptr<const TypeKernels*[]> big;
  const TypeKernels** ks = small;
  if (n_weights > 16) {
    big.reset(new const TypeKernels*[n_weights]);
    ks = big.get();
  }
  for (int i = 0; i < n_weights; ++i) ks[i] = &kernels(weights[i].type, precision);
  run(pool, ks, weights, outputs, n_weights, x, n_tokens, scratch);
}

void get_rows(const WeightView& w, const int32_t* ids, int64_t n, float* out) {
  check_weight(w, "get_rows");
  if (n <= 0) return;
  if (!ids || !out) fail(ErrorKind::InvalidArgument, "get_rows: null pointer");
  const TypeKernels& k = kernels(w.type);
  const std::size_t rb = row_bytes(w.type, w.cols);
  const unsigned char* base = static_cast<const unsigned char*>(w.data);
  for (int64_t i = 0; i < n; ++i)  // all ids first: a bad one leaves `out` untouched
    if (ids[i] < 0 || ids[i] >= w.rows)
      fail(ErrorKind::TokenOutOfRange, "token id " + std::to_string(ids[i]) + " is outside the vocabulary [0, " +
                                           std::to_string(w.rows) + ")");
  std::vector<unsigned char> lane_row(w.lanes ? rb : 0);
  for (int64_t i = 0; i < n; ++i) {
    const unsigned char* row = base + static_cast<std::size_t>(ids[i]) * rb;
    if (w.lanes) {
      unpack_lane_rows(w.type, base, w.cols, ids[i], 1, lane_row.data());
      row = lane_row.data();
    }
    if (w.type == DType::F8_E4M3)
      fp8_dequantize_row(row, ids[i], w.cols, w.scales, out + i * w.cols);
    else
      k.dequantize_row(row, out + i * w.cols, w.cols);
  }
}

}  // namespace colibri
