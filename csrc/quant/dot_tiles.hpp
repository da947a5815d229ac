// Prefill tiles: a block of weight rows against a block of activation rows in one pass, so
// each weight block is decoded once for several tokens instead of once per token (prefill
// is compute-bound; decoding the 5-bit quants of Q5_0 costs as much as the dot itself).
//
//   out[t * out_stride + r] = vec_dot(weight row r, activation row t)
//
// BIT-IDENTICAL to the VecDotFn the tile belongs to, for every (r, t): each (row, token)
// pair keeps its own accumulator and sees the same operations in the same order as that
// row's vec_dot, so a prefill still equals token-by-token decode (matmul.hpp's contract).
// Only types whose tile kernel exists use this path (dot_tile_for); the matmul falls back
// to vec_dot_rows per token otherwise.
#pragma once
#include <array>
#include <cstddef>
#include <cstdint>
#include <utility>

#include "common/unroll.hpp"
#include "quant/group_prefetch.hpp"
#include "quant/kernels.hpp"

namespace colibri {

using DotTileFn = void (*)(int64_t n, const void* w, std::size_t w_stride, int64_t nrows, const void* act,
                           std::size_t act_stride, int64_t ntok, float* out, std::size_t out_stride);

// A vec_dot and the tile kernel that reproduces it (the per-ISA registries).
struct DotTile {
  VecDotFn vec_dot;
  DotTileFn tile;
  // Weight bytes the matmul hands the tile per call (0: its default, 16 KiB, for tiles that
  // want the rows in L1 across their token passes). Tiles with per-call setup (the AVX-512
  // row-lane kernels convert the tokens' scales once per pass) ask for more.
  std::size_t weight_tile_bytes = 0;
  // The same products for a weight in the row-lane layout (quant/lane_pack.hpp), or nullptr
  // (then the matmul unpacks the rows it needs for vec_dot_rows / tile). Given row ranges that
  // start at a multiple of kLaneRows; w_stride stays the ordinary row bytes.
  VecDotRowsFn packed_rows = nullptr;
  DotTileFn packed_tile = nullptr;
};

// The tile entry reproducing exactly k.vec_dot, or nullptr (quant/dot_tiles.cpp).
const DotTile* dot_tile_for(const TypeKernels& k);

namespace dot_tiles {
namespace {

// The driver for a kernel struct K with
//   template <int R, int T> static void tile(int64_t nb, const unsigned char* w, size_t ws,
//                                            const unsigned char* act, size_t as,
//                                            float* out, size_t os);
// computing R rows x T tokens: the matrix is covered by MR x MT tiles, the edges by the
// smaller instantiations (picked from a table, 1..MR x 1..MT). Internal linkage: each ISA
// file instantiates it with its own flags.
using TileBody = void (*)(int64_t, const unsigned char*, std::size_t, const unsigned char*, std::size_t, float*,
                          std::size_t);

// The loop the 32-element x86 tiles share (block32_dot_x86.hpp, kernels_avx2.cpp,
// kernels_avx512.cpp), for a kernel struct K with
//   using Block, Act;                       // a weight block, an activation block
//   using Row, Token, Acc;                  // what is kept per row, per token, per pair
//   static Row row(const Block&);           // once per (row, block): unpacked quants, scale
//   static Token token(const Act&);         // once per (token, block)
//   static Acc zero();
//   static void madd(const Row&, const Token&, Acc&);   // once per (row, token, block)
//   static float sum(const Acc&);
// madd repeats, per pair, what K's rows<NR> does per row and block, in the same order, so a
// tile equals vec_dot bit for bit. The rows after the tile's are prefetched as rows<> do.
template <class K, int R, int T>
void tile_loop(int64_t nb, const unsigned char* w, std::size_t ws, const unsigned char* act, std::size_t as,
               float* out, std::size_t os) {
  typename K::Acc acc[R][T];
  COLIBRI_UNROLL
  for (int r = 0; r < R; ++r)
    COLIBRI_UNROLL
    for (int t = 0; t < T; ++t) acc[r][t] = K::zero();
  GroupPrefetch pf(w, ws, R, nb);
  for (int64_t i = 0; i < nb; ++i) {
    pf.step();
    typename K::Row row[R];
    COLIBRI_UNROLL
    for (int r = 0; r < R; ++r) row[r] = K::row(reinterpret_cast<const typename K::Block*>(w + r * ws)[i]);
    COLIBRI_UNROLL
    for (int t = 0; t < T; ++t) {
      const typename K::Token tok = K::token(reinterpret_cast<const typename K::Act*>(act + t * as)[i]);
      COLIBRI_UNROLL
      for (int r = 0; r < R; ++r) K::madd(row[r], tok, acc[r][t]);
    }
  }
  COLIBRI_UNROLL
  for (int t = 0; t < T; ++t)
    COLIBRI_UNROLL
    for (int r = 0; r < R; ++r) out[t * os + r] = K::sum(acc[r][t]);
}

template <class K, int R, int T>
void body(int64_t nb, const unsigned char* w, std::size_t ws, const unsigned char* a, std::size_t as, float* out,
          std::size_t os) {
  K::template tile<R, T>(nb, w, ws, a, as, out, os);
}

template <class K, int MR, int MT, std::size_t... I>
constexpr std::array<TileBody, MR * MT> bodies(std::index_sequence<I...>) {
  return {&body<K, static_cast<int>(I) / MT + 1, static_cast<int>(I) % MT + 1>...};
}

template <class K, int MR, int MT, int64_t Block>
void run(int64_t n, const void* w, std::size_t ws, int64_t nrows, const void* act, std::size_t as, int64_t ntok,
         float* out, std::size_t os) {
  static constexpr std::array<TileBody, MR * MT> table = bodies<K, MR, MT>(std::make_index_sequence<MR * MT>{});
  const auto* wb = static_cast<const unsigned char*>(w);
  const auto* ab = static_cast<const unsigned char*>(act);
  const int64_t nb = n / Block;
  for (int64_t t0 = 0; t0 < ntok; t0 += MT) {
    const int64_t tt = ntok - t0 < MT ? ntok - t0 : MT;
    for (int64_t r0 = 0; r0 < nrows; r0 += MR) {
      const int64_t rr = nrows - r0 < MR ? nrows - r0 : MR;
      table[static_cast<std::size_t>((rr - 1) * MT + (tt - 1))](
          nb, wb + static_cast<std::size_t>(r0) * ws, ws, ab + static_cast<std::size_t>(t0) * as, as,
          out + static_cast<std::size_t>(t0) * os + r0, os);
    }
  }
}

}  // namespace
}  // namespace dot_tiles

// Per-ISA registries (kernels_avx2.cpp, kquants_<isa>.cpp, iquants_avx2.cpp): lists of
// pairs ending with {nullptr, nullptr}. (x86 only so far; elsewhere the matmul uses
// vec_dot_rows per token.)
#if defined(COLIBRI_X86)
const DotTile* basic_avx2_tiles();
const DotTile* basic_avx512_tiles();
const DotTile* kquant_avx2_tiles();
const DotTile* kquant_avx512_tiles();
const DotTile* iq_avx2_tiles();
const DotTile* iq_avx512_tiles();
#endif
// The float-activation kernels' tiles (quant/float_act.cpp; every ISA).
const DotTile* float_act_tiles();

}  // namespace colibri
