// QDwConv's AVX-512 VNNI form (dwconv_kernel.h): DwVnni's constructor (weights as tap quads in lane order,
// the requantization arrays in lane order) and the per-pixel kernel dw_vnni_pixel with its dispatch.
// On CPUs with AVX-512 VNNI QDwConv takes 64 channels x 4 taps per step: the four taps' bytes are
// interleaved (vpunpck) so each int32 lane holds one channel's four taps, vpdpbusd sums x w over them
// (u8 x s8, exact, no saturation), and zp sum_t w[c, t] is subtracted once (taps outside the input read a
// row of zp bytes, so they add zp w and the subtraction cancels them: the same sum as DwConv). The lanes
// come out in the order of the interleave (lane 4L + e of quarter q is channel 16L + 4q + e), which the
// requantization parameters follow; a 4x4 transpose of 32-bit groups puts the bytes back in channel order.
#include "simd.h"

#include <algorithm>
#include <climits>
#include <cstdlib>

#include "dwconv_kernel.h"

namespace zonnx_native {
namespace {

// Lane l of quarter q of a 64-channel block holds channel 16 (l / 4) + 4 q + l % 4 (module comment).
inline int64_t lane_channel(int64_t q, int64_t l) { return 16 * (l / 4) + 4 * q + l % 4; }

}  // namespace

DwVnni::DwVnni(const DwCore& core, const std::vector<int64_t>& mult, const std::vector<int64_t>& cnst,
               const std::vector<int64_t>& shift, const std::vector<int64_t>& addend, const std::vector<int64_t>& bmask,
               int kind, int64_t zs, int64_t lo, int64_t hi) {
  const int64_t c = core.channels;
  pair = c == 32;
  taps = core.kh * core.kw;
  quads = (taps + 3) / 4;
  blocks = (c + 63) / 64;
  const size_t padded = static_cast<size_t>(blocks * 64);
  wq.assign(static_cast<size_t>(blocks * quads * 256), 0);
  for (auto* v : {&m, &k, &s, &a, &b}) v->assign(padded, 0);
  zw.assign(padded, 0);
  xm.assign(padded, 0);
  xa.assign(padded, 0);
  for (int64_t bl = 0; bl < blocks; ++bl)
    for (int64_t q = 0; q < 4; ++q)
      for (int64_t l = 0; l < 16; ++l) {
        const int64_t lane = 64 * bl + lane_channel(q, l), ch = pair ? lane % c : lane;
        const size_t at = static_cast<size_t>(64 * bl + 16 * q + l);
        if (ch >= c) continue;
        int64_t sw = 0, mag = 0;
        for (int64_t t = 0; t < taps; ++t) {
          const int32_t wv = core.w[static_cast<size_t>(t * c + ch)];
          sw += wv;
          mag += std::abs(wv);
          wq[static_cast<size_t>(((bl * quads + t / 4) * 64 + 16 * q + l) * 4 + t % 4)] = static_cast<int8_t>(wv);
        }
        zw[at] = static_cast<int32_t>(core.zp * sw);
        xm[at] = mag * std::max<int64_t>(core.zp, 255 - core.zp);
        xa[at] = mag * 255;
        m[at] = mult[static_cast<size_t>(ch)];
        k[at] = cnst[static_cast<size_t>(ch)];
        s[at] = shift[static_cast<size_t>(ch)];
        a[at] = addend[static_cast<size_t>(ch)];
        b[at] = bmask[static_cast<size_t>(ch)];
      }
  if (std::all_of(m.begin(), m.end(), [](int64_t v) { return v >= INT32_MIN && v <= INT32_MAX; }))
    m32.assign(m.begin(), m.end());
  std::vector<int64_t> kf = k;  // rq16_32's kPlain form: K + A (fold_plain)
  if (kind == kPlain)
    for (size_t j = 0; j < padded; ++j) kf[j] = fold_plain(k[j], a[j]);
  const std::vector<int64_t>* src[4] = {&kf, &s, &a, &b};
  std::vector<int64_t>* even[4] = {&ke, &se, &ae, &be};
  std::vector<int64_t>* odd[4] = {&ko, &so, &ao, &bo};
  for (int t = 0; t < 4; ++t) {
    even[t]->assign(padded / 2, 0);
    odd[t]->assign(padded / 2, 0);
    for (size_t j = 0; j < padded; ++j) (j % 2 ? odd[t] : even[t])->at(j / 16 * 8 + j % 16 / 2) = (*src[t])[j];
  }
  zrow.assign(padded, static_cast<uint8_t>(core.zp));
  vkind = kind;
  if (!m32.empty() && f64.build(padded, m.data(), k.data(), s.data(), a.data(), zw.data(), xm.data(), kind, zs))
    vkind = kind == kPlain ? kF64Floor : kF64Even;
  if (vkind == kF64Floor || vkind == kF64Even)
    f32.build(padded, m.data(), k.data(), s.data(), a.data(), zw.data(), xa.data(), kind, zs, lo, hi);
}

namespace {

template <int LOAD>
__attribute__((target("avx512f,avx512bw,avx512dq,avx512vnni"), always_inline)) inline __m512i dw_tap(
    const uint8_t* const* ptr, const int64_t* adv, int64_t t, int64_t c0, __mmask64 mask) {
  if constexpr (LOAD == kOne) return _mm512_maskz_loadu_epi8(mask, ptr[t] + c0);
  if constexpr (LOAD == kPairRun) return _mm512_loadu_si512(ptr[t]);
  const __m256i lo = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(ptr[t]));
  const __m256i hi = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(ptr[t] + adv[t]));
  return _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
}

// One output position, all channels (LOAD = kOne), or two adjacent ones of a pair block (DwLoad): ptr[t]
// is tap t's input pixel (or the zp row), y the output pixel.
template <int KIND, bool M32, int LOAD = kOne>
__attribute__((target("avx512f,avx512bw,avx512dq,avx512vnni"))) void dw_vnni_pixel(
    const DwVnni& v, const uint8_t* const* ptr, const int64_t* adv, int64_t c, uint8_t* y, int64_t zs, int64_t lo,
    int64_t hi) {
  if constexpr (LOAD != kOne) c = 64;  // two pixels of 32 channels: one full block
  for (int64_t bl = 0; bl < v.blocks; ++bl) {
    const int64_t c0 = 64 * bl, left = c - c0;
    const __mmask64 mask = left >= 64 ? ~__mmask64(0) : ((__mmask64(1) << left) - 1);
    __m512i q0 = _mm512_setzero_si512(), q1 = q0, q2 = q0, q3 = q0;
    const int8_t* wb = v.wq.data() + bl * v.quads * 256;
    for (int64_t g = 0; g < v.quads; ++g, wb += 256) {
      const __m512i x0 = dw_tap<LOAD>(ptr, adv, 4 * g, c0, mask);
      const __m512i x1 = dw_tap<LOAD>(ptr, adv, 4 * g + 1, c0, mask);
      const __m512i x2 = dw_tap<LOAD>(ptr, adv, 4 * g + 2, c0, mask);
      const __m512i x3 = dw_tap<LOAD>(ptr, adv, 4 * g + 3, c0, mask);
      const __m512i ab0 = _mm512_unpacklo_epi8(x0, x1), ab1 = _mm512_unpackhi_epi8(x0, x1);
      const __m512i cd0 = _mm512_unpacklo_epi8(x2, x3), cd1 = _mm512_unpackhi_epi8(x2, x3);
      q0 = _mm512_dpbusd_epi32(q0, _mm512_unpacklo_epi16(ab0, cd0), _mm512_loadu_si512(wb));
      q1 = _mm512_dpbusd_epi32(q1, _mm512_unpackhi_epi16(ab0, cd0), _mm512_loadu_si512(wb + 64));
      q2 = _mm512_dpbusd_epi32(q2, _mm512_unpacklo_epi16(ab1, cd1), _mm512_loadu_si512(wb + 128));
      q3 = _mm512_dpbusd_epi32(q3, _mm512_unpackhi_epi16(ab1, cd1), _mm512_loadu_si512(wb + 192));
    }
    const RqArgs rq = v.args(bl, zs, lo, hi);
    if constexpr (KIND == kF64Floor || KIND == kF64Even) {
      // pack64_u8 puts the values 4 L .. 4 L + 3 of q0, q1, q2, q3 in 128-bit lane L: channels 16 L + 4 q + e
      // in q, e order, which is channel order
      const __m512i out = rq64_f64<KIND, 4>(q0, q1, q2, q3, rq);
      _mm512_mask_storeu_epi8(y + c0, mask, out);
      continue;
    }
    // r[q] lane 4 L + e is channel 16 L + 4 q + e: transpose the 4 x 4 groups of 4 bytes
    const __m128i r0 = _mm512_cvtepi32_epi8(M32 ? rq16_32_values<KIND>(q0, rq, 0) : rq16_values<KIND>(q0, rq, 0));
    const __m128i r1 = _mm512_cvtepi32_epi8(M32 ? rq16_32_values<KIND>(q1, rq, 16) : rq16_values<KIND>(q1, rq, 16));
    const __m128i r2 = _mm512_cvtepi32_epi8(M32 ? rq16_32_values<KIND>(q2, rq, 32) : rq16_values<KIND>(q2, rq, 32));
    const __m128i r3 = _mm512_cvtepi32_epi8(M32 ? rq16_32_values<KIND>(q3, rq, 48) : rq16_values<KIND>(q3, rq, 48));
    const __m128i t0 = _mm_unpacklo_epi32(r0, r1), t1 = _mm_unpacklo_epi32(r2, r3);
    const __m128i t2 = _mm_unpackhi_epi32(r0, r1), t3 = _mm_unpackhi_epi32(r2, r3);
    __m512i out = _mm512_castsi128_si512(_mm_unpacklo_epi64(t0, t1));
    out = _mm512_inserti32x4(out, _mm_unpackhi_epi64(t0, t1), 1);
    out = _mm512_inserti32x4(out, _mm_unpacklo_epi64(t2, t3), 2);
    out = _mm512_inserti32x4(out, _mm_unpackhi_epi64(t2, t3), 3);
    _mm512_mask_storeu_epi8(y + c0, mask, out);
  }
}

template <int LOAD>
DwPixelFn dw_vnni_load(int kind, bool m32) {
  if (kind == kF64Floor) return dw_vnni_pixel<kF64Floor, true, LOAD>;
  if (kind == kF64Even) return dw_vnni_pixel<kF64Even, true, LOAD>;
  if (kind == kParity) return m32 ? dw_vnni_pixel<kParity, true, LOAD> : dw_vnni_pixel<kParity, false, LOAD>;
  if (kind == kSign) return m32 ? dw_vnni_pixel<kSign, true, LOAD> : dw_vnni_pixel<kSign, false, LOAD>;
  return m32 ? dw_vnni_pixel<kPlain, true, LOAD> : dw_vnni_pixel<kPlain, false, LOAD>;
}
}  // namespace

DwPixelFn dw_vnni_for(int kind, bool m32, int load) {
  if (load == kPairRun) return dw_vnni_load<kPairRun>(kind, m32);
  if (load == kPairSplit) return dw_vnni_load<kPairSplit>(kind, m32);
  return dw_vnni_load<kOne>(kind, m32);
}

}  // namespace zonnx_native
