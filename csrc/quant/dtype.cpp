// Type traits for every GGML type id colibri knows. Sizes are GGUF's.
#include "quant/dtype.hpp"

#include <cctype>

#include "common/errors.hpp"

namespace colibri {
namespace {

struct Entry {
  DType type;
  TypeTraits traits;
};

// Every type is listed with its GGUF sizes; `implemented` says whether it has kernels.
// The weight types come first, in the order messages list them (Python's supported-type
// lists are this order too).
constexpr TypeRole W = TypeRole::Weight;
constexpr Entry kTypes[] = {
    {DType::F32, {"F32", 1, 4, true, W}},
    {DType::F16, {"F16", 1, 2, true, W}},
    {DType::BF16, {"BF16", 1, 2, true, W}},
    {DType::Q8_0, {"Q8_0", 32, 34, true, W}},
    {DType::Q4_0, {"Q4_0", 32, 18, true, W}},
    {DType::Q4_1, {"Q4_1", 32, 20, true, W}},
    {DType::Q5_0, {"Q5_0", 32, 22, true, W}},
    {DType::Q5_1, {"Q5_1", 32, 24, true, W}},
    {DType::Q2_K, {"Q2_K", 256, 84, true, W}},
    {DType::Q3_K, {"Q3_K", 256, 110, true, W}},
    {DType::Q4_K, {"Q4_K", 256, 144, true, W}},
    {DType::Q5_K, {"Q5_K", 256, 176, true, W}},
    {DType::Q6_K, {"Q6_K", 256, 210, true, W}},
    // i-quants and MXFP4
    {DType::IQ4_NL, {"IQ4_NL", 32, 18, true, W}},
    {DType::IQ4_XS, {"IQ4_XS", 256, 136, true, W}},
    {DType::IQ2_XXS, {"IQ2_XXS", 256, 66, true, W}},
    {DType::IQ2_XS, {"IQ2_XS", 256, 74, true, W}},
    {DType::IQ2_S, {"IQ2_S", 256, 82, true, W}},
    {DType::IQ3_XXS, {"IQ3_XXS", 256, 98, true, W}},
    {DType::IQ3_S, {"IQ3_S", 256, 110, true, W}},
    {DType::IQ1_S, {"IQ1_S", 256, 50, true, W}},
    {DType::IQ1_M, {"IQ1_M", 256, 56, true, W}},
    {DType::MXFP4, {"MXFP4", 32, 17, true, W}},
    // activation formats
    {DType::Q8_1, {"Q8_1", 32, 36, true, TypeRole::Activation}},
    {DType::Q8_K, {"Q8_K", 256, 292, true, TypeRole::Activation}},
    // plus its block scales (quant/fp8.hpp)
    {DType::F8_E4M3, {"F8_E4M3", 1, 1, true, TypeRole::ScaledWeight}},
};

const Entry* find(DType type) {
  for (const Entry& e : kTypes)
    if (e.type == type) return &e;
  return nullptr;
}

std::string known_names() {
  std::string s;
  for (const Entry& e : kTypes) {
    if (!s.empty()) s += ", ";
    s += e.traits.name;
  }
  return s;
}

}  // namespace

const TypeTraits& type_traits(DType type) {
  const Entry* e = find(type);
  if (!e) fail(ErrorKind::Unsupported, "unknown tensor type id " + std::to_string(static_cast<int>(type)));
  return e->traits;
}

DType dtype_from_id(int id) {
  const DType type = static_cast<DType>(id);
  if (!find(type))
    fail(ErrorKind::Unsupported, "tensor type id " + std::to_string(id) +
                                     " is not supported by colibri (known: " + known_names() + ")");
  return type;
}

std::vector<DType> all_types() {
  std::vector<DType> out;
  for (const Entry& e : kTypes) out.push_back(e.type);
  return out;
}

const char* type_role_name(TypeRole role) {
  switch (role) {
    case TypeRole::Weight: return "weight";
    case TypeRole::Activation: return "activation";
    case TypeRole::ScaledWeight: return "scaled_weight";
  }
  return "unknown";
}

std::string dtype_name(DType type) { return type_traits(type).name; }

std::string implemented_type_names() {
  std::string s;
  for (const Entry& e : kTypes) {
    if (!e.traits.implemented) continue;
    if (!s.empty()) s += ", ";
    s += e.traits.name;
  }
  return s;
}

DType dtype_from_name(const std::string& name) {
  std::string upper;
  for (char c : name) upper += static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  for (const Entry& e : kTypes)
    if (upper == e.traits.name) return e.type;
  fail(ErrorKind::InvalidArgument, "unknown tensor type '" + name + "' (known: " + known_names() + ")");
}

std::size_t row_bytes(DType type, int64_t n) {
  const TypeTraits& t = type_traits(type);
  if (n < 0 || n % t.block_size != 0)
    fail(ErrorKind::InvalidArgument, "a row of " + std::string(t.name) + " needs a multiple of " +
                                         std::to_string(t.block_size) + " elements, got " +
                                         std::to_string(n));
  return static_cast<std::size_t>(n / t.block_size * t.type_size);
}

}  // namespace colibri
