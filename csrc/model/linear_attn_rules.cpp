#include "model/linear_attn_rules.hpp"

#include <algorithm>
#include <cmath>
#include <vector>

namespace colibri::linattn {

void delta_rule_recurrent(const Kernels& kern, const HeadRows& r, int64_t n, float* S) {
  std::vector<float> decay(static_cast<std::size_t>(r.dk));
  for (int64_t t = 0; t < n; ++t) {
    const float* g = r.g + t * r.g_stride;
    if (r.channel_decay) {
      for (int64_t i = 0; i < r.dk; ++i) decay[static_cast<std::size_t>(i)] = std::exp(g[i]);
    } else {
      std::fill(decay.begin(), decay.end(), std::exp(g[0]));
    }
    kern.step(S, r.dk, r.dv, decay.data(), r.k + t * r.stride, r.v + t * r.stride, r.beta[t * r.beta_stride],
              r.q + t * r.stride, r.out + t * r.ostride);
  }
}

// Per chunk of L tokens, c_i the running sum of the log decays in the chunk (one per key
// channel with channel_decay, else one; e^(c_i - c_j) below is then per channel, inside
// the sums over channels):
//   T = I + strictly-lower (beta_i k_i.k_j e^(c_i - c_j));
//   U = T^-1 (beta v), W = T^-1 (beta e^(c) k)  (forward substitution, row by row);
//   v' = U - W S;  o_i = (e^(c_i) q_i) S + sum_(j<=i) (q_i.k_j e^(c_i - c_j)) v'_j;
//   S = diag(e^(c_last)) S + sum_i (e^(c_last - c_i) k_i) v'_i^T.
// Every product with a row vector goes through kern.row_acc, the dot products of a
// scalar-decay chunk too (k_i . k_j as row i of K times K^T), each summed in the order of
// the plain loops. The channel-decay dot products keep an exp per channel and pair, scalar.
void delta_rule_chunked(const Kernels& kern, const HeadRows& r, int64_t n, float* S) {
  const int64_t dk = r.dk, dv = r.dv, cw = r.channel_decay ? dk : 1;  // c's values per token
  std::vector<float> c(static_cast<std::size_t>(kChunk * cw)), U(static_cast<std::size_t>(kChunk * dv)),
      W(static_cast<std::size_t>(kChunk * dk)), KT(static_cast<std::size_t>(dk * kChunk)),
      dots(kChunk), coef(kChunk), row(static_cast<std::size_t>(dk));
  auto at = [](std::vector<float>& x, int64_t i) { return x.data() + i; };
  for (int64_t t0 = 0; t0 < n; t0 += kChunk) {
    const int64_t L = std::min(kChunk, n - t0);
    auto q = [&](int64_t i) { return r.q + (t0 + i) * r.stride; };
    auto k = [&](int64_t i) { return r.k + (t0 + i) * r.stride; };
    auto v = [&](int64_t i) { return r.v + (t0 + i) * r.stride; };
    auto ci = [&](int64_t i) { return at(c, i * cw); };
    for (int64_t i = 0; i < L; ++i)
      for (int64_t a = 0; a < cw; ++a) ci(i)[a] = (i ? ci(i - 1)[a] : 0.0f) + r.g[(t0 + i) * r.g_stride + a];
    for (int64_t i = 0; i < L; ++i)
      for (int64_t a = 0; a < dk; ++a) KT[static_cast<std::size_t>(a * kChunk + i)] = k(i)[a];
    // x_i . k_j (times e^(c_i - c_j)) for j < m into dots.
    auto decayed_dots = [&](const float* x, int64_t i, int64_t m) {
      if (!r.channel_decay) {
        std::fill(dots.begin(), dots.begin() + m, 0.0f);
        kern.row_acc(dots.data(), x, dk, KT.data(), kChunk, m);
        for (int64_t j = 0; j < m; ++j) dots[static_cast<std::size_t>(j)] *= std::exp(ci(i)[0] - ci(j)[0]);
        return;
      }
      for (int64_t j = 0; j < m; ++j) {
        float acc = 0.0f;
        for (int64_t a = 0; a < dk; ++a) acc += x[a] * k(j)[a] * std::exp(ci(i)[a] - ci(j)[a]);
        dots[static_cast<std::size_t>(j)] = acc;
      }
    };
    for (int64_t i = 0; i < L; ++i) {  // forward substitution through the unit lower-triangular T
      float* Ui = at(U, i * dv);
      float* Wi = at(W, i * dk);
      const float bi = r.beta[(t0 + i) * r.beta_stride];
      for (int64_t x = 0; x < dv; ++x) Ui[x] = bi * v(i)[x];
      for (int64_t a = 0; a < dk; ++a) Wi[a] = bi * std::exp(ci(i)[r.channel_decay ? a : 0]) * k(i)[a];
      decayed_dots(k(i), i, i);
      for (int64_t j = 0; j < i; ++j) coef[static_cast<std::size_t>(j)] = -(bi * dots[static_cast<std::size_t>(j)]);
      kern.row_acc(Ui, coef.data(), i, U.data(), dv, dv);  // Ui -= t_ij Uj, j in order
      kern.row_acc(Wi, coef.data(), i, W.data(), dk, dk);
    }
    for (int64_t i = 0; i < L; ++i) {  // U becomes v' = U - W S
      const float* Wi = at(W, i * dk);
      for (int64_t a = 0; a < dk; ++a) row[static_cast<std::size_t>(a)] = -Wi[a];
      kern.row_acc(at(U, i * dv), row.data(), dk, S, dv, dv);
    }
    for (int64_t i = 0; i < L; ++i) {
      float* o = r.out + (t0 + i) * r.ostride;
      for (int64_t a = 0; a < dk; ++a)
        row[static_cast<std::size_t>(a)] = std::exp(ci(i)[r.channel_decay ? a : 0]) * q(i)[a];
      std::fill(o, o + dv, 0.0f);
      kern.row_acc(o, row.data(), dk, S, dv, dv);
      decayed_dots(q(i), i, i + 1);
      kern.row_acc(o, dots.data(), i + 1, U.data(), dv, dv);
    }
    const float* last = ci(L - 1);
    for (int64_t a = 0; a < dk; ++a) {
      const float el = std::exp(last[r.channel_decay ? a : 0]);
      float* Sa = S + a * dv;
      for (int64_t x = 0; x < dv; ++x) Sa[x] *= el;
    }
    for (int64_t a = 0; a < dk; ++a) {  // S_a += sum_i (e^(c_last - c_i) k_i[a]) v'_i, i in order
      const int64_t ca = r.channel_decay ? a : 0;
      for (int64_t i = 0; i < L; ++i) coef[static_cast<std::size_t>(i)] = std::exp(last[ca] - ci(i)[ca]) * k(i)[a];
      kern.row_acc(S + a * dv, coef.data(), L, U.data(), dv, dv);
    }
  }
}

}  // namespace colibri::linattn
