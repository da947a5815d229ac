// CRC-32 with the zlib polynomial (what the native container's checksums are): zlib's
// crc32() is the reference; on x86-64 with PCLMULQDQ the bulk of a buffer is folded with
// carry-less multiplies (about ten times zlib's speed), so that checking every resident
// byte at load and every expert read stays cheap.
#pragma once
#include <cstddef>
#include <cstdint>

namespace colibri {

// crc32(crc, p, n) continues a CRC like zlib's crc32(): crc32(0, ...) starts one, and
// crc32(crc32(0, a), b) == crc32(0, a + b).
uint32_t crc32(uint32_t crc, const uint8_t* p, std::size_t n);

// The same with zlib only (the reference the fast path is tested against).
uint32_t crc32_reference(uint32_t crc, const uint8_t* p, std::size_t n);

// Whether crc32() uses the carry-less-multiply path on this CPU.
bool crc32_accelerated();

}  // namespace colibri
