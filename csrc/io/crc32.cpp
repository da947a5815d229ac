#include "io/crc32.hpp"

#include <zlib.h>

#include <cstring>

#if defined(COLIBRI_X86)
#include <immintrin.h>
#endif

namespace colibri {

uint32_t crc32_reference(uint32_t crc, const uint8_t* p, std::size_t n) {
  uLong c = crc;
  while (n > 0) {  // zlib's length argument is a uInt
    const uInt chunk = static_cast<uInt>(n < (std::size_t{1} << 30) ? n : (std::size_t{1} << 30));
    c = ::crc32(c, p, chunk);
    p += chunk;
    n -= chunk;
  }
  return static_cast<uint32_t>(c);
}

#if defined(COLIBRI_X86)
namespace {

// Folding (Gopal et al., "Fast CRC Computation for Generic Polynomials Using PCLMULQDQ",
// Intel 2009), bit-reflected as zlib's CRC is. A 128-bit register r standing for the
// message prefix is moved forward by D bits with
//     r' = clmul(r.lo, K(D + 32)) ^ clmul(r.hi, K(D - 32)) ^ next 16 bytes,
// which keeps the CRC of (r' + rest) equal to the CRC of the message. K(n) is
// x^n mod P, bit-reflected in 32 bits and shifted left by one (tests/engine/test_checksums.py derives
// these four values from the polynomial). No Barrett reduction: the last register and the
// tail are finished by zlib, 16 + < 16 bytes.
constexpr uint64_t kFold1024Lo = 0x1e88ef372;  // K(1056)
constexpr uint64_t kFold1024Hi = 0x14a7fe880;  // K(992)
constexpr uint64_t kFold128Lo = 0x1751997d0;  // K(160)
constexpr uint64_t kFold128Hi = 0xccaa009e;   // K(96)

__attribute__((target("pclmul,sse2"))) inline __m128i fold(__m128i r, __m128i k, __m128i next) {
  const __m128i lo = _mm_clmulepi64_si128(r, k, 0x00);
  const __m128i hi = _mm_clmulepi64_si128(r, k, 0x11);
  return _mm_xor_si128(_mm_xor_si128(lo, hi), next);
}

__attribute__((target("pclmul,sse2"))) uint32_t crc32_folded(uint32_t crc, const uint8_t* p, std::size_t n) {
  // n >= 128. The initial CRC (inverted, as zlib does) is xored into the first 4 bytes.
  const __m128i k1024 = _mm_set_epi64x(static_cast<long long>(kFold1024Hi), static_cast<long long>(kFold1024Lo));
  const __m128i k128 = _mm_set_epi64x(static_cast<long long>(kFold128Hi), static_cast<long long>(kFold128Lo));
  auto load = [](const uint8_t* q) { return _mm_loadu_si128(reinterpret_cast<const __m128i*>(q)); };
  constexpr int kChains = 8;  // independent chains hide the multiplier's latency
  __m128i r[kChains];
  for (int i = 0; i < kChains; ++i) r[i] = load(p + 16 * i);
  r[0] = _mm_xor_si128(r[0], _mm_cvtsi32_si128(static_cast<int>(~crc)));
  p += 16 * kChains;
  n -= 16 * kChains;
  while (n >= 16 * kChains) {
    for (int i = 0; i < kChains; ++i) r[i] = fold(r[i], k1024, load(p + 16 * i));
    p += 16 * kChains;
    n -= 16 * kChains;
  }
  __m128i acc = r[0];
  for (int i = 1; i < kChains; ++i) acc = fold(acc, k128, r[i]);
  while (n >= 16) {
    acc = fold(acc, k128, load(p));
    p += 16;
    n -= 16;
  }
  // The register is a 16-byte message with the CRC's state already applied: zlib with an
  // initial value of ~0 (a zero register) finishes it and the tail.
  alignas(16) uint8_t last[16];
  _mm_store_si128(reinterpret_cast<__m128i*>(last), acc);
  const uint32_t c = crc32_reference(0xFFFFFFFFu, last, sizeof last);
  return crc32_reference(c, p, n);
}

bool have_pclmul() {
  static const bool yes = __builtin_cpu_supports("pclmul") && __builtin_cpu_supports("sse2");
  return yes;
}

}  // namespace

bool crc32_accelerated() { return have_pclmul(); }

uint32_t crc32(uint32_t crc, const uint8_t* p, std::size_t n) {
  if (n < 128 || !have_pclmul()) return crc32_reference(crc, p, n);
  return crc32_folded(crc, p, n);
}
#else
bool crc32_accelerated() { return false; }

uint32_t crc32(uint32_t crc, const uint8_t* p, std::size_t n) { return crc32_reference(crc, p, n); }
#endif

}  // namespace colibri
