// The row-lane layout (lane_pack.hpp): the byte moves, in one place for every ISA.
#include "quant/lane_pack.hpp"

#include <cstring>
#include <string>

#include "common/errors.hpp"
#include "quant/blocks.hpp"

namespace colibri {
namespace {

// A block's layout: `halves` 16-bit scale fields, then `quant_bytes` of quants.
struct BlockShape {
  std::size_t bytes, halves, quant_bytes;
};

BlockShape shape_of(DType type) {
  switch (type) {
    case DType::Q4_1:
      return {sizeof(BlockQ4_1), 2, sizeof(BlockQ4_1::qs)};
    case DType::Q8_0:
      return {sizeof(BlockQ8_0), 1, sizeof(BlockQ8_0::qs)};
    default:
      fail(ErrorKind::InvalidArgument, dtype_name(type) + " has no row-lane layout (Q4_1 and Q8_0 do)");
  }
}

// Where lane r's bytes sit in a packed (group, block): scale field h, quant dword k.
std::size_t half_at(const BlockShape& s, std::size_t r, std::size_t h) {
  return s.quant_bytes * kLaneRows + h * 2 * kLaneRows + r * 2;
}
std::size_t dword_at(std::size_t r, std::size_t k) { return k * 4 * kLaneRows + r * 4; }

void to_lanes(const BlockShape& s, std::size_t r, const unsigned char* block, unsigned char* lanes) {
  for (std::size_t h = 0; h < s.halves; ++h) std::memcpy(lanes + half_at(s, r, h), block + 2 * h, 2);
  for (std::size_t k = 0; k < s.quant_bytes / 4; ++k)
    std::memcpy(lanes + dword_at(r, k), block + 2 * s.halves + 4 * k, 4);
}

void from_lanes(const BlockShape& s, std::size_t r, const unsigned char* lanes, unsigned char* block) {
  for (std::size_t h = 0; h < s.halves; ++h) std::memcpy(block + 2 * h, lanes + half_at(s, r, h), 2);
  for (std::size_t k = 0; k < s.quant_bytes / 4; ++k)
    std::memcpy(block + 2 * s.halves + 4 * k, lanes + dword_at(r, k), 4);
}

}  // namespace

bool lane_packable(DType type) { return type == DType::Q4_1 || type == DType::Q8_0; }

void pack_lanes(DType type, const void* src, void* dst, int64_t rows, int64_t cols) {
  const BlockShape s = shape_of(type);
  if (rows < 0 || rows % kLaneRows != 0)
    fail(ErrorKind::InvalidArgument, "pack_lanes: " + std::to_string(rows) + " rows is not a multiple of " +
                                         std::to_string(kLaneRows));
  const std::size_t rb = row_bytes(type, cols), nb = rb / s.bytes;
  const auto* in = static_cast<const unsigned char*>(src);
  auto* out = static_cast<unsigned char*>(dst);
  for (int64_t g = 0; g < rows / kLaneRows; ++g) {
    unsigned char* group = out + static_cast<std::size_t>(g) * kLaneRows * rb;
    for (std::size_t r = 0; r < kLaneRows; ++r) {
      const unsigned char* row = in + (static_cast<std::size_t>(g) * kLaneRows + r) * rb;
      for (std::size_t i = 0; i < nb; ++i) to_lanes(s, r, row + i * s.bytes, group + i * kLaneRows * s.bytes);
    }
  }
}

void unpack_lane_rows(DType type, const void* packed, int64_t cols, int64_t r0, int64_t n, void* dst) {
  const BlockShape s = shape_of(type);
  const std::size_t rb = row_bytes(type, cols), nb = rb / s.bytes;
  const auto* in = static_cast<const unsigned char*>(packed);
  auto* out = static_cast<unsigned char*>(dst);
  for (int64_t j = 0; j < n; ++j) {
    const auto row = static_cast<std::size_t>(r0 + j);
    const unsigned char* group = in + (row / kLaneRows) * kLaneRows * rb;
    const std::size_t r = row % kLaneRows;
    unsigned char* o = out + static_cast<std::size_t>(j) * rb;
    for (std::size_t i = 0; i < nb; ++i) from_lanes(s, r, group + i * kLaneRows * s.bytes, o + i * s.bytes);
  }
}

}  // namespace colibri
