// Expert workers (model/remote_experts.hpp): the coordinator's hand-over of the experts it
// does not own, and the worker's computation of the ones it does.
#include <memory>
#include <mutex>
#include <string>
#include <utility>

#include "common/errors.hpp"
#include "model/engine.hpp"

namespace colibri {

void Engine::set_remote_experts(std::shared_ptr<RemoteExperts> remote) {
  std::lock_guard<std::mutex> lock(mu_);
  if (remote && (remote->n_layers() != spec_.n_layers + spec_.n_mtp_layers || remote->n_experts() != spec_.n_experts))
    fail(ErrorKind::InvalidArgument, "remote experts: the mask is [" + std::to_string(remote->n_layers()) + "][" +
                                         std::to_string(remote->n_experts()) + "], the model has [" +
                                         std::to_string(spec_.n_layers + spec_.n_mtp_layers) + "][" +
                                         std::to_string(spec_.n_experts) + "] (layers with MTP, experts)");
  remote_ = std::move(remote);
}

void Engine::compute_experts(int64_t layer, const std::vector<int32_t>& experts, const std::vector<int64_t>& counts,
                             const float* rows, float* out) {
  std::lock_guard<std::mutex> lock(mu_);
  const ModelSpec& s = spec_;
  const FfnWeights* W = nullptr;
  if (layer >= 0 && layer < s.n_layers)
    W = &layers_[static_cast<std::size_t>(layer)].ffn;
  else if (layer >= s.n_layers && layer < s.n_layers + s.n_mtp_layers)
    W = &mtp_[static_cast<std::size_t>(layer - s.n_layers)].block.ffn;
  if (W == nullptr)
    fail(ErrorKind::InvalidArgument, "compute_experts: layer " + std::to_string(layer) + " is out of range");
  FfnContext fctx{pool_, ws_.matmul, precision_, *store_, phase_};
  ffn_.compute_experts(fctx, *W, experts, counts, rows, out);
}

}  // namespace colibri
