// DwConv: depthwise convolution of an NHWC uint8 tensor, int32 out:
//   acc[n, oy, ox, c] = sum_{i, j} (x[n, oy*sh - pt + i*dh, ox*sw - pl + j*dw, c] - zp) * w[c, i, j]
// with positions outside the input contributing 0 (they hold the pad code zp). Exact in int32 while
// kh * kw * 255 * 128 < 2^31 (checked). Weights (int8 values) arrive as the attribute "weights" in
// [C, kh, kw] order.
// This file: DwCore's constructor and row sums, and the DwConv kernel and op. The parts of the depthwise
// convolutions are listed in dwconv_kernel.h; QDwConv is in qdwconv.cpp.
#include <algorithm>
#include <cstring>
#include <stdexcept>

#include "dwconv_kernel.h"

namespace zonnx_native {
namespace {

// acc[c] += (x[c] - zp) * w[c] over one tap of all channels; AVX-512 and baseline clones.
__attribute__((target_clones("arch=x86-64-v4", "default"))) void tap_row(const uint8_t* __restrict x,
                                                                         const int32_t* __restrict w,
                                                                         int32_t* __restrict acc, int64_t c,
                                                                         int32_t zp) {
  for (int64_t k = 0; k < c; ++k) acc[k] += (static_cast<int32_t>(x[k]) - zp) * w[k];
}

}  // namespace

DwCore::DwCore(const Ort::ConstKernelInfo& ki) {
  auto k = ki.GetAttributes<int64_t>("kernel");
  auto s = ki.GetAttributes<int64_t>("strides");
  auto d = ki.GetAttributes<int64_t>("dilations");
  auto p = ki.GetAttributes<int64_t>("pads");
  auto wa = ki.GetAttributes<int64_t>("weights");
  if (k.size() != 2 || s.size() != 2 || d.size() != 2 || p.size() != 4)
    throw std::runtime_error("DwConv: kernel, strides, dilations take 2 values and pads 4");
  kh = k[0]; kw = k[1]; sh = s[0]; sw = s[1]; dh = d[0]; dw = d[1];
  pt = p[0]; pl = p[1]; pb = p[2]; pr = p[3];
  zp = static_cast<int32_t>(ki.GetAttribute<int64_t>("x_zero_point"));
  if (kh < 1 || kw < 1 || sh < 1 || sw < 1 || dh < 1 || dw < 1 || pt < 0 || pl < 0 || pb < 0 || pr < 0 || zp < 0 ||
      zp > 255 || kh * kw > 65535 || wa.empty() || wa.size() % static_cast<size_t>(kh * kw) != 0)
    throw std::runtime_error("DwConv: bad kernel, stride, dilation, pad, zero point or weights attribute");
  channels = static_cast<int64_t>(wa.size()) / (kh * kw);
  w.resize(wa.size());
  for (int64_t c = 0; c < channels; ++c) {
    for (int64_t t = 0; t < kh * kw; ++t) {
      const int64_t v = wa[c * kh * kw + t];
      if (v < -128 || v > 127) throw std::runtime_error("DwConv: weights must be int8 values");
      w[t * channels + c] = static_cast<int32_t>(v);
    }
  }
  tile = channels * std::max<int64_t>(1, 1024 / channels);
  wt.resize(static_cast<size_t>(kh * kw * tile));
  for (int64_t t = 0; t < kh * kw; ++t)
    for (int64_t e = 0; e < tile; ++e) wt[t * tile + e] = w[t * channels + e % channels];
}

// The int32 sums of output row r (= b oh + oy) into row[ow c].
void DwCore::row_sums(const uint8_t* xv, const Geometry& g, int64_t r, int32_t* row) const {
  const int64_t b = r / g.oh, oy = r % g.oh, ow = g.ow, c = g.c, h = g.h, wd = g.wd;
  std::memset(row, 0, sizeof(int32_t) * static_cast<size_t>(ow * c));
  // stride 1: for each tap, the outputs whose input lies inside form one run, contiguous in both the
  // input and the output, weighted by the tap's weights repeated every c (wt)
  for (int64_t i = 0; sw == 1 && i < kh; ++i) {
    const int64_t iy = oy * sh - pt + i * dh;
    if (iy < 0 || iy >= h) continue;
    for (int64_t j = 0; j < kw; ++j) {
      const int64_t off = j * dw - pl;  // ix = ox + off
      const int64_t o0 = std::max<int64_t>(0, -off), o1 = std::min<int64_t>(ow, wd - off);
      if (o1 <= o0) continue;
      const uint8_t* src = xv + ((b * h + iy) * wd + o0 + off) * c;
      const int32_t* wrow = wt.data() + (i * kw + j) * tile;
      for (int64_t e = 0, len = (o1 - o0) * c; e < len; e += tile)
        tap_row(src + e, wrow, row + o0 * c + e, std::min<int64_t>(tile, len - e), zp);
    }
  }
  for (int64_t ox = 0; sw != 1 && ox < ow; ++ox) {
    int32_t* acc = row + ox * c;
    for (int64_t i = 0; i < kh; ++i) {
      const int64_t iy = oy * sh - pt + i * dh;
      if (iy < 0 || iy >= h) continue;
      for (int64_t j = 0; j < kw; ++j) {
        const int64_t ix = ox * sw - pl + j * dw;
        if (ix < 0 || ix >= wd) continue;
        tap_row(xv + ((b * h + iy) * wd + ix) * c, w.data() + (i * kw + j) * c, acc, c, zp);
      }
    }
  }
}

namespace {

struct DwConvKernel {
  DwCore core;

  explicit DwConvKernel(const OrtKernelInfo* info) : core(Ort::ConstKernelInfo(info)) {}

  void Compute(OrtKernelContext* context) {
    Ort::KernelContext ctx(context);
    Ort::ConstValue x = ctx.GetInput(0);
    auto info = x.GetTensorTypeAndShapeInfo();
    if (info.GetElementType() != ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT8)
      throw std::runtime_error("DwConv: input must be uint8 NHWC rank 4");
    const DwCore::Geometry g = core.geometry(info.GetShape());
    Ort::UnownedValue out = ctx.GetOutput(0, std::vector<int64_t>{g.n, g.oh, g.ow, g.c});
    int32_t* y = static_cast<int32_t*>(out.GetTensorMutableRawData());
    const uint8_t* xv = static_cast<const uint8_t*>(x.GetTensorRawData());
    const int64_t rows = g.n * g.oh, per_task = core.rows_per_task(g);
    const size_t tasks = static_cast<size_t>((rows + per_task - 1) / per_task);
    parallel_for(ctx, tasks, [&](size_t task) {
      const int64_t r1 = std::min<int64_t>(rows, (static_cast<int64_t>(task) + 1) * per_task);
      for (int64_t r = static_cast<int64_t>(task) * per_task; r < r1; ++r) core.row_sums(xv, g, r, y + r * g.ow * g.c);
    });
  }
  OrtStatusPtr ComputeV2(OrtKernelContext* context) { return guarded(this, context); }
};

struct DwConvOp : Ort::CustomOpBase<DwConvOp, DwConvKernel, true> {
  OrtStatusPtr CreateKernelV2(const OrtApi& api, const OrtKernelInfo* info, void** kernel) const {
    try {
      *kernel = new DwConvKernel(info);
      return nullptr;
    } catch (const std::exception& e) {
      return api.CreateStatus(ORT_INVALID_ARGUMENT, (std::string("zonnx.native ") + e.what()).c_str());
    }
  }
  const char* GetName() const { return "DwConv"; }
  size_t GetInputTypeCount() const { return 1; }
  ONNXTensorElementDataType GetInputType(size_t) const { return ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT8; }
  size_t GetOutputTypeCount() const { return 1; }
  ONNXTensorElementDataType GetOutputType(size_t) const { return ONNX_TENSOR_ELEMENT_DATA_TYPE_INT32; }
};

}  // namespace

const OrtCustomOp* dwconv_op() {
  static const DwConvOp op;
  return &op;
}

}  // namespace zonnx_native
