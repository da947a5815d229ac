// Argument handling shared by colibri._core.attention and colibri._bench
// (attention_args.hpp).
#include "bindings/attention_args.hpp"

#include "common/errors.hpp"

namespace py = pybind11;
#include "quant/dtype.hpp"

namespace colibri::bindings::attention_args {
namespace {

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

}  // namespace

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

}  // namespace colibri::bindings::attention_args
