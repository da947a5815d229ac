// Tensor element types. The numeric values are GGML's type ids, so a GGUF tensor's type
// maps to a DType without a table, and block layouts are byte-identical to GGUF's.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace colibri {

enum class DType : int {
  F32 = 0,
  F16 = 1,
  Q4_0 = 2,
  Q4_1 = 3,
  Q5_0 = 6,
  Q5_1 = 7,
  Q8_0 = 8,
  Q8_1 = 9,   // activation format for Q4_1 and Q5_1 (carries d * sum(q) per block)
  Q2_K = 10,  // K-quants: 256-element super-blocks (quant/kquants.hpp)
  Q3_K = 11,
  Q4_K = 12,
  Q5_K = 13,
  Q6_K = 14,
  Q8_K = 15,  // activation format of the super-block types (quant/q8_k.hpp)
  // i-quants and MXFP4 (quant/iquants_*.cpp)
  IQ2_XXS = 16,
  IQ2_XS = 17,
  IQ3_XXS = 18,
  IQ1_S = 19,
  IQ4_NL = 20,
  IQ3_S = 21,
  IQ2_S = 22,
  IQ4_XS = 23,
  IQ1_M = 29,
  BF16 = 30,
  MXFP4 = 39,
  // colibri's own id (not a GGML type, never in a GGUF): FP8 e4m3 with a companion F32
  // block-scale matrix (quant/fp8.hpp), as DeepSeek-V3 / GLM safetensors store it.
  F8_E4M3 = 200,
};

// What a type is for. Python's sources derive their type tables from this one
// (python/colibri/sources/quant_types.py), so a new weight type is added here only.
enum class TypeRole : int {
  Weight,        // weights a model file stores as they are (GGUF, native containers)
  Activation,    // quantized activations a weight type's dot product consumes (Q8_1, Q8_K)
  ScaledWeight,  // weights read with a companion block-scale matrix (F8_E4M3)
};

struct TypeTraits {
  const char* name;
  int64_t block_size;  // elements per block (1 for plain float types)
  int64_t type_size;   // bytes per block
  bool implemented;    // has kernels in this build
  TypeRole role;
};

// Throws Error(Unsupported) for an unknown id.
const TypeTraits& type_traits(DType type);
// Every type colibri knows, in table order: the weight types first, in the order
// messages list them.
std::vector<DType> all_types();
const char* type_role_name(TypeRole role);  // "weight", "activation", "scaled_weight"
DType dtype_from_id(int id);
std::string dtype_name(DType type);
// The names of the types that have kernels in this build, comma-separated (for errors).
std::string implemented_type_names();
// Parses a GGUF type name ("Q4_0", "bf16", ...; case-insensitive). Throws
// Error(InvalidArgument) naming the known types for anything else.
DType dtype_from_name(const std::string& name);

// Bytes of one row of `n` elements. Throws Error(InvalidArgument) unless n is a whole
// number of blocks.
std::size_t row_bytes(DType type, int64_t n);

}  // namespace colibri
