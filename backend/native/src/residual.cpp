// The residual add a QConv applies to its own uint8 output (attributes add_*, input 2 the skip tensor):
//   y = clamp(R((M1[c] v + M2[c] x + K[c]) / 2^s[c]) + zs, lo, hi)
// with v the conv's output code (its own requantization done first, unchanged) and x the skip tensor's
// code: RequantU8's two-term rule (requant.cpp), per tensor or per channel along C. Every form computes the
// same integers: on AVX-512 an int32 form where every value fits int32 (small multipliers: power-of-two and
// 15-bit targets), a pair form of 16-bit halves (one large multiplier pair for all), or the float64 form of
// requant_f64.cpp where its per-channel bound proves it exact (as RequantU8 picks it); else the int64 loop
// (requant_tail). Products must fit int64 (checked at creation: the lowering fuses only adds without int128
// products). A skip tensor of another shape than the conv output is added after the conv with numpy
// broadcasting (exact scalar loop).
#include "simd.h"

#include <algorithm>
#include <stdexcept>

#include "zonnx_native.h"

// GCC 12 warns inside its own AVX-512 intrinsics headers (_mm512_undefined_* as "maybe uninitialized").
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

namespace zonnx_native {
namespace {

template <int KIND, bool LANES>
inline __attribute__((always_inline)) void res_loop(uint8_t* __restrict y, const uint8_t* __restrict x, int64_t n,
                                                    const int64_t* __restrict m1, const int64_t* __restrict m2,
                                                    const int64_t* __restrict k, const int64_t* __restrict s,
                                                    const int64_t* __restrict a, const int64_t* __restrict b,
                                                    int64_t zs, int64_t lo, int64_t hi) {
  for (int64_t j = 0; j < n; ++j) {
    const int64_t c = LANES ? j : 0;
    const int64_t p = m1[c] * static_cast<int64_t>(y[j]) + m2[c] * static_cast<int64_t>(x[j]) + k[c];
    y[j] = static_cast<uint8_t>(requant_tail<KIND>(p, s[c], a[c], b[c], zs, lo, hi));
  }
}

// The int32 form on AVX-512: the same rule in 16 int32 lanes, exact where every value it forms fits int32
// (255 (|M1| + |M2|) + |K| + |A| + |B| < 2^31, checked per channel: then p, p + A + sel and the shifted
// value are the int64 rule's integers); kPlain's constant holds K + A. rows rows of n elements, ld apart.
template <bool LANES>
__attribute__((target("avx512f,avx512bw,avx512dq,avx512vl"), always_inline)) inline __m512i chan(const int32_t* t,
                                                                                                  int64_t c) {
  return LANES ? _mm512_loadu_si512(t + c) : _mm512_set1_epi32(t[0]);
}

template <int KIND, bool LANES>
__attribute__((target("avx512f,avx512bw,avx512dq,avx512vl"))) void res_i32_loop(
    uint8_t* y0, const uint8_t* x0, int64_t ld, int64_t rows, int64_t n, const int32_t* m1, const int32_t* m2,
    const int32_t* k, const int32_t* s, const int32_t* a, const int32_t* b, int32_t zs, int32_t lo, int32_t hi) {
  const __m512i vlo = _mm512_set1_epi32(lo - zs), vhi = _mm512_set1_epi32(hi - zs), vzs = _mm512_set1_epi32(zs);
  for (int64_t i = 0; i < rows; ++i)
  for (int64_t j = 0; j < n; j += 16) {
    uint8_t* y = y0 + i * ld;
    const uint8_t* x = x0 + i * ld;
    const int64_t left = n - j;
    const __mmask16 mask = left >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << left) - 1);
    const int64_t c = LANES ? j : 0;
    const __m512i v = _mm512_cvtepu8_epi32(_mm_maskz_loadu_epi8(mask, y + j));
    const __m512i w = _mm512_cvtepu8_epi32(_mm_maskz_loadu_epi8(mask, x + j));
    const __m512i sh = chan<LANES>(s, c);
    const __m512i p = _mm512_add_epi32(_mm512_add_epi32(_mm512_mullo_epi32(v, chan<LANES>(m1, c)), _mm512_mullo_epi32(w, chan<LANES>(m2, c))), chan<LANES>(k, c));
    __m512i t = KIND == kPlain ? p : _mm512_add_epi32(p, chan<LANES>(a, c));
    if (KIND == kParity) t = _mm512_add_epi32(t, _mm512_and_si512(_mm512_srav_epi32(p, sh), chan<LANES>(b, c)));
    if (KIND == kSign) t = _mm512_add_epi32(t, _mm512_and_si512(_mm512_srai_epi32(p, 31), chan<LANES>(b, c)));
    const __m512i r = _mm512_min_epi32(_mm512_max_epi32(_mm512_srav_epi32(t, sh), vlo), vhi);
    _mm512_mask_cvtepi32_storeu_epi8(y + j, mask, _mm512_add_epi32(r, vzs));
  }
}

// The pair form on AVX-512 for one tensor-wide kPlain rule with large multipliers (the 31-bit ones of
// bm1684x), s >= 16: with M_t = 2^16 a_t + b_t (b_t in [-2^15, 2^15), |a_t| < 2^15) and K + A = 2^16 kh + kl
// (kl in [0, 2^16)), p = M1 v + M2 x + K + A = 2^16 (a1 v + a2 x + kh) + L with L = b1 v + b2 x + kl, so
// floor(p / 2^16) = a1 v + a2 x + kh + (L >> 16) and (p + A) >> s is that >> (s - 16): every value is an
// int32 (|kh| <= 2^30, |L| < 2^25) and (v, x) word pairs times (a1, a2) and (b1, b2) are two vpmaddwd.
// The result packs to int16 with saturation, exact after the clamp to [lo - zs, hi - zs] (|zs| <= 32512).
// Rows of 32 codes: words in order (vpmovzxbw), pairs by unpacklo/hi within 128-bit lanes, which packs_epi32
// puts back in order.
__attribute__((target("avx512f,avx512bw,avx512dq,avx512vl"))) void res_pair_loop(
    uint8_t* y0, const uint8_t* x0, int64_t ld, int64_t rows, int64_t n, int32_t pa, int32_t pb, int32_t kh,
    int32_t kl, int32_t sh, int32_t zs, int32_t lo, int32_t hi) {
  const __m512i va = _mm512_set1_epi32(pa), vb = _mm512_set1_epi32(pb);
  const __m512i vkh = _mm512_set1_epi32(kh), vkl = _mm512_set1_epi32(kl);
  const __m128i count = _mm_cvtsi32_si128(sh);
  const __m512i wlo = _mm512_set1_epi16(static_cast<int16_t>(lo - zs)), whi = _mm512_set1_epi16(static_cast<int16_t>(hi - zs));
  const __m512i wzs = _mm512_set1_epi16(static_cast<int16_t>(zs));
  for (int64_t i = 0; i < rows; ++i) {
    uint8_t* y = y0 + i * ld;
    const uint8_t* x = x0 + i * ld;
    for (int64_t j = 0; j < n; j += 32) {
      const int64_t left = n - j;
      const __mmask32 mask = left >= 32 ? ~__mmask32(0) : ((__mmask32(1) << left) - 1);
      const __m512i v = _mm512_cvtepu8_epi16(_mm256_maskz_loadu_epi8(mask, y + j));
      const __m512i w = _mm512_cvtepu8_epi16(_mm256_maskz_loadu_epi8(mask, x + j));
      __m512i r[2];
      for (int h = 0; h < 2; ++h) {
        const __m512i pair = h ? _mm512_unpackhi_epi16(v, w) : _mm512_unpacklo_epi16(v, w);
        const __m512i l = _mm512_add_epi32(_mm512_madd_epi16(pair, vb), vkl);
        const __m512i q = _mm512_add_epi32(_mm512_add_epi32(_mm512_madd_epi16(pair, va), vkh), _mm512_srai_epi32(l, 16));
        r[h] = _mm512_sra_epi32(q, count);
      }
      const __m512i words = _mm512_min_epi16(_mm512_max_epi16(_mm512_packs_epi32(r[0], r[1]), wlo), whi);
      _mm512_mask_cvtepi16_storeu_epi8(y + j, mask, _mm512_add_epi16(words, wzs));
    }
  }
}

// y[j] = the rule of (y[j], x[j]) for n elements; per-channel arrays start at the row's first channel.
__attribute__((target_clones("arch=x86-64-v4", "default"))) void res_row(
    uint8_t* y, const uint8_t* x, int64_t n, const int64_t* m1, const int64_t* m2, const int64_t* k,
    const int64_t* s, const int64_t* a, const int64_t* b, int64_t zs, int64_t lo, int64_t hi, int kind, bool lanes) {
  if (lanes) {
    if (kind == kPlain) res_loop<kPlain, true>(y, x, n, m1, m2, k, s, a, b, zs, lo, hi);
    else if (kind == kParity) res_loop<kParity, true>(y, x, n, m1, m2, k, s, a, b, zs, lo, hi);
    else res_loop<kSign, true>(y, x, n, m1, m2, k, s, a, b, zs, lo, hi);
  } else {
    if (kind == kPlain) res_loop<kPlain, false>(y, x, n, m1, m2, k, s, a, b, zs, lo, hi);
    else if (kind == kParity) res_loop<kParity, false>(y, x, n, m1, m2, k, s, a, b, zs, lo, hi);
    else res_loop<kSign, false>(y, x, n, m1, m2, k, s, a, b, zs, lo, hi);
  }
}

// An int64 attribute list, or empty when the node does not have it (asked through the C API: a missing
// attribute is a status, not an exception, on every QConv without a residual add).
std::vector<int64_t> optional_ints(const Ort::ConstKernelInfo& ki, const char* name) {
  const OrtApi& api = Ort::GetApi();
  size_t size = 0;
  if (OrtStatus* missing = api.KernelInfoGetAttributeArray_int64(ki, name, nullptr, &size)) {
    api.ReleaseStatus(missing);
    return {};
  }
  std::vector<int64_t> out(size);
  Ort::ThrowOnError(api.KernelInfoGetAttributeArray_int64(ki, name, out.data(), &size));
  return out;
}

// numpy's broadcast of two shapes (std::runtime_error when they do not broadcast).
std::vector<int64_t> broadcast_shape(const std::vector<int64_t>& u, const std::vector<int64_t>& v) {
  const size_t rank = std::max(u.size(), v.size());
  std::vector<int64_t> out(rank, 1);
  for (const auto* sh : {&u, &v}) {
    for (size_t i = 0; i < sh->size(); ++i) {
      int64_t& o = out[rank - sh->size() + i];
      const int64_t d = (*sh)[i];
      if (d == o || d == 1) continue;
      if (o != 1) throw std::runtime_error("QConv: the residual input's shape does not broadcast with the output");
      o = d;
    }
  }
  return out;
}

// Per output axis, the element stride of a tensor of shape sh broadcast to rank (0 along broadcast axes).
std::vector<int64_t> broadcast_strides(const std::vector<int64_t>& sh, size_t rank) {
  std::vector<int64_t> st(rank, 0);
  int64_t step = 1;
  for (size_t i = sh.size(); i-- > 0;) {
    st[rank - sh.size() + i] = sh[i] == 1 ? 0 : step;
    step *= sh[i];
  }
  return st;
}

}  // namespace

void ResidualAdd::init(const Ort::ConstKernelInfo& ki, int64_t channels, size_t padded, bool avx512) {
  const std::vector<int64_t> mult = optional_ints(ki, "add_mult");
  const std::vector<int64_t> cnst = optional_ints(ki, "add_cnst");
  const std::vector<int64_t> shift = optional_ints(ki, "add_shift");
  active = !mult.empty() || !cnst.empty() || !shift.empty();
  if (!active) return;
  const int64_t mode = ki.GetAttribute<int64_t>("add_mode");
  zs = ki.GetAttribute<int64_t>("add_zs");
  lo = ki.GetAttribute<int64_t>("add_lo");
  hi = ki.GetAttribute<int64_t>("add_hi");
  const size_t ch = cnst.size();
  if ((ch != 1 && ch != static_cast<size_t>(channels)) || shift.size() != ch || mult.size() != 2 * ch ||
      mode < 0 || mode > 6 || lo < 0 || hi > 255 || lo > hi)
    throw std::runtime_error("QConv: inconsistent residual add attributes (add_mult, add_cnst, add_shift, add_mode, "
                             "add_lo, add_hi)");
  lanes = ch > 1;
  // Where lo >= zs, half_away rounds like half_up and trunc like floor: the modes differ only for p < 0,
  // where both give R <= 0, and clamp(R + zs, lo, hi) = lo for every R <= 0 (the cheaper form runs).
  int64_t rmode = mode;
  if (lo >= zs && mode == kHalfAway) rmode = kHalfUp;
  if (lo >= zs && mode == kTrunc) rmode = kFloor;
  kind = round_kind(static_cast<int>(rmode));
  const size_t len = lanes ? padded : 1;  // whole panels: a panel's row reads its channels' entries
  m1.assign(len, 0);
  m2.assign(len, 0);
  k.assign(len, 0);
  s.assign(len, 0);
  a.assign(len, 0);
  b.assign(len, 0);
  for (size_t c = 0; c < ch; ++c) {
    if (shift[c] < 0 || shift[c] > 62) throw std::runtime_error("QConv: residual add shift outside [0, 62]");
    const RoundParams rp = round_params(static_cast<int>(rmode), shift[c]);
    m1[c] = mult[c];
    m2[c] = mult[ch + c];
    k[c] = cnst[c];
    s[c] = shift[c];
    a[c] = rp.addend;
    b[c] = rp.bmask;
    const auto mag = [](int64_t u) { return u < 0 ? -static_cast<__int128>(u) : static_cast<__int128>(u); };
    const __int128 bound = 255 * (mag(m1[c]) + mag(m2[c])) + mag(k[c]) + mag(a[c]);
    if (bound >= (__int128{1} << 62))
      throw std::runtime_error("QConv: the residual add's products exceed int64 (it needs RequantU8's wide form)");
  }
  // the int32 form where its bound holds for every channel, else the float64 form where that one's holds
  use_i32 = avx512 && zs >= -(int64_t{1} << 24) && zs <= (int64_t{1} << 24);
  for (size_t c = 0; use_i32 && c < ch; ++c) {
    const auto mag = [](int64_t u) { return u < 0 ? -static_cast<__int128>(u) : static_cast<__int128>(u); };
    use_i32 = 255 * (mag(m1[c]) + mag(m2[c])) + mag(k[c]) + mag(a[c]) + mag(b[c]) < (__int128{1} << 31);
  }
  if (use_i32) {
    for (auto* v : {&m1w, &m2w, &kw, &sw, &aw, &bw}) v->assign(len, 0);
    for (size_t c = 0; c < len; ++c) {
      m1w[c] = static_cast<int32_t>(m1[c]);
      m2w[c] = static_cast<int32_t>(m2[c]);
      kw[c] = static_cast<int32_t>(kind == kPlain ? k[c] + a[c] : k[c]);
      sw[c] = static_cast<int32_t>(s[c]);
      aw[c] = static_cast<int32_t>(a[c]);
      bw[c] = static_cast<int32_t>(b[c]);
    }
    return;
  }
  // the pair form (one rule for all, kPlain, s >= 16, the split's bounds)
  if (avx512 && !lanes && kind == kPlain && s[0] >= 16 && zs >= -32512 && zs <= 32512) {
    const int64_t a1 = (m1[0] + (1 << 15)) >> 16, a2 = (m2[0] + (1 << 15)) >> 16;
    const __int128 kk = static_cast<__int128>(k[0]) + a[0];
    const __int128 khi = kk >> 16;  // floor
    if (a1 >= -32768 && a1 <= 32767 && a2 >= -32768 && a2 <= 32767 && khi >= -(__int128{1} << 30) &&
        khi <= (__int128{1} << 30)) {
      const int64_t b1 = m1[0] - a1 * 65536, b2 = m2[0] - a2 * 65536;  // in [-2^15, 2^15)
      const auto word_pair = [](int64_t lo16, int64_t hi16) {
        return static_cast<int32_t>(static_cast<uint32_t>(static_cast<uint16_t>(lo16)) |
                                    static_cast<uint32_t>(static_cast<uint16_t>(hi16)) << 16);
      };
      pair_a = word_pair(a1, a2);
      pair_b = word_pair(b1, b2);
      pair_kh = static_cast<int32_t>(khi);
      pair_kl = static_cast<int32_t>(kk - khi * 65536);
      use_pair = true;
      return;
    }
  }
  use_f64 = avx512 && f64.build(m1.data(), m2.data(), k.data(), s.data(), a.data(), len, static_cast<int>(rmode), zs,
                                lo, hi);
}

ResidualInput ResidualAdd::input(const Ort::KernelContext& ctx, const std::vector<int64_t>& conv_shape) const {
  ResidualInput in;
  const OrtValue* given = nullptr;
  Ort::ConstValue v{nullptr};
  if (ctx.GetInputCount() > 2) {
    v = ctx.GetInput(2);
    given = v;
  }
  if ((given != nullptr) != active)
    throw std::runtime_error(active ? "QConv: the residual add attributes need input 2 (the skip tensor)"
                                    : "QConv: input 2 (a skip tensor) needs the add_* attributes");
  if (!active) return in;
  auto info = v.GetTensorTypeAndShapeInfo();
  if (info.GetElementType() != ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT8)
    throw std::runtime_error("QConv: the residual input must be uint8");
  in.skip = static_cast<const uint8_t*>(v.GetTensorRawData());
  in.skip_shape = info.GetShape();
  in.same = in.skip_shape == conv_shape;
  // per channel: the output's last axis is the conv's (C > 1 broadcasts only against 1 or C)
  in.out_shape = in.same ? conv_shape : broadcast_shape(conv_shape, in.skip_shape);
  return in;
}

void ResidualAdd::rows_i32(uint8_t* y, const uint8_t* x, int64_t ld, int64_t mr, int64_t n, int64_t c) const {
  const int32_t *p1 = m1w.data() + c, *p2 = m2w.data() + c, *pk = kw.data() + c, *ps = sw.data() + c;
  const int32_t *pa = aw.data() + c, *pb = bw.data() + c;
  const auto z = static_cast<int32_t>(zs), l = static_cast<int32_t>(lo), h = static_cast<int32_t>(hi);
  switch (kind * 2 + (lanes ? 1 : 0)) {
    case kPlain * 2: return res_i32_loop<kPlain, false>(y, x, ld, mr, n, p1, p2, pk, ps, pa, pb, z, l, h);
    case kPlain * 2 + 1: return res_i32_loop<kPlain, true>(y, x, ld, mr, n, p1, p2, pk, ps, pa, pb, z, l, h);
    case kParity * 2: return res_i32_loop<kParity, false>(y, x, ld, mr, n, p1, p2, pk, ps, pa, pb, z, l, h);
    case kParity * 2 + 1: return res_i32_loop<kParity, true>(y, x, ld, mr, n, p1, p2, pk, ps, pa, pb, z, l, h);
    case kSign * 2: return res_i32_loop<kSign, false>(y, x, ld, mr, n, p1, p2, pk, ps, pa, pb, z, l, h);
    default: return res_i32_loop<kSign, true>(y, x, ld, mr, n, p1, p2, pk, ps, pa, pb, z, l, h);
  }
}

void ResidualAdd::rows(uint8_t* y, const uint8_t* x, int64_t ld, int64_t mr, int64_t n, int64_t c0) const {
  const int64_t c = lanes ? c0 : 0;
  if (!lanes && n == ld) {  // whole output rows, one tensor-wide rule: one run of mr n elements
    n *= mr;
    mr = 1;
  }
  if (use_i32) return rows_i32(y, x, ld, mr, n, c);
  if (use_pair)
    return res_pair_loop(y, x, ld, mr, n, pair_a, pair_b, pair_kh, pair_kl, static_cast<int32_t>(s[0] - 16),
                         static_cast<int32_t>(zs), static_cast<int32_t>(lo), static_cast<int32_t>(hi));
  for (int64_t i = 0; i < mr; ++i) {
    uint8_t* yi = y + i * ld;
    const uint8_t* xi = x + i * ld;
    if (use_f64)
      rq2_row(f64, yi, xi, yi, n, c, lanes, zs, lo, hi);
    else
      res_row(yi, xi, n, m1.data() + c, m2.data() + c, k.data() + c, s.data() + c, a.data() + c, b.data() + c, zs,
              lo, hi, kind, lanes);
  }
}

void ResidualAdd::broadcast(const uint8_t* v, const std::vector<int64_t>& conv_shape, const ResidualInput& in,
                            uint8_t* y) const {
  const std::vector<int64_t>& shape = in.out_shape;
  const size_t rank = shape.size();
  const std::vector<int64_t> sv = broadcast_strides(conv_shape, rank), sx = broadcast_strides(in.skip_shape, rank);
  const int64_t total = element_count(shape);
  std::vector<int64_t> idx(rank, 0);
  int64_t ov = 0, ox = 0;  // the element offsets of idx in v and x
  for (int64_t i = 0; i < total; ++i) {
    const int64_t c = lanes ? idx[rank - 1] : 0;
    y[i] = v[ov];
    res_row(y + i, in.skip + ox, 1, m1.data() + c, m2.data() + c, k.data() + c, s.data() + c, a.data() + c,
            b.data() + c, zs, lo, hi, kind, false);
    for (size_t d = rank; d-- > 0;) {
      ov += sv[d];
      ox += sx[d];
      if (++idx[d] < shape[d]) break;
      ov -= sv[d] * shape[d];
      ox -= sx[d] * shape[d];
      idx[d] = 0;
    }
  }
}

}  // namespace zonnx_native
