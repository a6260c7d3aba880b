// DwConv: depthwise convolution of an NHWC uint8 tensor, int32 out:
//   acc[n, oy, ox, c] = sum_{i, j} (x[n, oy*sh - pt + i*dh, ox*sw - pl + j*dw, c] - zp) * w[c, i, j]
// with positions outside the input contributing 0 (they hold the pad code zp). Exact in int32 while
// kh * kw * 255 * 128 < 2^31 (checked). Weights (int8 values) arrive as the attribute "weights" in
// [C, kh, kw] order.
// QDwConv: the same sums requantized in the same kernel, uint8 out (RequantU8's one-term int64 rule,
// requant_tail in zonnx_native.h):
//   y[n, oy, ox, c] = clamp(((M[c] acc + K[c]) + A[c] + sel) >> s[c]) + zs, lo, hi)
// Each output row's sums stay in a thread-local buffer (cache) and are requantized straight away, so no
// int32 tensor reaches memory. Exact while |M acc| + |K| < 2^62 (the Python side checks it).
//
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
#include <cstring>
#include <memory>
#include <stdexcept>

#include "rq_avx512.h"
#include "zonnx_native.h"

namespace zonnx_native {
namespace {

// acc[c] += (x[c] - zp) * w[c] over one tap of all channels; AVX-512 and baseline clones.
__attribute__((target_clones("arch=x86-64-v4", "default"))) void tap_row(const uint8_t* __restrict x,
                                                                         const int32_t* __restrict w,
                                                                         int32_t* __restrict acc, int64_t c,
                                                                         int32_t zp) {
  for (int64_t k = 0; k < c; ++k) acc[k] += (static_cast<int32_t>(x[k]) - zp) * w[k];
}

// The geometry and weights of a depthwise conv, and one output row's int32 sums.
struct DwCore {
  int64_t kh, kw, sh, sw, dh, dw, pt, pl, pb, pr, channels;
  int32_t zp;
  std::vector<int32_t> w;   // [kh, kw, C]
  int64_t tile = 0;         // a multiple of C near 1024
  std::vector<int32_t> wt;  // [kh, kw, tile]: each tap's weights repeated

  explicit DwCore(const Ort::ConstKernelInfo& ki) {
    auto k = ki.GetAttributes<int64_t>("kernel");
    auto s = ki.GetAttributes<int64_t>("strides");
    auto d = ki.GetAttributes<int64_t>("dilations");
    auto p = ki.GetAttributes<int64_t>("pads");
    auto wa = ki.GetAttributes<int64_t>("weights");
    if (k.size() != 2 || s.size() != 2 || d.size() != 2 || p.size() != 4)
      throw std::runtime_error("DwConv: kernel, strides, dilations take 2 values and pads 4");
    kh = k[0]; kw = k[1]; sh = s[0]; sw = s[1]; dh = d[0]; dw = d[1];
    pt = p[0]; pl = p[1]; pb = p[2]; pr = p[3];
    zp = static_cast<int32_t>(ki.GetAttribute<int64_t>("x_zero_point"));
    if (kh < 1 || kw < 1 || sh < 1 || sw < 1 || dh < 1 || dw < 1 || pt < 0 || pl < 0 || pb < 0 || pr < 0 || zp < 0 ||
        zp > 255 || kh * kw > 65535 || wa.empty() || wa.size() % static_cast<size_t>(kh * kw) != 0)
      throw std::runtime_error("DwConv: bad kernel, stride, dilation, pad, zero point or weights attribute");
    channels = static_cast<int64_t>(wa.size()) / (kh * kw);
    w.resize(wa.size());
    for (int64_t c = 0; c < channels; ++c) {
      for (int64_t t = 0; t < kh * kw; ++t) {
        const int64_t v = wa[c * kh * kw + t];
        if (v < -128 || v > 127) throw std::runtime_error("DwConv: weights must be int8 values");
        w[t * channels + c] = static_cast<int32_t>(v);
      }
    }
    tile = channels * std::max<int64_t>(1, 1024 / channels);
    wt.resize(static_cast<size_t>(kh * kw * tile));
    for (int64_t t = 0; t < kh * kw; ++t)
      for (int64_t e = 0; e < tile; ++e) wt[t * tile + e] = w[t * channels + e % channels];
  }

  struct Geometry {
    int64_t n, h, wd, c, oh, ow;
  };

  Geometry geometry(const std::vector<int64_t>& shape) const {
    if (shape.size() != 4) throw std::runtime_error("DwConv: input must be uint8 NHWC rank 4");
    const int64_t n = shape[0], h = shape[1], wd = shape[2], c = shape[3];
    if (c != channels) throw std::runtime_error("DwConv: input channels differ from the weights");
    const int64_t eh = (kh - 1) * dh + 1, ew = (kw - 1) * dw + 1;
    if (h + pt + pb < eh || wd + pl + pr < ew) throw std::runtime_error("DwConv: kernel larger than the padded input");
    return {n, h, wd, c, (h + pt + pb - eh) / sh + 1, (wd + pl + pr - ew) / sw + 1};
  }

  // The int32 sums of output row r (= b oh + oy) into row[ow c].
  void row_sums(const uint8_t* xv, const Geometry& g, int64_t r, int32_t* row) const {
    const int64_t b = r / g.oh, oy = r % g.oh, ow = g.ow, c = g.c, h = g.h, wd = g.wd;
    std::memset(row, 0, sizeof(int32_t) * static_cast<size_t>(ow * c));
    // stride 1: for each tap, the outputs whose input lies inside form one run, contiguous in both the
    // input and the output, weighted by the tap's weights repeated every c (wt)
    for (int64_t i = 0; sw == 1 && i < kh; ++i) {
      const int64_t iy = oy * sh - pt + i * dh;
      if (iy < 0 || iy >= h) continue;
      for (int64_t j = 0; j < kw; ++j) {
        const int64_t off = j * dw - pl;  // ix = ox + off
        const int64_t o0 = std::max<int64_t>(0, -off), o1 = std::min<int64_t>(ow, wd - off);
        if (o1 <= o0) continue;
        const uint8_t* src = xv + ((b * h + iy) * wd + o0 + off) * c;
        const int32_t* wrow = wt.data() + (i * kw + j) * tile;
        for (int64_t e = 0, len = (o1 - o0) * c; e < len; e += tile)
          tap_row(src + e, wrow, row + o0 * c + e, std::min<int64_t>(tile, len - e), zp);
      }
    }
    for (int64_t ox = 0; sw != 1 && ox < ow; ++ox) {
      int32_t* acc = row + ox * c;
      for (int64_t i = 0; i < kh; ++i) {
        const int64_t iy = oy * sh - pt + i * dh;
        if (iy < 0 || iy >= h) continue;
        for (int64_t j = 0; j < kw; ++j) {
          const int64_t ix = ox * sw - pl + j * dw;
          if (ix < 0 || ix >= wd) continue;
          tap_row(xv + ((b * h + iy) * wd + ix) * c, w.data() + (i * kw + j) * c, acc, c, zp);
        }
      }
    }
  }

  // Output rows per parallel task (at least kGrain multiply-adds each).
  int64_t rows_per_task(const Geometry& g) const {
    return std::max<int64_t>(1, kGrain / std::max<int64_t>(g.ow * g.c * kh * kw, 1));
  }
};

struct DwConvKernel {
  DwCore core;

  explicit DwConvKernel(const OrtKernelInfo* info) : core(Ort::ConstKernelInfo(info)) {}

  void Compute(OrtKernelContext* context) {
    Ort::KernelContext ctx(context);
    Ort::ConstValue x = ctx.GetInput(0);
    auto info = x.GetTensorTypeAndShapeInfo();
    if (info.GetElementType() != ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT8)
      throw std::runtime_error("DwConv: input must be uint8 NHWC rank 4");
    const DwCore::Geometry g = core.geometry(info.GetShape());
    Ort::UnownedValue out = ctx.GetOutput(0, std::vector<int64_t>{g.n, g.oh, g.ow, g.c});
    int32_t* y = static_cast<int32_t*>(out.GetTensorMutableRawData());
    const uint8_t* xv = static_cast<const uint8_t*>(x.GetTensorRawData());
    const int64_t rows = g.n * g.oh, per_task = core.rows_per_task(g);
    const size_t tasks = static_cast<size_t>((rows + per_task - 1) / per_task);
    parallel_for(ctx, tasks, [&](size_t task) {
      const int64_t r1 = std::min<int64_t>(rows, (static_cast<int64_t>(task) + 1) * per_task);
      for (int64_t r = static_cast<int64_t>(task) * per_task; r < r1; ++r) core.row_sums(xv, g, r, y + r * g.ow * g.c);
    });
  }
  OrtStatusPtr ComputeV2(OrtKernelContext* context) { return guarded(this, context); }
};

// One row of n sums requantized (channel arrays aligned with the row start).
template <int KIND>
inline __attribute__((always_inline)) void rq_loop(const int32_t* __restrict acc, uint8_t* __restrict y, int64_t n,
                                                   const int64_t* __restrict m, const int64_t* __restrict k,
                                                   const int64_t* __restrict s, const int64_t* __restrict a,
                                                   const int64_t* __restrict b, int64_t zs, int64_t lo, int64_t hi) {
  for (int64_t j = 0; j < n; ++j)
    y[j] = static_cast<uint8_t>(requant_tail<KIND>(m[j] * static_cast<int64_t>(acc[j]) + k[j], s[j], a[j], b[j], zs, lo, hi));
}
__attribute__((target_clones("arch=x86-64-v4", "default"))) void dw_rq_row(
    const int32_t* acc, uint8_t* y, int64_t n, const int64_t* m, const int64_t* k, const int64_t* s,
    const int64_t* a, const int64_t* b, int64_t zs, int64_t lo, int64_t hi, int kind) {
  if (kind == kPlain) rq_loop<kPlain>(acc, y, n, m, k, s, a, b, zs, lo, hi);
  else if (kind == kParity) rq_loop<kParity>(acc, y, n, m, k, s, a, b, zs, lo, hi);
  else rq_loop<kSign>(acc, y, n, m, k, s, a, b, zs, lo, hi);
}

// Lane l of quarter q of a 64-channel block holds channel 16 (l / 4) + 4 q + l % 4 (module comment).
inline int64_t lane_channel(int64_t q, int64_t l) { return 16 * (l / 4) + 4 * q + l % 4; }

// The AVX-512 VNNI form of a QDwConv: weights as tap quads in lane order, requantization arrays in lane
// order (RqArgs layout, padded to whole 64-channel blocks).
struct DwVnni {
  int64_t taps = 0, quads = 0, blocks = 0;
  bool pair = false;  // 32 channels: lanes 32-63 repeat lanes 0-31, so a block holds two adjacent pixels
  std::vector<int8_t> wq;  // [block][quad][quarter q][lane l][4 taps]
  std::vector<int32_t> zw, m32;
  std::vector<int64_t> m, k, s, a, b, ke, ko, se, so, ae, ao, be, bo;
  std::vector<uint8_t> zrow;  // zp bytes: the taps outside the input read it
  std::vector<int64_t> xm;    // per lane: max |acc - zw| = zp-centred input range x sum |w|
  std::vector<int64_t> xa;    // per lane: max |acc| = 255 sum |w| (F32Tables)
  F64Tables f64;              // the float64 requantization where exact (rq_avx512.h)
  F32Tables f32;              // its certified float32 shortcut where the error bound is small (rq_avx512.h)
  int vkind = kPlain;         // the rounding kind of dw_vnni_pixel: kind, or kF64Floor / kF64Even

  DwVnni(const DwCore& core, const std::vector<int64_t>& mult, const std::vector<int64_t>& cnst,
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

  RqArgs args(int64_t bl, int64_t zs, int64_t lo, int64_t hi) const {
    const size_t o = static_cast<size_t>(64 * bl), h = o / 2;
    return RqArgs{zw.data() + o, m.data() + o, k.data() + o, s.data() + o, a.data() + o, b.data() + o,
                  zs, lo, hi, 64, m32.empty() ? nullptr : m32.data() + o, ke.data() + h, ko.data() + h,
                  se.data() + h, so.data() + h, ae.data() + h, ao.data() + h, be.data() + h, bo.data() + h,
                  f64.fm.empty() ? nullptr : f64.fm.data() + o, f64.fc.empty() ? nullptr : f64.fc.data() + o,
                  f32.gm.empty() ? nullptr : f32.gm.data() + o, f32.gc.empty() ? nullptr : f32.gc.data() + o,
                  f32.gtc.empty() ? nullptr : f32.gtc.data() + o / 4};
  }
};

// How dw_vnni_pixel reads tap t of a 64-lane block: kOne, one pixel (c0 + the masked lanes); for a pair
// block (DwVnni::pair, 32 channels) the pixel at ptr[t] in lanes 0-31 and the next output pixel's tap in
// lanes 32-63: kPairRun, it follows in memory (stride 1; the zp row is 64 bytes of zp), kPairSplit, it is
// at ptr[t] + adv[t] (adv = 0 for the zp row).
enum DwLoad { kOne, kPairRun, kPairSplit };

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

using DwPixelFn = void (*)(const DwVnni&, const uint8_t* const*, const int64_t*, int64_t, uint8_t*, int64_t,
                          int64_t, int64_t);
template <int LOAD>
DwPixelFn dw_vnni_load(int kind, bool m32) {
  if (kind == kF64Floor) return dw_vnni_pixel<kF64Floor, true, LOAD>;
  if (kind == kF64Even) return dw_vnni_pixel<kF64Even, true, LOAD>;
  if (kind == kParity) return m32 ? dw_vnni_pixel<kParity, true, LOAD> : dw_vnni_pixel<kParity, false, LOAD>;
  if (kind == kSign) return m32 ? dw_vnni_pixel<kSign, true, LOAD> : dw_vnni_pixel<kSign, false, LOAD>;
  return m32 ? dw_vnni_pixel<kPlain, true, LOAD> : dw_vnni_pixel<kPlain, false, LOAD>;
}
DwPixelFn dw_vnni_for(int kind, bool m32, int load) {
  if (load == kPairRun) return dw_vnni_load<kPairRun>(kind, m32);
  if (load == kPairSplit) return dw_vnni_load<kPairSplit>(kind, m32);
  return dw_vnni_load<kOne>(kind, m32);
}

// A run of interior output pixels of a layer with at most 12 taps (3 quads: 3x3 and smaller) whose kernel
// rows all lie inside the input, in the float64 requantization form: tap t of the run's pixel i is at
// x0 + i step + off[t] (taps beyond the layer's hold zero weights and read a zero vector instead), so no
// per-pixel pointer table is kept; per 64-channel block the twelve weight vectors stay in registers while
// the pixels stream by. The same sums and requantization as dw_vnni_pixel. LOAD kOne: one pixel per step;
// kPairRun / kPairSplit (32 channels): two adjacent pixels per step (lanes 32-63: the next pixel's taps,
// at +32 bytes for stride 1, at + step otherwise).
template <int KIND, int LOAD>
__attribute__((target("avx512f,avx512bw,avx512dq,avx512vnni"))) void dw_vnni_run3(
    const DwVnni& v, const uint8_t* x0, const int64_t* off, int64_t step, int64_t count, int64_t c, uint8_t* y,
    int64_t zs, int64_t lo, int64_t hi) {
  const int taps = static_cast<int>(v.taps);
  const int64_t per = LOAD == kOne ? 1 : 2;  // output pixels per step
  const int64_t blocks = LOAD == kOne ? v.blocks : 1;
  for (int64_t bl = 0; bl < blocks; ++bl) {
    const int64_t c0 = 64 * bl, left = (LOAD == kOne ? c : 64) - c0;
    const __mmask64 mask = left >= 64 ? ~__mmask64(0) : ((__mmask64(1) << left) - 1);
    const int8_t* wb = v.wq.data() + bl * v.quads * 256;
    __m512i w[3][4];
    for (int g = 0; g < 3; ++g)
      for (int q = 0; q < 4; ++q)
        w[g][q] = g < v.quads ? _mm512_loadu_si512(wb + g * 256 + q * 64) : _mm512_setzero_si512();
    const RqArgs rq = v.args(bl, zs, lo, hi);
    const uint8_t* p = x0 + c0;
    uint8_t* yo = y + c0;
    for (int64_t i = 0; i < count; ++i, p += per * step, yo += per * c) {
      __m512i acc[4] = {_mm512_setzero_si512(), _mm512_setzero_si512(), _mm512_setzero_si512(),
                        _mm512_setzero_si512()};
      for (int g = 0; g < 3; ++g) {
        __m512i x[4];
        for (int e = 0; e < 4; ++e) {
          const int t = 4 * g + e;
          if (t >= taps) {
            x[e] = _mm512_setzero_si512();
          } else if constexpr (LOAD == kOne) {
            x[e] = _mm512_maskz_loadu_epi8(mask, p + off[t]);
          } else if constexpr (LOAD == kPairRun) {
            x[e] = _mm512_loadu_si512(p + off[t]);
          } else {
            const __m256i lo8 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + off[t]));
            const __m256i hi8 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + off[t] + step));
            x[e] = _mm512_inserti64x4(_mm512_castsi256_si512(lo8), hi8, 1);
          }
        }
        const __m512i ab0 = _mm512_unpacklo_epi8(x[0], x[1]), ab1 = _mm512_unpackhi_epi8(x[0], x[1]);
        const __m512i cd0 = _mm512_unpacklo_epi8(x[2], x[3]), cd1 = _mm512_unpackhi_epi8(x[2], x[3]);
        acc[0] = _mm512_dpbusd_epi32(acc[0], _mm512_unpacklo_epi16(ab0, cd0), w[g][0]);
        acc[1] = _mm512_dpbusd_epi32(acc[1], _mm512_unpackhi_epi16(ab0, cd0), w[g][1]);
        acc[2] = _mm512_dpbusd_epi32(acc[2], _mm512_unpacklo_epi16(ab1, cd1), w[g][2]);
        acc[3] = _mm512_dpbusd_epi32(acc[3], _mm512_unpackhi_epi16(ab1, cd1), w[g][3]);
      }
      const __m512i out = rq64_f64<KIND, 4>(acc[0], acc[1], acc[2], acc[3], rq);
      _mm512_mask_storeu_epi8(yo, mask, out);
    }
  }
}

using DwRunFn = void (*)(const DwVnni&, const uint8_t*, const int64_t*, int64_t, int64_t, int64_t, uint8_t*, int64_t,
                        int64_t, int64_t);
// The run kernel for a rounding kind and load form, or null where it does not apply (not a float64 kind).
DwRunFn dw_run_for(int kind, int load) {
  if (kind != kF64Floor && kind != kF64Even) return nullptr;
  const bool fl = kind == kF64Floor;
  if (load == kPairRun) return fl ? dw_vnni_run3<kF64Floor, kPairRun> : dw_vnni_run3<kF64Even, kPairRun>;
  if (load == kPairSplit) return fl ? dw_vnni_run3<kF64Floor, kPairSplit> : dw_vnni_run3<kF64Even, kPairSplit>;
  return fl ? dw_vnni_run3<kF64Floor, kOne> : dw_vnni_run3<kF64Even, kOne>;
}

struct QDwConvKernel {
  DwCore core;
  int kind;
  int64_t zs, lo, hi;
  std::vector<int64_t> mult, cnst, shift, addend, bmask;  // per channel, repeated to core.tile
  std::unique_ptr<DwVnni> vnni;                            // the AVX-512 VNNI form (qconv_isa() == 2)
  DwPixelFn pixel = nullptr;
  DwPixelFn pair = nullptr;  // two adjacent interior pixels of a 32-channel layer (DwVnni::pair)
  DwRunFn run = nullptr;      // interior runs, one pixel per step (dw_vnni_run3), where it applies
  DwRunFn run_pair = nullptr;  // the same, two pixels per step (DwVnni::pair)

  explicit QDwConvKernel(const OrtKernelInfo* info) : core(Ort::ConstKernelInfo(info)) {
    Ort::ConstKernelInfo ki(info);
    auto m = ki.GetAttributes<int64_t>("mult");
    auto k = ki.GetAttributes<int64_t>("cnst");
    auto s = ki.GetAttributes<int64_t>("shift");
    const int64_t mode = ki.GetAttribute<int64_t>("mode");
    zs = ki.GetAttribute<int64_t>("zs");
    lo = ki.GetAttribute<int64_t>("lo");
    hi = ki.GetAttribute<int64_t>("hi");
    const size_t c = static_cast<size_t>(core.channels);
    if (m.size() != c || k.size() != c || s.size() != c || mode < 0 || mode > 6 || lo < 0 || hi > 255 || lo > hi)
      throw std::runtime_error("QDwConv: inconsistent requantization attributes (mult, cnst, shift, mode, lo, hi)");
    kind = round_kind(static_cast<int>(mode));
    for (int64_t e = 0; e < core.tile; ++e) {
      const size_t ch = static_cast<size_t>(e) % c;
      if (s[ch] < 0 || s[ch] > 62) throw std::runtime_error("QDwConv: shift outside [0, 62]");
      const RoundParams rp = round_params(static_cast<int>(mode), s[ch]);
      mult.push_back(m[ch]);
      cnst.push_back(k[ch]);
      shift.push_back(s[ch]);
      addend.push_back(rp.addend);
      bmask.push_back(rp.bmask);
    }
    if (qconv_isa() == 2) {
      vnni = std::make_unique<DwVnni>(core, mult, cnst, shift, addend, bmask, kind, zs, lo, hi);
      pixel = dw_vnni_for(vnni->vkind, !vnni->m32.empty(), kOne);
      if (vnni->pair) pair = dw_vnni_for(vnni->vkind, !vnni->m32.empty(), core.sw == 1 ? kPairRun : kPairSplit);
      if (vnni->quads <= 3) {
        run = dw_run_for(vnni->vkind, kOne);
        if (vnni->pair) run_pair = dw_run_for(vnni->vkind, core.sw == 1 ? kPairRun : kPairSplit);
      }
    }
  }

  // The VNNI path over output rows [r0, r1): per position, the tap pointers, then dw_vnni_pixel.
  void rows_vnni(const uint8_t* xv, const DwCore::Geometry& g, int64_t r0, int64_t r1, uint8_t* y) const {
    const DwCore& k = core;
    std::vector<const uint8_t*> ptr(static_cast<size_t>(vnni->quads * 4), vnni->zrow.data());
    std::vector<char> row_in(static_cast<size_t>(k.kh));
    std::vector<int64_t> adv(ptr.size(), 0);  // pair blocks: tap t of the next pixel is at ptr[t] + adv[t]
    // interior columns: every tap of the row inside the input; there the pointers only step by sw c
    const int64_t in0 = (k.pl + k.sw - 1) / k.sw, ext = (k.kw - 1) * k.dw;
    const int64_t in1 = g.wd - 1 - ext + k.pl >= 0 ? (g.wd - 1 - ext + k.pl) / k.sw + 1 : 0;
    const int64_t step = k.sw * g.c;
    std::vector<int64_t> off(static_cast<size_t>(vnni->taps));  // tap (i, j) relative to tap (0, 0)
    for (int64_t t = 0; t < vnni->taps; ++t) off[static_cast<size_t>(t)] = ((t / k.kw) * k.dh * g.wd + (t % k.kw) * k.dw) * g.c;
    for (int64_t r = r0; r < r1; ++r) {
      const int64_t b = r / g.oh, oy = r % g.oh;
      for (int64_t i = 0; i < k.kh; ++i) {
        const int64_t iy = oy * k.sh - k.pt + i * k.dh;
        row_in[static_cast<size_t>(i)] = iy >= 0 && iy < g.h;
      }
      for (int64_t t = 0; t < vnni->taps; ++t) adv[static_cast<size_t>(t)] = row_in[static_cast<size_t>(t / k.kw)] ? step : 0;
      const bool rows_inside = std::all_of(row_in.begin(), row_in.end(), [](char v) { return v != 0; });
      for (int64_t ox = 0; ox < g.ow; ++ox) {
        if (run != nullptr && rows_inside && ox == in0 && in1 > in0) {  // the interior: dw_vnni_run3
          const uint8_t* x0 = xv + ((b * g.h + oy * k.sh - k.pt) * g.wd + in0 * k.sw - k.pl) * g.c;
          uint8_t* y0 = y + (r * g.ow + in0) * g.c;
          int64_t n = in1 - in0;
          if (run_pair != nullptr && n >= 2) {
            run_pair(*vnni, x0, off.data(), step, n / 2, g.c, y0, zs, lo, hi);
            x0 += (n / 2) * 2 * step;
            y0 += (n / 2) * 2 * g.c;
            n %= 2;
          }
          if (n > 0) run(*vnni, x0, off.data(), step, n, g.c, y0, zs, lo, hi);
          ox = in1 - 1;
          continue;
        }
        if (ox > in0 && ox < in1) {
          for (int64_t t = 0; t < vnni->taps; ++t) ptr[static_cast<size_t>(t)] += adv[static_cast<size_t>(t)];
          if (pair != nullptr && ox + 1 < in1) {  // ox and ox + 1 interior: one pair block
            pair(*vnni, ptr.data(), adv.data(), g.c, y + (r * g.ow + ox) * g.c, zs, lo, hi);
            for (int64_t t = 0; t < vnni->taps; ++t) ptr[static_cast<size_t>(t)] += adv[static_cast<size_t>(t)];
            ++ox;
            continue;
          }
          pixel(*vnni, ptr.data(), nullptr, g.c, y + (r * g.ow + ox) * g.c, zs, lo, hi);
          continue;
        }
        for (int64_t i = 0; i < k.kh; ++i) {
          const int64_t iy = oy * k.sh - k.pt + i * k.dh;
          for (int64_t j = 0; j < k.kw; ++j) {
            const int64_t ix = ox * k.sw - k.pl + j * k.dw;
            const bool in = iy >= 0 && iy < g.h && ix >= 0 && ix < g.wd;
            ptr[static_cast<size_t>(i * k.kw + j)] = in ? xv + ((b * g.h + iy) * g.wd + ix) * g.c : vnni->zrow.data();
          }
        }
        pixel(*vnni, ptr.data(), nullptr, g.c, y + (r * g.ow + ox) * g.c, zs, lo, hi);
      }
    }
  }

  void Compute(OrtKernelContext* context) {
    Ort::KernelContext ctx(context);
    Ort::ConstValue x = ctx.GetInput(0);
    auto info = x.GetTensorTypeAndShapeInfo();
    if (info.GetElementType() != ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT8)
      throw std::runtime_error("QDwConv: input must be uint8 NHWC rank 4");
    const DwCore::Geometry g = core.geometry(info.GetShape());
    Ort::UnownedValue out = ctx.GetOutput(0, std::vector<int64_t>{g.n, g.oh, g.ow, g.c});
    uint8_t* y = static_cast<uint8_t*>(out.GetTensorMutableRawData());
    const uint8_t* xv = static_cast<const uint8_t*>(x.GetTensorRawData());
    const int64_t rows = g.n * g.oh, per_task = core.rows_per_task(g), len = g.ow * g.c;
    const size_t tasks = static_cast<size_t>((rows + per_task - 1) / per_task);
    if (vnni) {
      parallel_for(ctx, tasks, [&](size_t task) {
        const int64_t r0 = static_cast<int64_t>(task) * per_task;
        rows_vnni(xv, g, r0, std::min<int64_t>(rows, r0 + per_task), y);
      });
      return;
    }
    parallel_for(ctx, tasks, [&](size_t task) {
      thread_local std::vector<int32_t> buf;
      if (buf.size() < static_cast<size_t>(len)) buf.resize(static_cast<size_t>(len));
      const int64_t r1 = std::min<int64_t>(rows, (static_cast<int64_t>(task) + 1) * per_task);
      for (int64_t r = static_cast<int64_t>(task) * per_task; r < r1; ++r) {
        core.row_sums(xv, g, r, buf.data());
        uint8_t* yr = y + r * len;
        for (int64_t e = 0; e < len; e += core.tile)  // core.tile is a multiple of C: channels stay aligned
          dw_rq_row(buf.data() + e, yr + e, std::min<int64_t>(core.tile, len - e), mult.data(), cnst.data(),
                    shift.data(), addend.data(), bmask.data(), zs, lo, hi, kind);
      }
    });
  }
  OrtStatusPtr ComputeV2(OrtKernelContext* context) { return guarded(this, context); }
};

struct DwConvOp : Ort::CustomOpBase<DwConvOp, DwConvKernel, true> {
  OrtStatusPtr CreateKernelV2(const OrtApi& api, const OrtKernelInfo* info, void** kernel) const {
    try {
      *kernel = new DwConvKernel(info);
      return nullptr;
    } catch (const std::exception& e) {
      return api.CreateStatus(ORT_INVALID_ARGUMENT, (std::string("zonnx.native ") + e.what()).c_str());
    }
  }
  const char* GetName() const { return "DwConv"; }
  size_t GetInputTypeCount() const { return 1; }
  ONNXTensorElementDataType GetInputType(size_t) const { return ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT8; }
  size_t GetOutputTypeCount() const { return 1; }
  ONNXTensorElementDataType GetOutputType(size_t) const { return ONNX_TENSOR_ELEMENT_DATA_TYPE_INT32; }
};

struct QDwConvOp : Ort::CustomOpBase<QDwConvOp, QDwConvKernel, true> {
  OrtStatusPtr CreateKernelV2(const OrtApi& api, const OrtKernelInfo* info, void** kernel) const {
    try {
      *kernel = new QDwConvKernel(info);
      return nullptr;
    } catch (const std::exception& e) {
      return api.CreateStatus(ORT_INVALID_ARGUMENT, (std::string("zonnx.native ") + e.what()).c_str());
    }
  }
  const char* GetName() const { return "QDwConv"; }
  size_t GetInputTypeCount() const { return 1; }
  ONNXTensorElementDataType GetInputType(size_t) const { return ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT8; }
  size_t GetOutputTypeCount() const { return 1; }
  ONNXTensorElementDataType GetOutputType(size_t) const { return ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT8; }
};

}  // namespace

const OrtCustomOp* dwconv_op() {
  static const DwConvOp op;
  return &op;
}
const OrtCustomOp* qdwconv_op() {
  static const QDwConvOp op;
  return &op;
}

}  // namespace zonnx_native
