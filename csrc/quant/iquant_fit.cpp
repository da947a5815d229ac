// The lattice fit behind colibri's low-bit i-quant quantizers (see iquant_fit.hpp).
// The SSE2 paths compute the same float operations per point as the scalar ones; build with
// -DCOLIBRI_FIT_SCALAR to get the scalar ones on x86 (checked: identical bytes for every
// type on x86-64 SSE2, x86-64 scalar and aarch64 under qemu).
#if defined(__clang__)
#pragma clang fp contract(off)
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=off")
#endif

#include "quant/iquant_fit.hpp"

#include <cmath>
#include <cstring>
#if defined(__SSE2__) && !defined(COLIBRI_FIT_SCALAR)
#include <emmintrin.h>
#endif

#include "quant/fp16.hpp"

namespace colibri::iq::fit {
namespace {

constexpr int kQK = 256;

// Per super-block: for every point group k and grid point p, c = sum w a g, e = sum w g^2,
// f = sum w g (shifted grids only), and the group's A = sum w a, W = sum w.
//
// cand[k]: the points that won a full scan of group k so far (the scale searches after the
// first full scans only look at these; the stored points come from full scans again).
constexpr int kMaxCand = 48;
struct Workspace {
  std::vector<float> c, e, f;
  float A[kMaxPoints], W[kMaxPoints];
  int cand[kMaxPoints][kMaxCand], ncand[kMaxPoints];
  void reserve(std::size_t n) {
    if (c.size() < n) c.resize(n), e.resize(n), f.resize(n);
  }
};

Workspace& workspace() {
  thread_local Workspace ws;
  return ws;
}

// One group's pick at a scale: the point, its shift sign, and num = c + sign delta A,
// den = e + 2 sign delta f + delta^2 W, so that its weighted error (less sum w a^2) is
// s^2 den - 2 s num.
struct Pick {
  int p = 0;
  bool neg = false;
  float num = 0, den = 0;
  float obj(float s) const { return s * (s * den - 2.0f * num); }
};

// argmin_p s*E[p] + t*F[p] - 2*C[p] (F may be null: t ignored). Lanes each keep their first
// minimum and are merged by value, then index: the same point as a sequential scan, with the
// same float operations per point on every ISA.
#if defined(__SSE2__) && !defined(COLIBRI_FIT_SCALAR)
template <bool kShift>
int argmin_sse2(const float* C, const float* E, const float* F, int P, float s, float t) {
  const __m128 vs = _mm_set1_ps(s), vt = _mm_set1_ps(t), two = _mm_set1_ps(2.0f);
  __m128 m[2] = {_mm_set1_ps(INFINITY), _mm_set1_ps(INFINITY)};
  __m128i id[2] = {_mm_setr_epi32(0, 1, 2, 3), _mm_setr_epi32(4, 5, 6, 7)};
  __m128i cur[2] = {id[0], id[1]};
  const __m128i eight = _mm_set1_epi32(8);
  for (int p = 0; p < P; p += 8)
    for (int h = 0; h < 2; ++h) {
      const int o = p + 4 * h;
      __m128 v = _mm_mul_ps(vs, _mm_loadu_ps(E + o));
      if (kShift) v = _mm_add_ps(v, _mm_mul_ps(vt, _mm_loadu_ps(F + o)));
      v = _mm_sub_ps(v, _mm_mul_ps(two, _mm_loadu_ps(C + o)));
      const __m128 lt = _mm_cmplt_ps(v, m[h]);
      m[h] = _mm_or_ps(_mm_and_ps(lt, v), _mm_andnot_ps(lt, m[h]));
      const __m128i lti = _mm_castps_si128(lt);
      id[h] = _mm_or_si128(_mm_and_si128(lti, cur[h]), _mm_andnot_si128(lti, id[h]));
      cur[h] = _mm_add_epi32(cur[h], eight);
    }
  float mv[8];
  int iv[8];
  _mm_storeu_ps(mv, m[0]);
  _mm_storeu_ps(mv + 4, m[1]);
  _mm_storeu_si128(reinterpret_cast<__m128i*>(iv), id[0]);
  _mm_storeu_si128(reinterpret_cast<__m128i*>(iv + 4), id[1]);
  int b = 0;
  for (int l = 1; l < 8; ++l)
    if (mv[l] < mv[b] || (mv[l] == mv[b] && iv[l] < iv[b])) b = l;
  return iv[b];
}
#endif

[[maybe_unused]] int argmin_scalar(const float* C, const float* E, const float* F, int P, float s, float t) {
  float m = INFINITY;
  int id = 0;
  for (int p = 0; p < P; ++p) {
    float v = s * E[p];
    if (F) v = v + t * F[p];
    v = v - 2.0f * C[p];
    if (v < m) m = v, id = p;
  }
  return id;
}

int argmin(const float* C, const float* E, const float* F, int P, float s, float t) {
#if defined(__SSE2__) && !defined(COLIBRI_FIT_SCALAR)
  return F ? argmin_sse2<true>(C, E, F, P, s, t) : argmin_sse2<false>(C, E, F, P, s, t);
#else
  return argmin_scalar(C, E, F, P, s, t);
#endif
}

class Fitter {
 public:
  Fitter(const Spec& spec, Workspace& ws) : S(spec), L(*spec.lattice), ws(ws) {
    groups = kQK / L.width;
    per_block = S.scale_block / L.width;
    blocks = kQK / S.scale_block;
    ws.reserve(static_cast<std::size_t>(groups * L.points));
  }

  void prepare(const float* w, const float* a) {
    if (L.width == 8) {
      S.shift == Shift::None ? prepare_as<8, false>(w, a) : prepare_as<8, true>(w, a);
    } else {
      S.shift == Shift::None ? prepare_as<4, false>(w, a) : prepare_as<4, true>(w, a);
    }
  }

  // Point by point, the group's elements inner (registers, one store per array and point).
  template <int kWidth, bool kShift>
  void prepare_as(const float* w, const float* a) {
    const int P = L.points;
    const float* __restrict g = L.g.data();
    const float* __restrict g2 = L.g2.data();
    for (int k = 0; k < groups; ++k) {
      float* __restrict C = &ws.c[static_cast<std::size_t>(k * P)];
      float* __restrict E = &ws.e[static_cast<std::size_t>(k * P)];
      float* __restrict F = &ws.f[static_cast<std::size_t>(k * P)];
      float wk[kWidth], wa[kWidth], A = 0.0f, W = 0.0f;
      for (int j = 0; j < kWidth; ++j) {
        wk[j] = w[k * kWidth + j];
        wa[j] = wk[j] * a[k * kWidth + j];
        A += wa[j];
        W += wk[j];
      }
      int p = 0;
#if defined(__SSE2__) && !defined(COLIBRI_FIT_SCALAR)
      for (; p + 4 <= P; p += 4) {
        __m128 c = _mm_setzero_ps(), e = _mm_setzero_ps(), f = _mm_setzero_ps();
        for (int j = 0; j < kWidth; ++j) {
          const __m128 gj = _mm_loadu_ps(g + j * P + p), wj = _mm_set1_ps(wk[j]);
          c = _mm_add_ps(c, _mm_mul_ps(_mm_set1_ps(wa[j]), gj));
          e = _mm_add_ps(e, _mm_mul_ps(wj, _mm_loadu_ps(g2 + j * P + p)));
          if (kShift) f = _mm_add_ps(f, _mm_mul_ps(wj, gj));
        }
        _mm_storeu_ps(C + p, c);
        _mm_storeu_ps(E + p, e);
        if (kShift) _mm_storeu_ps(F + p, f);
      }
#endif
      for (; p < P; ++p) {  // the same operations, one point at a time
        float c = 0.0f, e = 0.0f, f = 0.0f;
        for (int j = 0; j < kWidth; ++j) {
          c += wa[j] * g[j * P + p];
          e += wk[j] * g2[j * P + p];
          if (kShift) f += wk[j] * g[j * P + p];
        }
        C[p] = c;
        E[p] = e;
        if (kShift) F[p] = f;
      }
      ws.A[k] = A;
      ws.W[k] = W;
      ws.ncand[k] = 0;
    }
  }

  // The best of group k's candidate list (same expression as argmin; ties: lowest index).
  int argmin_listed(int k, float s, float t) const {
    const std::size_t o = static_cast<std::size_t>(k * L.points);
    const float *C = &ws.c[o], *E = &ws.e[o], *F = &ws.f[o];
    float m = INFINITY;
    int id = ws.cand[k][0];
    for (int i = 0; i < ws.ncand[k]; ++i) {
      const int p = ws.cand[k][i];
      float v = s * E[p];
      if (S.shift != Shift::None) v = v + t * F[p];
      v = v - 2.0f * C[p];
      if (v < m || (v == m && p < id)) m = v, id = p;
    }
    return id;
  }

  void remember(int k, int p) {
    for (int i = 0; i < ws.ncand[k]; ++i)
      if (ws.cand[k][i] == p) return;
    if (ws.ncand[k] < kMaxCand) ws.cand[k][ws.ncand[k]++] = p;
  }

  // Group k's best point at scale s and shift sign neg: over the whole grid (`full`, and
  // remembered as a candidate), or over the candidates.
  Pick pick(int k, float s, bool neg, bool full) {
    const std::size_t o = static_cast<std::size_t>(k * L.points);
    const float sd = S.shift == Shift::None ? 0.0f : (neg ? -S.delta : S.delta);
    const float t = 2.0f * s * sd;
    Pick r;
    r.neg = neg;
    if (full || ws.ncand[k] == 0) {
      r.p = argmin(&ws.c[o], &ws.e[o], S.shift == Shift::None ? nullptr : &ws.f[o], L.points, s, t);
      remember(k, r.p);
    } else {
      r.p = argmin_listed(k, s, t);
    }
    const std::size_t i = o + static_cast<std::size_t>(r.p);
    if (S.shift == Shift::None) {
      r.num = ws.c[i];
      r.den = ws.e[i];
    } else {
      r.num = ws.c[i] + sd * ws.A[k];
      r.den = ws.e[i] + 2.0f * sd * ws.f[i] + S.delta * S.delta * ws.W[k];
    }
    return r;
  }

  // Every group of scale block b at scale s; returns the block's error (less sum w a^2).
  float eval_block(int b, float s, Pick* out, bool full) {
    const int k0 = b * per_block;
    if (S.shift == Shift::PerScaleBlock) {
      Pick alt[8];
      float pos = 0.0f, neg = 0.0f;
      for (int i = 0; i < per_block; ++i) {
        out[i] = pick(k0 + i, s, false, full);
        alt[i] = pick(k0 + i, s, true, full);
        pos += out[i].obj(s);
        neg += alt[i].obj(s);
      }
      if (neg < pos) {
        for (int i = 0; i < per_block; ++i) out[i] = alt[i];
        return neg;
      }
      return pos;
    }
    float total = 0.0f;
    for (int i = 0; i < per_block; ++i) {
      out[i] = pick(k0 + i, s, false, full);
      if (S.shift == Shift::PerPoint) {
        const Pick n = pick(k0 + i, s, true, full);
        if (n.obj(s) < out[i].obj(s)) out[i] = n;
      }
      total += out[i].obj(s);
    }
    return total;
  }

  // The block's least-squares scale over candidates around amax / gmax.
  // The first full_tries candidates scan the whole grid, the rest only the winners so far.
  float block_scale(int b, float amax) {
    if (!(amax > 0.0f) || !std::isfinite(amax)) return 0.0f;
    Pick picks[8];
    float best_s = 0.0f, best = 0.0f;
    auto try_scale = [&](float s, bool full) {
      eval_block(b, s, picks, full);
      float num = 0.0f, den = 0.0f;
      for (int i = 0; i < per_block; ++i) num += picks[i].num, den += picks[i].den;
      if (!(num > 0.0f && den > 0.0f)) return false;
      const float score = -num * num / den;
      if (score < best) {
        best = score;
        best_s = num / den;
        return true;
      }
      return false;
    };
    auto spaced = [&](int t, int n) {
      return amax / L.gmax * (0.5f + 0.8f * static_cast<float>(t) / static_cast<float>(n - 1));
    };
    for (int t = 0; t < S.full_tries; ++t) try_scale(spaced(t, S.full_tries), true);
    for (int t = 0; t < S.scale_tries; ++t) try_scale(spaced(t, S.scale_tries), false);
    for (int it = 0; it < 3 && best_s > 0.0f; ++it)
      if (!try_scale(best_s, false)) break;
    return best_s;
  }

  // Codes and picks of every block at half scale bits dh; returns the total error.
  float eval_d(uint16_t dh, const float* sb, int* code, Pick* picks) {
    const float d = fp16_to_fp32(dh);
    float total = 0.0f;
    Pick tmp[8];
    for (int b = 0; b < blocks; ++b) {
      const float lf = sb[b] / (d * S.alpha) - 0.5f;
      int l0 = 0;
      if (lf >= static_cast<float>(S.levels - 1)) l0 = S.levels - 1;
      else if (lf >= 0.0f) l0 = static_cast<int>(lf);
      float best = INFINITY;
      for (int l = l0; l <= l0 + 1 && l < S.levels; ++l) {
        const float s = d * S.alpha * (static_cast<float>(l) + 0.5f);
        const float err = eval_block(b, s, tmp, false);
        if (err < best) {
          best = err;
          code[b] = l;
          std::memcpy(picks + b * per_block, tmp, sizeof(Pick) * static_cast<std::size_t>(per_block));
        }
      }
      total += best;
    }
    return total;
  }

  const Spec& S;
  const Lattice& L;
  Workspace& ws;
  int groups, per_block, blocks;
};

// Signs and the values to fit: |x| (even parity: the element that costs least keeps its
// opposite sign), or x itself for the signed IQ1 grid.
void choose_signs(const Spec& S, const float* x, const float* w, float* a, uint8_t* sign_bits) {
  for (int j = 0; j < kQK; ++j) a[j] = S.signs == Signs::InGrid ? x[j] : std::fabs(x[j]);
  if (S.signs == Signs::InGrid) return;
  for (int g = 0; g < kQK / 8; ++g) {
    unsigned bits = 0;
    for (int j = 0; j < 8; ++j)
      if (x[8 * g + j] < 0.0f) bits |= 1u << j;
    if (S.signs == Signs::EvenPer8 && __builtin_popcount(bits) % 2) {
      int jmin = 0;
      float vmin = INFINITY;
      for (int j = 0; j < 8; ++j) {
        const float v = w[8 * g + j] * x[8 * g + j] * x[8 * g + j];
        if (v < vmin) vmin = v, jmin = j;
      }
      bits ^= 1u << jmin;
      a[8 * g + jmin] = -a[8 * g + jmin];
    }
    sign_bits[g] = static_cast<uint8_t>(bits);
  }
}

}  // namespace

void fit_superblock(const Spec& S, const float* x, Result* out) {
  *out = Result{};
  float sumx2 = 0.0f;
  for (int j = 0; j < kQK; ++j) sumx2 += x[j] * x[j];
  const float sigma2 = S.sigma_factor * sumx2 / static_cast<float>(kQK);
  float w[kQK], a[kQK];
  for (int j = 0; j < kQK; ++j) w[j] = std::sqrt(sigma2 + x[j] * x[j]);
  uint8_t sign_bits[32] = {};
  choose_signs(S, x, w, a, sign_bits);

  Fitter F(S, workspace());
  F.prepare(w, a);
  float sb[16];
  float smax = 0.0f;
  for (int b = 0; b < F.blocks; ++b) {
    float amax = 0.0f;
    for (int j = 0; j < S.scale_block; ++j) amax = std::fmax(amax, std::fabs(a[b * S.scale_block + j]));
    sb[b] = F.block_scale(b, amax);
    smax = std::fmax(smax, sb[b]);
  }
  if (!(smax > 0.0f) || !std::isfinite(smax)) return;

  int code[16], best_code[16];
  Pick picks[kMaxPoints], best_picks[kMaxPoints];
  float best = INFINITY;
  uint16_t best_dh = 0;
  auto try_d = [&](float d) {
    const uint16_t dh = fp32_to_fp16(d);
    const float dq = fp16_to_fp32(dh);
    if (!(dq > 0.0f) || !std::isfinite(dq)) return;
    const float err = F.eval_d(dh, sb, code, picks);
    if (err < best) {
      best = err;
      best_dh = dh;
      std::memcpy(best_code, code, sizeof code);
      std::memcpy(best_picks, picks, sizeof picks);
    }
  };
  const float d0 = smax / (S.alpha * (static_cast<float>(S.levels) - 0.5f));
  for (int t = 0; t < S.d_tries; ++t) try_d(d0 * (1.0f - 0.05f * static_cast<float>(t)));
  if (best_dh == 0) return;
  // Least-squares d for the chosen codes and points, then re-picked at that d.
  float num = 0.0f, den = 0.0f;
  for (int b = 0; b < F.blocks; ++b) {
    const float m = S.alpha * (static_cast<float>(best_code[b]) + 0.5f);
    for (int i = 0; i < F.per_block; ++i) {
      const Pick& p = best_picks[b * F.per_block + i];
      num += m * p.num;
      den += m * m * p.den;
    }
  }
  if (num > 0.0f && den > 0.0f) try_d(num / den);
  // The stored points: a full scan of the grid at each block's final scale.
  const float d = fp16_to_fp32(best_dh);
  for (int b = 0; b < F.blocks; ++b)
    F.eval_block(b, d * S.alpha * (static_cast<float>(best_code[b]) + 0.5f), best_picks + b * F.per_block, true);

  out->d_bits = best_dh;
  std::memcpy(out->code, best_code, sizeof best_code);
  for (int k = 0; k < F.groups; ++k) {
    out->index[k] = best_picks[k].p;
    out->shift_negative[k] = best_picks[k].neg;
  }
  std::memcpy(out->sign_bits, sign_bits, sizeof sign_bits);
}

}  // namespace colibri::iq::fit
