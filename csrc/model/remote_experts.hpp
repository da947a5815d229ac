// The seam to routed experts computed in another process (issue 36: expert workers on
// Ray, colibri.engine.cluster). An engine with a RemoteExperts set hands the experts it
// owns() to it instead of its expert store: per MoE layer, the MoE block gathers the rows
// routed to each remote expert (the batch union, as for local experts), start()s one batch
// for the layer, computes its local experts meanwhile, then finish()es and parks each
// expert's rows in their (token, slot) places. The sum over a token's experts stays on this
// side, in the router's order, so the output is the same bits as one engine computing every
// expert (Engine::compute_experts on the other side runs the same kernels on the same rows).
// Without a RemoteExperts set nothing changes: the MoE block never looks at this.
#pragma once
#include <cstdint>
#include <utility>
#include <vector>

#include "common/errors.hpp"

namespace colibri {

// One layer's rows for the remote experts: experts[i] gets counts[i] rows, stored one
// expert after the other in `rows` ([sum(counts), hidden]), each expert's rows in token
// order. Its results come back in the same layout.
struct RemoteBatch {
  int64_t layer = -1;
  std::vector<int32_t> experts;  // ascending, distinct
  std::vector<int64_t> counts;
  std::vector<float> rows;
  int64_t total_rows() const {
    int64_t m = 0;
    for (int64_t c : counts) m += c;
    return m;
  }
};

class RemoteExperts {
 public:
  // remote: [n_layers][n_experts], nonzero where the expert is computed elsewhere
  // (n_layers counts the store's layers: the trunk's, then the MTP layers').
  RemoteExperts(int64_t n_layers, int64_t n_experts, std::vector<uint8_t> remote)
      : n_layers_(n_layers), n_experts_(n_experts), remote_(std::move(remote)) {
    if (n_layers < 0 || n_experts < 0 || remote_.size() != static_cast<std::size_t>(n_layers * n_experts))
      fail(ErrorKind::InvalidArgument, "remote experts: the ownership mask must be [layers][experts]");
  }
  virtual ~RemoteExperts() = default;
  RemoteExperts(const RemoteExperts&) = delete;
  RemoteExperts& operator=(const RemoteExperts&) = delete;

  int64_t n_layers() const { return n_layers_; }
  int64_t n_experts() const { return n_experts_; }
  bool owns(int64_t layer, int64_t expert) const {
    return layer >= 0 && layer < n_layers_ && expert >= 0 && expert < n_experts_ &&
           remote_[static_cast<std::size_t>(layer * n_experts_ + expert)] != 0;
  }
  // Sends the batch; returns without waiting for the results.
  virtual void start(const RemoteBatch& batch) = 0;
  // The started batch's results, [batch.total_rows(), hidden], into out. Throws on failure.
  virtual void finish(const RemoteBatch& batch, float* out) = 0;
  // After an exception between start() and finish(): forget the started batch.
  virtual void cancel() noexcept = 0;

 private:
  int64_t n_layers_, n_experts_;
  std::vector<uint8_t> remote_;
};

}  // namespace colibri
