// QDwConv: the same sums requantized in the same kernel, uint8 out (RequantU8's one-term int64 rule,
// requant_tail in zonnx_native.h):
//   y[n, oy, ox, c] = clamp(((M[c] acc + K[c]) + A[c] + sel) >> s[c]) + zs, lo, hi)
// Each output row's sums stay in a thread-local buffer (cache) and are requantized straight away, so no
// int32 tensor reaches memory. Exact while |M acc| + |K| < 2^62 (the Python side checks it).
// This file: the QDwConv kernel (the VNNI path over output rows, else DwCore's row sums requantized by
// dw_rq_row) and op; the parts of the depthwise convolutions are listed in dwconv_kernel.h.
#include "simd.h"

#include <algorithm>
#include <memory>
#include <stdexcept>

#include "dwconv_kernel.h"

namespace zonnx_native {
namespace {

// One row of n sums requantized (channel arrays aligned with the row start).
template <int KIND>
inline __attribute__((always_inline)) void rq_loop(const int32_t* __restrict acc, uint8_t* __restrict y, int64_t n,
                                                   const int64_t* __restrict m, const int64_t* __restrict k,
                                                   const int64_t* __restrict s, const int64_t* __restrict a,
                                                   const int64_t* __restrict b, int64_t zs, int64_t lo, int64_t hi) {
  for (int64_t j = 0; j < n; ++j)
    y[j] = static_cast<uint8_t>(requant_tail<KIND>(m[j] * static_cast<int64_t>(acc[j]) + k[j], s[j], a[j], b[j], zs, lo, hi));
}
__attribute__((target_clones("arch=x86-64-v4", "default"))) void dw_rq_row(
    const int32_t* acc, uint8_t* y, int64_t n, const int64_t* m, const int64_t* k, const int64_t* s,
    const int64_t* a, const int64_t* b, int64_t zs, int64_t lo, int64_t hi, int kind) {
  if (kind == kPlain) rq_loop<kPlain>(acc, y, n, m, k, s, a, b, zs, lo, hi);
  else if (kind == kParity) rq_loop<kParity>(acc, y, n, m, k, s, a, b, zs, lo, hi);
  else rq_loop<kSign>(acc, y, n, m, k, s, a, b, zs, lo, hi);
}

struct QDwConvKernel {
  DwCore core;
  int kind;
  int64_t zs, lo, hi;
  std::vector<int64_t> mult, cnst, shift, addend, bmask;  // per channel, repeated to core.tile
  std::unique_ptr<DwVnni> vnni;                            // the AVX-512 VNNI form (qconv_isa() == 2)
  DwPixelFn pixel = nullptr;
  DwPixelFn pair = nullptr;  // two adjacent interior pixels of a 32-channel layer (DwVnni::pair)
  DwRunFn run = nullptr;      // interior runs, one pixel per step (dw_vnni_run3), where it applies
  DwRunFn run_pair = nullptr;  // the same, two pixels per step (DwVnni::pair)

  explicit QDwConvKernel(const OrtKernelInfo* info) : core(Ort::ConstKernelInfo(info)) {
    Ort::ConstKernelInfo ki(info);
    auto m = ki.GetAttributes<int64_t>("mult");
    auto k = ki.GetAttributes<int64_t>("cnst");
    auto s = ki.GetAttributes<int64_t>("shift");
    const int64_t mode = ki.GetAttribute<int64_t>("mode");
    zs = ki.GetAttribute<int64_t>("zs");
    lo = ki.GetAttribute<int64_t>("lo");
    hi = ki.GetAttribute<int64_t>("hi");
    const size_t c = static_cast<size_t>(core.channels);
    if (m.size() != c || k.size() != c || s.size() != c || mode < 0 || mode > 6 || lo < 0 || hi > 255 || lo > hi)
      throw std::runtime_error("QDwConv: inconsistent requantization attributes (mult, cnst, shift, mode, lo, hi)");
    kind = round_kind(static_cast<int>(mode));
    for (int64_t e = 0; e < core.tile; ++e) {
      const size_t ch = static_cast<size_t>(e) % c;
      if (s[ch] < 0 || s[ch] > 62) throw std::runtime_error("QDwConv: shift outside [0, 62]");
      const RoundParams rp = round_params(static_cast<int>(mode), s[ch]);
      mult.push_back(m[ch]);
      cnst.push_back(k[ch]);
      shift.push_back(s[ch]);
      addend.push_back(rp.addend);
      bmask.push_back(rp.bmask);
    }
    if (qconv_isa() == 2) {
      vnni = std::make_unique<DwVnni>(core, mult, cnst, shift, addend, bmask, kind, zs, lo, hi);
      pixel = dw_vnni_for(vnni->vkind, !vnni->m32.empty(), kOne);
      if (vnni->pair) pair = dw_vnni_for(vnni->vkind, !vnni->m32.empty(), core.sw == 1 ? kPairRun : kPairSplit);
      if (vnni->quads <= 3) {
        run = dw_run_for(vnni->vkind, kOne);
        if (vnni->pair) run_pair = dw_run_for(vnni->vkind, core.sw == 1 ? kPairRun : kPairSplit);
      }
    }
  }

  // The VNNI path over output rows [r0, r1): per position, the tap pointers, then dw_vnni_pixel.
  void rows_vnni(const uint8_t* xv, const DwCore::Geometry& g, int64_t r0, int64_t r1, uint8_t* y) const {
    const DwCore& k = core;
    std::vector<const uint8_t*> ptr(static_cast<size_t>(vnni->quads * 4), vnni->zrow.data());
    std::vector<char> row_in(static_cast<size_t>(k.kh));
    std::vector<int64_t> adv(ptr.size(), 0);  // pair blocks: tap t of the next pixel is at ptr[t] + adv[t]
    // interior columns: every tap of the row inside the input; there the pointers only step by sw c
    const int64_t in0 = (k.pl + k.sw - 1) / k.sw, ext = (k.kw - 1) * k.dw;
    const int64_t in1 = g.wd - 1 - ext + k.pl >= 0 ? (g.wd - 1 - ext + k.pl) / k.sw + 1 : 0;
    const int64_t step = k.sw * g.c;
    std::vector<int64_t> off(static_cast<size_t>(vnni->taps));  // tap (i, j) relative to tap (0, 0)
    for (int64_t t = 0; t < vnni->taps; ++t) off[static_cast<size_t>(t)] = ((t / k.kw) * k.dh * g.wd + (t % k.kw) * k.dw) * g.c;
    for (int64_t r = r0; r < r1; ++r) {
      const int64_t b = r / g.oh, oy = r % g.oh;
      for (int64_t i = 0; i < k.kh; ++i) {
        const int64_t iy = oy * k.sh - k.pt + i * k.dh;
        row_in[static_cast<size_t>(i)] = iy >= 0 && iy < g.h;
      }
      for (int64_t t = 0; t < vnni->taps; ++t) adv[static_cast<size_t>(t)] = row_in[static_cast<size_t>(t / k.kw)] ? step : 0;
      const bool rows_inside = std::all_of(row_in.begin(), row_in.end(), [](char v) { return v != 0; });
      for (int64_t ox = 0; ox < g.ow; ++ox) {
        if (run != nullptr && rows_inside && ox == in0 && in1 > in0) {  // the interior: dw_vnni_run3
          const uint8_t* x0 = xv + ((b * g.h + oy * k.sh - k.pt) * g.wd + in0 * k.sw - k.pl) * g.c;
          uint8_t* y0 = y + (r * g.ow + in0) * g.c;
          int64_t n = in1 - in0;
          if (run_pair != nullptr && n >= 2) {
            run_pair(*vnni, x0, off.data(), step, n / 2, g.c, y0, zs, lo, hi);
            x0 += (n / 2) * 2 * step;
            y0 += (n / 2) * 2 * g.c;
            n %= 2;
          }
          if (n > 0) run(*vnni, x0, off.data(), step, n, g.c, y0, zs, lo, hi);
          ox = in1 - 1;
          continue;
        }
        if (ox > in0 && ox < in1) {
          for (int64_t t = 0; t < vnni->taps; ++t) ptr[static_cast<size_t>(t)] += adv[static_cast<size_t>(t)];
          if (pair != nullptr && ox + 1 < in1) {  // ox and ox + 1 interior: one pair block
            pair(*vnni, ptr.data(), adv.data(), g.c, y + (r * g.ow + ox) * g.c, zs, lo, hi);
            for (int64_t t = 0; t < vnni->taps; ++t) ptr[static_cast<size_t>(t)] += adv[static_cast<size_t>(t)];
            ++ox;
            continue;
          }
          pixel(*vnni, ptr.data(), nullptr, g.c, y + (r * g.ow + ox) * g.c, zs, lo, hi);
          continue;
        }
        for (int64_t i = 0; i < k.kh; ++i) {
          const int64_t iy = oy * k.sh - k.pt + i * k.dh;
          for (int64_t j = 0; j < k.kw; ++j) {
            const int64_t ix = ox * k.sw - k.pl + j * k.dw;
            const bool in = iy >= 0 && iy < g.h && ix >= 0 && ix < g.wd;
            ptr[static_cast<size_t>(i * k.kw + j)] = in ? xv + ((b * g.h + iy) * g.wd + ix) * g.c : vnni->zrow.data();
          }
        }
        pixel(*vnni, ptr.data(), nullptr, g.c, y + (r * g.ow + ox) * g.c, zs, lo, hi);
      }
    }
  }

  void Compute(OrtKernelContext* context) {
    Ort::KernelContext ctx(context);
    Ort::ConstValue x = ctx.GetInput(0);
    auto info = x.GetTensorTypeAndShapeInfo();
    if (info.GetElementType() != ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT8)
      throw std::runtime_error("QDwConv: input must be uint8 NHWC rank 4");
    const DwCore::Geometry g = core.geometry(info.GetShape());
    Ort::UnownedValue out = ctx.GetOutput(0, std::vector<int64_t>{g.n, g.oh, g.ow, g.c});
    uint8_t* y = static_cast<uint8_t*>(out.GetTensorMutableRawData());
    const uint8_t* xv = static_cast<const uint8_t*>(x.GetTensorRawData());
    const int64_t rows = g.n * g.oh, per_task = core.rows_per_task(g), len = g.ow * g.c;
    const size_t tasks = static_cast<size_t>((rows + per_task - 1) / per_task);
    if (vnni) {
      parallel_for(ctx, tasks, [&](size_t task) {
        const int64_t r0 = static_cast<int64_t>(task) * per_task;
        rows_vnni(xv, g, r0, std::min<int64_t>(rows, r0 + per_task), y);
      });
      return;
    }
    parallel_for(ctx, tasks, [&](size_t task) {
      thread_local std::vector<int32_t> buf;
      if (buf.size() < static_cast<size_t>(len)) buf.resize(static_cast<size_t>(len));
      const int64_t r1 = std::min<int64_t>(rows, (static_cast<int64_t>(task) + 1) * per_task);
      for (int64_t r = static_cast<int64_t>(task) * per_task; r < r1; ++r) {
        core.row_sums(xv, g, r, buf.data());
        uint8_t* yr = y + r * len;
        for (int64_t e = 0; e < len; e += core.tile)  // core.tile is a multiple of C: channels stay aligned
          dw_rq_row(buf.data() + e, yr + e, std::min<int64_t>(core.tile, len - e), mult.data(), cnst.data(),
                    shift.data(), addend.data(), bmask.data(), zs, lo, hi, kind);
      }
    });
  }
  OrtStatusPtr ComputeV2(OrtKernelContext* context) { return guarded(this, context); }
};

struct QDwConvOp : Ort::CustomOpBase<QDwConvOp, QDwConvKernel, true> {
  OrtStatusPtr CreateKernelV2(const OrtApi& api, const OrtKernelInfo* info, void** kernel) const {
    try {
      *kernel = new QDwConvKernel(info);
      return nullptr;
    } catch (const std::exception& e) {
      return api.CreateStatus(ORT_INVALID_ARGUMENT, (std::string("zonnx.native ") + e.what()).c_str());
    }
  }
  const char* GetName() const { return "QDwConv"; }
  size_t GetInputTypeCount() const { return 1; }
  ONNXTensorElementDataType GetInputType(size_t) const { return ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT8; }
  size_t GetOutputTypeCount() const { return 1; }
  ONNXTensorElementDataType GetOutputType(size_t) const { return ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT8; }
};

}  // namespace

const OrtCustomOp* qdwconv_op() {
  static const QDwConvOp op;
  return &op;
}

}  // namespace zonnx_native
