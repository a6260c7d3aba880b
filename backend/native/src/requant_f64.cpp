// RequantU8 with two uint8 terms (the residual adds) in float64 on AVX-512, exact where it is used:
//   y = clamp(R((M1[c] x1 + M2[c] x2 + K[c]) / 2^s[c]) + zs, lo, hi)
// With f_t = M_t 2^-s and fc = K' 2^-s (K' = K + A for the modes that floor after adding A: half_up,
// half_down, floor, ceil; K' = K for half_even, half_away and trunc), fma(x1, f1, fma(x2, f2, fc)) is the
// exact value p 2^-s, p = M1 x1 + M2 x2 + K': every partial sum is an integer below 2^52 in magnitude times
// 2^-s (255 (|M1| + |M2|) + |K'| < 2^52, checked per channel), so each fma's one rounding leaves it
// unchanged. R is then one rounding of that exact value: floor (the A modes: floor((p + A) / 2^s) is
// requant_tail's rule), nearest-even (half_even), toward zero (trunc), or half away from zero as trunc(v +
// copysign(0.5, v)): v +- 0.5 = (p +- 2^(s-1)) 2^-s is exact for s <= 52 (|p + 2^(s-1)| < 2^53), and
// truncating it rounds ties away from zero. The same bound proves |R| < 2^31, so the conversion to int32 is
// exact and the clamp runs on int32 values (clamp(v + zs, lo, hi) = clamp(v, lo - zs, hi - zs) + zs).
#include "simd.h"

#include <cstdint>
#include <vector>

#include "zonnx_native.h"

#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

namespace zonnx_native {

// R's form in rq2_row: 0 floor, 1 nearest-even, 2 toward zero, 3 half away from zero.
int rq2_rounding(int mode) {
  switch (mode) {
    case kHalfEven: return 1;
    case kTrunc: return 2;
    case kHalfAway: return 3;
    default: return 0;  // half_up, half_down, floor, ceil: floor after the addend
  }
}

bool Rq2Tables::build(const int64_t* m1, const int64_t* m2, const int64_t* k, const int64_t* s, const int64_t* a,
                      size_t n, int mode, int64_t zs, int64_t lo, int64_t hi) {
  rounding = rq2_rounding(mode);
  // whole 16-lane vectors: rq2_loop loads a row's last vector of channels in full
  const size_t len = (n + 15) / 16 * 16;
  f1.assign(len, 0.0);
  f2.assign(len, 0.0);
  fc.assign(len, 0.0);
  const __int128 lim = __int128{1} << 52;
  bool ok = zs >= INT32_MIN / 2 && zs <= INT32_MAX / 2 && lo >= 0 && hi <= 255 && lo <= hi;
  for (size_t j = 0; ok && j < n; ++j) {
    const __int128 kj = static_cast<__int128>(k[j]) + (rounding == 0 ? a[j] : 0);
    const __int128 a1 = m1[j] < 0 ? -static_cast<__int128>(m1[j]) : m1[j];
    const __int128 a2 = m2[j] < 0 ? -static_cast<__int128>(m2[j]) : m2[j];
    const __int128 bound = 255 * (a1 + a2) + (kj < 0 ? -kj : kj);
    ok = s[j] >= 0 && s[j] <= 52 && bound < lim && (bound >> s[j]) + 2 < (__int128{1} << 30);
    if (!ok) break;
    const double scale = 1.0 / static_cast<double>(int64_t{1} << s[j]);  // 2^-s, exact
    f1[j] = static_cast<double>(m1[j]) * scale;
    f2[j] = static_cast<double>(m2[j]) * scale;
    fc[j] = static_cast<double>(static_cast<int64_t>(kj)) * scale;
  }
  if (!ok) {
    f1.clear();
    f2.clear();
    fc.clear();
  }
  return ok;
}

namespace {

template <int R>
__attribute__((target("avx512f,avx512bw,avx512dq,avx512vl"), always_inline)) inline __m256i round8(__m512d v) {
  constexpr int kNoExc = _MM_FROUND_NO_EXC;
  if constexpr (R == 0) return _mm512_cvt_roundpd_epi32(v, _MM_FROUND_TO_NEG_INF | kNoExc);
  if constexpr (R == 1) return _mm512_cvt_roundpd_epi32(v, _MM_FROUND_TO_NEAREST_INT | kNoExc);
  if constexpr (R == 2) return _mm512_cvt_roundpd_epi32(v, _MM_FROUND_TO_ZERO | kNoExc);
  const __m512d half = _mm512_or_pd(_mm512_and_pd(v, _mm512_set1_pd(-0.0)), _mm512_set1_pd(0.5));
  return _mm512_cvt_roundpd_epi32(_mm512_add_pd(v, half), _MM_FROUND_TO_ZERO | kNoExc);
}

// n elements; channel arrays indexed like the elements (lanes) or one channel for all (scalars).
template <int R, bool LANES>
__attribute__((target("avx512f,avx512bw,avx512dq,avx512vl"))) void rq2_loop(
    const uint8_t* x1, const uint8_t* x2, uint8_t* y, int64_t n, const double* f1, const double* f2,
    const double* fc, int64_t zs, int64_t lo, int64_t hi) {
  const __m512i vlo = _mm512_set1_epi32(static_cast<int32_t>(lo - zs));
  const __m512i vhi = _mm512_set1_epi32(static_cast<int32_t>(hi - zs));
  const __m512i vzs = _mm512_set1_epi32(static_cast<int32_t>(zs));
  for (int64_t j = 0; j < n; j += 16) {
    const int64_t left = n - j;
    const __mmask16 mask = left >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << left) - 1);
    const __m512i a = _mm512_cvtepu8_epi32(_mm_maskz_loadu_epi8(mask, x1 + j));
    const __m512i b = _mm512_cvtepu8_epi32(_mm_maskz_loadu_epi8(mask, x2 + j));
    __m256i half[2];
    for (int h = 0; h < 2; ++h) {
      const int64_t c = LANES ? j + 8 * h : 0;
      const __m512d g1 = LANES ? _mm512_loadu_pd(f1 + c) : _mm512_set1_pd(f1[0]);
      const __m512d g2 = LANES ? _mm512_loadu_pd(f2 + c) : _mm512_set1_pd(f2[0]);
      const __m512d gc = LANES ? _mm512_loadu_pd(fc + c) : _mm512_set1_pd(fc[0]);
      const __m512d da = _mm512_cvtepi32_pd(h ? _mm512_extracti64x4_epi64(a, 1) : _mm512_castsi512_si256(a));
      const __m512d db = _mm512_cvtepi32_pd(h ? _mm512_extracti64x4_epi64(b, 1) : _mm512_castsi512_si256(b));
      half[h] = round8<R>(_mm512_fmadd_pd(da, g1, _mm512_fmadd_pd(db, g2, gc)));
    }
    __m512i v = _mm512_inserti64x4(_mm512_castsi256_si512(half[0]), half[1], 1);
    v = _mm512_add_epi32(_mm512_min_epi32(_mm512_max_epi32(v, vlo), vhi), vzs);
    _mm512_mask_cvtepi32_storeu_epi8(y + j, mask, v);
  }
}

}  // namespace

void rq2_row(const Rq2Tables& t, const uint8_t* x1, const uint8_t* x2, uint8_t* y, int64_t n, int64_t c0, bool lanes,
             int64_t zs, int64_t lo, int64_t hi) {
  const double *f1 = t.f1.data() + c0, *f2 = t.f2.data() + c0, *fc = t.fc.data() + c0;
  switch (t.rounding * 2 + (lanes ? 1 : 0)) {
    case 0: return rq2_loop<0, false>(x1, x2, y, n, f1, f2, fc, zs, lo, hi);
    case 1: return rq2_loop<0, true>(x1, x2, y, n, f1, f2, fc, zs, lo, hi);
    case 2: return rq2_loop<1, false>(x1, x2, y, n, f1, f2, fc, zs, lo, hi);
    case 3: return rq2_loop<1, true>(x1, x2, y, n, f1, f2, fc, zs, lo, hi);
    case 4: return rq2_loop<2, false>(x1, x2, y, n, f1, f2, fc, zs, lo, hi);
    case 5: return rq2_loop<2, true>(x1, x2, y, n, f1, f2, fc, zs, lo, hi);
    case 6: return rq2_loop<3, false>(x1, x2, y, n, f1, f2, fc, zs, lo, hi);
    default: return rq2_loop<3, true>(x1, x2, y, n, f1, f2, fc, zs, lo, hi);
  }
}

}  // namespace zonnx_native
