// colibri._core.attention: the attention kernels on NumPy arrays, for tests and benchmarks
// (not a user API). Keys and values are stored at the requested KV type the way the KV
// cache stores them, then attended over; isa picks the kernels ("reference": the naive one).
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "attention/attention.hpp"
#include "common/errors.hpp"
#include "quant/dtype.hpp"
#include "quant/kernels.hpp"
#include "threadpool/threadpool.hpp"

namespace py = pybind11;

namespace colibri::bindings {
namespace {

using FloatArray = py::array_t<float, py::array::c_style | py::array::forcecast>;
using IntArray = py::array_t<int32_t, py::array::c_style | py::array::forcecast>;
using OffsetArray = py::array_t<int64_t, py::array::c_style | py::array::forcecast>;

// K or V rows [n_positions, heads, dim] stored at `type`, one cache row per position.
struct Stored {
  std::vector<uint8_t> bytes;
  attn::KvSide side;
};

Stored store(const FloatArray& x, DType type) {
  if (x.ndim() != 3) fail(ErrorKind::InvalidArgument, "keys and values must be [positions, heads, dim]");
  const int64_t n = x.shape(0), heads = x.shape(1), dim = x.shape(2);
  const std::size_t head_bytes = row_bytes(type, dim), pos_bytes = head_bytes * static_cast<std::size_t>(heads);
  Stored s;
  s.bytes.resize(pos_bytes * static_cast<std::size_t>(n) + 64);
  const QuantizeRowFn quantize = kernels(type).quantize_row;
  for (int64_t j = 0; j < n; ++j)
    for (int64_t h = 0; h < heads; ++h)
      quantize(x.data() + (j * heads + h) * dim, s.bytes.data() + j * pos_bytes + h * head_bytes, dim);
  s.side = attn::KvSide{type, s.bytes.data(), pos_bytes, head_bytes};
  return s;
}

struct Call {
  Stored k, v;
  std::vector<int32_t> index;
  std::vector<int64_t> offsets;
  attn::Problem p;
  py::array_t<float> out;
};

std::unique_ptr<Call> prepare(const FloatArray& q, const FloatArray& k, const std::optional<FloatArray>& v,
                              int64_t dv, int64_t pos0, float scale, const std::string& kv_type,
                              const std::optional<IntArray>& key_index, const std::optional<OffsetArray>& key_offsets) {
  if (q.ndim() != 3) fail(ErrorKind::InvalidArgument, "queries must be [n_queries, n_heads, dk]");
  auto c = std::make_unique<Call>();
  const DType type = dtype_from_name(kv_type);
  c->k = store(k, type);
  const int64_t n_kv = k.shape(1), dk = k.shape(2), nh = q.shape(1);
  if (q.shape(2) != dk || nh % n_kv != 0)
    fail(ErrorKind::InvalidArgument, "queries need dk = the keys' dim and n_heads a multiple of the KV heads");
  attn::Problem& p = c->p;
  if (v) {
    c->v = store(*v, type);
    if (v->shape(0) != k.shape(0) || v->shape(1) != n_kv) fail(ErrorKind::InvalidArgument, "values do not match keys");
    dv = v->shape(2);
    p.v = c->v.side;
  } else {
    if (dv <= 0 || dv > dk) fail(ErrorKind::InvalidArgument, "without values, give 0 < dv <= dk (values = key prefix)");
    p.v = c->k.side;
  }
  p.k = c->k.side;
  p.n_queries = q.shape(0);
  p.n_kv_heads = n_kv;
  p.group = nh / n_kv;
  p.dk = dk;
  p.dv = dv;
  p.scale = scale;
  p.q = q.data();
  p.q_stride = nh * dk;
  p.q_head_stride = dk;
  c->out = py::array_t<float>({p.n_queries, nh, dv});
  p.out = c->out.mutable_data();
  p.out_stride = nh * dv;
  p.out_head_stride = dv;
  p.pos0 = pos0;
  if (key_index) {
    if (!key_offsets || key_offsets->ndim() != 1 || key_offsets->shape(0) != p.n_queries + 1)
      fail(ErrorKind::InvalidArgument, "key_index needs key_offsets of n_queries + 1 entries");
    c->index.assign(key_index->data(), key_index->data() + key_index->size());
    c->offsets.assign(key_offsets->data(), key_offsets->data() + key_offsets->size());
    if (c->offsets.back() > static_cast<int64_t>(c->index.size()))
      fail(ErrorKind::InvalidArgument, "key_offsets point past key_index");
    p.key_index = c->index.data();
    p.key_offsets = c->offsets.data();
    p.n_positions = k.shape(0);
  } else if (pos0 < 0 || pos0 + p.n_queries > k.shape(0)) {
    fail(ErrorKind::InvalidArgument, "causal attention needs pos0 >= 0 and pos0 + n_queries <= positions");
  }
  return c;
}

std::optional<Isa> parse_isa(const std::optional<std::string>& name) {
  if (!name || *name == "reference") return std::nullopt;
  for (Isa isa : {Isa::Scalar, Isa::AVX2, Isa::AVX512, Isa::NEON})
    if (*name == isa_name(isa)) return isa;
  fail(ErrorKind::InvalidArgument, "unknown ISA '" + *name + "' (reference, scalar, avx2, avx512, neon)");
}

ThreadSettings team(int threads) {
  ThreadSettings s;
  s.n_threads = threads;
  s.policy = WaitPolicy::Spin;
  return s;
}

py::array_t<float> run(const FloatArray& q, const FloatArray& k, const std::optional<FloatArray>& v, int64_t dv,
                       int64_t pos0, float scale, const std::string& kv_type, const std::optional<std::string>& isa,
                       int threads, const std::optional<IntArray>& key_index,
                       const std::optional<OffsetArray>& key_offsets) {
  std::unique_ptr<Call> c = prepare(q, k, v, dv, pos0, scale, kv_type, key_index, key_offsets);
  const std::optional<Isa> which = parse_isa(isa);
  {
    py::gil_scoped_release release;
    if (!isa) {
      ThreadPool pool(team(threads));
      std::vector<float> ws;
      attn::run(pool, c->p, ws);
    } else if (!which) {
      attn::reference(c->p);
    } else {
      ThreadPool pool(team(threads));
      std::vector<float> ws;
      attn::run_with(pool, c->p, ws, *which);
    }
  }
  return c->out;
}

double bench(const FloatArray& q, const FloatArray& k, const std::optional<FloatArray>& v, int64_t dv, int64_t pos0,
             float scale, const std::string& kv_type, int threads, int iters,
             const std::optional<std::string>& isa) {
  std::unique_ptr<Call> c = prepare(q, k, v, dv, pos0, scale, kv_type, std::nullopt, std::nullopt);
  const std::optional<Isa> which = parse_isa(isa);
  if (isa && !which) fail(ErrorKind::InvalidArgument, "bench runs the tiled kernels: isa 'reference' is not one");
  py::gil_scoped_release release;
  ThreadPool pool(team(threads));
  std::vector<float> ws;
  ThreadPool::ComputeScope scope(pool);
  auto once = [&] { which ? attn::run_with(pool, c->p, ws, *which) : attn::run(pool, c->p, ws); };
  once();  // warm-up: grows the workspace
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < iters; ++i) once();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / std::max(iters, 1);
}

}  // namespace

void bind_attention(py::module_& m) {
  py::module_ a = m.def_submodule("attention", "Attention kernels (tests and benchmarks).");
  const auto none = py::none();
  a.def("run", &run, py::arg("q"), py::arg("k"), py::arg("v") = none, py::arg("dv") = 0, py::arg("pos0") = 0,
        py::arg("scale") = 1.0f, py::arg("kv_type") = "F32", py::arg("isa") = none, py::arg("threads") = 1,
        py::arg("key_index") = none, py::arg("key_offsets") = none,
        "out[n_queries, n_heads, dv] = softmax(scale q k^T) v, causal from pos0 (query t sees keys "
        "0..pos0+t) or over key_index[key_offsets[t]:key_offsets[t+1]]. q: [n_queries, n_heads, dk]; "
        "k: [positions, n_kv_heads, dk]; v: [positions, n_kv_heads, dv], or None for the first dv "
        "values of each key row. Keys and values are stored at kv_type first. isa: None (best), "
        "'reference' (naive, double) or an ISA name.");
  a.def("bench", &bench, py::arg("q"), py::arg("k"), py::arg("v") = none, py::arg("dv") = 0, py::arg("pos0") = 0,
        py::arg("scale") = 1.0f, py::arg("kv_type") = "F32", py::arg("threads") = 1, py::arg("iters") = 10, py::arg("isa") = none,
        "Seconds per run() with the best kernels (or those of isa), iters runs inside one "
        "ComputeScope.");
  a.def("workspace_floats", &attn::workspace_floats, py::arg("n_heads"), py::arg("dk"), py::arg("dv"),
        py::arg("threads"), "Most floats of working memory a run needs (the budget mirrors it).");
  a.def("block_keys", [] { return attn::kBlockKeys; });
  a.def("chunk_keys", [] { return attn::kChunkKeys; });
}

}  // namespace colibri::bindings
