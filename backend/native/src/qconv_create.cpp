// QConv / QConv16 kernel creation: the attributes checked, the GEMM path picked (select_isa), the
// requantization tables built, the constant weights packed into panels (pack); and the two ORT custom ops
// that create the kernel. The kernel's other parts are listed in qconv_kernel.h.
#include <algorithm>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "qconv_kernel.h"
#include "rq_avx512.h"
#include "zonnx_native.h"

namespace zonnx_native {
namespace {

// The GEMM path: 2 = AVX-512 VNNI, 1 = AVX-VNNI (256-bit VEX), 0 = portable. $ZONNX_NATIVE_ISA = baseline
// or avx-vnni caps it (tests of every path on one machine).
int select_isa() {
  const bool v512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                    __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vnni");
  const bool v256 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("avxvnni");
  const char* env = std::getenv("ZONNX_NATIVE_ISA");
  if (env != nullptr && std::strcmp(env, "baseline") == 0) return 0;
  if (env != nullptr && std::strcmp(env, "avx-vnni") == 0) return v256 ? 1 : 0;
  return v512 ? 2 : (v256 ? 1 : 0);
}

}  // namespace

QConvKernel::QConvKernel(const OrtKernelInfo* info, bool wide16) : wide(wide16) {
  Ort::ConstKernelInfo ki(info);
  auto kk = ki.GetAttributes<int64_t>("kernel");
  auto s = ki.GetAttributes<int64_t>("strides");
  auto d = ki.GetAttributes<int64_t>("dilations");
  auto p = ki.GetAttributes<int64_t>("pads");
  if (kk.size() != 2 || s.size() != 2 || d.size() != 2 || p.size() != 4)
    throw std::runtime_error("QConv: kernel, strides, dilations take 2 values and pads 4");
  kh = kk[0]; kw = kk[1]; sh = s[0]; sw = s[1]; dh = d[0]; dw = d[1];
  pt = p[0]; pl = p[1]; pb = p[2]; pr = p[3];
  xzp = ki.GetAttribute<int64_t>("x_zero_point");
  if (kh < 1 || kw < 1 || sh < 1 || sw < 1 || dh < 1 || dw < 1 || pt < 0 || pl < 0 || pb < 0 || pr < 0 ||
      xzp < 0 || xzp > (wide ? 65535 : 255))
    throw std::runtime_error("QConv: bad kernel, stride, dilation, pad or zero point attribute");
  mult = ki.GetAttributes<int64_t>("mult");
  cnst = ki.GetAttributes<int64_t>("cnst");
  shift = ki.GetAttributes<int64_t>("shift");
  const int64_t mode = ki.GetAttribute<int64_t>("mode");
  zs = ki.GetAttribute<int64_t>("zs");
  lo = ki.GetAttribute<int64_t>("lo");
  hi = ki.GetAttribute<int64_t>("hi");
  if (mult.empty() || mult.size() != cnst.size() || mult.size() != shift.size() || mode < 0 || mode > 6 ||
      lo > hi || (wide ? (lo < INT32_MIN || hi > INT32_MAX) : (lo < 0 || hi > 255)))
    throw std::runtime_error("QConv: inconsistent requantization attributes (mult, cnst, shift, mode, lo, hi)");
  for (int64_t v : shift) {
    if (v < 0 || v > 62) throw std::runtime_error("QConv: shift outside [0, 62]");
    const RoundParams rp = round_params(static_cast<int>(mode), v);
    addend.push_back(rp.addend);
    bmask.push_back(rp.bmask);
  }
  channels = static_cast<int64_t>(mult.size());
  const size_t padded = static_cast<size_t>((channels + kPanel - 1) / kPanel * kPanel);  // whole panels
  for (auto* v : {&mult, &cnst, &shift, &addend, &bmask}) v->resize(padded, 0);
  if (std::all_of(mult.begin(), mult.end(), [](int64_t v) { return v >= INT32_MIN && v <= INT32_MAX; }))
    mult32.assign(mult.begin(), mult.end());
  const std::vector<int64_t>* src[4] = {&cnst, &shift, &addend, &bmask};
  std::vector<int64_t>* even[4] = {&ke, &se, &ae, &be};
  std::vector<int64_t>* odd[4] = {&ko, &so, &ao, &bo};
  for (int t = 0; t < 4; ++t) {
    even[t]->assign(padded / 2, 0);
    odd[t]->assign(padded / 2, 0);
    for (size_t ch = 0; ch < padded; ++ch)
      (ch % 2 ? odd[t] : even[t])->at(ch / 16 * 8 + ch % 16 / 2) = (*src[t])[ch];
  }
  kind = round_kind(static_cast<int>(mode));
  isa = select_isa();
  int is_const = 0;
  Ort::ConstValue wv = ki.GetTensorConstantInput(1, &is_const);
  if (!is_const) throw std::runtime_error("QConv: the weights must be a constant initializer");
  auto wi = wv.GetTensorTypeAndShapeInfo();
  auto wshape = wi.GetShape();
  if (wi.GetElementType() != ONNX_TENSOR_ELEMENT_DATA_TYPE_INT8 || wshape.size() != 2 || wshape[1] != channels)
    throw std::runtime_error("QConv: weights must be int8 [kh kw C, O] with O = the requantization channels");
  if (wshape[0] * 255 * 128 >= (int64_t{1} << 31)) throw std::runtime_error("QConv: int32 sums could overflow");
  // 16-bit codes on the AVX-512 VNNI path: compute16_direct, in segments of a kernel row (kw C rows of the
  // weights, contiguous in a padded input row when dw == 1) or of a tap (C rows)
  direct16 = wide && isa == 2 && wshape[0] % (kh * kw) == 0;
  const int64_t cin = wshape[0] / (kh * kw);
  pack(static_cast<const int8_t*>(wv.GetTensorRawData()), wshape[0], wshape[1],
       direct16 ? (dw == 1 ? kw * cin : cin) : wshape[0]);
  vkind = kind;
  if (!wide && !mult32.empty() &&
      f64.build(zw.size(), mult.data(), cnst.data(), shift.data(), addend.data(), zw.data(), xm.data(), kind,
                zs))
    vkind = kind == kPlain ? kF64Floor : kF64Even;
  if (!wide && isa == 2 && (kind == kPlain || kind == kParity))
    f32.build(zw.size(), mult.data(), cnst.data(), shift.data(), addend.data(), zw.data(), xa.data(), kind, zs, lo,
              hi);
  // rq16_wide32: int32 multipliers and [lo - zs, hi - zs] and zs within int32; K - M zw (+ A for kPlain)
  // in wrapping 64-bit arithmetic (rq16_wide32 forms p modulo 2^64)
  w32 = wide && isa == 2 && !mult32.empty() && lo - zs >= INT32_MIN && hi - zs <= INT32_MAX &&
        zs >= INT32_MIN && zs <= INT32_MAX;
  if (w32) {
    kwe.assign(zw64.size() / 2, 0);
    kwo.assign(zw64.size() / 2, 0);
    for (size_t ch = 0; ch < zw64.size(); ++ch) {
      uint64_t v = static_cast<uint64_t>(cnst[ch]) - static_cast<uint64_t>(mult[ch]) * static_cast<uint64_t>(zw64[ch]);
      if (kind == kPlain) v += static_cast<uint64_t>(addend[ch]);
      (ch % 2 ? kwo : kwe)[ch / 16 * 8 + ch % 16 / 2] = static_cast<int64_t>(v);
    }
  }
  if (kind == kPlain && !wide) {  // rq16_32's kPlain form: K + A (fold_plain)
    for (size_t ch = 0; ch < zw.size(); ++ch) {
      const int64_t f = fold_plain(cnst[ch], addend[ch]);
      (ch % 2 ? ko : ke)[ch / 16 * 8 + ch % 16 / 2] = f;
    }
  }
  residual.init(ki, channels, zw.size(), isa == 2);
  if (wide && residual.active) throw std::runtime_error("QConv16: no residual add (add_* attributes)");
}

// The weights as panels of 64 channels, k-quads of 4 rows. The k rows are taken in segments of seg rows
// (kdim for an im2col row, a kernel row or tap for compute16_direct), each padded with zero weights to a
// whole number of quads, so the GEMM reads every segment as its own run of quads.
void QConvKernel::pack(const int8_t* w, int64_t kdim, int64_t o, int64_t seg) {
  k = kdim;
  kseg = seg;
  const int64_t segp = (seg + 3) / 4 * 4;
  kp = kdim / seg * segp;
  outs = o;
  const int64_t panels = (o + kPanel - 1) / kPanel;
  packed.assign(static_cast<size_t>(panels * kp * kPanel), 0);
  zw.assign(static_cast<size_t>(panels * kPanel), 0);
  zw64.assign(static_cast<size_t>(panels * kPanel), 0);
  xm.assign(static_cast<size_t>(panels * kPanel), 0);
  xa.assign(static_cast<size_t>(panels * kPanel), 0);
  // Weight sums and magnitudes per channel, row by row (rows of w are contiguous; |sum| < k 128 < 2^31).
  std::vector<int32_t> sum(static_cast<size_t>(o), 0), mag(static_cast<size_t>(o), 0);
  for (int64_t kk = 0; kk < kdim; ++kk) {
    const int8_t* row = w + kk * o;
    for (int64_t oc = 0; oc < o; ++oc) {
      sum[static_cast<size_t>(oc)] += row[oc];
      mag[static_cast<size_t>(oc)] += row[oc] < 0 ? -row[oc] : row[oc];
    }
  }
  // packed[pn][q][j][t] = w[kk][pn kPanel + j] for padded row 4 q + t = segment s, entry e (kk = s seg + e;
  // zero where e >= seg, past k or past o): four padded rows at a time, each channel's four bytes one
  // 32-bit word (t = byte t), so the writes run in order (a padding row reads zeros).
  const std::vector<uint8_t> zeros(static_cast<size_t>(o), 0);
  for (int64_t q = 0; q < kp / 4; ++q) {
    const uint8_t* rows[4];
    for (int t = 0; t < 4; ++t) {
      const int64_t e = (4 * q + t) % segp, kk = (4 * q + t) / segp * seg + e;
      rows[t] = e < seg && kk < kdim ? reinterpret_cast<const uint8_t*>(w + kk * o) : zeros.data();
    }
    for (int64_t pn = 0; pn < panels; ++pn) {
      const int64_t o0 = pn * kPanel, n = std::min<int64_t>(kPanel, o - o0);
      int8_t* dst = packed.data() + (pn * kp + 4 * q) * kPanel;
      for (int64_t j = 0; j < n; ++j) {
        const uint32_t word = uint32_t{rows[0][o0 + j]} | uint32_t{rows[1][o0 + j]} << 8 |
                              uint32_t{rows[2][o0 + j]} << 16 | uint32_t{rows[3][o0 + j]} << 24;
        std::memcpy(dst + 4 * j, &word, 4);
      }
    }
  }
  for (int64_t oc = 0; oc < o; ++oc) {
    const int64_t total = sum[static_cast<size_t>(oc)];
    xm[static_cast<size_t>(oc)] = mag[static_cast<size_t>(oc)] * std::max<int64_t>(xzp, 255 - xzp);
    xa[static_cast<size_t>(oc)] = int64_t{mag[static_cast<size_t>(oc)]} * 255;
    zw[static_cast<size_t>(oc)] = static_cast<int32_t>(wide ? 0 : xzp * total);
    zw64[static_cast<size_t>(oc)] = xzp * total;
  }
}

namespace {

// QConv (uint8 codes in and out) and QConv16 (int32-stored 16-bit codes in and out).
template <bool WIDE>
struct QConvOpT : Ort::CustomOpBase<QConvOpT<WIDE>, QConvKernel, true> {
  OrtStatusPtr CreateKernelV2(const OrtApi& api, const OrtKernelInfo* info, void** kernel) const {
    try {
      *kernel = new QConvKernel(info, WIDE);
      return nullptr;
    } catch (const std::exception& e) {
      return api.CreateStatus(ORT_INVALID_ARGUMENT, (std::string("zonnx.native ") + e.what()).c_str());
    }
  }
  const char* GetName() const { return WIDE ? "QConv16" : "QConv"; }
  size_t GetInputTypeCount() const { return WIDE ? 2 : 3; }  // QConv's input 2: the residual add's skip tensor
  OrtCustomOpInputOutputCharacteristic GetInputCharacteristic(size_t i) const {
    return i < 2 ? INPUT_OUTPUT_REQUIRED : INPUT_OUTPUT_OPTIONAL;
  }
  ONNXTensorElementDataType GetInputType(size_t i) const {
    if (i == 1) return ONNX_TENSOR_ELEMENT_DATA_TYPE_INT8;
    return WIDE ? ONNX_TENSOR_ELEMENT_DATA_TYPE_INT32 : ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT8;
  }
  size_t GetOutputTypeCount() const { return 1; }
  ONNXTensorElementDataType GetOutputType(size_t) const {
    return WIDE ? ONNX_TENSOR_ELEMENT_DATA_TYPE_INT32 : ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT8;
  }
};

}  // namespace

const OrtCustomOp* qconv_op() {
  static const QConvOpT<false> op;
  return &op;
}
const OrtCustomOp* qconv16_op() {
  static const QConvOpT<true> op;
  return &op;
}

int qconv_isa() { return select_isa(); }

}  // namespace zonnx_native
