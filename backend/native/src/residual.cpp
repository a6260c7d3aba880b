// The residual add a QConv applies to its own uint8 output (attributes add_*, input 2 the skip tensor):
//   y = clamp(R((M1[c] v + M2[c] x + K[c]) / 2^s[c]) + zs, lo, hi)
// with v the conv's output code (its own requantization done first, unchanged) and x the skip tensor's
// code: RequantU8's two-term rule (requant.cpp), per tensor or per channel along C, computed the same two
// ways: the float64 form of requant_f64.cpp where its per-channel bound proves it exact and the CPU has
// AVX-512 (as RequantU8 picks it), else the int64 loop (requant_tail). Products must fit int64 (checked at
// creation: the lowering fuses only adds without int128 products). A skip tensor of another shape than the
// conv output is added after the conv with numpy broadcasting (exact scalar loop).
#include <algorithm>
#include <stdexcept>

#include "zonnx_native.h"

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

// An int64 attribute list, or empty when the node does not have it.
std::vector<int64_t> optional_ints(const Ort::ConstKernelInfo& ki, const char* name) {
  try {
    return ki.GetAttributes<int64_t>(name);
  } catch (const Ort::Exception&) {
    return {};
  }
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
  kind = round_kind(static_cast<int>(mode));
  const size_t len = lanes ? padded : 1;  // whole panels: a panel's row reads its channels' entries
  m1.assign(len, 0);
  m2.assign(len, 0);
  k.assign(len, 0);
  s.assign(len, 0);
  a.assign(len, 0);
  b.assign(len, 0);
  for (size_t c = 0; c < ch; ++c) {
    if (shift[c] < 0 || shift[c] > 62) throw std::runtime_error("QConv: residual add shift outside [0, 62]");
    const RoundParams rp = round_params(static_cast<int>(mode), shift[c]);
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
  use_f64 = avx512 && f64.build(m1.data(), m2.data(), k.data(), s.data(), a.data(), len, static_cast<int>(mode), zs,
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

void ResidualAdd::rows(uint8_t* y, const uint8_t* x, int64_t ld, int64_t mr, int64_t n, int64_t c0) const {
  const int64_t c = lanes ? c0 : 0;
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
