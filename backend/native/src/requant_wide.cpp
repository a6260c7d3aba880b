// Requant's exact __int128 path (requant_kernel.h): the rows of a wide=1 requantization (wide_row) and the
// scalar loop over terms whose shapes broadcast (RequantKernel::broadcast, broadcast_run, finish_wide).
#include <algorithm>
#include <stdexcept>

#include "requant_kernel.h"
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

__int128 load(const void* x, ONNXTensorElementDataType t, int64_t i) {
  switch (t) {
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT8: return static_cast<const uint8_t*>(x)[i];
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_INT32: return static_cast<const int32_t*>(x)[i];
    default: return static_cast<const int64_t*>(x)[i];
  }
}

}  // namespace

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

std::vector<int64_t> RequantKernel::broadcast(const std::vector<std::vector<int64_t>>& shapes) {
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
Out RequantKernel::finish_wide(__int128 acc, int64_t c) const {
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

template <typename Out>
void RequantKernel::broadcast_run(const std::vector<const void*>& xs, const std::vector<ONNXTensorElementDataType>& ts,
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

// The instances Compute (requant.cpp) calls.
template void wide_row<uint8_t>(const std::vector<const void*>&, const std::vector<ONNXTensorElementDataType>&,
                                int64_t, int64_t, uint8_t*, const Params&, int64_t, bool);
template void wide_row<int32_t>(const std::vector<const void*>&, const std::vector<ONNXTensorElementDataType>&,
                                int64_t, int64_t, int32_t*, const Params&, int64_t, bool);
template void RequantKernel::broadcast_run<uint8_t>(const std::vector<const void*>&,
                                                  const std::vector<ONNXTensorElementDataType>&,
                                                  const std::vector<std::vector<int64_t>>&,
                                                  const std::vector<int64_t>&, uint8_t*, int64_t, int64_t) const;
template void RequantKernel::broadcast_run<int32_t>(const std::vector<const void*>&,
                                                  const std::vector<ONNXTensorElementDataType>&,
                                                  const std::vector<std::vector<int64_t>>&,
                                                  const std::vector<int64_t>&, int32_t*, int64_t, int64_t) const;

}  // namespace zonnx_native
