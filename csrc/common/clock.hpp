// Wall-clock seconds since a steady_clock time point (the phase timers of the forward).
#pragma once
#include <chrono>

namespace colibri {

inline double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace colibri
