#include "model/weights.hpp"

#include <sys/mman.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <vector>

#include "common/errors.hpp"
#include "io/crc32.hpp"
#include "quant/fp16.hpp"
#include "quant/kernels.hpp"
#include "quant/lane_pack.hpp"

namespace colibri {

namespace {

// GGUF's Llama converter reorders each head's rows from [first half | second half] to
// interleaved pairs (0, h, 1, h+1, ...) for llama.cpp's RoPE. Undo it: within a head of
// `r` rows, stored row 2i is original row i and stored row 2i+1 is original row i + r/2.
void unpermute_rows(Tensor& t, int64_t n_heads) {
  if (n_heads <= 0) return;
  if (t.rows % n_heads != 0 || (t.rows / n_heads) % 2 != 0)
    fail(ErrorKind::Format, "tensor '" + t.name + "': " + std::to_string(t.rows) +
                                " rows cannot be split into " + std::to_string(n_heads) +
                                " RoPE heads of even size");
  const int64_t per_head = t.rows / n_heads, half = per_head / 2;
  const std::size_t rb = t.nbytes / static_cast<std::size_t>(t.rows);
  const std::vector<uint8_t> stored(t.data, t.data + t.nbytes);
  for (int64_t h = 0; h < n_heads; ++h) {
    for (int64_t i = 0; i < half; ++i) {
      const int64_t base = h * per_head;
      std::memcpy(t.data + (base + i) * rb, stored.data() + (base + 2 * i) * rb, rb);
      std::memcpy(t.data + (base + half + i) * rb, stored.data() + (base + 2 * i + 1) * rb, rb);
    }
  }
}

// Hugging Face keeps MLA's W_UK inside kv_b_proj as [nope rows, kv_lora cols] per head;
// absorbed attention multiplies by its transpose. The bytes hold n_heads blocks of
// [cols, rows / n_heads] elements; each becomes [rows / n_heads, cols]. Exact (a copy).
void transpose_head_blocks(Tensor& t, int64_t n_heads) {
  std::size_t elem = 0;
  if (t.type == DType::F8_E4M3) elem = 1;  // its scales come already laid out for the result
  if (t.type == DType::F32) elem = 4;
  if (t.type == DType::F16 || t.type == DType::BF16) elem = 2;
  if (elem == 0)
    fail(ErrorKind::Unsupported, "tensor '" + t.name + "' is " + dtype_name(t.type) +
                                     " but must be transposed at load, which needs a float type (F32, F16, "
                                     "BF16, F8_E4M3); convert the checkpoint with 'colibri convert'");
  if (t.rows % n_heads != 0)
    fail(ErrorKind::Format, "tensor '" + t.name + "': " + std::to_string(t.rows) + " rows do not split into " +
                                std::to_string(n_heads) + " heads");
  const int64_t rph = t.rows / n_heads, cols = t.cols;
  const std::size_t block = static_cast<std::size_t>(rph * cols) * elem;
  std::vector<uint8_t> src(block);
  for (int64_t h = 0; h < n_heads; ++h) {
    uint8_t* base = t.data + static_cast<std::size_t>(h) * block;
    std::memcpy(src.data(), base, block);
    for (int64_t i = 0; i < cols; ++i)      // stored row i of the block: rph elements
      for (int64_t j = 0; j < rph; ++j)     // -> element (j, i) of [rph, cols]
        std::memcpy(base + static_cast<std::size_t>(j * cols + i) * elem,
                    src.data() + static_cast<std::size_t>(i * rph + j) * elem, elem);
  }
}

}  // namespace

void check_shape(const Tensor* t, int64_t rows, int64_t cols) {
  if (t->rows != rows || t->cols != cols)
    fail(ErrorKind::Format, "tensor '" + t->name + "' is " + std::to_string(t->rows) + "x" +
                                std::to_string(t->cols) + " but the config implies " +
                                std::to_string(rows) + "x" + std::to_string(cols));
}

const float* Tensor::f32() const {
  if (type != DType::F32)
    fail(ErrorKind::Unsupported, "tensor '" + name + "' must be F32 but is " + dtype_name(type));
  return reinterpret_cast<const float*>(data);
}

namespace {

constexpr std::size_t kTensorAlign = 64;             // cache line: SIMD loads, no false sharing
constexpr std::size_t kHugePage = 2u * 1024 * 1024;  // x86-64 / arm64 transparent huge page

std::size_t round_up(std::size_t n, std::size_t a) { return (n + a - 1) / a * a; }

// Norm weights and biases (vectors) are used as F32 by the core; half-precision ones (a
// BF16 or F16 Hugging Face checkpoint) are widened at load, which is exact.
bool widened(const TensorSpec& s) {
  return s.shape.size() == 1 && (s.type == DType::F16 || s.type == DType::BF16);
}

// Byte size a spec needs in the arena (its extents are validated in the constructor).
std::size_t spec_bytes(const TensorSpec& s) {
  if (widened(s)) return static_cast<std::size_t>(s.shape[0]) * sizeof(float);
  int64_t rows = 1, cols = 0;
  if (s.shape.size() == 1) {
    cols = s.shape[0];
  } else if (s.shape.size() == 2) {
    rows = s.shape[0];
    cols = s.shape[1];
  } else {
    fail(ErrorKind::Format, "tensor '" + s.name + "' has " + std::to_string(s.shape.size()) +
                                " dimensions; the core takes vectors and matrices");
  }
  return row_bytes(s.type, cols) * static_cast<std::size_t>(rows) + kTensorAlign + scale_bytes(s);
}

// An F8_E4M3 matrix needs its scale matrix, F32, of the size its block shape implies.
void check_scales(const TensorSpec& s) {
  if (s.type != DType::F8_E4M3) {
    if (!s.scale_extents.empty() || !s.scale_values.empty())
      fail(ErrorKind::Format, "tensor '" + s.name + "': only F8_E4M3 weights carry block scales");
    return;
  }
  if (s.shape.size() != 2 || s.scale_block_rows <= 0 || s.scale_block_cols <= 0)
    fail(ErrorKind::Format, "F8_E4M3 tensor '" + s.name + "' needs a 2-D shape and a positive scale block shape");
  if (!s.scale_extents.empty() && !s.scale_values.empty())
    fail(ErrorKind::Format, "F8_E4M3 tensor '" + s.name + "': block scales from extents and as values");
  std::size_t have = s.scale_values.size() * sizeof(float);
  for (const auto& e : s.scale_extents) have += e.length;
  if (have != scale_bytes(s))
    fail(ErrorKind::Format, "F8_E4M3 tensor '" + s.name + "': its block scales need " +
                                std::to_string(scale_bytes(s)) + " bytes (F32) but their extents hold " +
                                std::to_string(have));
}

// A checksum mismatch, named by file, tensor and offset.
[[noreturn]] void checksum_failed(const std::string& path, const std::string& name, uint64_t offset,
                                  std::size_t n, uint32_t want, uint32_t got) {
  char hex[48];
  std::snprintf(hex, sizeof hex, "expected crc32 %08x, got %08x", want, got);
  fail(ErrorKind::Format, path + ": tensor '" + name + "' at offset " + std::to_string(offset) + " (" +
                              std::to_string(n) + " bytes) fails its checksum (" + hex +
                              "); the file is damaged: convert or download the model again");
}

}  // namespace

WeightStore::WeightStore(const std::vector<TensorSpec>& specs, const FileSet& files) {
  std::size_t arena_bytes = 0;
  for (const auto& s : specs) arena_bytes += round_up(spec_bytes(s), kTensorAlign);
  arena_bytes = round_up(std::max<std::size_t>(arena_bytes, 1), kHugePage);
  arena_ = aligned_alloc_array<uint8_t>(arena_bytes, kHugePage);
#if defined(MADV_HUGEPAGE)
  // A hint: where transparent huge pages are off this is a no-op, never an error.
  (void)::madvise(arena_.get(), arena_bytes, MADV_HUGEPAGE);
#endif
  std::size_t cursor = 0;
  for (const auto& s : specs) {
    Tensor t;
    t.name = s.name;
    t.type = s.type;
    if (s.shape.size() == 1) {
      t.rows = 1;
      t.cols = s.shape[0];
    } else if (s.shape.size() == 2) {
      t.rows = s.shape[0];
      t.cols = s.shape[1];
    } else {
      fail(ErrorKind::Format, "tensor '" + s.name + "' has " + std::to_string(s.shape.size()) +
                                  " dimensions; the core takes vectors and matrices");
    }
    const std::size_t expect = row_bytes(t.type, t.cols) * static_cast<std::size_t>(t.rows);
    std::size_t have = 0;
    for (const auto& e : s.extents) have += e.length;
    if (have != expect)
      fail(ErrorKind::Format, "tensor '" + s.name + "' (" + dtype_name(t.type) + ", " +
                                  std::to_string(t.rows) + "x" + std::to_string(t.cols) + ") needs " +
                                  std::to_string(expect) + " bytes but its extents hold " +
                                  std::to_string(have));
    check_scales(s);
    t.nbytes = expect;
    t.data = arena_.get() + cursor;
    cursor += round_up(spec_bytes(s), kTensorAlign);
    if (t.type == DType::F8_E4M3) {  // the scales, float-aligned, right after the codes
      uint8_t* sp = t.data + round_up(expect, kTensorAlign);
      std::size_t at = 0;
      for (const auto& e : s.scale_extents) {
        files.read(e, sp + at);
        at += e.length;
      }
      if (!s.scale_values.empty())
        std::memcpy(sp, s.scale_values.data(), s.scale_values.size() * sizeof(float));
      t.scales = BlockScales{sp, s.scale_block_rows, s.scale_block_cols};
    }
    std::vector<uint8_t> half;  // staging for a widened vector
    uint8_t* dst = t.data;
    if (widened(s)) {
      half.resize(expect);
      dst = half.data();
    }
    std::size_t at = 0;
    for (const auto& e : s.extents) {
      files.read(e, dst + at);
      at += e.length;
    }
    if (s.has_crc32) {
      // The bytes as stored. A tensor transformed below (widened, transposed, unpermuted) is
      // checked now; the others, most of the bytes, later and in parallel (verify_checksums).
      const Extent& e = s.extents.front();
      Pending p{t.name, files.path(e.file), e.offset, dst, expect, s.crc32};
      if (widened(s) || s.transpose_heads > 0 || s.rope_unpermute_heads > 0) {
        const uint32_t got = crc32(0, dst, expect);
        if (got != s.crc32) checksum_failed(p.path, p.name, p.offset, p.n, p.crc32, got);
      } else {
        pending_.push_back(std::move(p));
      }
    }
    if (widened(s)) {
      auto* out = reinterpret_cast<float*>(t.data);
      for (int64_t i = 0; i < t.cols; ++i) {
        uint16_t h;
        std::memcpy(&h, half.data() + i * 2, 2);
        out[i] = t.type == DType::BF16 ? bf16_to_fp32(h) : fp16_to_fp32(h);
      }
      t.type = DType::F32;
      t.nbytes = static_cast<std::size_t>(t.cols) * sizeof(float);
    }
    if (s.transpose_heads > 0) transpose_head_blocks(t, s.transpose_heads);
    if (s.rope_unpermute_heads > 0) {
      if (s.shape.size() == 1) {  // a bias or norm vector: permute its elements like rows
        t.rows = t.cols;
        t.cols = 1;
        unpermute_rows(t, s.rope_unpermute_heads);
        t.cols = t.rows;
        t.rows = 1;
      } else {
        unpermute_rows(t, s.rope_unpermute_heads);
      }
    }
    total_bytes_ += t.nbytes + scale_bytes(s);
    tensors_.emplace(t.name, std::move(t));
  }
}

void WeightStore::verify_checksums(ThreadPool& pool) {
  std::vector<uint32_t> got(pending_.size());
  pool.parallel_for(static_cast<int64_t>(pending_.size()), 1, [&](int64_t begin, int64_t end, int) {
    for (int64_t i = begin; i < end; ++i) {
      const Pending& p = pending_[static_cast<std::size_t>(i)];
      got[static_cast<std::size_t>(i)] = crc32(0, p.data, p.n);
    }
  });
  for (std::size_t i = 0; i < pending_.size(); ++i) {  // the first mismatch in tensor order
    const Pending& p = pending_[i];
    if (got[i] != p.crc32) checksum_failed(p.path, p.name, p.offset, p.n, p.crc32, got[i]);
  }
  pending_.clear();
}

std::size_t WeightStore::pack_lanes(ThreadPool& pool, const std::function<bool(const Tensor&)>& want) {
  std::size_t packed = 0;
  for (auto& [name, t] : tensors_) {
    if (t.lanes || !lane_packable(t.type) || t.rows < kLaneRows || t.rows % kLaneRows != 0 || !want(t)) continue;
    const std::size_t group_bytes = static_cast<std::size_t>(kLaneRows) * row_bytes(t.type, t.cols);
    // Groups are independent: each is copied aside (one group of extra memory per member,
    // not a copy of the tensor) and packed back into its own place.
    pool.parallel_for(t.rows / kLaneRows, 0, [&](int64_t g0, int64_t g1, int) {
      std::vector<uint8_t> group(group_bytes);
      for (int64_t g = g0; g < g1; ++g) {
        uint8_t* at = t.data + static_cast<std::size_t>(g) * group_bytes;
        std::memcpy(group.data(), at, group_bytes);
        colibri::pack_lanes(t.type, group.data(), at, kLaneRows, t.cols);
      }
    });
    t.lanes = true;
    packed += t.nbytes;
  }
  return packed;
}

const Tensor& WeightStore::get(const std::string& name) const {
  auto it = tensors_.find(name);
  if (it == tensors_.end()) fail(ErrorKind::Format, "the model has no tensor '" + name + "'");
  return it->second;
}

const Tensor* WeightStore::find(const std::string& name) const {
  auto it = tensors_.find(name);
  return it == tensors_.end() ? nullptr : &it->second;
}

std::vector<Tensor*> WeightStore::all() {
  std::vector<Tensor*> out;
  out.reserve(tensors_.size());
  for (auto& entry : tensors_) out.push_back(&entry.second);
  return out;
}

}  // namespace colibri
