// Requant: y = clamp(R((sum_t M_t[c] x_t + K[c]) / 2^s[c]) + zs, lo, hi), the NPU requantization of
// zonnx.backend.compiler.requant in exact integers (int64 products, or __int128 when attribute wide=1).
// R is one of the seven rounding modes of requant.rshift_round (same order as ROUND_MODES).
#include <algorithm>
#include <cstring>
#include <stdexcept>

#include "zonnx_native.h"

namespace zonnx_native {
namespace {

// floor(p / 2^s) rounded by MODE; half == 2^(s-1) for s > 0 and 1 for s == 0 (then r == 0 < half).
template <int MODE, typename T>
inline T round_shift(T p, int s, T half) {
  const T q = p >> s;  // arithmetic shift: floor (GCC and Clang define it for negative values)
  const T r = p & ((T(1) << s) - 1);
  switch (MODE) {
    case kHalfUp: return q + T(r >= half);
    case kHalfEven: return q + T((r > half) | ((r == half) & ((q & 1) != 0)));
    case kHalfAway: return q + T((r > half) | ((r == half) & (p >= 0)));
    case kHalfDown: return q + T(r > half);
    case kFloor: return q;
    case kCeil: return q + T(r > 0);
    default: return q + T((p < 0) & (r > 0));  // trunc
  }
}

struct Params {
  int terms = 1;
  int64_t channels = 1;
  int64_t caxis_from_end = 0;
  std::vector<int64_t> mult, cnst, half;
  std::vector<int> shift;
  std::vector<int64_t> shift64, addend, bmask;  // the single-shift form of the int64 loops
  // The same per-channel arrays repeated to a length L (a multiple of the channels, about 1024): a
  // channels-last tensor is then requantized in rows of L elements instead of one row per position.
  int64_t tile = 0;
  std::vector<int64_t> mult_t, cnst_t, shift_t, addend_t, bmask_t;
  int mode = 0, kind = 0;
  int64_t zs = 0, lo = 0, hi = 0;
  bool wide = false;
  // two uint8 terms into uint8 on AVX-512: the float64 form (requant_f64.cpp) per channel and tiled
  bool f64 = false;
  Rq2Tables rq2, rq2_t;
};

// The hot loops. Each entry below is compiled twice (x86-64-v4 with AVX-512, and the baseline) and picked
// at load time by the CPU (GCC target_clones); both are the same integer code, so results never differ.
#define ZN_CLONES __attribute__((target_clones("arch=x86-64-v4", "default")))

// The int64 loops: requant_tail (zonnx_native.h) per element, per-channel A, B and s.
template <int KIND, typename In, typename Out, bool LANES, bool UNIT>
inline __attribute__((always_inline)) void fused(const In* __restrict x, Out* __restrict y, int64_t n,
                                                 const int64_t* __restrict m, const int64_t* __restrict k,
                                                 const int64_t* __restrict s, const int64_t* __restrict a,
                                                 const int64_t* __restrict b, int64_t zs, int64_t lo, int64_t hi) {
  for (int64_t j = 0; j < n; ++j) {
    const int64_t c = LANES ? j : 0;
    const int64_t xv = static_cast<int64_t>(x[j]);
    const int64_t p = (UNIT ? xv : m[c] * xv) + k[c];
    y[j] = static_cast<Out>(requant_tail<KIND>(p, s[c], a[c], b[c], zs, lo, hi));
  }
}

#define ZN_ENTRY(NAME, In, Out, LANES, UNIT)                                                                  \
  ZN_CLONES void NAME(const In* x, Out* y, int64_t n, const int64_t* m, const int64_t* k, const int64_t* s,     \
                      const int64_t* a, const int64_t* b, int64_t zs, int64_t lo, int64_t hi, int kind) {       \
    if (kind == kPlain) fused<kPlain, In, Out, LANES, UNIT>(x, y, n, m, k, s, a, b, zs, lo, hi);              \
    else if (kind == kParity) fused<kParity, In, Out, LANES, UNIT>(x, y, n, m, k, s, a, b, zs, lo, hi);       \
    else fused<kSign, In, Out, LANES, UNIT>(x, y, n, m, k, s, a, b, zs, lo, hi);                              \
  }

ZN_ENTRY(rq_u8_u8_0, uint8_t, uint8_t, false, false)
ZN_ENTRY(rq_u8_u8_1, uint8_t, uint8_t, true, false)
ZN_ENTRY(rq_i32_u8_0, int32_t, uint8_t, false, false)
ZN_ENTRY(rq_i32_u8_1, int32_t, uint8_t, true, false)
ZN_ENTRY(rq_i64_u8_0, int64_t, uint8_t, false, false)
ZN_ENTRY(rq_i64_u8_1, int64_t, uint8_t, true, false)
ZN_ENTRY(rq_u8_i32_0, uint8_t, int32_t, false, false)
ZN_ENTRY(rq_u8_i32_1, uint8_t, int32_t, true, false)
ZN_ENTRY(rq_i32_i32_0, int32_t, int32_t, false, false)
ZN_ENTRY(rq_i32_i32_1, int32_t, int32_t, true, false)
ZN_ENTRY(rq_i64_i32_0, int64_t, int32_t, false, false)
ZN_ENTRY(rq_i64_i32_1, int64_t, int32_t, true, false)
ZN_ENTRY(rq_sum_u8_0, int64_t, uint8_t, false, true)
ZN_ENTRY(rq_sum_u8_1, int64_t, uint8_t, true, true)
ZN_ENTRY(rq_sum_i32_0, int64_t, int32_t, false, true)
ZN_ENTRY(rq_sum_i32_1, int64_t, int32_t, true, true)

// acc[j] (+)= m * x[j] over one row (the terms of a multi-input requantization).
template <typename In, bool LANES>
inline __attribute__((always_inline)) void add_loop(const In* __restrict x, int64_t n, const int64_t* __restrict m,
                                                    int64_t* __restrict acc, bool first) {
  for (int64_t j = 0; j < n; ++j) {
    const int64_t v = m[LANES ? j : 0] * static_cast<int64_t>(x[j]);
    acc[j] = first ? v : acc[j] + v;
  }
}
#define ZN_ADD(NAME, In)                                                                          \
  ZN_CLONES void NAME(const In* x, int64_t n, const int64_t* m, int64_t* acc, bool first, bool lanes) { \
    if (lanes) add_loop<In, true>(x, n, m, acc, first);                                           \
    else add_loop<In, false>(x, n, m, acc, first);                                                \
  }
ZN_ADD(add_u8, uint8_t)
ZN_ADD(add_i32, int32_t)
ZN_ADD(add_i64, int64_t)

// Two int32 terms (a 16-bit residual add) in one pass: p = M1 x1 + M2 x2 + K in int64, the same integers (and
// the same order of additions) as add_i32 twice and rq_sum_i32, without the int64 sums going through memory.
template <int KIND, bool LANES>
inline __attribute__((always_inline)) void fused2(const int32_t* __restrict x1, const int32_t* __restrict x2,
                                                  int32_t* __restrict y, int64_t n, const int64_t* __restrict m1,
                                                  const int64_t* __restrict m2, const int64_t* __restrict k,
                                                  const int64_t* __restrict s, const int64_t* __restrict a,
                                                  const int64_t* __restrict b, int64_t zs, int64_t lo, int64_t hi) {
  for (int64_t j = 0; j < n; ++j) {
    const int64_t c = LANES ? j : 0;
    const int64_t p = (m1[c] * static_cast<int64_t>(x1[j]) + m2[c] * static_cast<int64_t>(x2[j])) + k[c];
    y[j] = static_cast<int32_t>(requant_tail<KIND>(p, s[c], a[c], b[c], zs, lo, hi));
  }
}
#define ZN_ENTRY2(NAME, LANES)                                                                                  \
  ZN_CLONES void NAME(const int32_t* x1, const int32_t* x2, int32_t* y, int64_t n, const int64_t* m1,         \
                      const int64_t* m2, const int64_t* k, const int64_t* s, const int64_t* a, const int64_t* b, \
                      int64_t zs, int64_t lo, int64_t hi, int kind) {                                          \
    if (kind == kPlain) fused2<kPlain, LANES>(x1, x2, y, n, m1, m2, k, s, a, b, zs, lo, hi);                   \
    else if (kind == kParity) fused2<kParity, LANES>(x1, x2, y, n, m1, m2, k, s, a, b, zs, lo, hi);            \
    else fused2<kSign, LANES>(x1, x2, y, n, m1, m2, k, s, a, b, zs, lo, hi);                                   \
  }
ZN_ENTRY2(rq2_i32_i32_0, false)
ZN_ENTRY2(rq2_i32_i32_1, true)

// Single-term requantization of one row, by input type.
template <typename Out>
void single_row(const void* x, ONNXTensorElementDataType t, Out* y, int64_t n, const int64_t* m, const int64_t* k,
                const int64_t* s, const int64_t* h, const int64_t* bm, int64_t zs, int64_t lo, int64_t hi, int mode,
                bool lanes) {
  if constexpr (sizeof(Out) == 1) {
    switch (t) {
      case ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT8:
        return (lanes ? rq_u8_u8_1 : rq_u8_u8_0)(static_cast<const uint8_t*>(x), y, n, m, k, s, h, bm, zs, lo, hi, mode);
      case ONNX_TENSOR_ELEMENT_DATA_TYPE_INT32:
        return (lanes ? rq_i32_u8_1 : rq_i32_u8_0)(static_cast<const int32_t*>(x), y, n, m, k, s, h, bm, zs, lo, hi, mode);
      default:
        return (lanes ? rq_i64_u8_1 : rq_i64_u8_0)(static_cast<const int64_t*>(x), y, n, m, k, s, h, bm, zs, lo, hi, mode);
    }
  } else {
    switch (t) {
      case ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT8:
        return (lanes ? rq_u8_i32_1 : rq_u8_i32_0)(static_cast<const uint8_t*>(x), y, n, m, k, s, h, bm, zs, lo, hi, mode);
      case ONNX_TENSOR_ELEMENT_DATA_TYPE_INT32:
        return (lanes ? rq_i32_i32_1 : rq_i32_i32_0)(static_cast<const int32_t*>(x), y, n, m, k, s, h, bm, zs, lo, hi, mode);
      default:
        return (lanes ? rq_i64_i32_1 : rq_i64_i32_0)(static_cast<const int64_t*>(x), y, n, m, k, s, h, bm, zs, lo, hi, mode);
    }
  }
}

inline void sum_row(const int64_t* acc, uint8_t* y, int64_t n, const int64_t* k, const int64_t* s, const int64_t* h,
                    const int64_t* bm, int64_t zs, int64_t lo, int64_t hi, int mode, bool lanes) {
  (lanes ? rq_sum_u8_1 : rq_sum_u8_0)(acc, y, n, nullptr, k, s, h, bm, zs, lo, hi, mode);
}
inline void sum_row(const int64_t* acc, int32_t* y, int64_t n, const int64_t* k, const int64_t* s, const int64_t* h,
                    const int64_t* bm, int64_t zs, int64_t lo, int64_t hi, int mode, bool lanes) {
  (lanes ? rq_sum_i32_1 : rq_sum_i32_0)(acc, y, n, nullptr, k, s, h, bm, zs, lo, hi, mode);
}

const void* at(const void* x, ONNXTensorElementDataType t, int64_t off) {
  const size_t size = t == ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT8 ? 1 : (t == ONNX_TENSOR_ELEMENT_DATA_TYPE_INT32 ? 4 : 8);
  return static_cast<const char*>(x) + off * static_cast<int64_t>(size);
}

__int128 load(const void* x, ONNXTensorElementDataType t, int64_t i) {
  switch (t) {
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT8: return static_cast<const uint8_t*>(x)[i];
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_INT32: return static_cast<const int32_t*>(x)[i];
    default: return static_cast<const int64_t*>(x)[i];
  }
}

template <typename Out>
void wide_row(const std::vector<const void*>& xs, const std::vector<ONNXTensorElementDataType>& ts,
              int64_t off, int64_t n, Out* y, const Params& p, int64_t c0, bool lanes) {
  for (int64_t j = 0; j < n; ++j) {
    const int64_t c = lanes ? (c0 + j) % p.channels : c0;
    __int128 acc = p.cnst[c];
    for (int t = 0; t < p.terms; ++t) acc += static_cast<__int128>(p.mult[t * p.channels + c]) * load(xs[t], ts[t], off + j);
    const __int128 h = p.half[c];
    __int128 v;
    switch (p.mode) {
      case kHalfUp: v = round_shift<kHalfUp, __int128>(acc, p.shift[c], h); break;
      case kHalfEven: v = round_shift<kHalfEven, __int128>(acc, p.shift[c], h); break;
      case kHalfAway: v = round_shift<kHalfAway, __int128>(acc, p.shift[c], h); break;
      case kHalfDown: v = round_shift<kHalfDown, __int128>(acc, p.shift[c], h); break;
      case kFloor: v = round_shift<kFloor, __int128>(acc, p.shift[c], h); break;
      case kCeil: v = round_shift<kCeil, __int128>(acc, p.shift[c], h); break;
      default: v = round_shift<kTrunc, __int128>(acc, p.shift[c], h); break;
    }
    v += p.zs;
    y[j] = static_cast<Out>(v < p.lo ? p.lo : (v > p.hi ? p.hi : static_cast<int64_t>(v)));
  }
}

struct RequantKernel {
  Params p;
  ONNXTensorElementDataType out_type;

  RequantKernel(const OrtKernelInfo* info, ONNXTensorElementDataType out) : out_type(out) {
    Ort::ConstKernelInfo ki(info);
    p.terms = static_cast<int>(ki.GetAttribute<int64_t>("terms"));
    p.mult = ki.GetAttributes<int64_t>("mult");
    p.cnst = ki.GetAttributes<int64_t>("cnst");
    std::vector<int64_t> shift = ki.GetAttributes<int64_t>("shift");
    p.mode = static_cast<int>(ki.GetAttribute<int64_t>("mode"));
    p.zs = ki.GetAttribute<int64_t>("zs");
    p.lo = ki.GetAttribute<int64_t>("lo");
    p.hi = ki.GetAttribute<int64_t>("hi");
    p.caxis_from_end = ki.GetAttribute<int64_t>("caxis_from_end");
    p.wide = ki.GetAttribute<int64_t>("wide") != 0;
    p.channels = static_cast<int64_t>(p.cnst.size());
    if (p.terms < 1 || p.terms > 4 || p.channels < 1 || shift.size() != p.cnst.size() ||
        p.mult.size() != static_cast<size_t>(p.terms * p.channels) || p.mode < 0 || p.mode > 6)
      throw std::runtime_error("Requant: inconsistent attributes (terms, mult, cnst, shift, mode)");
    for (int64_t v : shift) {
      if (v < 0 || v > 62) throw std::runtime_error("Requant: shift outside [0, 62]");
      p.shift.push_back(static_cast<int>(v));
      p.half.push_back(v > 0 ? (int64_t{1} << (v - 1)) : 1);
      const RoundParams rp = round_params(p.mode, v);
      p.shift64.push_back(v);
      p.addend.push_back(rp.addend);
      p.bmask.push_back(rp.bmask);
    }
    p.kind = round_kind(p.mode);
    p.tile = p.channels * std::max<int64_t>(1, 1024 / p.channels);
    for (int t = 0; t < p.terms; ++t)
      for (int64_t j = 0; j < p.tile; ++j) p.mult_t.push_back(p.mult[t * p.channels + j % p.channels]);
    for (int64_t j = 0; j < p.tile; ++j) {
      const int64_t c = j % p.channels;
      p.cnst_t.push_back(p.cnst[c]);
      p.shift_t.push_back(p.shift64[c]);
      p.addend_t.push_back(p.addend[c]);
      p.bmask_t.push_back(p.bmask[c]);
    }
    if (p.terms == 2 && !p.wide && out == ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT8 && qconv_isa() == 2)
      p.f64 = p.rq2.build(p.mult.data(), p.mult.data() + p.channels, p.cnst.data(), p.shift64.data(),
                          p.addend.data(), static_cast<size_t>(p.channels), p.mode, p.zs, p.lo, p.hi) &&
              p.rq2_t.build(p.mult_t.data(), p.mult_t.data() + p.tile, p.cnst_t.data(), p.shift_t.data(),
                            p.addend_t.data(), static_cast<size_t>(p.tile), p.mode, p.zs, p.lo, p.hi);
  }

  void Compute(OrtKernelContext* context) {
    Ort::KernelContext ctx(context);
    const size_t nin = ctx.GetInputCount();
    if (static_cast<int>(nin) < p.terms) throw std::runtime_error("Requant: fewer inputs than terms");
    std::vector<const void*> xs;
    std::vector<ONNXTensorElementDataType> ts;
    std::vector<std::vector<int64_t>> shapes;
    for (int t = 0; t < p.terms; ++t) {
      Ort::ConstValue v = ctx.GetInput(t);
      auto info = v.GetTensorTypeAndShapeInfo();
      auto ty = info.GetElementType();
      if (ty != ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT8 && ty != ONNX_TENSOR_ELEMENT_DATA_TYPE_INT32 &&
          ty != ONNX_TENSOR_ELEMENT_DATA_TYPE_INT64)
        throw std::runtime_error("Requant: inputs must be uint8, int32 or int64");
      shapes.push_back(info.GetShape());
      xs.push_back(v.GetTensorRawData());
      ts.push_back(ty);
    }
    const std::vector<int64_t> shape = broadcast(shapes);
    const int64_t total = element_count(shape);
    int64_t inner = 1, cdim = 1;
    if (p.channels > 1) {
      const int64_t rank = static_cast<int64_t>(shape.size());
      const int64_t axis = rank - 1 - p.caxis_from_end;
      if (axis < 0) throw std::runtime_error("Requant: channel axis beyond the input rank");
      cdim = shape[axis];
      if (cdim != p.channels) throw std::runtime_error("Requant: channel dimension differs from the parameters");
      for (int64_t a = axis + 1; a < rank; ++a) inner *= shape[a];
    }
    bool same = true;
    for (const auto& sh : shapes) same = same && sh == shape;
    if (!same) {  // numpy broadcasting between the terms: exact __int128 scalar loop
      Ort::UnownedValue out = ctx.GetOutput(0, shape);
      void* y = out.GetTensorMutableRawData();
      if (out_type == ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT8) broadcast_run(xs, ts, shapes, shape, static_cast<uint8_t*>(y), inner, cdim);
      else broadcast_run(xs, ts, shapes, shape, static_cast<int32_t*>(y), inner, cdim);
      return;
    }
    Ort::UnownedValue out = ctx.GetOutput(0, shape);
    void* y = out.GetTensorMutableRawData();
    if (out_type == ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT8) run(ctx, xs, ts, static_cast<uint8_t*>(y), total, inner, cdim);
    else run(ctx, xs, ts, static_cast<int32_t*>(y), total, inner, cdim);
  }

  static std::vector<int64_t> broadcast(const std::vector<std::vector<int64_t>>& shapes) {
    size_t rank = 0;
    for (const auto& sh : shapes) rank = std::max(rank, sh.size());
    std::vector<int64_t> out(rank, 1);
    for (const auto& sh : shapes) {
      for (size_t i = 0; i < sh.size(); ++i) {
        int64_t& o = out[rank - sh.size() + i];
        if (sh[i] == o || sh[i] == 1) continue;
        if (o != 1) throw std::runtime_error("Requant: term shapes do not broadcast");
        o = sh[i];
      }
    }
    return out;
  }

  template <typename Out>
  void broadcast_run(const std::vector<const void*>& xs, const std::vector<ONNXTensorElementDataType>& ts,
                     const std::vector<std::vector<int64_t>>& shapes, const std::vector<int64_t>& shape, Out* y,
                     int64_t inner, int64_t cdim) const {
    const size_t rank = shape.size();
    std::vector<std::vector<int64_t>> strides;  // per term, per output axis (0 where broadcast)
    for (const auto& sh : shapes) {
      std::vector<int64_t> st(rank, 0);
      int64_t step = 1;
      for (size_t i = sh.size(); i-- > 0;) {
        st[rank - sh.size() + i] = sh[i] == 1 ? 0 : step;
        step *= sh[i];
      }
      strides.push_back(st);
    }
    const int64_t total = element_count(shape);
    std::vector<int64_t> idx(rank, 0);
    for (int64_t i = 0; i < total; ++i) {
      const int64_t c = p.channels == 1 ? 0 : (i / inner) % cdim;
      __int128 acc = p.cnst[c];
      for (int t = 0; t < p.terms; ++t) {
        int64_t o = 0;
        for (size_t a = 0; a < rank; ++a) o += idx[a] * strides[t][a];
        acc += static_cast<__int128>(p.mult[t * p.channels + c]) * load(xs[t], ts[t], o);
      }
      y[i] = finish_wide<Out>(acc, c);
      for (size_t a = rank; a-- > 0;) {
        if (++idx[a] < shape[a]) break;
        idx[a] = 0;
      }
    }
  }

  template <typename Out>
  Out finish_wide(__int128 acc, int64_t c) const {
    const __int128 h = p.half[c];
    const int s = p.shift[c];
    __int128 v;
    switch (p.mode) {
      case kHalfUp: v = round_shift<kHalfUp, __int128>(acc, s, h); break;
      case kHalfEven: v = round_shift<kHalfEven, __int128>(acc, s, h); break;
      case kHalfAway: v = round_shift<kHalfAway, __int128>(acc, s, h); break;
      case kHalfDown: v = round_shift<kHalfDown, __int128>(acc, s, h); break;
      case kFloor: v = round_shift<kFloor, __int128>(acc, s, h); break;
      case kCeil: v = round_shift<kCeil, __int128>(acc, s, h); break;
      default: v = round_shift<kTrunc, __int128>(acc, s, h); break;
    }
    v += p.zs;
    return static_cast<Out>(v < p.lo ? p.lo : (v > p.hi ? p.hi : static_cast<int64_t>(v)));
  }

  // Rows: a run of elements with one channel (inner > 1) or the channels of one position (inner == 1).
  template <typename Out>
  void run(const Ort::KernelContext& ctx, const std::vector<const void*>& xs,
           const std::vector<ONNXTensorElementDataType>& ts, Out* y, int64_t total, int64_t inner, int64_t cdim) {
    const bool lanes = p.channels > 1 && inner == 1;
    const int64_t row = p.channels == 1 ? std::min<int64_t>(total, 4096) : (inner == 1 ? p.tile : inner);
    const int64_t rows = row ? (total + row - 1) / row : 0;
    const int64_t per_task = std::max<int64_t>(1, kGrain / std::max<int64_t>(row, 1));
    const size_t tasks = static_cast<size_t>((rows + per_task - 1) / per_task);
    parallel_for(ctx, tasks, [&](size_t task) {
      std::vector<int64_t> acc;  // the multi-term int64 sums (allocated only where that loop runs)
      const int64_t r1 = std::min<int64_t>(rows, (static_cast<int64_t>(task) + 1) * per_task);
      for (int64_t r = static_cast<int64_t>(task) * per_task; r < r1; ++r) {
        const int64_t off = r * row;
        const int64_t n = std::min<int64_t>(row, total - off);
        const int64_t c0 = p.channels == 1 ? 0 : (lanes ? 0 : r % cdim);
        if (p.wide) {
          wide_row(xs, ts, off, n, y + off, p, c0, lanes);
          continue;
        }
        const int64_t* k = (lanes ? p.cnst_t.data() : p.cnst.data()) + c0;
        const int64_t* sh = (lanes ? p.shift_t.data() : p.shift64.data()) + c0;
        const int64_t* a = (lanes ? p.addend_t.data() : p.addend.data()) + c0;
        const int64_t* bm = (lanes ? p.bmask_t.data() : p.bmask.data()) + c0;
        const int64_t* mult = lanes ? p.mult_t.data() : p.mult.data();
        const int64_t mstride = lanes ? p.tile : p.channels;
        if (p.terms == 1) {
          single_row(at(xs[0], ts[0], off), ts[0], y + off, n, mult + c0, k, sh, a, bm, p.zs, p.lo, p.hi, p.kind,
                     lanes);
          continue;
        }
        if constexpr (sizeof(Out) == 1) {
          if (p.f64 && ts[0] == ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT8 && ts[1] == ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT8) {
            rq2_row(lanes ? p.rq2_t : p.rq2, static_cast<const uint8_t*>(xs[0]) + off,
                    static_cast<const uint8_t*>(xs[1]) + off, y + off, n, c0, lanes, p.zs, p.lo, p.hi);
            continue;
          }
        }
        if constexpr (sizeof(Out) == 4) {
          if (p.terms == 2 && ts[0] == ONNX_TENSOR_ELEMENT_DATA_TYPE_INT32 && ts[1] == ONNX_TENSOR_ELEMENT_DATA_TYPE_INT32) {
            (lanes ? rq2_i32_i32_1 : rq2_i32_i32_0)(static_cast<const int32_t*>(xs[0]) + off,
                                                    static_cast<const int32_t*>(xs[1]) + off, y + off, n, mult + c0,
                                                    mult + mstride + c0, k, sh, a, bm, p.zs, p.lo, p.hi, p.kind);
            continue;
          }
        }
        if (acc.empty()) acc.resize(static_cast<size_t>(row));
        for (int t = 0; t < p.terms; ++t) {
          const int64_t* m = mult + t * mstride + c0;
          switch (ts[t]) {
            case ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT8: add_u8(static_cast<const uint8_t*>(xs[t]) + off, n, m, acc.data(), t == 0, lanes); break;
            case ONNX_TENSOR_ELEMENT_DATA_TYPE_INT32: add_i32(static_cast<const int32_t*>(xs[t]) + off, n, m, acc.data(), t == 0, lanes); break;
            default: add_i64(static_cast<const int64_t*>(xs[t]) + off, n, m, acc.data(), t == 0, lanes); break;
          }
        }
        sum_row(acc.data(), y + off, n, k, sh, a, bm, p.zs, p.lo, p.hi, p.kind, lanes);
      }
    });
  }

  OrtStatusPtr ComputeV2(OrtKernelContext* context) { return guarded(this, context); }
};

template <ONNXTensorElementDataType OUT>
struct RequantOpT : Ort::CustomOpBase<RequantOpT<OUT>, RequantKernel, true> {
  OrtStatusPtr CreateKernelV2(const OrtApi& api, const OrtKernelInfo* info, void** kernel) const {
    try {
      *kernel = new RequantKernel(info, OUT);
      return nullptr;
    } catch (const std::exception& e) {
      return api.CreateStatus(ORT_INVALID_ARGUMENT, (std::string("zonnx.native ") + e.what()).c_str());
    }
  }
  const char* GetName() const { return OUT == ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT8 ? "RequantU8" : "RequantI32"; }
  size_t GetInputTypeCount() const { return 4; }
  ONNXTensorElementDataType GetInputType(size_t) const { return ONNX_TENSOR_ELEMENT_DATA_TYPE_UNDEFINED; }
  OrtCustomOpInputOutputCharacteristic GetInputCharacteristic(size_t i) const {
    return i == 0 ? INPUT_OUTPUT_REQUIRED : INPUT_OUTPUT_OPTIONAL;
  }
  size_t GetOutputTypeCount() const { return 1; }
  ONNXTensorElementDataType GetOutputType(size_t) const { return OUT; }
};

}  // namespace

const OrtCustomOp* requant_u8_op() {
  static const RequantOpT<ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT8> op;
  return &op;
}
const OrtCustomOp* requant_i32_op() {
  static const RequantOpT<ONNX_TENSOR_ELEMENT_DATA_TYPE_INT32> op;
  return &op;
}

}  // namespace zonnx_native
