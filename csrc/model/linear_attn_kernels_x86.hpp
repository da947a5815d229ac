// The delta rule's kernels (linear_attn_kernels.hpp) for one x86 vector width, included by
// linear_attn_kernels_avx2.cpp and _avx512.cpp with their vector type V:
//   V::W lanes, V::kBlock vectors a column block; reg; zero(); set1(x); load(p) and
//   store(p, r); load(p, n) and store(p, r, n)
//   for the first n < W lanes (the others read as 0, never touched); add, sub, mul.
// Vectorized over the columns only: each element gets the scalar reference's multiply and
// add in its order (the including file turns contraction to FMA off), so the same bits.
// Columns go in blocks of V::kBlock vectors whose accumulators (two sets in step) stay in
// registers over all rows; the last columns one vector at a time, the very last masked.
#pragma once
#include <cstdint>

#include "common/unroll.hpp"

namespace colibri::linattn::x86 {

// Loads and stores of NV vectors at p, the last one holding `tail` lanes (0: whole).
template <class V, int NV>
struct Cols {
  int64_t tail;
  COLIBRI_FORCE_INLINE typename V::reg load(const float* p, int b) const {
    return (NV == 1 && tail) ? V::load(p + b * V::W, tail) : V::load(p + b * V::W);
  }
  COLIBRI_FORCE_INLINE void store(float* p, int b, typename V::reg r) const {
    if (NV == 1 && tail) V::store(p + b * V::W, r, tail);
    else V::store(p + b * V::W, r);
  }
};

// The decayed row S_i * decay_i is formed in both passes (the same operation on the same
// values: the same bits) and stored once, in the second: a store fewer per
// vector than storing it in the first pass (the kernel is bound by its loads and stores).
template <class V, int NV>
COLIBRI_FORCE_INLINE void step_cols(float* S, int64_t dk, int64_t dv, const float* decay, const float* k,
                                    const float* v, float beta, const float* q, float* o, const Cols<V, NV> c) {
  using R = typename V::reg;
  R acc[NV];
  COLIBRI_UNROLL for (int b = 0; b < NV; ++b) acc[b] = V::zero();
  for (int64_t i = 0; i < dk; ++i) {  // S^T k of the decayed S
    const float* Si = S + i * dv;
    const R di = V::set1(decay[i]), ki = V::set1(k[i]);
    COLIBRI_UNROLL for (int b = 0; b < NV; ++b) acc[b] = V::add(acc[b], V::mul(V::mul(c.load(Si, b), di), ki));
  }
  const R vb = V::set1(beta);
  R out[NV];
  COLIBRI_UNROLL for (int b = 0; b < NV; ++b) {
    acc[b] = V::mul(V::sub(c.load(v, b), acc[b]), vb);  // d
    out[b] = V::zero();
  }
  for (int64_t i = 0; i < dk; ++i) {  // S = decayed S + k d^T, o = S^T q
    float* Si = S + i * dv;
    const R di = V::set1(decay[i]), ki = V::set1(k[i]), qi = V::set1(q[i]);
    COLIBRI_UNROLL for (int b = 0; b < NV; ++b) {
      const R s = V::add(V::mul(c.load(Si, b), di), V::mul(ki, acc[b]));
      c.store(Si, b, s);
      out[b] = V::add(out[b], V::mul(s, qi));
    }
  }
  COLIBRI_UNROLL for (int b = 0; b < NV; ++b) c.store(o, b, out[b]);
}

template <class V>
void step(float* S, int64_t dk, int64_t dv, const float* decay, const float* k, const float* v, float beta,
          const float* q, float* o) {
  constexpr int64_t wide = V::kBlock * V::W;
  int64_t x = 0;
  for (; x + wide <= dv; x += wide)
    step_cols<V, V::kBlock>(S + x, dk, dv, decay, k, v + x, beta, q, o + x, Cols<V, V::kBlock>{0});
  for (; x < dv; x += V::W) {
    const int64_t left = dv - x;
    step_cols<V, 1>(S + x, dk, dv, decay, k, v + x, beta, q, o + x, Cols<V, 1>{left < V::W ? left : 0});
  }
}

template <class V, int NV>
COLIBRI_FORCE_INLINE void row_acc_cols(float* c, const float* w, int64_t m, const float* B, int64_t ldb,
                                       const Cols<V, NV> cl) {
  using R = typename V::reg;
  R acc[NV];
  COLIBRI_UNROLL for (int b = 0; b < NV; ++b) acc[b] = cl.load(c, b);
  for (int64_t a = 0; a < m; ++a) {
    const R wa = V::set1(w[a]);
    const float* Ba = B + a * ldb;
    COLIBRI_UNROLL for (int b = 0; b < NV; ++b) acc[b] = V::add(acc[b], V::mul(wa, cl.load(Ba, b)));
  }
  COLIBRI_UNROLL for (int b = 0; b < NV; ++b) cl.store(c, b, acc[b]);
}

template <class V>
void row_acc(float* c, const float* w, int64_t m, const float* B, int64_t ldb, int64_t n) {
  constexpr int64_t wide = V::kBlock * V::W;
  int64_t x = 0;
  for (; x + wide <= n; x += wide) row_acc_cols<V, V::kBlock>(c + x, w, m, B + x, ldb, Cols<V, V::kBlock>{0});
  for (; x < n; x += V::W) {
    const int64_t left = n - x;
    row_acc_cols<V, 1>(c + x, w, m, B + x, ldb, Cols<V, 1>{left < V::W ? left : 0});
  }
}

}  // namespace colibri::linattn::x86
