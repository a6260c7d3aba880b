// Requant's creation (requant_kernel.h): the attributes checked into Params (the per-channel arrays, their
// tiled copies and the two-term float64 tables), and the ORT ops RequantU8 and RequantI32.
#include <algorithm>
#include <stdexcept>
#include <string>

#include "requant_kernel.h"
#include "zonnx_native.h"

namespace zonnx_native {

RequantKernel::RequantKernel(const OrtKernelInfo* info, ONNXTensorElementDataType out) : out_type(out) {
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

namespace {

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
