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
  return row_bytes(s.type, cols) * static_cast<std::size_t>(rows);
}

// A native container's dense tensor against the crc32 its manifest records: the bytes are
// in RAM already, so this is one pass at memory speed (io/crc32.hpp).
void check_crc32(const TensorSpec& s, const uint8_t* data, std::size_t n, const FileSet& files) {
  const uint32_t got = crc32(0, data, n);
  if (got == s.crc32) return;
  char hex[48];
  std::snprintf(hex, sizeof hex, "expected crc32 %08x, got %08x", s.crc32, got);
  const Extent& e = s.extents.front();
  fail(ErrorKind::Format, files.path(e.file) + ": tensor '" + s.name + "' at offset " + std::to_string(e.offset) +
                              " (" + std::to_string(n) + " bytes) fails its checksum (" + hex +
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
    t.nbytes = expect;
    t.data = arena_.get() + cursor;
    cursor += round_up(spec_bytes(s), kTensorAlign);
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
    if (s.has_crc32) check_crc32(s, dst, expect, files);
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
    total_bytes_ += t.nbytes;
    tensors_.emplace(t.name, std::move(t));
  }
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

}  // namespace colibri
