// A standalone check of the attention kernels of one build target against the naive
// reference and against themselves (bit-identical across threads, batching and splits),
// without Python: for cross-compiled targets run under an emulator, e.g. the NEON kernels
// on an x86 host (scripts/check_arm64_qemu.sh). Exit status 0 when every check passes.
#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

#include "attention/attention.hpp"
#include "attention/kernels.hpp"
#include "quant/kernels.hpp"
#include "threadpool/threadpool.hpp"

using namespace colibri;

namespace {

int failures = 0;

struct Case {
  int64_t n_pos, n_kv, group, dk, dv;
  bool v_in_k;
  DType type;
  int64_t window = 0;  // sliding window (0: none)
  bool sinks = false;  // a sink logit per head, drawn from N(0, 2)
};

std::vector<uint8_t> store(const std::vector<float>& x, int64_t n, int64_t heads, int64_t dim, DType type) {
  const std::size_t hb = row_bytes(type, dim);
  std::vector<uint8_t> out(hb * static_cast<std::size_t>(n * heads));
  for (int64_t i = 0; i < n * heads; ++i) kernels(type).quantize_row(x.data() + i * dim, out.data() + i * hb, dim);
  return out;
}

void run_case(const Case& c, Isa isa) {
  std::mt19937 rng(static_cast<unsigned>(c.n_pos * 7 + c.dk));
  std::normal_distribution<float> nd;
  const int64_t nh = c.n_kv * c.group;
  std::vector<float> q(static_cast<std::size_t>(c.n_pos * nh * c.dk)), k(static_cast<std::size_t>(c.n_pos * c.n_kv * c.dk)),
      v(static_cast<std::size_t>(c.n_pos * c.n_kv * c.dv));
  for (auto* x : {&q, &k, &v})
    for (float& f : *x) f = nd(rng);
  const std::vector<uint8_t> kb = store(k, c.n_pos, c.n_kv, c.dk, c.type), vb = store(v, c.n_pos, c.n_kv, c.dv, c.type);
  std::vector<float> sinks(static_cast<std::size_t>(nh));
  for (float& f : sinks) f = 2.0f * nd(rng);
  attn::Problem p;
  p.window = c.window;
  p.sinks = c.sinks ? sinks.data() : nullptr;
  p.n_queries = c.n_pos;
  p.n_kv_heads = c.n_kv;
  p.group = c.group;
  p.dk = c.dk;
  p.dv = c.dv;
  p.scale = 1.0f / std::sqrt(static_cast<float>(c.dk));
  p.q = q.data();
  p.q_stride = nh * c.dk;
  p.q_head_stride = c.dk;
  p.out_stride = nh * c.dv;
  p.out_head_stride = c.dv;
  p.k = attn::KvSide{c.type, kb.data(), row_bytes(c.type, c.dk) * c.n_kv, row_bytes(c.type, c.dk)};
  p.v = c.v_in_k ? p.k : attn::KvSide{c.type, vb.data(), row_bytes(c.type, c.dv) * c.n_kv, row_bytes(c.type, c.dv)};
  const std::size_t out_n = static_cast<std::size_t>(c.n_pos * nh * c.dv);
  std::vector<float> ref(out_n), full(out_n), other(out_n), ws;
  p.out = ref.data();
  attn::reference(p);
  ThreadSettings ts;
  ts.n_threads = 2;
  ThreadPool pool2(ts);
  ts.n_threads = 3;
  ThreadPool pool3(ts);
  p.out = full.data();
  attn::run_with(pool2, p, ws, isa);
  float err = 0, vmax = 0;
  for (std::size_t i = 0; i < out_n; ++i) err = std::fmax(err, std::fabs(full[i] - ref[i]));
  for (float x : (c.v_in_k ? k : v)) vmax = std::fmax(vmax, std::fabs(x));
  const bool close = err <= 2e-5f * vmax;
  p.out = other.data();
  attn::run_with(pool3, p, ws, isa);
  bool same = other == full;
  for (int64_t t : {int64_t{0}, c.n_pos / 2, c.n_pos - 1}) {  // decode of single queries
    attn::Problem one = p;
    one.n_queries = 1;
    one.pos0 = t;
    one.q = q.data() + t * nh * c.dk;
    std::vector<float> o(static_cast<std::size_t>(nh * c.dv));
    one.out = o.data();
    attn::run_with(pool2, one, ws, isa);
    for (std::size_t i = 0; i < o.size(); ++i) same = same && o[i] == full[static_cast<std::size_t>(t * nh * c.dv) + i];
  }
  std::printf("%-6s %-4s pos %4lld kv %lld x %3lld dk %3lld dv %3lld window %3lld%s: max err %.2e (%s), "
              "deterministic %s\n",
              isa_name(isa), dtype_name(c.type).c_str(), static_cast<long long>(c.n_pos),
              static_cast<long long>(c.n_kv), static_cast<long long>(c.group), static_cast<long long>(c.dk),
              static_cast<long long>(c.dv), static_cast<long long>(c.window), c.sinks ? " sinks" : "", err,
              close ? "ok" : "FAIL", same ? "ok" : "FAIL");
  failures += !close + !same;
}

// Decode of the last query at a long context (9 chunks of 256 keys): a team of 1 runs every
// KV head of a chunk in one task, a team of 3 splits the heads; both read the cache rows in
// place. Same bits both ways, close to the reference.
void run_long_decode(DType type, Isa isa) {
  const int64_t n_pos = 2100, n_kv = 3, group = 3, d = 64, nh = n_kv * group;
  std::mt19937 rng(static_cast<unsigned>(n_pos));
  std::normal_distribution<float> nd;
  std::vector<float> q(static_cast<std::size_t>(nh * d)), k(static_cast<std::size_t>(n_pos * n_kv * d)),
      v(static_cast<std::size_t>(n_pos * n_kv * d));
  for (auto* x : {&q, &k, &v})
    for (float& f : *x) f = nd(rng);
  const std::vector<uint8_t> kb = store(k, n_pos, n_kv, d, type), vb = store(v, n_pos, n_kv, d, type);
  attn::Problem p;
  p.n_queries = 1;
  p.n_kv_heads = n_kv;
  p.group = group;
  p.dk = p.dv = d;
  p.scale = 0.125f;
  p.q = q.data();
  p.q_stride = nh * d;
  p.q_head_stride = d;
  p.out_stride = nh * d;
  p.out_head_stride = d;
  p.pos0 = n_pos - 1;
  p.k = attn::KvSide{type, kb.data(), row_bytes(type, d) * n_kv, row_bytes(type, d)};
  p.v = attn::KvSide{type, vb.data(), row_bytes(type, d) * n_kv, row_bytes(type, d)};
  std::vector<float> ref(static_cast<std::size_t>(nh * d)), one(ref.size()), three(ref.size()), ws;
  p.out = ref.data();
  attn::reference(p);
  ThreadSettings ts;
  ThreadPool pool1(ts);
  ts.n_threads = 3;
  ThreadPool pool3(ts);
  p.out = one.data();
  attn::run_with(pool1, p, ws, isa);
  p.out = three.data();
  attn::run_with(pool3, p, ws, isa);
  float err = 0, vmax = 0;
  for (std::size_t i = 0; i < ref.size(); ++i) err = std::fmax(err, std::fabs(one[i] - ref[i]));
  for (float x : v) vmax = std::fmax(vmax, std::fabs(x));
  const bool close = err <= 2e-5f * vmax, same = one == three;
  std::printf("%-6s %-4s decode at %lld positions: max err %.2e (%s), 1 vs 3 threads %s\n", isa_name(isa),
              dtype_name(type).c_str(), static_cast<long long>(n_pos), err, close ? "ok" : "FAIL",
              same ? "same bits" : "FAIL");
  failures += !close + !same;
}

}  // namespace

int main() {
  const Case cases[] = {
      {300, 3, 3, 64, 64, false, DType::F32},   {300, 2, 4, 80, 80, false, DType::F16},
      {200, 1, 2, 96, 96, false, DType::BF16},  {200, 2, 8, 128, 128, false, DType::Q8_0},
      {150, 4, 2, 192, 128, false, DType::F16}, {100, 1, 16, 576, 512, true, DType::F32},
      {70, 1, 128, 576, 512, true, DType::Q8_0},
      {300, 2, 3, 64, 64, false, DType::F16, 3, true},  // gpt-oss: sliding window + sinks
      {600, 2, 3, 64, 64, false, DType::F32, 100, true}, {600, 3, 3, 64, 64, false, DType::Q8_0, 257, false},
  };
  for (Isa isa : {Isa::Scalar, Isa::AVX2, Isa::AVX512, Isa::NEON}) {
    if (!attn::kernels_for(isa)) continue;
    for (const Case& c : cases) run_case(c, isa);
    for (DType type : {DType::F32, DType::F16, DType::BF16, DType::Q8_0}) run_long_decode(type, isa);
  }
  std::printf("%s\n", failures ? "FAILED" : "all passed");
  return failures ? 1 : 0;
}
