// SumHwU8: the window sum of a global average pool on an NHWC uint8 tensor, int32 out:
//   y[n, 0, 0, c] = sum_{h, w} x[n, h, w, c]
// exact in int32 while H W 255 < 2^31 (checked); one pass instead of Cast to int32 + ReduceSum.
#include <algorithm>
#include <cstring>
#include <stdexcept>

#include "zonnx_native.h"

namespace zonnx_native {
namespace {

// acc[c] += x[p c + c] over the positions p < n of one image (AVX-512 and baseline clones).
__attribute__((target_clones("arch=x86-64-v4", "default"))) void sum_positions(const uint8_t* __restrict x,
                                                                            int32_t* __restrict acc, int64_t n,
                                                                            int64_t c) {
  for (int64_t p = 0; p < n; ++p, x += c)
    for (int64_t k = 0; k < c; ++k) acc[k] += x[k];
}

struct SumHwKernel {
  explicit SumHwKernel(const OrtKernelInfo*) {}

  void Compute(OrtKernelContext* context) {
    Ort::KernelContext ctx(context);
    Ort::ConstValue xv = ctx.GetInput(0);
    auto info = xv.GetTensorTypeAndShapeInfo();
    const std::vector<int64_t> shape = info.GetShape();
    if (info.GetElementType() != ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT8 || shape.size() != 4)
      throw std::runtime_error("SumHwU8: input must be uint8 NHWC rank 4");
    const int64_t n = shape[0], hw = shape[1] * shape[2], c = shape[3];
    if (hw * 255 >= (int64_t{1} << 31)) throw std::runtime_error("SumHwU8: int32 sums could overflow");
    Ort::UnownedValue out = ctx.GetOutput(0, std::vector<int64_t>{n, 1, 1, c});
    int32_t* y = static_cast<int32_t*>(out.GetTensorMutableRawData());
    const uint8_t* x = static_cast<const uint8_t*>(xv.GetTensorRawData());
    std::fill(y, y + n * c, 0);
    parallel_for(ctx, static_cast<size_t>(n), [&](size_t i) {
      const int64_t b = static_cast<int64_t>(i);
      sum_positions(x + b * hw * c, y + b * c, hw, c);
    });
  }
  OrtStatusPtr ComputeV2(OrtKernelContext* context) { return guarded(this, context); }
};


}  // namespace

const OrtCustomOp* sum_hw_u8_op() {
  static const UnaryOp<SumHwKernel, ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT8, ONNX_TENSOR_ELEMENT_DATA_TYPE_INT32> op("SumHwU8");
  return &op;
}

}  // namespace zonnx_native
