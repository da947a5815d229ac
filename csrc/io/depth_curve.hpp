// How many reads in flight the device wants (issue 14: "more reads in flight when the device
// benefits, from a measured queue-depth curve, not a constant").
//
// measure_depth_curve() times cold reads through the engine's own path (the ReadPool, its
// DirectReader, O_DIRECT into the caller's slabs: the expert cache's huge-page arena) at
// several depths, `bytes_per_depth` each, and knee_depth() picks the smallest depth whose
// bandwidth is within `share` of the best: past the knee more reads in flight buy little
// and cost the prefetch throttle its meaning (idle capacity = depth - reads in flight) and
// the crc32 checks CPU. The expert store runs it once at configure when workers = auto.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "io/direct_reader.hpp"

namespace colibri {

struct DepthSample {
  int depth = 0;
  double gbps = 0;  // wanted bytes / wall seconds / 1e9
};

// `extents` are read in turn (depth d keeps d reads outstanding, each into its own slab of
// `slabs`, which needs at least max(depths) entries of `slab_capacity` bytes). Each depth
// starts where the previous one stopped, so no extent is read twice while enough remain.
std::vector<DepthSample> measure_depth_curve(const std::vector<std::string>& files, bool direct,
                                             const std::vector<Extent>& extents,
                                             const std::vector<uint8_t*>& slabs, std::size_t slab_capacity,
                                             const std::vector<int>& depths, uint64_t bytes_per_depth);

// Smallest depth with gbps >= share x the best sample (the first depth when all are 0).
int knee_depth(const std::vector<DepthSample>& curve, double share = 0.9);

}  // namespace colibri
