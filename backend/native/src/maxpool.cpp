// MaxPoolI32 / MaxPoolU8: max pooling of an NHWC int32 tensor (16-bit codes stored as int32), int32 out, or
// of an NHWC uint8 tensor (8-bit codes), uint8 out:
//   y[n, oy, ox, c] = max over the window taps inside the input of x[n, iy, ix, c]
// (padding never wins, as in ONNX MaxPool), with ONNX's output size: floor((H + pads - ((k - 1) d + 1)) / s) + 1,
// or with ceil_mode the ceiling, less one when the last window would start inside the end padding.
// An empty window (only possible with large pads) is refused at creation. Codes compare as integers, so
// the result is exact for any stored width.
#include "simd.h"

#include <algorithm>
#include <climits>
#include <vector>
#include <stdexcept>

#include "zonnx_native.h"

namespace zonnx_native {
namespace {

// acc[k] = max(acc[k], x[k]) over one tap of all channels (AVX-512 and baseline clones).
__attribute__((target_clones("arch=x86-64-v4", "default"))) void max_row(const int32_t* __restrict x,
                                                                         int32_t* __restrict acc, int64_t c) {
  for (int64_t k = 0; k < c; ++k) acc[k] = std::max(acc[k], x[k]);
}
__attribute__((target_clones("arch=x86-64-v4", "default"))) void max_row(const uint8_t* __restrict x,
                                                                         uint8_t* __restrict acc, int64_t c) {
  for (int64_t k = 0; k < c; ++k) acc[k] = std::max(acc[k], x[k]);
}

// One output pixel of a uint8 pool on AVX-512: the taps' rows (taps[t], c bytes each) maxed 64 channels at a
// time in registers (the same maxima as max_row, without a call per tap).
__attribute__((target("avx512f,avx512bw"))) void max_taps_u8(const uint8_t* const* taps, int n, uint8_t* y,
                                                             int64_t c) {
  for (int64_t c0 = 0; c0 < c; c0 += 64) {
    const int64_t left = c - c0;
    const __mmask64 mask = left >= 64 ? ~__mmask64(0) : ((__mmask64(1) << left) - 1);
    __m512i acc = _mm512_setzero_si512();
    for (int t = 0; t < n; ++t) acc = _mm512_max_epu8(acc, _mm512_maskz_loadu_epi8(mask, taps[t] + c0));
    _mm512_mask_storeu_epi8(y + c0, mask, acc);
  }
}

int64_t out_size(int64_t in, int64_t k, int64_t s, int64_t d, int64_t p0, int64_t p1, bool ceil) {
  const int64_t span = in + p0 + p1 - ((k - 1) * d + 1);
  if (span < 0) throw std::runtime_error("MaxPool: window larger than the padded input");
  int64_t out = (ceil ? (span + s - 1) / s : span / s) + 1;
  if (ceil && (out - 1) * s >= in + p0) --out;
  return out;
}

template <typename T>
struct MaxPoolKernel {
  int64_t kh, kw, sh, sw, dh, dw, pt, pl, pb, pr;
  bool ceil;

  explicit MaxPoolKernel(const OrtKernelInfo* info) {
    Ort::ConstKernelInfo ki(info);
    auto k = ki.GetAttributes<int64_t>("kernel");
    auto s = ki.GetAttributes<int64_t>("strides");
    auto d = ki.GetAttributes<int64_t>("dilations");
    auto p = ki.GetAttributes<int64_t>("pads");
    if (k.size() != 2 || s.size() != 2 || d.size() != 2 || p.size() != 4)
      throw std::runtime_error("MaxPool: kernel, strides, dilations take 2 values and pads 4");
    kh = k[0]; kw = k[1]; sh = s[0]; sw = s[1]; dh = d[0]; dw = d[1];
    pt = p[0]; pl = p[1]; pb = p[2]; pr = p[3];
    ceil = ki.GetAttribute<int64_t>("ceil_mode") != 0;
    if (kh < 1 || kw < 1 || sh < 1 || sw < 1 || dh < 1 || dw < 1 || pt < 0 || pl < 0 || pb < 0 || pr < 0 ||
        pt >= (kh - 1) * dh + 1 || pl >= (kw - 1) * dw + 1)
      throw std::runtime_error("MaxPool: bad kernel, stride, dilation or pad attribute (a window must touch the input)");
  }

  void Compute(OrtKernelContext* context) {
    Ort::KernelContext ctx(context);
    Ort::ConstValue xv = ctx.GetInput(0);
    auto info = xv.GetTensorTypeAndShapeInfo();
    auto shape = info.GetShape();
    constexpr auto kType = sizeof(T) == 1 ? ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT8 : ONNX_TENSOR_ELEMENT_DATA_TYPE_INT32;
    if (info.GetElementType() != kType || shape.size() != 4)
      throw std::runtime_error("MaxPool: input must be NHWC rank 4 (int32 for MaxPoolI32, uint8 for MaxPoolU8)");
    const int64_t n = shape[0], h = shape[1], w = shape[2], c = shape[3];
    const int64_t oh = out_size(h, kh, sh, dh, pt, pb, ceil), ow = out_size(w, kw, sw, dw, pl, pr, ceil);
    Ort::UnownedValue out = ctx.GetOutput(0, std::vector<int64_t>{n, oh, ow, c});
    T* y = static_cast<T*>(out.GetTensorMutableRawData());
    const T* x = static_cast<const T*>(xv.GetTensorRawData());
    const int64_t rows = n * oh;
    const int64_t per_task = std::max<int64_t>(1, kGrain / std::max<int64_t>(ow * c * kh * kw, 1));
    const size_t tasks = static_cast<size_t>((rows + per_task - 1) / per_task);
    const bool vec = sizeof(T) == 1 && qconv_isa() == 2;  // AVX-512 (BW): max_taps_u8
    parallel_for(ctx, tasks, [&](size_t task) {
      std::vector<const uint8_t*> taps(static_cast<size_t>(kh * kw));
      const int64_t r1 = std::min<int64_t>(rows, (static_cast<int64_t>(task) + 1) * per_task);
      for (int64_t r = static_cast<int64_t>(task) * per_task; r < r1; ++r) {
        const int64_t b = r / oh, oy = r % oh;
        for (int64_t ox = 0; ox < ow; ++ox) {
          T* acc = y + (r * ow + ox) * c;
          if constexpr (sizeof(T) == 1) {
            if (vec) {
              int ntaps = 0;
              for (int64_t i = 0; i < kh; ++i) {
                const int64_t iy = oy * sh - pt + i * dh;
                if (iy < 0 || iy >= h) continue;
                for (int64_t j = 0; j < kw; ++j) {
                  const int64_t ix = ox * sw - pl + j * dw;
                  if (ix >= 0 && ix < w) taps[static_cast<size_t>(ntaps++)] = x + ((b * h + iy) * w + ix) * c;
                }
              }
              if (ntaps == 0) throw std::runtime_error("MaxPool: a window lies wholly in the padding");
              max_taps_u8(taps.data(), ntaps, acc, c);
              continue;
            }
          }
          std::fill(acc, acc + c, sizeof(T) == 1 ? T(0) : T(INT32_MIN));  // below every code
          bool any = false;
          for (int64_t i = 0; i < kh; ++i) {
            const int64_t iy = oy * sh - pt + i * dh;
            if (iy < 0 || iy >= h) continue;
            for (int64_t j = 0; j < kw; ++j) {
              const int64_t ix = ox * sw - pl + j * dw;
              if (ix < 0 || ix >= w) continue;
              max_row(x + ((b * h + iy) * w + ix) * c, acc, c);
              any = true;
            }
          }
          if (!any) throw std::runtime_error("MaxPool: a window lies wholly in the padding");
        }
      }
    });
  }
  OrtStatusPtr ComputeV2(OrtKernelContext* context) { return guarded(this, context); }
};

template <typename T>
struct MaxPoolOp : Ort::CustomOpBase<MaxPoolOp<T>, MaxPoolKernel<T>, true> {
  OrtStatusPtr CreateKernelV2(const OrtApi& api, const OrtKernelInfo* info, void** kernel) const {
    try {
      *kernel = new MaxPoolKernel<T>(info);
      return nullptr;
    } catch (const std::exception& e) {
      return api.CreateStatus(ORT_INVALID_ARGUMENT, (std::string("zonnx.native ") + e.what()).c_str());
    }
  }
  static constexpr ONNXTensorElementDataType kType =
      sizeof(T) == 1 ? ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT8 : ONNX_TENSOR_ELEMENT_DATA_TYPE_INT32;
  const char* GetName() const { return sizeof(T) == 1 ? "MaxPoolU8" : "MaxPoolI32"; }
  size_t GetInputTypeCount() const { return 1; }
  ONNXTensorElementDataType GetInputType(size_t) const { return kType; }
  size_t GetOutputTypeCount() const { return 1; }
  ONNXTensorElementDataType GetOutputType(size_t) const { return kType; }
};

}  // namespace

const OrtCustomOp* maxpool_i32_op() {
  static const MaxPoolOp<int32_t> op;
  return &op;
}
const OrtCustomOp* maxpool_u8_op() {
  static const MaxPoolOp<uint8_t> op;
  return &op;
}

}  // namespace zonnx_native
