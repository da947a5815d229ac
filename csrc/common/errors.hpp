// Core error type. Every failure the core can report is a colibri::Error with a kind;
// bindings/errors.cpp maps each kind to one class of the Python colibri.errors hierarchy.
// Library code throws; it never calls exit() or abort() on bad input.
#pragma once
#include <stdexcept>
#include <string>

namespace colibri {

enum class ErrorKind {
  InvalidArgument,   // a bad argument in a call (-> InvalidRequestError, a ValueError)
  Io,                // a read failed or came back short (-> ModelIOError)
  Format,            // the model's bytes are not what the manifest says (-> ModelFormatError)
  TokenOutOfRange,   // a token id outside [0, vocab) (-> TokenOutOfRangeError)
  ContextOverflow,   // more tokens than the KV cache holds (-> ContextOverflowError)
  Unsupported,       // a tensor type or feature this build does not implement
  Internal,          // a broken invariant inside the core (a bug)
  Cancelled,         // a forward stopped by its cancellation check (Ctrl-C); nothing changed
  DeviceUnavailable, // no usable GPU: library missing, no adapter, limits too small, device lost
  Cluster,           // an expert worker failed or answered wrongly (-> ClusterError)
};

class Error : public std::runtime_error {
 public:
  Error(ErrorKind kind, const std::string& message) : std::runtime_error(message), kind_(kind) {}
  ErrorKind kind() const noexcept { return kind_; }

 private:
  ErrorKind kind_;
};

[[noreturn]] inline void fail(ErrorKind kind, const std::string& message) { throw Error(kind, message); }

}  // namespace colibri
