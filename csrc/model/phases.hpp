// Wall-clock time per phase of the forward pass, cumulative since load: the engine times
// attention and the LM head, the FFN unit (model/ffn_block.hpp) its own phases.
#pragma once
#include <array>

namespace colibri {

enum Phase : int { kAttention = 0, kDense, kRouter, kExpertMatmul, kExpertWait, kLmHead, kHyperConn, kPhases };
using PhaseSeconds = std::array<double, kPhases>;

}  // namespace colibri
