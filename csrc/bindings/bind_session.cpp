// Session bindings. A forward runs with the GIL released; between layers and prefill chunks
// the core asks whether to stop, and this file answers by running Python's signal handlers
// (Ctrl-C raises KeyboardInterrupt there), so a long prefill stops within one layer and the
// KeyboardInterrupt reaches Python after the core has unwound, the session unchanged.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <memory>
#include <optional>

#include "common/errors.hpp"
#include "model/forward_stats.hpp"
#include "model/session.hpp"
#include "quant/dtype.hpp"

namespace py = pybind11;

namespace colibri::bindings {

namespace {

// A core session and the logits its last forward returned. They live side by side in one
// native object and change together inside one native call, which a KeyboardInterrupt
// cannot split (it is raised between Python bytecodes).
struct BoundSession {
  std::unique_ptr<Session> core;
  py::object last_logits = py::none();  // [vocab] float32, or None
};

py::array_t<float> forward(BoundSession& s, py::array_t<int32_t, py::array::c_style | py::array::forcecast> ids,
                           bool all_logits, int64_t chunk, const py::object& progress) {
  if (ids.ndim() != 1) fail(ErrorKind::InvalidArgument, "token ids must be a 1-D sequence");
  const int64_t n = ids.shape(0);
  if (n == 0) fail(ErrorKind::InvalidArgument, "forward needs at least one token id");
  if (chunk < 0) fail(ErrorKind::InvalidArgument, "the prefill chunk must be >= 0 tokens (0: one batch)");
  const int64_t vocab = s.core->vocab_size();
  py::array_t<float> out = all_logits ? py::array_t<float>({n, vocab}) : py::array_t<float>({vocab});
  const int32_t* p = ids.data();
  float* o = out.mutable_data();

  std::optional<py::error_already_set> interrupt;  // what a signal handler raised
  ForwardHooks hooks;
  hooks.chunk = chunk;
  // The core calls this at most every few ms (session.cpp), so decode never waits on it.
  hooks.cancelled = [&interrupt] {
    py::gil_scoped_acquire gil;
    if (PyErr_CheckSignals() == 0) return false;
    interrupt.emplace();  // fetches the pending exception, re-raised below
    return true;
  };
  if (!progress.is_none())
    hooks.progress = [&progress](int64_t done, int64_t total) {
      py::gil_scoped_acquire gil;
      progress(done, total);  // an exception it raises stops the forward
    };
  bool interrupted = false;
  {
    py::gil_scoped_release release;
    try {
      s.core->forward(p, n, all_logits, o, hooks);
    } catch (const Error& e) {
      if (e.kind() != ErrorKind::Cancelled || !interrupt) throw;
      interrupted = true;
    }
  }
  if (interrupted) throw *interrupt;
  s.last_logits = all_logits ? py::object(out[py::int_(n - 1)]) : py::object(out);
  return out;
}

// Continuous batching (Session::forward_batch): one forward for several sessions. The
// GIL is released; Ctrl-C stops it as it stops forward(). Returns each session's logits
// ([vocab], or [n, vocab] with all_logits; all_logits None: no logits, None returned) and
// sets its last_logits, all after the commit.
std::vector<py::object> forward_batch(const std::vector<BoundSession*>& sessions, const std::vector<py::object>& ids,
                                      const std::vector<std::optional<bool>>& all_logits) {
  const std::size_t n = sessions.size();
  if (n == 0) fail(ErrorKind::InvalidArgument, "forward_batch needs at least one session");
  if (ids.size() != n || all_logits.size() != n)
    fail(ErrorKind::InvalidArgument, "forward_batch: give one id array and one all_logits flag per session");
  using Ids = py::array_t<int32_t, py::array::c_style | py::array::forcecast>;
  const std::vector<BoundSession*>& bound = sessions;
  std::vector<Ids> arrays(n);
  std::vector<py::array_t<float>> outs(n);
  std::vector<SessionStep> steps(n);
  for (std::size_t i = 0; i < n; ++i) {
    if (!bound[i]) fail(ErrorKind::InvalidArgument, "forward_batch: a session is None");
    arrays[i] = Ids::ensure(ids[i]);
    if (!arrays[i] || arrays[i].ndim() != 1)
      fail(ErrorKind::InvalidArgument, "forward_batch: token ids must be 1-D integer sequences");
    const int64_t len = arrays[i].shape(0);
    if (len == 0) fail(ErrorKind::InvalidArgument, "forward needs at least one token id");
    const bool none = !all_logits[i].has_value();  // a prompt chunk before the last: no lm_head
    const bool all = !none && *all_logits[i];
    const int64_t vocab = bound[i]->core->vocab_size();
    if (!none) outs[i] = all ? py::array_t<float>({len, vocab}) : py::array_t<float>({vocab});
    steps[i] = SessionStep{bound[i]->core.get(), arrays[i].data(), len, all, none ? nullptr : outs[i].mutable_data()};
  }
  std::optional<py::error_already_set> interrupt;
  const CancelCheck cancelled = [&interrupt] {
    py::gil_scoped_acquire gil;
    if (PyErr_CheckSignals() == 0) return false;
    interrupt.emplace();
    return true;
  };
  bool interrupted = false;
  {
    py::gil_scoped_release release;
    try {
      Session::forward_batch(steps, cancelled);
    } catch (const Error& e) {
      if (e.kind() != ErrorKind::Cancelled || !interrupt) throw;
      interrupted = true;
    }
  }
  if (interrupted) throw *interrupt;
  std::vector<py::object> result;
  for (std::size_t i = 0; i < n; ++i) {
    if (!steps[i].logits_out) {
      bound[i]->last_logits = py::none();
      result.push_back(py::none());
      continue;
    }
    bound[i]->last_logits = steps[i].all_logits ? py::object(outs[i][py::int_(steps[i].n - 1)]) : py::object(outs[i]);
    result.push_back(outs[i]);
  }
  return result;
}

std::string lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

}  // namespace

void bind_session(py::module_& m) {
  py::class_<BoundSession>(m, "Session")
      .def(py::init([](std::shared_ptr<Engine> engine, int64_t context_length, const std::string& kv_type) {
             if (context_length <= 0) fail(ErrorKind::InvalidArgument, "context_length must be > 0");
             auto s = std::make_unique<BoundSession>();
             s->core = std::make_unique<Session>(std::move(engine), context_length, dtype_from_name(kv_type));
             return s;
           }),
           py::arg("engine"), py::arg("context_length"), py::arg("kv_type") = "f32",
           "kv_type: the KV cache's storage type, 'f32', 'f16', 'bf16' or 'q8_0'.")
      .def_property_readonly("kv_type", [](const BoundSession& s) { return lower(dtype_name(s.core->kv_type())); })
      .def("kv_bytes", [](const BoundSession& s, std::optional<int64_t> n) {
             const int64_t k = n.value_or(s.core->n_tokens());
             if (k < 0) fail(ErrorKind::InvalidArgument, "kv_bytes: n must be >= 0");
             return s.core->kv_bytes_for(k);
           }, py::arg("n") = py::none(), "Bytes of n positions of KV state (default: the tokens held).")
      .def_property_readonly("kv_allocated_bytes", [](const BoundSession& s) { return s.core->kv_allocated_bytes(); })
      .def("holds_prefix", [](const BoundSession& s, int64_t n) { return s.core->holds_prefix(n); }, py::arg("n"),
           "Whether the session can go back to its first n tokens (rollback, export_kv, copy_prefix_from): "
           "a sliding-window layer keeps only its last window + 64 positions.")
      .def("export_kv", [](BoundSession& s, std::optional<int64_t> n) {
             std::vector<uint8_t> b;
             {
               py::gil_scoped_release release;
               b = s.core->export_kv(n.value_or(s.core->n_tokens()));
             }
             return py::bytes(reinterpret_cast<const char*>(b.data()), b.size());
           }, py::arg("n") = py::none(),
           "Positions [0, n) of every layer's KV state as bytes (default: all tokens held).")
      .def("import_kv", [](BoundSession& s, const py::bytes& data, const std::vector<int32_t>& ids) {
             const std::string_view v = data;
             {
               py::gil_scoped_release release;
               s.core->import_kv(reinterpret_cast<const uint8_t*>(v.data()), v.size(), ids);
             }
             s.last_logits = py::none();
           }, py::arg("data"), py::arg("ids"),
           "Replaces the state by the tokens `ids` whose KV state export_kv gave (same model and KV type).")
      .def("copy_prefix_from", [](BoundSession& s, BoundSession& other, int64_t n) {
             {
               py::gil_scoped_release release;
               s.core->copy_prefix_from(*other.core, n);
             }
             s.last_logits = py::none();
           }, py::arg("other"), py::arg("n"),
           "Copies the first n tokens' KV state of another session (same model and KV type); holds n tokens.")
      .def("forward", &forward, py::arg("ids"), py::arg("all_logits") = false, py::arg("chunk") = 0,
           py::arg("progress") = py::none())
      .def_property_readonly("n_tokens", [](const BoundSession& s) { return s.core->n_tokens(); })
      .def_property_readonly("context_length", [](const BoundSession& s) { return s.core->context_length(); })
      .def("token_ids", [](const BoundSession& s) { return s.core->token_ids(); })
      .def_property_readonly("last_logits",
                             [](const BoundSession& s) {
                               (void)s.core->n_tokens();  // raises once the model is closed
                               return s.last_logits;
                             })
      .def("forward_stats",
           [](const BoundSession& s) {
             const ForwardStats f = s.core->forward_stats();
             return py::make_tuple(f.experts, std::vector<double>(f.phases.begin(), f.phases.end()),
                                   f.forwards);
           },
           "This session's share of the expert and phase counters: (ExpertStoreStats, phase "
           "seconds, forwards), measured inside the engine lock around each forward.")
      .def("last_routing",
           [](const BoundSession& s) {
             const Session& c = *s.core;
             const int64_t k = c.spec().n_experts_per_tok, layers = c.spec().n_layers;
             const std::vector<int32_t> routing = c.last_routing();
             const int64_t n = k > 0 ? c.last_routing_tokens() : 0;
             py::array_t<int32_t> out({n, layers, std::max<int64_t>(k, 0)});
             if (n > 0) std::copy(routing.begin(), routing.end(), out.mutable_data());
             return out;
           })
      .def("reset",
           [](BoundSession& s) {
             s.core->reset();
             s.last_logits = py::none();
           })
      .def(
          "rollback",
          [](BoundSession& s, int64_t n, const py::object& last_logits) {
            // Speculative decoding rolls back rejected drafts and keeps the verify's logits
            // for the new last token: checked first, then both change in this one call.
            if (!last_logits.is_none()) {
              auto a = py::array_t<float, py::array::c_style | py::array::forcecast>::ensure(last_logits);
              if (!a || a.ndim() != 1 || a.shape(0) != s.core->vocab_size())
                fail(ErrorKind::InvalidArgument, "rollback: last_logits must be a [vocab] float32 array");
              s.core->rollback(n);
              s.last_logits = a;
              return;
            }
            s.core->rollback(n);
            if (n > 0) s.last_logits = py::none();  // the new last token's logits were not kept
          },
          py::arg("n"), py::arg("last_logits") = py::none(),
          "Forgets the last n tokens; last_logits (optional, [vocab]) become the logits after the new last token.")
      .def("close",
           [](BoundSession& s) {
             {
               py::gil_scoped_release release;  // a running forward needs the GIL to stop
               s.core->close();
             }
             s.last_logits = py::none();
           })
      .def("enable_mtp", [](BoundSession& s) { s.core->enable_mtp(); },
           "Records the trunk's hidden states from now on and keeps the MTP layer's KV cache in step "
           "with the session's tokens (model/mtp.hpp). Unsupported when the model has no MTP layer.")
      .def_property_readonly("mtp_enabled", [](const BoundSession& s) { return s.core->mtp_enabled(); })
      .def_property_readonly("mtp_committed", [](const BoundSession& s) { return s.core->mtp_committed(); })
      .def_property_readonly("mtp_origin", [](const BoundSession& s) { return s.core->mtp_origin(); })
      .def_property_readonly(
          "mtp_kv_allocated_bytes", [](const BoundSession& s) { return s.core->mtp_kv_allocated_bytes(); },
          "Bytes the MTP layer's own KV cache holds now (0 until enable_mtp).")
      .def(
          "mtp_draft",
          [](BoundSession& s, int32_t next, int64_t k,
             bool return_logits) -> std::pair<std::vector<int32_t>, std::optional<py::array_t<float>>> {
            if (k < 0) fail(ErrorKind::InvalidArgument, "mtp_draft: k must be >= 0");
            const int64_t vocab = s.core->vocab_size();
            std::vector<float> logits(return_logits ? static_cast<std::size_t>(k * vocab) : 0);
            std::vector<int32_t> drafts;
            {
              py::gil_scoped_release release;
              drafts = s.core->mtp_draft(next, k, return_logits ? logits.data() : nullptr);
            }
            if (!return_logits) return {drafts, std::nullopt};
            const auto rows = static_cast<int64_t>(drafts.size());
            py::array_t<float> out({rows, vocab});
            std::copy(logits.begin(), logits.begin() + rows * vocab, out.mutable_data());
            return {drafts, out};
          },
          py::arg("next"), py::arg("k"), py::arg("return_logits") = false,
          "Up to k greedy MTP drafts after the session's tokens and `next` (chosen, not forwarded "
          "yet): (tokens, [depth, vocab] logits or None).")
      .def_property_readonly("closed", [](const BoundSession& s) { return s.core->closed(); });
  m.def("forward_batch", &forward_batch, py::arg("sessions"), py::arg("ids"), py::arg("all_logits"),
        "One forward for several sessions of one model (continuous batching): session i "
        "appends ids[i]; returns each one's logits ([vocab], or [n, vocab] when all_logits[i]; "
        "None when all_logits[i] is None). "
        "All or nothing: on any error no session changes.");
}

}  // namespace colibri::bindings
