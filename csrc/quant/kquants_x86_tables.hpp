// The kernel and prefill-tile tables of the x86 K-quant / Q5 files, written once. Included
// at the end of kquants_avx2.cpp and kquants_avx512.cpp (inside their anonymous
// namespace, so each copy is compiled with its file's ISA flags), after that file has
// defined what differs between the ISAs, as data:
//   Ops                  the multiply-accumulate primitives (kquants_x86.hpp, q5_x86.hpp)
//   kGroup               weight rows per decode pass (how many accumulators fit the registers)
//   kTileRowsQ5, kTileRowsK, kTileTokens   the prefill tile shape (rows x tokens)
//   kQuantizeQ8K         this ISA's Q8_K activation quantizer
//   base_kernels(type)   this ISA's kernels_*.cpp table (for its Q8_0 / Q8_1 quantizers,
//                        which are byte-identical to the reference)
// Not a normal header: no include guard on purpose, it has no meaning outside those files.

template <class K, int64_t Block>
constexpr VecDotRowsFn rows_fn = row_groups::vec_dot_rows<K, kGroup, kGroupPrefetchAhead, Block>;
template <class K, int64_t Block>
constexpr VecDotFn dot_fn = row_groups::vec_dot<K, Block>;

using Q2 = Q2K<Ops>;
using Q3 = Q3K<Ops>;
using Q4 = Q45K<Ops, false>;
using Q5 = Q45K<Ops, true>;
using Q6 = Q6K<Ops>;

const TypeKernels kTable[] = {
    {DType::Q2_K, DType::Q8_K, dequantize_row_q2_k_x86, ref::quantize_row_q2_k, dot_fn<Q2, kQK_K>, kQuantizeQ8K,
     rows_fn<Q2, kQK_K>},
    {DType::Q3_K, DType::Q8_K, dequantize_row_q3_k_x86, ref::quantize_row_q3_k, dot_fn<Q3, kQK_K>, kQuantizeQ8K,
     rows_fn<Q3, kQK_K>},
    {DType::Q4_K, DType::Q8_K, dequantize_row_q45_k_x86<false>, ref::quantize_row_q4_k, dot_fn<Q4, kQK_K>,
     kQuantizeQ8K, rows_fn<Q4, kQK_K>},
    {DType::Q5_K, DType::Q8_K, dequantize_row_q45_k_x86<true>, ref::quantize_row_q5_k, dot_fn<Q5, kQK_K>,
     kQuantizeQ8K, rows_fn<Q5, kQK_K>},
    {DType::Q6_K, DType::Q8_K, dequantize_row_q6_k_x86, ref::quantize_row_q6_k, dot_fn<Q6, kQK_K>, kQuantizeQ8K,
     rows_fn<Q6, kQK_K>},
    {DType::Q5_0, DType::Q8_0, dequantize_row_q5_0_x86, ref::quantize_row_q5_0, dot_fn<Q5_0<Ops>, 32>,
     base_kernels(DType::Q8_0)->quantize_act, rows_fn<Q5_0<Ops>, 32>},
    {DType::Q5_1, DType::Q8_1, dequantize_row_q5_1_x86, ref::quantize_row_q5_1, dot_fn<Q5_1<Ops>, 32>,
     base_kernels(DType::Q8_1)->quantize_act, rows_fn<Q5_1<Ops>, 32>},
    {DType::Q8_K, DType::Q8_K, q8k::dequantize_row_ref, kQuantizeQ8K, nullptr, kQuantizeQ8K, nullptr},
};

// Prefill tiles, each reproducing its vec_dot above bit for bit.
const DotTile kTiles[] = {
    {dot_fn<Q5_0<Ops>, 32>, dot_tiles::run<Q5_0<Ops>, kTileRowsQ5, kTileTokens, 32>},
    {dot_fn<Q5_1<Ops>, 32>, dot_tiles::run<Q5_1<Ops>, kTileRowsQ5, kTileTokens, 32>},
    {dot_fn<Q2, kQK_K>, dot_tiles::run<Q2, kTileRowsK, kTileTokens, kQK_K>},
    {dot_fn<Q3, kQK_K>, dot_tiles::run<Q3, kTileRowsK, kTileTokens, kQK_K>},
    {dot_fn<Q4, kQK_K>, dot_tiles::run<Q4, kTileRowsK, kTileTokens, kQK_K>},
    {dot_fn<Q5, kQK_K>, dot_tiles::run<Q5, kTileRowsK, kTileTokens, kQK_K>},
    {dot_fn<Q6, kQK_K>, dot_tiles::run<Q6, kTileRowsK, kTileTokens, kQK_K>},
    {nullptr, nullptr},
};

const TypeKernels* find_kernels(DType type) {
  for (const TypeKernels& k : kTable)
    if (k.type == type) return &k;
  return nullptr;
}
