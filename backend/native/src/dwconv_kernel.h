// The depthwise convolutions DwConv and QDwConv: what their translation units share. DwCore (the geometry,
// the weights, one output row's int32 sums), DwVnni (QDwConv's AVX-512 VNNI form) and the VNNI kernels' types.
// Its parts: dwconv.cpp (DwCore, the DwConv kernel and op), dwconv_vnni.cpp (DwVnni and the per-pixel VNNI
// kernels), dwconv_run.cpp (the interior-run VNNI kernels), qdwconv.cpp (the QDwConv kernel and op).
#pragma once

#include <algorithm>
#include <cstdint>
#include <stdexcept>
#include <vector>

#include "rq_avx512.h"
#include "zonnx_native.h"

namespace zonnx_native {

// The geometry and weights of a depthwise conv, and one output row's int32 sums.
struct DwCore {
  int64_t kh, kw, sh, sw, dh, dw, pt, pl, pb, pr, channels;
  int32_t zp;
  std::vector<int32_t> w;   // [kh, kw, C]
  int64_t tile = 0;         // a multiple of C near 1024
  std::vector<int32_t> wt;  // [kh, kw, tile]: each tap's weights repeated

  explicit DwCore(const Ort::ConstKernelInfo& ki);

  struct Geometry {
    int64_t n, h, wd, c, oh, ow;
  };

  Geometry geometry(const std::vector<int64_t>& shape) const {
    if (shape.size() != 4) throw std::runtime_error("DwConv: input must be uint8 NHWC rank 4");
    const int64_t n = shape[0], h = shape[1], wd = shape[2], c = shape[3];
    if (c != channels) throw std::runtime_error("DwConv: input channels differ from the weights");
    const int64_t eh = (kh - 1) * dh + 1, ew = (kw - 1) * dw + 1;
    if (h + pt + pb < eh || wd + pl + pr < ew) throw std::runtime_error("DwConv: kernel larger than the padded input");
    return {n, h, wd, c, (h + pt + pb - eh) / sh + 1, (wd + pl + pr - ew) / sw + 1};
  }

  // The int32 sums of output row r (= b oh + oy) into row[ow c] (dwconv.cpp).
  void row_sums(const uint8_t* xv, const Geometry& g, int64_t r, int32_t* row) const;

  // Output rows per parallel task (at least kGrain multiply-adds each).
  int64_t rows_per_task(const Geometry& g) const {
    return std::max<int64_t>(1, kGrain / std::max<int64_t>(g.ow * g.c * kh * kw, 1));
  }
};

// The AVX-512 VNNI form of a QDwConv: weights as tap quads in lane order, requantization arrays in lane
// order (RqArgs layout, padded to whole 64-channel blocks).
struct DwVnni {
  int64_t taps = 0, quads = 0, blocks = 0;
  bool pair = false;  // 32 channels: lanes 32-63 repeat lanes 0-31, so a block holds two adjacent pixels
  std::vector<int8_t> wq;  // [block][quad][quarter q][lane l][4 taps]
  std::vector<int32_t> zw, m32;
  std::vector<int64_t> m, k, s, a, b, ke, ko, se, so, ae, ao, be, bo;
  std::vector<uint8_t> zrow;  // zp bytes: the taps outside the input read it
  std::vector<int64_t> xm;    // per lane: max |acc - zw| = zp-centred input range x sum |w|
  std::vector<int64_t> xa;    // per lane: max |acc| = 255 sum |w| (F32Tables)
  F64Tables f64;              // the float64 requantization where exact (rq_avx512.h)
  F32Tables f32;              // its certified float32 shortcut where the error bound is small (rq_avx512.h)
  int vkind = kPlain;         // the rounding kind of dw_vnni_pixel: kind, or kF64Floor / kF64Even

  DwVnni(const DwCore& core, const std::vector<int64_t>& mult, const std::vector<int64_t>& cnst,
         const std::vector<int64_t>& shift, const std::vector<int64_t>& addend, const std::vector<int64_t>& bmask,
         int kind, int64_t zs, int64_t lo, int64_t hi);  // dwconv_vnni.cpp

  RqArgs args(int64_t bl, int64_t zs, int64_t lo, int64_t hi) const {
    const size_t o = static_cast<size_t>(64 * bl), h = o / 2;
    return RqArgs{zw.data() + o, m.data() + o, k.data() + o, s.data() + o, a.data() + o, b.data() + o,
                  zs, lo, hi, 64, m32.empty() ? nullptr : m32.data() + o, ke.data() + h, ko.data() + h,
                  se.data() + h, so.data() + h, ae.data() + h, ao.data() + h, be.data() + h, bo.data() + h,
                  f64.fm.empty() ? nullptr : f64.fm.data() + o, f64.fc.empty() ? nullptr : f64.fc.data() + o,
                  f32.gm.empty() ? nullptr : f32.gm.data() + o, f32.gc.empty() ? nullptr : f32.gc.data() + o,
                  f32.gtc.empty() ? nullptr : f32.gtc.data() + o / 4};
  }
};

// How dw_vnni_pixel reads tap t of a 64-lane block: kOne, one pixel (c0 + the masked lanes); for a pair
// block (DwVnni::pair, 32 channels) the pixel at ptr[t] in lanes 0-31 and the next output pixel's tap in
// lanes 32-63: kPairRun, it follows in memory (stride 1; the zp row is 64 bytes of zp), kPairSplit, it is
// at ptr[t] + adv[t] (adv = 0 for the zp row).
enum DwLoad { kOne, kPairRun, kPairSplit };

using DwPixelFn = void (*)(const DwVnni&, const uint8_t* const*, const int64_t*, int64_t, uint8_t*, int64_t,
                          int64_t, int64_t);
// The per-pixel kernel for a rounding kind, multiplier width and load form (dwconv_vnni.cpp).
DwPixelFn dw_vnni_for(int kind, bool m32, int load);

using DwRunFn = void (*)(const DwVnni&, const uint8_t*, const int64_t*, int64_t, int64_t, int64_t, uint8_t*, int64_t,
                        int64_t, int64_t);
// The run kernel for a rounding kind and load form, or null where it does not apply (not a float64 kind).
DwRunFn dw_run_for(int kind, int load);

}  // namespace zonnx_native
