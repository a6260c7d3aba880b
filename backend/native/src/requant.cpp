// Requant: y = clamp(R((sum_t M_t[c] x_t + K[c]) / 2^s[c]) + zs, lo, hi), the NPU requantization of
// zonnx.backend.compiler.requant in exact integers (int64 products, or __int128 when attribute wide=1).
// R is one of the seven rounding modes of requant.rshift_round (same order as ROUND_MODES).
// This file: the int64 row loops (compiled per CPU by target_clones) and the kernel's Compute; the other
// parts are listed in requant_kernel.h.
#include <algorithm>
#include <cstring>
#include <stdexcept>

#include "requant_kernel.h"
#include "zonnx_native.h"

namespace zonnx_native {
namespace {

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

}  // namespace

void RequantKernel::Compute(OrtKernelContext* context) {
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

template <typename Out>
void RequantKernel::run(const Ort::KernelContext& ctx, const std::vector<const void*>& xs,
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

}  // namespace zonnx_native
