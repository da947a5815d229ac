#include "io/depth_curve.hpp"

#include <algorithm>
#include <chrono>

#include "common/clock.hpp"
#include "common/errors.hpp"
#include "io/read_pool.hpp"

namespace colibri {

std::vector<DepthSample> measure_depth_curve(const std::vector<std::string>& files, bool direct,
                                             const std::vector<Extent>& extents,
                                             const std::vector<uint8_t*>& slabs, std::size_t slab_capacity,
                                             const std::vector<int>& depths, uint64_t bytes_per_depth) {
  std::vector<DepthSample> curve;
  if (extents.empty()) return curve;
  std::size_t next = 0;
  for (int depth : depths) {
    if (depth < 1 || static_cast<std::size_t>(depth) > slabs.size())
      fail(ErrorKind::InvalidArgument, "depth " + std::to_string(depth) + " needs " + std::to_string(depth) +
                                           " slabs, have " + std::to_string(slabs.size()));
    ReadPool pool(files, depth, direct);
    std::vector<Ticket> ring(static_cast<std::size_t>(depth), 0);
    uint64_t bytes = 0;
    const auto t0 = std::chrono::steady_clock::now();
    std::size_t submitted = 0;
    // Keep `depth` reads outstanding until bytes_per_depth were submitted, then drain.
    for (std::size_t i = 0;; ++i) {
      const std::size_t k = i % ring.size();
      if (ring[k] != 0) {
        pool.wait(ring[k]);
        ring[k] = 0;
      }
      if (bytes < bytes_per_depth || submitted < ring.size()) {
        const Extent& e = extents[next++ % extents.size()];
        ring[k] = pool.submit({e, slabs[k], slab_capacity});
        bytes += e.length;
        ++submitted;
      } else if (std::all_of(ring.begin(), ring.end(), [](Ticket t) { return t == 0; })) {
        break;
      }
    }
    const double secs = seconds_since(t0);
    curve.push_back({depth, secs > 0 ? static_cast<double>(bytes) / secs / 1e9 : 0.0});
  }
  return curve;
}

int knee_depth(const std::vector<DepthSample>& curve, double share) {
  if (curve.empty()) return 1;
  double best = 0;
  for (const auto& s : curve) best = std::max(best, s.gbps);
  for (const auto& s : curve)
    if (s.gbps >= share * best) return s.depth;
  return curve.front().depth;
}

}  // namespace colibri
