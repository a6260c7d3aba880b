// The requantization tail (requant_tail in zonnx_native.h) on 16 int32 accumulators in AVX-512 registers,
// stored as bytes: shared by the fused kernels QConv and QDwConv. The same integers as requant_tail.
#pragma once

#include "simd.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstdint>
#include <vector>

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
  const double *fm, *fc;               // rq16_f64 tables (F64Tables), channel order like m32; else null
  const float *gm, *gc, *gt;           // F32Tables' gm, gc (channel order) and gtc (the group's 16); else null
};

// Two more values of the KIND template argument (beyond RoundKind): the float64 form of kPlain (floor) and
// of kParity (nearest even), used by rq16_32_values where F64Tables proved them exact.
enum F64Kind { kF64Floor = 3, kF64Even = 4 };

// The float64 form of the requantization, exact where it is used. With fm = M 2^-s and fc = C 2^-s, where
// C = K + A - M zw (kPlain) or K - M zw (kParity), fma(acc, fm, fc) is (M (acc - zw) + K + A) 2^-s (or
// without A): the exact sum is an integer below 2^52 in magnitude scaled by a power of two (|M| xm + |K| + A
// < 2^52, xm = max |acc - zw| from the weights), so it is representable and the one rounding of the fma
// leaves it unchanged; fm and fc are exact for the same reason (|M| < 2^32, |C| < 2^52, 2^-s >= 2^-62 is no
// subnormal). Then floor (kPlain: (p + A) >> s) or round-half-even (kParity: the parity-corrected shift) of
// that value is the integer shift result v. The tables are built only where the same bound also proves
// |v| <= (|M| xm + |K|) 2^-s + 1 < 2^31, so the rounding conversion to int32 is exact (no saturation) and
// the clamp works on int32 values: clamp(v + zs, lo, hi) in int32 (rq16_32_values), or packed
// (pack64_u8: int16 and uint8 saturation, exact for -32512 <= zs <= 32767, also checked).
struct F64Tables {
  std::vector<double> fm, fc;

  // Fills the tables for n channels (xm[j] bounds |acc - zw| of channel j); false (tables empty) when one
  // channel breaks the bound or the rounding kind is not kPlain / kParity: the integer form then stays.
  bool build(size_t n, const int64_t* m, const int64_t* k, const int64_t* s, const int64_t* a,
             const int32_t* zw, const int64_t* xm, int kind, int64_t zs) {
    fm.assign(n, 0.0);
    fc.assign(n, 0.0);
    const __int128 lim = __int128{1} << 52;
    bool ok = (kind == kPlain || kind == kParity) && zs >= -32512 && zs <= 32767;
    for (size_t j = 0; ok && j < n; ++j) {
      const __int128 mj = m[j], kj = k[j] + (kind == kPlain ? a[j] : 0);
      const __int128 c = kj - mj * zw[j];
      const __int128 bound = (mj < 0 ? -mj : mj) * xm[j] + (kj < 0 ? -kj : kj);
      ok = m[j] >= INT32_MIN && m[j] <= INT32_MAX && xm[j] >= 0 && bound < lim && c < lim && -c < lim &&
           (bound >> s[j]) + 2 < (__int128{1} << 31);
      if (!ok) break;
      const double scale = std::ldexp(1.0, -static_cast<int>(s[j]));
      fm[j] = static_cast<double>(m[j]) * scale;
      fc[j] = static_cast<double>(static_cast<int64_t>(c)) * scale;
    }
    if (!ok) {
      fm.clear();
      fc.clear();
    }
    return ok;
  }
};

// The float64 form (F64Tables) on 16 int32 accumulators: the rounded values v before the zero point and
// the clamp, exact int32 (F64Tables proved |v| < 2^31).
template <int KIND>
__attribute__((target("avx512f,avx512bw,avx512dq,avx512vnni"), always_inline)) inline __m512i rq16_f64_values(
    __m512i acc, const RqArgs& q, int j0) {
  constexpr int kRound = (KIND == kF64Floor ? _MM_FROUND_TO_NEG_INF : _MM_FROUND_TO_NEAREST_INT) | _MM_FROUND_NO_EXC;
  __m512d v0 = _mm512_cvtepi32_pd(_mm512_castsi512_si256(acc));
  __m512d v1 = _mm512_cvtepi32_pd(_mm512_extracti64x4_epi64(acc, 1));
  v0 = _mm512_fmadd_pd(v0, _mm512_loadu_pd(q.fm + j0), _mm512_loadu_pd(q.fc + j0));
  v1 = _mm512_fmadd_pd(v1, _mm512_loadu_pd(q.fm + j0 + 8), _mm512_loadu_pd(q.fc + j0 + 8));
  return _mm512_inserti64x4(_mm512_castsi256_si512(_mm512_cvt_roundpd_epi32(v0, kRound)),
                            _mm512_cvt_roundpd_epi32(v1, kRound), 1);
}

// The float32 form of the requantization, certified per lane. The result is clamp(R(y), lo, hi) for the exact
// y = (M (acc - zw) + K + A) 2^-s + zs = acc fm + fz, fm = M 2^-s, fz = C 2^-s with C = K + A - M zw + zs 2^s,
// R = floor (kPlain: (p + A) >> s), or with C = K - M zw + zs 2^s and R = round-half-even (kParity); zs is
// an integer, so R(y - zs) + zs = R(y). With gm, gc the float32 roundings of fm, fz (fz through float64: one
// more relative error of 2^-53) and A a bound on |acc| (255 sum |w| for uint8 inputs), y32 = fma(float(acc),
// gm, gc) differs from y by at most E = 2^-22 (A |fm| + |fz|) (the conversions of acc, fm and fz and the fma's
// rounding, each at most 2^-24 (1 + 2^-22) times a term of the bound); the tables are built only where E <=
// 1/4. Where y32 lies beyond [lo - 1/2, hi + 1/2] (floor: [lo, hi + 1)), y lies beyond [lo - 1/2, hi + 1/2)
// on the same side (E < 1/2), so both give lo, resp. hi, whatever the rounding. Inside, |y| <= 256, so |acc
// fm| <= 256 + |fz| and the error is at most e = 2^-22 (258 + |fz|). vreduceps gives r = y32 - rint(y32)
// exactly. floor: when |r| > e no integer lies between y and y32, so floor(y32) = floor(y); round-half-even:
// when |r| < 1/2 - e no half-integer does, so both round to rint(y32). gt holds the test's threshold per
// channel (e rounded up for floor, 1/2 - e rounded down for half_even; a lane fails when |r| <= gt, resp. >=
// gt, whether or not it lies inside); where every value is exact in float32 (1 <= A, |M| A + |C| < 2^24) the
// lane never fails (gt = -1, resp. 1): built then whatever E. A channel without weights (A = 0: also the
// padding of a panel) has the constant result v = clamp(R(C 2^-s), lo - 1, hi + 1), stored as gm = 0, gc =
// v + 1/2 (floor) or v (half_even), exact, and its r (1/2, resp. 0) passes any test. The test runs on 64
// lanes at once: per lane position l of the four 16-lane blocks of a 64-channel group, gtc holds the largest
// (floor), resp. smallest threshold of the four, compared with the smallest, resp. largest |r| of the lanes
// (vrangeps); a row that fails anywhere is computed again by the integer or float64 form. E <= 1/4 bounds
// |y32| below 2^21 for the conversion to int32.
struct F32Tables {
  std::vector<float> gm, gc, gt, gtc;

  // n channels (a multiple of 64) of RequantU8's one-term rule (multiplier m, constant k, shift s, rounding
  // addend a, kind kPlain or kParity), weight-sum term zw, |acc| bounds amax; false (tables empty) where
  // a channel breaks the bound.
  bool build(size_t n, const int64_t* m, const int64_t* k, const int64_t* s, const int64_t* a, const int32_t* zw,
             const int64_t* amax, int kind, int64_t zs, int64_t lo, int64_t hi) {
    gm.assign(n, 0.0f);
    gc.assign(n, 0.0f);
    gt.assign(n, 0.0f);
    bool ok = n > 0 && n % 64 == 0 && (kind == kPlain || kind == kParity) && lo >= 0 && hi <= 255 && lo <= hi;
    const bool fl = kind == kPlain;
    const __int128 lim24 = __int128{1} << 24;
    for (size_t j = 0; ok && j < n; ++j) {
      ok = amax[j] >= 0 && s[j] >= 0 && s[j] <= 62;
      if (!ok) break;
      const __int128 p2 = __int128{1} << s[j];
      const __int128 c = __int128{k[j]} + (fl ? a[j] : 0) - __int128{m[j]} * zw[j] + __int128{zs} * p2;
      const double scale = std::ldexp(1.0, -static_cast<int>(s[j]));
      if (amax[j] == 0) {  // constant: R(C 2^-s) in integers
        __int128 q = c >> s[j];
        if (!fl && s[j] > 0) {
          const __int128 rem = c - q * p2, half = p2 / 2;
          if (rem > half || (rem == half && (q & 1) != 0)) ++q;
        }
        const int64_t v = static_cast<int64_t>(std::clamp<__int128>(q, lo - 1, hi + 1));
        gm[j] = 0.0f;
        gc[j] = static_cast<float>(fl ? static_cast<double>(v) + 0.5 : static_cast<double>(v));
        gt[j] = fl ? -1.0f : 1.0f;
        continue;
      }
      const double fm = static_cast<double>(m[j]) * scale, fz = static_cast<double>(c) * scale;
      const double aj = static_cast<double>(amax[j]);
      const __int128 mabs = m[j] < 0 ? -__int128{m[j]} : __int128{m[j]};
      const bool exact = mabs * amax[j] + (c < 0 ? -c : c) < lim24;
      ok = exact || std::ldexp(aj * std::fabs(fm) + std::fabs(fz), -22) <= 0.25;
      if (!ok) break;
      gm[j] = static_cast<float>(fm);
      gc[j] = static_cast<float>(fz);
      const double e = std::ldexp(258 + std::fabs(fz), -22) * (1 + 1e-9);
      float t;
      if (fl) {
        t = exact ? -1.0f : static_cast<float>(e);
        if (!exact && static_cast<double>(t) < e) t = std::nextafter(t, 1.0f);
      } else {
        t = exact ? 1.0f : static_cast<float>(0.5 - e);
        if (!exact && static_cast<double>(t) > 0.5 - e) t = std::nextafter(t, 0.0f);
      }
      gt[j] = t;
    }
    if (!ok) {
      gm.clear();
      gc.clear();
      gt.clear();
      gtc.clear();
      return false;
    }
    gtc.assign(n / 4, 0.0f);
    for (size_t g = 0; g < n / 64; ++g)
      for (size_t l = 0; l < 16; ++l) {
        const float* t = gt.data() + 64 * g + l;
        gtc[16 * g + l] = fl ? std::max({t[0], t[16], t[32], t[48]}) : std::min({t[0], t[16], t[32], t[48]});
      }
    return true;
  }
};

template <int KIND>
__attribute__((target("avx512f,avx512bw,avx512dq,avx512vnni"), always_inline)) inline __m512i cvt_f32(__m512 y) {
  constexpr int kRound = (KIND == kF64Floor ? _MM_FROUND_TO_NEG_INF : _MM_FROUND_TO_NEAREST_INT) | _MM_FROUND_NO_EXC;
  return _mm512_cvt_roundps_epi32(y, kRound);
}

// clamp(v + zs, lo, hi) of four vectors of exact int32 values v as 64 bytes, for 0 <= lo <= hi <= 255 and
// -32512 <= zs <= 32767: packs saturates v to int16, adds_epi16 adds zs with int16 saturation, packus
// saturates to [0, 255], then the clamp to [lo, hi]. Exact: where v is in int16 range and v + zs too, no
// saturation acts before the final clamp; where v > 32767, 32767 + zs >= 255 and the result is hi, as the
// true v + zs > 255 gives; where v < -32768, -32768 + zs < 0 and the result is lo, likewise; where only
// v + zs leaves the int16 range, it leaves [0, 255] on the same side. Byte order: per 128-bit lane L, the
// values 4L .. 4L + 3 of v0, then of v1, v2, v3.
__attribute__((target("avx512f,avx512bw,avx512dq,avx512vnni"), always_inline)) inline __m512i pack64_u8(
    __m512i v0, __m512i v1, __m512i v2, __m512i v3, const RqArgs& q) {
  const __m512i zs = _mm512_set1_epi16(static_cast<int16_t>(q.zs));
  const __m512i a = _mm512_adds_epi16(_mm512_packs_epi32(v0, v1), zs);
  const __m512i b = _mm512_adds_epi16(_mm512_packs_epi32(v2, v3), zs);
  const __m512i r = _mm512_packus_epi16(a, b);
  return _mm512_min_epu8(_mm512_max_epu8(r, _mm512_set1_epi8(static_cast<char>(q.lo))),
                         _mm512_set1_epi8(static_cast<char>(q.hi)));
}

// clamp(v, lo, hi) of four vectors of int32 values as 64 bytes (pack64_u8's byte order) for 0 <= lo <= hi <=
// 255: int16 then uint8 saturation (the identity on [0, 255], and each keeps a value beyond it beyond it on
// the same side), then the clamp to [lo, hi].
__attribute__((target("avx512f,avx512bw,avx512dq,avx512vnni"), always_inline)) inline __m512i pack64_u8_clamp(
    __m512i v0, __m512i v1, __m512i v2, __m512i v3, const RqArgs& q) {
  const __m512i r = _mm512_packus_epi16(_mm512_packs_epi32(v0, v1), _mm512_packs_epi32(v2, v3));
  return _mm512_min_epu8(_mm512_max_epu8(r, _mm512_set1_epi8(static_cast<char>(q.lo))),
                         _mm512_set1_epi8(static_cast<char>(q.hi)));
}

// F32Tables' shortcut for NV (1, 2 or 4) accumulator vectors c[v] (channels 16 v .. of a 64-channel group)
// with the group's table vectors gm[v], gc[v] and combined thresholds tc: true and the packed bytes (pack64_u8's
// order; the vectors beyond NV repeat the first) when every lane passes the test, else false.
template <int KIND, int NV>
__attribute__((target("avx512f,avx512bw,avx512dq,avx512vnni"), always_inline)) inline bool f32_try(
    const __m512i* c, const __m512* gm, const __m512* gc, __m512 tc, const RqArgs& q, __m512i& out) {
  constexpr int kRed = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
  constexpr int kRange = KIND == kF64Floor ? 0xA : 0xB;  // min |.|, resp. max |.|, sign cleared
  __m512 y[4], r;
  for (int v = 0; v < NV; ++v) {
    y[v] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(c[v]), gm[v], gc[v]);
    const __m512 rv = _mm512_reduce_ps(y[v], kRed);
    r = v == 0 ? _mm512_range_ps(rv, rv, kRange) : _mm512_range_ps(r, rv, kRange);
  }
  if (_mm512_cmp_ps_mask(r, tc, KIND == kF64Floor ? _CMP_LE_OQ : _CMP_GE_OQ) != 0) return false;
  const __m512i v0 = cvt_f32<KIND>(y[0]);
  const __m512i v1 = NV > 1 ? cvt_f32<KIND>(y[NV > 1 ? 1 : 0]) : v0;
  const __m512i v2 = NV > 2 ? cvt_f32<KIND>(y[NV > 2 ? 2 : 0]) : v0;
  const __m512i v3 = NV > 3 ? cvt_f32<KIND>(y[NV > 3 ? 3 : 0]) : v0;
  out = pack64_u8_clamp(v0, v1, v2, v3, q);
  return true;
}

// pack64_u8 of rq16_f64_values of NV (1, 2 or 4) accumulator vectors (the vectors beyond NV repeat the first).
template <int KIND, int NV>
__attribute__((target("avx512f,avx512bw,avx512dq,avx512vnni"), always_inline)) inline __m512i pack64_f64(
    __m512i c0, __m512i c1, __m512i c2, __m512i c3, const RqArgs& q) {
  const __m512i v0 = rq16_f64_values<KIND>(c0, q, 0);
  const __m512i v1 = NV > 1 ? rq16_f64_values<KIND>(c1, q, 16) : v0;
  const __m512i v2 = NV > 2 ? rq16_f64_values<KIND>(c2, q, 32) : v0;
  const __m512i v3 = NV > 3 ? rq16_f64_values<KIND>(c3, q, 48) : v0;
  return pack64_u8(v0, v1, v2, v3, q);
}

// The float64 form's bytes of NV (1, 2 or 4) accumulator vectors (channels 0 .. 16 NV of a 64-channel group,
// pack64_u8's order; the vectors beyond NV repeat the first): by F32Tables' shortcut (f32_try) where the
// tables exist and its test passes, else by rq16_f64_values. KIND: kF64Floor or kF64Even.
template <int KIND, int NV>
__attribute__((target("avx512f,avx512bw,avx512dq,avx512vnni"), always_inline)) inline __m512i rq64_f64(
    __m512i c0, __m512i c1, __m512i c2, __m512i c3, const RqArgs& q) {
  if (q.gm != nullptr) {
    const __m512i c[4] = {c0, c1, c2, c3};
    __m512 gm[4], gc[4];
    for (int v = 0; v < NV; ++v) {
      gm[v] = _mm512_loadu_ps(q.gm + 16 * v);
      gc[v] = _mm512_loadu_ps(q.gc + 16 * v);
    }
    __m512i out;
    if (__builtin_expect(f32_try<KIND, NV>(c, gm, gc, _mm512_loadu_ps(q.gt), q, out), 1)) return out;
  }
  return pack64_f64<KIND, NV>(c0, c1, c2, c3, q);
}

// The tail of the int32-multiplier forms (rq16_32_values, rq16_wide32) on the int64 p of the even lanes (pe)
// and of the odd ones (po) of 16 channels, group g = j0 / 2 of the even / odd tables: (p + A (+ the rounding
// bit)) >> s, clamped to [lo - zs, hi - zs] (then every value fits int32), interleaved back into 16 int32
// lanes, + zs. ``Args`` has the tables ke/ko (unused here), se/so, ae/ao, be/bo and lo, hi, zs.
template <int KIND, class Args>
__attribute__((target("avx512f,avx512bw,avx512dq,avx512vnni"), always_inline)) inline __m512i tail_pairs(
    __m512i pe, __m512i po, const Args& q, int g) {
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

// rq16 for int32 multipliers without widening the accumulators: vpmuldq multiplies the even int32 lanes
// (and, after a 32-bit shift, the odd ones) into int64 products; after the shift and the clamp to
// [lo - zs, hi - zs] every value fits int32, so the even and odd results interleave back into 16 int32
// lanes (clamp(v + zs, lo, hi) = clamp(v, lo - zs, hi - zs) + zs). The same integers as rq_loop.
template <int KIND>
__attribute__((target("avx512f,avx512bw,avx512dq,avx512vnni"), always_inline)) inline __m512i rq16_32_values(
    __m512i acc, const RqArgs& q, int j0) {
  if constexpr (KIND == kF64Floor || KIND == kF64Even) {
    const __m512i v = rq16_f64_values<KIND>(acc, q, j0);
    const __m512i lo = _mm512_set1_epi32(static_cast<int32_t>(q.lo - q.zs));
    const __m512i hi = _mm512_set1_epi32(static_cast<int32_t>(q.hi - q.zs));
    return _mm512_add_epi32(_mm512_min_epi32(_mm512_max_epi32(v, lo), hi), _mm512_set1_epi32(static_cast<int32_t>(q.zs)));
  }
  const int g = j0 / 2;
  const __m512i d = _mm512_sub_epi32(acc, _mm512_loadu_si512(q.zw + j0));
  const __m512i m = _mm512_loadu_si512(q.m32 + j0);
  const __m512i pe = _mm512_add_epi64(_mm512_mul_epi32(d, m), _mm512_loadu_si512(q.ke + g));
  const __m512i po = _mm512_add_epi64(_mm512_mul_epi32(_mm512_srli_epi64(d, 32), _mm512_srli_epi64(m, 32)),
                                      _mm512_loadu_si512(q.ko + g));
  return tail_pairs<KIND>(pe, po, q, g);
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
