// The 16-bit micro-kernels of QConv16 (part of qconv16.cpp's translation unit: included there, inside its
// namespaces, after qconv_kernel.h's panel constants; not a header of its own).
#pragma once

// ---- 16-bit inputs (QConv16): two byte planes, one int64 requantization ---------------------------------
// A stored 16-bit code is 256 hi + lo (bytes); sum x w = 256 sum hi w + sum lo w, each plane's sum exact in
// int32 (vpdpbusd, K 255 128 < 2^31), combined in int64: t = 256 S_hi + S_lo - zs sum w, then
// p = M t + K and requant_tail, stored as int32 codes.
struct Rq16Args {
  const int64_t *zw, *m, *k, *s, *a, *b;
  int64_t zs, lo, hi;
  int nch;
  // rq16_wide32's tables (even / odd channels of each 16-group, like RqArgs): the multipliers as int32,
  // K - M zs sum w (+ A for kPlain) as ke / ko, and s, A, B
  const int32_t* m32;
  const int64_t *ke, *ko, *se, *so, *ae, *ao, *be, *bo;
};

// rq16_wide for int32 multipliers (M32, tables built at creation): the int64 p of the even and, after a
// 32-bit shift, the odd lanes by vpmuldq, p = M S_lo + (M S_hi << 8) + (K - M zw) in wrapping 64-bit
// arithmetic (M S_hi and M S_lo are exact int64 products, and p mod 2^64 is the p of rq16_wide, which fits
// int64), then RequantU8's rule as rq16_32_values: the clamp to [lo - zs, hi - zs] (int32, checked at
// creation) in int64, the halves interleaved back into int32 lanes and zs added. The same integers.
template <int KIND>
__attribute__((target("avx512f,avx512bw,avx512dq,avx512vnni"), always_inline)) inline void rq16_wide32(
    __m512i lo, __m512i hi, const Rq16Args& q, int j0, int32_t* y) {
  if (j0 >= q.nch) return;
  const int g = j0 / 2;
  const __m512i m = _mm512_loadu_si512(q.m32 + j0), mo = _mm512_srli_epi64(m, 32);
  const __m512i pe = _mm512_add_epi64(
      _mm512_add_epi64(_mm512_mul_epi32(lo, m), _mm512_slli_epi64(_mm512_mul_epi32(hi, m), 8)),
      _mm512_loadu_si512(q.ke + g));
  const __m512i po = _mm512_add_epi64(
      _mm512_add_epi64(_mm512_mul_epi32(_mm512_srli_epi64(lo, 32), mo),
                       _mm512_slli_epi64(_mm512_mul_epi32(_mm512_srli_epi64(hi, 32), mo), 8)),
      _mm512_loadu_si512(q.ko + g));
  const __m512i v = tail_pairs<KIND>(pe, po, q, g);
  const int left = q.nch - j0;
  if (left >= 16) _mm512_storeu_si512(y + j0, v);
  else _mm512_mask_storeu_epi32(y + j0, static_cast<__mmask16>((1u << left) - 1), v);
}

// Channels j0 .. j0 + 15 of one row (the arrays cover all 16 lanes: they are padded to whole panels): the
// int64 rule on each half of 8 lanes, v = (p + A (+ the rounding bit)) >> s + zs, then v saturated to int32
// (vpmovsqd) and clamped to [lo, hi] in int32 lanes: the same integers as the int64 clamp, as lo and hi lie
// in int32 (checked at creation), and one 16-lane store.
template <int KIND>
__attribute__((target("avx512f,avx512bw,avx512dq,avx512vnni"), always_inline)) inline void rq16_wide(
    __m512i lo, __m512i hi, const Rq16Args& q, int j0, int32_t* y) {
  if (j0 >= q.nch) return;
  __m256i half[2];
  for (int h = 0; h < 2; ++h) {
    const int j = j0 + 8 * h;
    const __m512i l64 = _mm512_cvtepi32_epi64(h ? _mm512_extracti64x4_epi64(lo, 1) : _mm512_castsi512_si256(lo));
    const __m512i h64 = _mm512_cvtepi32_epi64(h ? _mm512_extracti64x4_epi64(hi, 1) : _mm512_castsi512_si256(hi));
    const __m512i t = _mm512_sub_epi64(_mm512_add_epi64(_mm512_slli_epi64(h64, 8), l64), _mm512_loadu_si512(q.zw + j));
    const __m512i p = _mm512_add_epi64(_mm512_mullo_epi64(t, _mm512_loadu_si512(q.m + j)), _mm512_loadu_si512(q.k + j));
    const __m512i sh = _mm512_loadu_si512(q.s + j);
    __m512i u = _mm512_add_epi64(p, _mm512_loadu_si512(q.a + j));
    if (KIND == kParity) u = _mm512_add_epi64(u, _mm512_and_si512(_mm512_srav_epi64(p, sh), _mm512_loadu_si512(q.b + j)));
    if (KIND == kSign) u = _mm512_add_epi64(u, _mm512_and_si512(_mm512_srai_epi64(p, 63), _mm512_loadu_si512(q.b + j)));
    half[h] = _mm512_cvtsepi64_epi32(_mm512_add_epi64(_mm512_srav_epi64(u, sh), _mm512_set1_epi64(q.zs)));
  }
  __m512i v = _mm512_inserti64x4(_mm512_castsi256_si512(half[0]), half[1], 1);
  v = _mm512_min_epi32(_mm512_max_epi32(v, _mm512_set1_epi32(static_cast<int32_t>(q.lo))),
                       _mm512_set1_epi32(static_cast<int32_t>(q.hi)));
  const int left = q.nch - j0;
  if (left >= 16) _mm512_storeu_si512(y + j0, v);
  else _mm512_mask_storeu_epi32(y + j0, static_cast<__mmask16>((1u << left) - 1), v);
}

#define ZN_ACC16(r) __m512i l##r##0 = _mm512_setzero_si512(), l##r##1 = l##r##0, l##r##2 = l##r##0, l##r##3 = l##r##0, \
                            h##r##0 = l##r##0, h##r##1 = l##r##0, h##r##2 = l##r##0, h##r##3 = l##r##0;
#define ZN_ROW16(r)                                                                \
  if constexpr (MR > r) {                                                          \
    int32_t ql, qh;                                                                \
    std::memcpy(&ql, p##r + 4 * q, 4);                                             \
    std::memcpy(&qh, p##r + hoff + 4 * q, 4);                                      \
    const __m512i al = _mm512_set1_epi32(ql), ah = _mm512_set1_epi32(qh);          \
    l##r##0 = _mm512_dpbusd_epi32(l##r##0, al, b0);                                \
    h##r##0 = _mm512_dpbusd_epi32(h##r##0, ah, b0);                                \
    if constexpr (NV > 1) {                                                        \
      l##r##1 = _mm512_dpbusd_epi32(l##r##1, al, b1);                              \
      h##r##1 = _mm512_dpbusd_epi32(h##r##1, ah, b1);                              \
    }                                                                              \
    if constexpr (NV > 2) {                                                        \
      l##r##2 = _mm512_dpbusd_epi32(l##r##2, al, b2);                              \
      h##r##2 = _mm512_dpbusd_epi32(h##r##2, ah, b2);                              \
    }                                                                              \
    if constexpr (NV > 3) {                                                        \
      l##r##3 = _mm512_dpbusd_epi32(l##r##3, al, b3);                              \
      h##r##3 = _mm512_dpbusd_epi32(h##r##3, ah, b3);                              \
    }                                                                              \
  }
#define ZN_STORE16(r)                                                              \
  if constexpr (MR > r) {                                                          \
    int32_t* yr = y + r * ldy;                                                     \
    if constexpr (M32) {                                                           \
      rq16_wide32<KIND>(l##r##0, h##r##0, rqv, 0, yr);                             \
      if constexpr (NV > 1) rq16_wide32<KIND>(l##r##1, h##r##1, rqv, 16, yr);      \
      if constexpr (NV > 2) rq16_wide32<KIND>(l##r##2, h##r##2, rqv, 32, yr);      \
      if constexpr (NV > 3) rq16_wide32<KIND>(l##r##3, h##r##3, rqv, 48, yr);      \
    } else {                                                                       \
      rq16_wide<KIND>(l##r##0, h##r##0, rqv, 0, yr);                               \
      if constexpr (NV > 1) rq16_wide<KIND>(l##r##1, h##r##1, rqv, 16, yr);        \
      if constexpr (NV > 2) rq16_wide<KIND>(l##r##2, h##r##2, rqv, 32, yr);        \
      if constexpr (NV > 3) rq16_wide<KIND>(l##r##3, h##r##3, rqv, 48, yr);        \
    }                                                                              \
  }

// The A side of mk_vnni16: MR <= 3 output positions, each a base pointer rows[r]; the k axis is taps
// segments of cq quads, segment t at rows[r] + toff[t] (low bytes) and hoff bytes further on (high bytes).
// An im2col row is one segment (toff {0}, hoff kp); a conv read straight from the padded planes (compute16)
// has one segment per kernel tap, C / 4 quads each.
struct Rows16 {
  const uint8_t* rows[3];
  const int64_t* toff;
  int64_t taps, cq, hoff;
};

// MR <= 3 output positions x NV blocks: both planes' int32 sums by vpdpbusd, then rq16_wide (rq16_wide32
// for M32) to y rows.
template <int MR, int KIND, bool M32, int NV>
__attribute__((target("avx512f,avx512bw,avx512dq,avx512vnni"))) void mk_vnni16(const Rows16& a, const int8_t* b,
                                                                                const Rq16Args& rq, int32_t* y,
                                                                                int64_t ldy) {
  ZN_ACC16(0) ZN_ACC16(1) ZN_ACC16(2)
  const int64_t cq = a.cq, hoff = a.hoff;
  for (int64_t t = 0; t < a.taps; ++t) {
    const int64_t off = a.toff[t];
    const uint8_t* p0 = a.rows[0] + off;
    [[maybe_unused]] const uint8_t* p1 = MR > 1 ? a.rows[1] + off : p0;
    [[maybe_unused]] const uint8_t* p2 = MR > 2 ? a.rows[2] + off : p0;
    for (int64_t q = 0; q < cq; ++q, b += kPanel * 4) {
      const __m512i b0 = _mm512_loadu_si512(b);
      const __m512i b1 = NV > 1 ? _mm512_loadu_si512(b + 64) : b0;
      const __m512i b2 = NV > 2 ? _mm512_loadu_si512(b + 128) : b0;
      const __m512i b3 = NV > 3 ? _mm512_loadu_si512(b + 192) : b0;
      ZN_ROW16(0) ZN_ROW16(1) ZN_ROW16(2)
    }
  }
  const Rq16Args rqv = rq;  // a local copy: the stores cannot alias it, so its fields stay in registers
  ZN_STORE16(0) ZN_STORE16(1) ZN_STORE16(2)
}
#undef ZN_ACC16
#undef ZN_ROW16
#undef ZN_STORE16

using Vnni16Fn = void (*)(const Rows16&, const int8_t*, const Rq16Args&, int32_t*, int64_t);
template <int KIND, bool M32, int NV>
Vnni16Fn vnni16_for(int mr) {
  return mr == 1 ? mk_vnni16<1, KIND, M32, NV> : (mr == 2 ? mk_vnni16<2, KIND, M32, NV> : mk_vnni16<3, KIND, M32, NV>);
}
template <int KIND, bool M32>
Vnni16Fn vnni16_nv(int mr, int nv) {
  if (nv == 1) return vnni16_for<KIND, M32, 1>(mr);
  if (nv == 2) return vnni16_for<KIND, M32, 2>(mr);
  return vnni16_for<KIND, M32, 4>(mr);
}
Vnni16Fn vnni16_kernel(int mr, int nv, int kind, bool m32) {
  if (kind == kParity) return m32 ? vnni16_nv<kParity, true>(mr, nv) : vnni16_nv<kParity, false>(mr, nv);
  if (kind == kSign) return m32 ? vnni16_nv<kSign, true>(mr, nv) : vnni16_nv<kSign, false>(mr, nv);
  return m32 ? vnni16_nv<kPlain, true>(mr, nv) : vnni16_nv<kPlain, false>(mr, nv);
}

// The portable form: t = 256 hi + lo - zw in int64, requant_tail, int32 codes.
template <int KIND>
inline __attribute__((always_inline)) void rq16_loop(const int32_t* __restrict lo_acc, const int32_t* __restrict hi_acc,
                                                     int32_t* __restrict y, int n, const int64_t* __restrict zw,
                                                     const int64_t* __restrict m, const int64_t* __restrict k,
                                                     const int64_t* __restrict s, const int64_t* __restrict a,
                                                     const int64_t* __restrict b, int64_t zs, int64_t lo, int64_t hi) {
  for (int j = 0; j < n; ++j) {
    const int64_t t = 256 * static_cast<int64_t>(hi_acc[j]) + lo_acc[j] - zw[j];
    y[j] = static_cast<int32_t>(requant_tail<KIND>(m[j] * t + k[j], s[j], a[j], b[j], zs, lo, hi));
  }
}
__attribute__((target_clones("arch=x86-64-v4", "default"))) void rq16_row(
    const int32_t* lo_acc, const int32_t* hi_acc, int32_t* y, int n, const int64_t* zw, const int64_t* m,
    const int64_t* k, const int64_t* s, const int64_t* a, const int64_t* b, int64_t zs, int64_t lo, int64_t hi,
    int kind) {
  if (kind == kPlain) rq16_loop<kPlain>(lo_acc, hi_acc, y, n, zw, m, k, s, a, b, zs, lo, hi);
  else if (kind == kParity) rq16_loop<kParity>(lo_acc, hi_acc, y, n, zw, m, k, s, a, b, zs, lo, hi);
  else rq16_loop<kSign>(lo_acc, hi_acc, y, n, zw, m, k, s, a, b, zs, lo, hi);
}

