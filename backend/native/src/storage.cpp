// Int8ToU8: int8 program codes to their uint8 storage (ort_kernels.storage_of: stored = q + 128), in one
// pass instead of Cast + Add + Cast. For q in [-128, 127], q + 128 in [0, 255] is the two's complement byte
// of q with its top bit flipped (q + 128 = q - (-128) and -128 is the byte 0x80), so y = byte(q) ^ 0x80.
#include <algorithm>
#include <cstring>
#include <stdexcept>

#include "zonnx_native.h"

namespace zonnx_native {
namespace {

__attribute__((target_clones("arch=x86-64-v4", "default"))) void flip_top_bits(const uint8_t* __restrict x,
                                                                            uint8_t* __restrict y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = static_cast<uint8_t>(x[i] ^ 0x80u);
}

struct Int8ToU8Kernel {
  explicit Int8ToU8Kernel(const OrtKernelInfo*) {}

  void Compute(OrtKernelContext* context) {
    Ort::KernelContext ctx(context);
    Ort::ConstValue xv = ctx.GetInput(0);
    auto info = xv.GetTensorTypeAndShapeInfo();
    if (info.GetElementType() != ONNX_TENSOR_ELEMENT_DATA_TYPE_INT8) throw std::runtime_error("Int8ToU8: input must be int8");
    const std::vector<int64_t> shape = info.GetShape();
    Ort::UnownedValue out = ctx.GetOutput(0, shape);
    const int64_t n = element_count(shape);
    const uint8_t* x = static_cast<const uint8_t*>(xv.GetTensorRawData());
    uint8_t* y = static_cast<uint8_t*>(out.GetTensorMutableRawData());
    constexpr int64_t chunk = 4 * kGrain;
    parallel_for(ctx, static_cast<size_t>((n + chunk - 1) / chunk), [&](size_t i) {
      const int64_t i0 = static_cast<int64_t>(i) * chunk;
      flip_top_bits(x + i0, y + i0, std::min<int64_t>(chunk, n - i0));
    });
  }
  OrtStatusPtr ComputeV2(OrtKernelContext* context) { return guarded(this, context); }
};


}  // namespace

const OrtCustomOp* int8_to_u8_op() {
  static const UnaryOp<Int8ToU8Kernel, ONNX_TENSOR_ELEMENT_DATA_TYPE_INT8, ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT8> op("Int8ToU8");
  return &op;
}

}  // namespace zonnx_native
