// Python bindings of the compute team: colibri._core.WaitPolicy, ThreadSettings,
// ThreadPoolStats and ThreadPool. The ThreadPool binding also carries small synthetic
// workloads (run_regions, coverage, raise_at, nested) so tests and benchmarks can observe
// the pool's behaviour (coverage, exceptions, CPU use per wait policy) without a model.
// Every call that waits or computes releases the GIL.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "common/errors.hpp"
#include "threadpool/threadpool.hpp"

namespace py = pybind11;

namespace colibri::bindings {

namespace {

const char* policy_name(WaitPolicy p) {
  switch (p) {
    case WaitPolicy::Spin: return "spin";
    case WaitPolicy::Passive: return "passive";
    case WaitPolicy::Hybrid: return "hybrid";
    case WaitPolicy::Auto: return "auto";
  }
  return "?";
}

// Busy work of about `ns` nanoseconds on this thread (a clock-bounded loop, so it costs
// CPU time like real compute and does not depend on compiler cleverness).
void burn_ns(int64_t ns) {
  if (ns <= 0) return;
  const auto end = std::chrono::steady_clock::now() + std::chrono::nanoseconds(ns);
  while (std::chrono::steady_clock::now() < end) {
  }
}

std::string settings_repr(const ThreadSettings& s) {
  return "ThreadSettings(n_threads=" + std::to_string(s.n_threads) + ", policy='" +
         policy_name(s.policy) + "', spin_us=" + std::to_string(s.spin_us) + ")";
}

}  // namespace

void bind_threads(py::module_& m) {
  py::enum_<WaitPolicy>(m, "WaitPolicy",
                        "How the compute team waits between parallel regions of a computation.")
      .value("SPIN", WaitPolicy::Spin, "busy-wait (lowest latency; burns a core per thread)")
      .value("PASSIVE", WaitPolicy::Passive, "sleep on a condition variable")
      .value("HYBRID", WaitPolicy::Hybrid, "spin for spin_us microseconds, then sleep")
      .value("AUTO", WaitPolicy::Auto, "engine only: passive when disk-bound, else hybrid (passive on Apple Silicon)");

  py::class_<ThreadSettings>(m, "ThreadSettings",
                             "Team size (caller included), wait policy and hybrid spin time.")
      .def(py::init([](int n_threads, WaitPolicy policy, int64_t spin_us) {
             ThreadSettings s;
             s.n_threads = n_threads;
             s.policy = policy;
             s.spin_us = spin_us;
             return s;
           }),
           py::arg("n_threads") = 1, py::arg("policy") = WaitPolicy::Hybrid,
           py::arg("spin_us") = ThreadSettings{}.spin_us)
      .def_readwrite("n_threads", &ThreadSettings::n_threads)
      .def_readwrite("policy", &ThreadSettings::policy)
      .def_readwrite("spin_us", &ThreadSettings::spin_us)
      .def("__eq__",
           [](const ThreadSettings& a, const ThreadSettings& b) {
             return a.n_threads == b.n_threads && a.policy == b.policy && a.spin_us == b.spin_us;
           })
      .def("__repr__", &settings_repr);

  py::class_<ThreadPoolStats>(m, "ThreadPoolStats", "Counters since creation or reset_stats().")
      .def_readonly("regions", &ThreadPoolStats::regions)
      .def_readonly("inline_regions", &ThreadPoolStats::inline_regions)
      .def_readonly("sleeps", &ThreadPoolStats::sleeps)
      .def_readonly("caller_sleeps", &ThreadPoolStats::caller_sleeps)
      .def_readonly("scopes", &ThreadPoolStats::scopes)
      .def_readonly("starved", &ThreadPoolStats::starved)
      .def("as_dict",
           [](const ThreadPoolStats& s) {
             py::dict d;
             d["regions"] = s.regions;
             d["inline_regions"] = s.inline_regions;
             d["sleeps"] = s.sleeps;
             d["caller_sleeps"] = s.caller_sleeps;
             d["scopes"] = s.scopes;
             d["starved"] = s.starved;
             return d;
           })
      .def("__repr__", [](const ThreadPoolStats& s) {
        return "ThreadPoolStats(regions=" + std::to_string(s.regions) +
               ", inline_regions=" + std::to_string(s.inline_regions) +
               ", sleeps=" + std::to_string(s.sleeps) +
               ", caller_sleeps=" + std::to_string(s.caller_sleeps) +
               ", scopes=" + std::to_string(s.scopes) +
               ", starved=" + std::to_string(s.starved) + ")";
      });

  using Pool = ThreadPool;
  py::class_<Pool>(m, "ThreadPool",
                   "The compute team. The calling thread is member 0; settings take effect at "
                   "once; outside a computation every worker sleeps.")
      .def(py::init<const ThreadSettings&>(), py::arg("settings"),
           py::call_guard<py::gil_scoped_release>())
      .def(py::init([](int n_threads, WaitPolicy policy, int64_t spin_us) {
             ThreadSettings s;
             s.n_threads = n_threads;
             s.policy = policy;
             s.spin_us = spin_us;
             py::gil_scoped_release nogil;
             return std::make_unique<Pool>(s);
           }),
           py::arg("n_threads") = 1, py::arg("policy") = WaitPolicy::Hybrid,
           py::arg("spin_us") = ThreadSettings{}.spin_us)
      .def("configure", &Pool::configure, py::arg("settings"),
           py::call_guard<py::gil_scoped_release>(),
           "Applies new settings at once (resizes the team, changes the policy).")
      .def(
          "configure",
          [](Pool& pool, py::object n_threads, py::object policy, py::object spin_us) {
            ThreadSettings s = pool.settings();
            if (!n_threads.is_none()) s.n_threads = n_threads.cast<int>();
            if (!policy.is_none()) s.policy = policy.cast<WaitPolicy>();
            if (!spin_us.is_none()) s.spin_us = spin_us.cast<int64_t>();
            py::gil_scoped_release nogil;
            pool.configure(s);
          },
          py::kw_only(), py::arg("n_threads") = py::none(), py::arg("policy") = py::none(),
          py::arg("spin_us") = py::none(), "Changes only the settings given.")
      .def_property_readonly("size", &Pool::size, "team size, the caller included")
      .def_property_readonly("settings", &Pool::settings)
      .def("stats", &Pool::stats)
      .def("reset_stats", &Pool::reset_stats)
      .def(
          "run_regions",
          [](Pool& pool, int64_t n_regions, int64_t work_ns_per_index, int64_t n_indices,
             int64_t grain, int64_t gap_ns, int64_t sleep_ns) {
            // n_regions parallel regions inside one ComputeScope, like one forward call.
            // Between regions the caller does gap_ns of serial work (norms, routing) and
            // then sleeps sleep_ns (a wait for an expert read or the GPU).
            std::atomic<int64_t> done{0};
            {
              Pool::ComputeScope scope(pool);
              for (int64_t r = 0; r < n_regions; ++r) {
                pool.parallel_for(n_indices, grain, [&](int64_t b, int64_t e, int) {
                  for (int64_t i = b; i < e; ++i) burn_ns(work_ns_per_index);
                  done.fetch_add(e - b, std::memory_order_relaxed);
                });
                burn_ns(gap_ns);
                if (sleep_ns > 0) std::this_thread::sleep_for(std::chrono::nanoseconds(sleep_ns));
              }
            }
            return done.load();
          },
          py::arg("n_regions"), py::arg("work_ns_per_index"), py::arg("n_indices"),
          py::arg("grain") = 1, py::arg("gap_ns") = 0, py::arg("sleep_ns") = 0,
          py::call_guard<py::gil_scoped_release>(),
          "Test helper: synthetic regions of busy work in one ComputeScope; returns the "
          "number of indices executed (n_regions * n_indices).")
      .def(
          "coverage",
          [](Pool& pool, int64_t n, int64_t grain) {
            // visits[i]: how often index i ran; per_member[t]: indices run by member t;
            // max_chunk: the largest end - begin handed to fn.
            std::vector<std::atomic<int64_t>> visits(static_cast<size_t>(std::max<int64_t>(n, 0)));
            std::vector<std::atomic<int64_t>> per_member(static_cast<size_t>(pool.size()));
            std::atomic<int64_t> max_chunk{0};
            pool.parallel_for(n, grain, [&](int64_t b, int64_t e, int t) {
              for (int64_t i = b; i < e; ++i) visits[static_cast<size_t>(i)].fetch_add(1);
              per_member.at(static_cast<size_t>(t)).fetch_add(e - b);
              int64_t cur = max_chunk.load();
              while (e - b > cur && !max_chunk.compare_exchange_weak(cur, e - b)) {
              }
            });
            std::vector<int64_t> v, pm;
            for (auto& x : visits) v.push_back(x.load());
            for (auto& x : per_member) pm.push_back(x.load());
            return std::make_tuple(v, pm, max_chunk.load());
          },
          py::arg("n"), py::arg("grain"), py::call_guard<py::gil_scoped_release>(),
          "Test helper: returns (visits per index, indices per member, largest chunk).")
      .def(
          "raise_at",
          [](Pool& pool, int64_t n, int64_t grain, int64_t index, const std::string& kind) {
            pool.parallel_for(n, grain, [&](int64_t b, int64_t e, int) {
              if (index < b || index >= e) return;
              if (kind == "runtime") throw std::runtime_error("boom at index " + std::to_string(index));
              if (kind == "value") throw std::invalid_argument("bad index " + std::to_string(index));
              if (kind == "io") fail(ErrorKind::Io, "read failed at index " + std::to_string(index));
              throw std::logic_error("unknown kind " + kind);
            });
          },
          py::arg("n"), py::arg("grain"), py::arg("index"), py::arg("kind") = "runtime",
          py::call_guard<py::gil_scoped_release>(),
          "Test helper: a region whose fn throws at `index` (kind: runtime -> RuntimeError, "
          "value -> ValueError, io -> colibri.errors.ModelIOError).")
      .def(
          "nested",
          [](Pool& pool, int64_t n_outer, int64_t n_inner) {
            // A parallel_for inside a region runs inline on that thread (no deadlock) and
            // passes on the thread's member index; -1 is returned if it did not.
            std::atomic<int64_t> count{0};
            std::atomic<bool> same_member{true};
            pool.parallel_for(n_outer, 1, [&](int64_t b, int64_t e, int outer) {
              for (int64_t i = b; i < e; ++i)
                pool.parallel_for(n_inner, 1, [&](int64_t ib, int64_t ie, int inner) {
                  if (inner != outer) same_member = false;
                  count.fetch_add(ie - ib);
                });
            });
            return same_member ? count.load() : int64_t{-1};
          },
          py::arg("n_outer"), py::arg("n_inner"), py::call_guard<py::gil_scoped_release>(),
          "Test helper: nested regions; returns n_outer * n_inner (-1 if an inner region saw "
          "another member index than its outer one).");
}

}  // namespace colibri::bindings
