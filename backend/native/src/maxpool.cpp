// MaxPoolI32: max pooling of an NHWC int32 tensor (16-bit codes stored as int32), int32 out:
//   y[n, oy, ox, c] = max over the window taps inside the input of x[n, iy, ix, c]
// (padding never wins, as in ONNX MaxPool), with ONNX's output size: floor((H + pads - ((k - 1) d + 1)) / s) + 1,
// or with ceil_mode the ceiling, less one when the last window would start inside the end padding.
// An empty window (only possible with large pads) is refused at creation. Codes compare as integers, so
// the result is exact for any stored width.
#include <algorithm>
#include <climits>
#include <stdexcept>

#include "zonnx_native.h"

namespace zonnx_native {
namespace {

// acc[k] = max(acc[k], x[k]) over one tap of all channels (AVX-512 and baseline clones).
__attribute__((target_clones("arch=x86-64-v4", "default"))) void max_row(const int32_t* __restrict x,
                                                                         int32_t* __restrict acc, int64_t c) {
  for (int64_t k = 0; k < c; ++k) acc[k] = std::max(acc[k], x[k]);
}

int64_t out_size(int64_t in, int64_t k, int64_t s, int64_t d, int64_t p0, int64_t p1, bool ceil) {
  const int64_t span = in + p0 + p1 - ((k - 1) * d + 1);
  if (span < 0) throw std::runtime_error("MaxPoolI32: window larger than the padded input");
  int64_t out = (ceil ? (span + s - 1) / s : span / s) + 1;
  if (ceil && (out - 1) * s >= in + p0) --out;
  return out;
}

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
      throw std::runtime_error("MaxPoolI32: kernel, strides, dilations take 2 values and pads 4");
    kh = k[0]; kw = k[1]; sh = s[0]; sw = s[1]; dh = d[0]; dw = d[1];
    pt = p[0]; pl = p[1]; pb = p[2]; pr = p[3];
    ceil = ki.GetAttribute<int64_t>("ceil_mode") != 0;
    if (kh < 1 || kw < 1 || sh < 1 || sw < 1 || dh < 1 || dw < 1 || pt < 0 || pl < 0 || pb < 0 || pr < 0 ||
        pt >= (kh - 1) * dh + 1 || pl >= (kw - 1) * dw + 1)
      throw std::runtime_error("MaxPoolI32: bad kernel, stride, dilation or pad attribute (a window must touch the input)");
  }

  void Compute(OrtKernelContext* context) {
    Ort::KernelContext ctx(context);
    Ort::ConstValue xv = ctx.GetInput(0);
    auto info = xv.GetTensorTypeAndShapeInfo();
    auto shape = info.GetShape();
    if (info.GetElementType() != ONNX_TENSOR_ELEMENT_DATA_TYPE_INT32 || shape.size() != 4)
      throw std::runtime_error("MaxPoolI32: input must be int32 NHWC rank 4");
    const int64_t n = shape[0], h = shape[1], w = shape[2], c = shape[3];
    const int64_t oh = out_size(h, kh, sh, dh, pt, pb, ceil), ow = out_size(w, kw, sw, dw, pl, pr, ceil);
    Ort::UnownedValue out = ctx.GetOutput(0, std::vector<int64_t>{n, oh, ow, c});
    int32_t* y = static_cast<int32_t*>(out.GetTensorMutableRawData());
    const int32_t* x = static_cast<const int32_t*>(xv.GetTensorRawData());
    const int64_t rows = n * oh;
    const int64_t per_task = std::max<int64_t>(1, kGrain / std::max<int64_t>(ow * c * kh * kw, 1));
    const size_t tasks = static_cast<size_t>((rows + per_task - 1) / per_task);
    parallel_for(ctx, tasks, [&](size_t task) {
      const int64_t r1 = std::min<int64_t>(rows, (static_cast<int64_t>(task) + 1) * per_task);
      for (int64_t r = static_cast<int64_t>(task) * per_task; r < r1; ++r) {
        const int64_t b = r / oh, oy = r % oh;
        for (int64_t ox = 0; ox < ow; ++ox) {
          int32_t* acc = y + (r * ow + ox) * c;
          std::fill(acc, acc + c, INT32_MIN);
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
          if (!any) throw std::runtime_error("MaxPoolI32: a window lies wholly in the padding");
        }
      }
    });
  }
  OrtStatusPtr ComputeV2(OrtKernelContext* context) {
    try {
      Compute(context);
      return nullptr;
    } catch (const std::exception& e) {
      return Ort::GetApi().CreateStatus(ORT_FAIL, (std::string("zonnx.native ") + e.what()).c_str());
    }
  }
};

struct MaxPoolOp : Ort::CustomOpBase<MaxPoolOp, MaxPoolKernel, true> {
  OrtStatusPtr CreateKernelV2(const OrtApi& api, const OrtKernelInfo* info, void** kernel) const {
    try {
      *kernel = new MaxPoolKernel(info);
      return nullptr;
    } catch (const std::exception& e) {
      return api.CreateStatus(ORT_INVALID_ARGUMENT, (std::string("zonnx.native ") + e.what()).c_str());
    }
  }
  const char* GetName() const { return "MaxPoolI32"; }
  size_t GetInputTypeCount() const { return 1; }
  ONNXTensorElementDataType GetInputType(size_t) const { return ONNX_TENSOR_ELEMENT_DATA_TYPE_INT32; }
  size_t GetOutputTypeCount() const { return 1; }
  ONNXTensorElementDataType GetOutputType(size_t) const { return ONNX_TENSOR_ELEMENT_DATA_TYPE_INT32; }
};

}  // namespace

const OrtCustomOp* maxpool_i32_op() {
  static const MaxPoolOp op;
  return &op;
}

}  // namespace zonnx_native
