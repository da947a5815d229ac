// The row-lane layout: a weight matrix stored for the AVX-512 row-lane kernels
// (kernels_avx512.cpp, namespace lanes), so they load their operands instead of
// transposing them from 8 rows at every pass.
//
// Rows go in groups of kLaneRows = 8. Group g holds rows 8g .. 8g + 7; its blocks follow one
// another, block i of the group in the bytes of 8 ordinary blocks:
//
//   quants: for each dword k of the block's quant bytes, that dword of rows 0..7 (32 bytes)
//   then:   for each 16-bit scale field of the block (Q4_1: d, m; Q8_0: d), rows 0..7's
//
// Group g starts where row 8g starts in the ordinary layout and the matrix keeps its size,
// so a row range that starts at a multiple of 8 is found where it always was. Only the order
// of bytes changes: kernels that read this layout do exactly the arithmetic of the ones that
// read rows (the matmul relies on it, and tests/kernels/test_lane_pack.py checks the bits).
#pragma once
#include <cstddef>
#include <cstdint>

#include "quant/dtype.hpp"

namespace colibri {

constexpr int64_t kLaneRows = 8;

// Whether `type` has a row-lane layout (Q4_1, Q8_0).
bool lane_packable(DType type);

// Rows x cols of `type` from the ordinary layout in src to the row-lane layout in dst (the
// same number of bytes; they must not overlap). Throws Error(InvalidArgument) unless the type
// is packable and rows is a multiple of kLaneRows.
void pack_lanes(DType type, const void* src, void* dst, int64_t rows, int64_t cols);

// Rows [r0, r0 + n) of a row-lane matrix (any r0, n) back in the ordinary layout, into dst
// (n * row_bytes(type, cols) bytes).
void unpack_lane_rows(DType type, const void* packed, int64_t cols, int64_t r0, int64_t n, void* dst);

}  // namespace colibri
