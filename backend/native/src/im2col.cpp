// Im2col: NHWC [N, H, W, C] -> [N, OH, OW, KH * KW * C] uint8, column order (kh, kw, c), positions outside
// the input read the stored pad value. plane 0 copies uint8 codes; planes 1 and 2 take the low and high
// byte of int32 stored 16-bit codes (values in [0, 65535]).
// BytePlane: the same byte selection elementwise, any shape.
#include <algorithm>
#include <cstring>
#include <stdexcept>

#include "zonnx_native.h"

namespace zonnx_native {

int64_t element_count(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) {
    if (d < 0) throw std::runtime_error("negative dimension");
    n *= d;
  }
  return n;
}

namespace {

inline uint8_t byte_of(int32_t v, int plane) {
  return static_cast<uint8_t>(plane == 2 ? (v >> 8) & 255 : v & 255);
}

void check_plane(ONNXTensorElementDataType t, int plane, const char* op) {
  const bool ok = plane == 0 ? t == ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT8 : t == ONNX_TENSOR_ELEMENT_DATA_TYPE_INT32;
  if (!ok) throw std::runtime_error(std::string(op) + ": plane 0 takes uint8, planes 1 and 2 take int32");
}

struct Im2colKernel {
  int64_t kh, kw, sh, sw, dh, dw, pt, pl, pb, pr, pad;
  int plane;

  explicit Im2colKernel(const OrtKernelInfo* info) {
    Ort::ConstKernelInfo ki(info);
    auto k = ki.GetAttributes<int64_t>("kernel");
    auto s = ki.GetAttributes<int64_t>("strides");
    auto d = ki.GetAttributes<int64_t>("dilations");
    auto p = ki.GetAttributes<int64_t>("pads");
    if (k.size() != 2 || s.size() != 2 || d.size() != 2 || p.size() != 4)
      throw std::runtime_error("Im2col: kernel, strides, dilations take 2 values and pads 4");
    kh = k[0]; kw = k[1]; sh = s[0]; sw = s[1]; dh = d[0]; dw = d[1];
    pt = p[0]; pl = p[1]; pb = p[2]; pr = p[3];
    pad = ki.GetAttribute<int64_t>("pad_value");
    plane = static_cast<int>(ki.GetAttribute<int64_t>("plane"));
    if (kh < 1 || kw < 1 || sh < 1 || sw < 1 || dh < 1 || dw < 1 || pt < 0 || pl < 0 || pb < 0 || pr < 0 ||
        plane < 0 || plane > 2)
      throw std::runtime_error("Im2col: bad kernel, stride, dilation, pad or plane attribute");
  }

  void Compute(OrtKernelContext* context) {
    Ort::KernelContext ctx(context);
    Ort::ConstValue x = ctx.GetInput(0);
    auto info = x.GetTensorTypeAndShapeInfo();
    auto shape = info.GetShape();
    check_plane(info.GetElementType(), plane, "Im2col");
    if (shape.size() != 4) throw std::runtime_error("Im2col: input must be NHWC rank 4");
    const int64_t n = shape[0], h = shape[1], w = shape[2], c = shape[3];
    const int64_t eh = (kh - 1) * dh + 1, ew = (kw - 1) * dw + 1;
    const int64_t oh = (h + pt + pb - eh) / sh + 1, ow = (w + pl + pr - ew) / sw + 1;
    if (h + pt + pb < eh || w + pl + pr < ew) throw std::runtime_error("Im2col: kernel larger than the padded input");
    const int64_t cols = kh * kw * c;
    Ort::UnownedValue out = ctx.GetOutput(0, std::vector<int64_t>{n, oh, ow, cols});
    uint8_t* y = out.GetTensorMutableRawData() ? static_cast<uint8_t*>(out.GetTensorMutableRawData()) : nullptr;
    const void* xv = x.GetTensorRawData();
    const uint8_t pbyte = plane == 0 ? static_cast<uint8_t>(pad) : byte_of(static_cast<int32_t>(pad), plane);
    const int64_t rows = n * oh;
    const int64_t per_task = std::max<int64_t>(1, kGrain / std::max<int64_t>(ow * cols, 1));
    const size_t tasks = static_cast<size_t>((rows + per_task - 1) / per_task);
    parallel_for(ctx, tasks, [&](size_t task) {
      const int64_t r1 = std::min<int64_t>(rows, (static_cast<int64_t>(task) + 1) * per_task);
      for (int64_t r = static_cast<int64_t>(task) * per_task; r < r1; ++r) {
        const int64_t b = r / oh, oy = r % oh;
        uint8_t* dst = y + r * ow * cols;
        for (int64_t ox = 0; ox < ow; ++ox) {
          for (int64_t i = 0; i < kh; ++i) {
            const int64_t iy = oy * sh - pt + i * dh;
            const int64_t ix0 = ox * sw - pl;
            if (plane == 0 && dw == 1 && iy >= 0 && iy < h && ix0 >= 0 && ix0 + kw <= w) {
              // the kw taps of this row are adjacent in the input: one copy of kw * c bytes
              std::memcpy(dst, static_cast<const uint8_t*>(xv) + ((b * h + iy) * w + ix0) * c,
                          static_cast<size_t>(kw * c));
              dst += kw * c;
              continue;
            }
            for (int64_t j = 0; j < kw; ++j, dst += c) {
              const int64_t ix = ox * sw - pl + j * dw;
              if (iy < 0 || iy >= h || ix < 0 || ix >= w) {
                std::memset(dst, pbyte, static_cast<size_t>(c));
                continue;
              }
              const int64_t src = ((b * h + iy) * w + ix) * c;
              if (plane == 0) {
                std::memcpy(dst, static_cast<const uint8_t*>(xv) + src, static_cast<size_t>(c));
              } else {
                const int32_t* s = static_cast<const int32_t*>(xv) + src;
                for (int64_t k = 0; k < c; ++k) dst[k] = byte_of(s[k], plane);
              }
            }
          }
        }
      }
    });
  }
  OrtStatusPtr ComputeV2(OrtKernelContext* context) { return guarded(this, context); }
};

// One row of BytePlane, compiled for AVX-512 and the baseline (picked by the CPU at load time).
__attribute__((target_clones("arch=x86-64-v4", "default"))) void plane_row(const int32_t* __restrict s,
                                                                           uint8_t* __restrict y, int64_t n,
                                                                           int plane) {
  if (plane == 2) {
    for (int64_t i = 0; i < n; ++i) y[i] = static_cast<uint8_t>((s[i] >> 8) & 255);
  } else {
    for (int64_t i = 0; i < n; ++i) y[i] = static_cast<uint8_t>(s[i] & 255);
  }
}

struct BytePlaneKernel {
  int plane;
  explicit BytePlaneKernel(const OrtKernelInfo* info) {
    Ort::ConstKernelInfo ki(info);
    plane = static_cast<int>(ki.GetAttribute<int64_t>("plane"));
    if (plane != 1 && plane != 2) throw std::runtime_error("BytePlane: plane must be 1 (low byte) or 2 (high byte)");
  }
  void Compute(OrtKernelContext* context) {
    Ort::KernelContext ctx(context);
    Ort::ConstValue x = ctx.GetInput(0);
    auto info = x.GetTensorTypeAndShapeInfo();
    check_plane(info.GetElementType(), plane, "BytePlane");
    auto shape = info.GetShape();
    const int64_t total = element_count(shape);
    Ort::UnownedValue out = ctx.GetOutput(0, shape);
    uint8_t* y = static_cast<uint8_t*>(out.GetTensorMutableRawData());
    const int32_t* s = static_cast<const int32_t*>(x.GetTensorRawData());
    const size_t tasks = static_cast<size_t>((total + kGrain - 1) / kGrain);
    parallel_for(ctx, tasks, [&](size_t task) {
      const int64_t i0 = static_cast<int64_t>(task) * kGrain;
      const int64_t i1 = std::min<int64_t>(total, i0 + kGrain);
      plane_row(s + i0, y + i0, i1 - i0, plane);
    });
  }
  OrtStatusPtr ComputeV2(OrtKernelContext* context) { return guarded(this, context); }
};

}  // namespace

const OrtCustomOp* im2col_op() {
  static const UnaryOp<Im2colKernel, ONNX_TENSOR_ELEMENT_DATA_TYPE_UNDEFINED, ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT8> op(
      "Im2col");
  return &op;
}
const OrtCustomOp* byteplane_op() {
  static const UnaryOp<BytePlaneKernel, ONNX_TENSOR_ELEMENT_DATA_TYPE_UNDEFINED, ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT8> op(
      "BytePlane");
  return &op;
}

}  // namespace zonnx_native
