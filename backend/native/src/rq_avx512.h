// The requantization tail (requant_tail in zonnx_native.h) on 16 int32 accumulators in AVX-512 registers,
// stored as bytes: shared by the fused kernels QConv and QDwConv. The same integers as requant_tail.
#pragma once

#include <immintrin.h>

#include <cstdint>

#include "zonnx_native.h"

// GCC 12 warns inside its own AVX-512 intrinsics headers (_mm512_undefined_* as "maybe uninitialized").
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

namespace zonnx_native {

// The constant of the kPlain form of rq16_32_values: K + A (the rounding addend joins the constant). The sum
// p + A = M (acc - zw) + K + A fits int64 (|p| < 2^62, A < 2^62); it is formed in wrapping 64-bit
// arithmetic (vector adds wrap), so the result is that exact value.
inline int64_t fold_plain(int64_t k, int64_t a) {
  return static_cast<int64_t>(static_cast<uint64_t>(k) + static_cast<uint64_t>(a));
}

// Requantization arguments of one panel (arrays padded to 64 channels) and one output row's destination.
struct RqArgs {
  const int32_t* zw;
  const int64_t *m, *k, *s, *a, *b;
  int64_t zs, lo, hi;
  int nch;
  const int32_t* m32;                  // the multipliers as int32 (when they all fit)
  const int64_t *ke, *ko, *se, *so;    // k and s of the even / odd channels of each 16-channel group
                                       // (ke, ko: K + A, fold_plain, for the kPlain rounding kind)
  const int64_t *ae, *ao, *be, *bo;    // a and b likewise
};

// rq16 for int32 multipliers without widening the accumulators: vpmuldq multiplies the even int32 lanes
// (and, after a 32-bit shift, the odd ones) into int64 products; after the shift and the clamp to
// [lo - zs, hi - zs] every value fits int32, so the even and odd results interleave back into 16 int32
// lanes (clamp(v + zs, lo, hi) = clamp(v, lo - zs, hi - zs) + zs). The same integers as rq_loop.
template <int KIND>
__attribute__((target("avx512f,avx512bw,avx512dq,avx512vnni"), always_inline)) inline __m512i rq16_32_values(
    __m512i acc, const RqArgs& q, int j0) {
  const int g = j0 / 2;
  const __m512i d = _mm512_sub_epi32(acc, _mm512_loadu_si512(q.zw + j0));
  const __m512i m = _mm512_loadu_si512(q.m32 + j0);
  const __m512i pe = _mm512_add_epi64(_mm512_mul_epi32(d, m), _mm512_loadu_si512(q.ke + g));
  const __m512i po = _mm512_add_epi64(_mm512_mul_epi32(_mm512_srli_epi64(d, 32), _mm512_srli_epi64(m, 32)),
                                      _mm512_loadu_si512(q.ko + g));
  const __m512i se = _mm512_loadu_si512(q.se + g), so = _mm512_loadu_si512(q.so + g);
  __m512i te = KIND == kPlain ? pe : _mm512_add_epi64(pe, _mm512_loadu_si512(q.ae + g));
  __m512i to = KIND == kPlain ? po : _mm512_add_epi64(po, _mm512_loadu_si512(q.ao + g));
  if (KIND == kParity) {
    te = _mm512_add_epi64(te, _mm512_and_si512(_mm512_srav_epi64(pe, se), _mm512_loadu_si512(q.be + g)));
    to = _mm512_add_epi64(to, _mm512_and_si512(_mm512_srav_epi64(po, so), _mm512_loadu_si512(q.bo + g)));
  }
  if (KIND == kSign) {
    te = _mm512_add_epi64(te, _mm512_and_si512(_mm512_srai_epi64(pe, 63), _mm512_loadu_si512(q.be + g)));
    to = _mm512_add_epi64(to, _mm512_and_si512(_mm512_srai_epi64(po, 63), _mm512_loadu_si512(q.bo + g)));
  }
  const __m512i lo = _mm512_set1_epi64(q.lo - q.zs), hi = _mm512_set1_epi64(q.hi - q.zs);
  te = _mm512_min_epi64(_mm512_max_epi64(_mm512_srav_epi64(te, se), lo), hi);
  to = _mm512_min_epi64(_mm512_max_epi64(_mm512_srav_epi64(to, so), lo), hi);
  const __m512i v = _mm512_mask_blend_epi32(__mmask16(0xAAAA), te, _mm512_slli_epi64(to, 32));
  return _mm512_add_epi32(v, _mm512_set1_epi32(static_cast<int32_t>(q.zs)));
}

// rq16_32_values stored as the bytes of channels j0 .. min(j0 + 16, nch).
template <int KIND>
__attribute__((target("avx512f,avx512bw,avx512dq,avx512vnni"), always_inline)) inline void rq16_32(
    __m512i acc, const RqArgs& q, int j0, uint8_t* y) {
  if (j0 >= q.nch) return;
  const __m512i v = rq16_32_values<KIND>(acc, q, j0);
  const int left = q.nch - j0;
  const __mmask16 mask = left >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << left) - 1);
  _mm512_mask_cvtepi32_storeu_epi8(y + j0, mask, v);
}

// The int64-multiplier form (rq16 below) of all 16 lanes as int32 values (the arrays cover them).
template <int KIND>
__attribute__((target("avx512f,avx512bw,avx512dq,avx512vnni"), always_inline)) inline __m512i rq16_values(
    __m512i acc, const RqArgs& q, int j0) {
  const __m512i d = _mm512_sub_epi32(acc, _mm512_loadu_si512(q.zw + j0));
  __m256i half[2];
  for (int h = 0; h < 2; ++h) {
    const int j = j0 + 8 * h;
    const __m512i x = _mm512_cvtepi32_epi64(h ? _mm512_extracti64x4_epi64(d, 1) : _mm512_castsi512_si256(d));
    const __m512i p = _mm512_add_epi64(_mm512_mullo_epi64(x, _mm512_loadu_si512(q.m + j)), _mm512_loadu_si512(q.k + j));
    const __m512i sh = _mm512_loadu_si512(q.s + j);
    __m512i t = _mm512_add_epi64(p, _mm512_loadu_si512(q.a + j));
    if (KIND == kParity) t = _mm512_add_epi64(t, _mm512_and_si512(_mm512_srav_epi64(p, sh), _mm512_loadu_si512(q.b + j)));
    if (KIND == kSign) t = _mm512_add_epi64(t, _mm512_and_si512(_mm512_srai_epi64(p, 63), _mm512_loadu_si512(q.b + j)));
    __m512i v = _mm512_add_epi64(_mm512_srav_epi64(t, sh), _mm512_set1_epi64(q.zs));
    v = _mm512_min_epi64(_mm512_max_epi64(v, _mm512_set1_epi64(q.lo)), _mm512_set1_epi64(q.hi));
    half[h] = _mm512_cvtepi64_epi32(v);
  }
  return _mm512_inserti64x4(_mm512_castsi256_si512(half[0]), half[1], 1);
}

// RequantU8's single-shift int64 rule on 16 accumulators (channels j0 .. j0 + 15) in registers, stored as
// bytes: the same integers as rq_loop, 8 int64 lanes at a time (M32: multipliers fit int32, vpmuldq).
template <int KIND, bool M32>
__attribute__((target("avx512f,avx512bw,avx512dq,avx512vnni"), always_inline)) inline void rq16(
    __m512i acc, const RqArgs& q, int j0, uint8_t* y) {
  if (j0 >= q.nch) return;
  const __m512i d = _mm512_sub_epi32(acc, _mm512_loadu_si512(q.zw + j0));
  for (int h = 0; h < 2; ++h) {
    const int j = j0 + 8 * h;
    if (j >= q.nch) return;
    const __m512i x = _mm512_cvtepi32_epi64(h ? _mm512_extracti64x4_epi64(d, 1) : _mm512_castsi512_si256(d));
    const __m512i m = _mm512_loadu_si512(q.m + j);
    __m512i p = M32 ? _mm512_mul_epi32(x, m) : _mm512_mullo_epi64(x, m);
    p = _mm512_add_epi64(p, _mm512_loadu_si512(q.k + j));
    const __m512i sh = _mm512_loadu_si512(q.s + j);
    __m512i t = _mm512_add_epi64(p, _mm512_loadu_si512(q.a + j));
    if (KIND == kParity) t = _mm512_add_epi64(t, _mm512_and_si512(_mm512_srav_epi64(p, sh), _mm512_loadu_si512(q.b + j)));
    if (KIND == kSign) t = _mm512_add_epi64(t, _mm512_and_si512(_mm512_srai_epi64(p, 63), _mm512_loadu_si512(q.b + j)));
    __m512i v = _mm512_add_epi64(_mm512_srav_epi64(t, sh), _mm512_set1_epi64(q.zs));
    v = _mm512_min_epi64(_mm512_max_epi64(v, _mm512_set1_epi64(q.lo)), _mm512_set1_epi64(q.hi));
    const __mmask8 mask = j + 8 <= q.nch ? __mmask8(0xFF) : __mmask8((1u << (q.nch - j)) - 1);
    _mm512_mask_cvtepi64_storeu_epi8(y + j, mask, v);
  }
}

}  // namespace zonnx_native
