// Requant (RequantU8, RequantI32): the kernel's declaration and parameters, shared by its translation units:
// requant.cpp (the int64 row loops and Compute), requant_wide.cpp (the exact __int128 loops: wide=1 and
// terms that broadcast), requant_create.cpp (the attributes and the ORT ops); the two-term float64 form
// is in requant_f64.cpp.
#pragma once

#include <cstdint>
#include <vector>

#include "zonnx_native.h"

namespace zonnx_native {

// The checked attributes of a Requant kernel and the arrays derived from them (requant_create.cpp).
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

// The exact __int128 requantization of n elements from offset off, channels from c0 (requant_wide.cpp).
template <typename Out>
void wide_row(const std::vector<const void*>& xs, const std::vector<ONNXTensorElementDataType>& ts,
              int64_t off, int64_t n, Out* y, const Params& p, int64_t c0, bool lanes);

struct RequantKernel {
  Params p;
  ONNXTensorElementDataType out_type;

  RequantKernel(const OrtKernelInfo* info, ONNXTensorElementDataType out);  // requant_create.cpp

  void Compute(OrtKernelContext* context);  // requant.cpp, with run

  // The exact scalar path for terms whose shapes broadcast (requant_wide.cpp).
  static std::vector<int64_t> broadcast(const std::vector<std::vector<int64_t>>& shapes);

  template <typename Out>
  void broadcast_run(const std::vector<const void*>& xs, const std::vector<ONNXTensorElementDataType>& ts,
                     const std::vector<std::vector<int64_t>>& shapes, const std::vector<int64_t>& shape, Out* y,
                     int64_t inner, int64_t cdim) const;

  template <typename Out>
  Out finish_wide(__int128 acc, int64_t c) const;

  // Rows: a run of elements with one channel (inner > 1) or the channels of one position (inner == 1).
  template <typename Out>
  void run(const Ort::KernelContext& ctx, const std::vector<const void*>& xs,
           const std::vector<ONNXTensorElementDataType>& ts, Out* y, int64_t total, int64_t inner, int64_t cdim);

  OrtStatusPtr ComputeV2(OrtKernelContext* context) { return guarded(this, context); }
};

}  // namespace zonnx_native
