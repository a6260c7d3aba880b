// QConv16, the 16-bit run of QConvKernel (int32-stored codes in and out): the input split into its low and
// high byte planes, both planes' exact int32 sums against the same packed weights, combined in int64 and
// requantized once (micro-kernels in qconv16_kernels.h). compute16_direct reads the padded planes in place
// (AVX-512 VNNI), compute16 builds im2col rows of both planes (AVX-VNNI and portable GEMMs). The kernel's
// other parts are listed in qconv_kernel.h.
#include "simd.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "qconv_kernel.h"
#include "rq_avx512.h"
#include "zonnx_native.h"

namespace zonnx_native {
namespace {

#include "qconv16_kernels.h"  // QConv16's micro-kernels (byte planes, int64 requantization)

// The low and high bytes of n int32-stored 16-bit codes (AVX-512 and baseline clones).
__attribute__((target_clones("arch=x86-64-v4", "default"))) void split_bytes(const int32_t* __restrict x,
                                                                          uint8_t* __restrict lo,
                                                                          uint8_t* __restrict hi, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    lo[i] = static_cast<uint8_t>(x[i] & 255);
    hi[i] = static_cast<uint8_t>((x[i] >> 8) & 255);
  }
}

}  // namespace

// 16-bit codes on the AVX-512 VNNI path (direct16), with no im2col: the input is split once into its low
// and high byte planes, each padded (pixel (b, yy, xx) of the padded input at (b hp + yy) wp + xx times C,
// the pad code's byte outside the input; the high plane hoff bytes after the low one). The k axis of
// output position (b, oy, ox) is then kernel rows (dw == 1: kw C contiguous bytes) or taps (C bytes), each
// at the position's base ((b hp + oy sh) wp + ox sw) C plus the segment's offset (i dh wp (+ j dw) times
// C), the same for every position: mk_vnni16 takes the bases and the offsets. The weights are packed in
// the same segments, each padded with zero weights to whole quads (pack): the bytes read past a segment's
// end (the next pixel's, or the zeroed slack after a plane) are multiplied by 0, so the sums are the
// im2col row's, in the same order.
void QConvKernel::compute16_direct(const Ort::KernelContext& ctx, const int32_t* x, int64_t n, int64_t h, int64_t w,
                                   int64_t c, int64_t oh, int64_t ow, int32_t* y, int64_t total) const {
  const int64_t o = outs, hp = h + pt + pb, wp = w + pl + pr, plane = n * hp * wp * c, hoff = plane + 64;
  thread_local std::vector<uint8_t> buffer;  // the calling thread's (as compute16's planes)
  if (buffer.size() < static_cast<size_t>(2 * hoff)) buffer.resize(static_cast<size_t>(2 * hoff));
  uint8_t* const lo_plane = buffer.data();
  uint8_t* const hi_plane = lo_plane + hoff;
  std::memset(lo_plane + plane, 0, 64);
  std::memset(hi_plane + plane, 0, 64);
  const uint8_t plo = static_cast<uint8_t>(xzp & 255), phi = static_cast<uint8_t>(xzp >> 8);
  const size_t prow = static_cast<size_t>(wp * c);
  parallel_for(ctx, static_cast<size_t>(n * hp), [&](size_t i) {
    const int64_t b = static_cast<int64_t>(i) / hp, iy = static_cast<int64_t>(i) % hp - pt;
    uint8_t* lrow = lo_plane + i * prow;
    uint8_t* hrow = hi_plane + i * prow;
    if (iy < 0 || iy >= h) {
      std::memset(lrow, plo, prow);
      std::memset(hrow, phi, prow);
      return;
    }
    std::memset(lrow, plo, static_cast<size_t>(pl * c));
    std::memset(hrow, phi, static_cast<size_t>(pl * c));
    split_bytes(x + (b * h + iy) * w * c, lrow + pl * c, hrow + pl * c, w * c);
    std::memset(lrow + (pl + w) * c, plo, static_cast<size_t>(pr * c));
    std::memset(hrow + (pl + w) * c, phi, static_cast<size_t>(pr * c));
  });
  const int64_t nseg = k / kseg;
  std::vector<int64_t> toff(static_cast<size_t>(nseg));
  for (int64_t sg = 0; sg < nseg; ++sg)
    toff[static_cast<size_t>(sg)] = dw == 1 ? sg * dh * wp * c : ((sg / kw) * dh * wp + (sg % kw) * dw) * c;
  const int64_t block = std::clamp<int64_t>((262144 / (2 * kp)) / 3 * 3, 3, 120);
  const TaskGrid grid = task_grid(total, block, (o + kPanel - 1) / kPanel, 2 * kp * kPanel);
  parallel_for(ctx, static_cast<size_t>(grid.blocks * grid.groups), [&](size_t t) {
    const int64_t task = static_cast<int64_t>(t) / grid.groups, group = static_cast<int64_t>(t) % grid.groups;
    const int64_t r0 = task * block, rows = std::min<int64_t>(block, total - r0);
    for (int64_t pn = grid.first_panel(group); pn < grid.first_panel(group + 1); ++pn) {
      const int64_t o0 = pn * kPanel;
      const int nch = static_cast<int>(std::min<int64_t>(kPanel, o - o0));
      const int nv = (nch + kLanes - 1) / kLanes;
      const int8_t* bp = packed.data() + pn * kp * kPanel;
      const int64_t h0 = o0 / 2;
      const Rq16Args rq{zw64.data() + o0, mult.data() + o0, cnst.data() + o0, shift.data() + o0,
                        addend.data() + o0, bmask.data() + o0, zs, lo, hi, nch,
                        w32 ? mult32.data() + o0 : nullptr, w32 ? kwe.data() + h0 : nullptr,
                        w32 ? kwo.data() + h0 : nullptr, se.data() + h0, so.data() + h0, ae.data() + h0,
                        ao.data() + h0, be.data() + h0, bo.data() + h0};
      // the output position (b, oy, ox) of row r0, then stepped one position at a time (no divisions per tile)
      int64_t b = r0 / (oh * ow), oy = (r0 / ow) % oh, ox = r0 % ow;
      for (int64_t r = 0; r < rows; r += 3) {
        const int mr = static_cast<int>(std::min<int64_t>(3, rows - r));
        Rows16 a{{nullptr, nullptr, nullptr}, toff.data(), nseg, kp / nseg / 4, hoff};
        for (int i = 0; i < mr; ++i) {
          a.rows[i] = lo_plane + ((b * hp + oy * sh) * wp + ox * sw) * c;
          if (++ox == ow) {
            ox = 0;
            if (++oy == oh) oy = 0, ++b;
          }
        }
        for (int i = mr; i < 3; ++i) a.rows[i] = a.rows[mr - 1];
        vnni16_kernel(mr, nv, kind, w32)(a, bp, rq, y + (r0 + r) * o + o0, o);
      }
    }
  });
}

// 16-bit codes: the input split once into its low and high byte planes (uint8 NHWC each), then per block
// the im2col rows of both planes side by side (row r: the low plane's kp bytes, then the high plane's;
// the pad code's low and high bytes outside the input) and two AVX-VNNI or portable GEMMs per tile (the
// AVX-512 VNNI path is compute16_direct).
void QConvKernel::compute16(const Ort::KernelContext& ctx, const int32_t* x, int64_t n, int64_t h, int64_t w, int64_t c,
                            int64_t oh, int64_t ow, int32_t* y, int64_t total) const {
  const int64_t o = outs, row = 2 * kp, size = n * h * w * c;
  // the calling thread's buffer, reused across runs; the tasks (on any pool thread) get its address, since
  // a thread_local named inside them would be their own thread's
  thread_local std::vector<uint8_t> buffer;
  if (buffer.size() < static_cast<size_t>(2 * size)) buffer.resize(static_cast<size_t>(2 * size));
  uint8_t* const planes = buffer.data();
  const size_t chunks = static_cast<size_t>((size + kGrain - 1) / kGrain);
  parallel_for(ctx, chunks, [&](size_t i) {
    const int64_t i0 = static_cast<int64_t>(i) * kGrain;
    split_bytes(x + i0, planes + i0, planes + size + i0, std::min<int64_t>(kGrain, size - i0));
  });
  const uint8_t plo = static_cast<uint8_t>(xzp & 255), phi = static_cast<uint8_t>(xzp >> 8);
  const int64_t block = std::clamp<int64_t>((262144 / row) / 3 * 3, 3, 120);
  const TaskGrid grid = task_grid(total, block, (o + kPanel - 1) / kPanel, row * kPanel);
  // split into channel groups too (task_grid): every block's rows are built once, before the GEMM tasks
  thread_local std::vector<uint8_t> built;  // the calling thread's, like buffer
  if (grid.groups > 1) {
    if (built.size() < static_cast<size_t>(total * row)) built.resize(static_cast<size_t>(total * row));
    uint8_t* const dst = built.data();
    parallel_for(ctx, static_cast<size_t>(grid.blocks), [&](size_t b) {
      const int64_t r0 = static_cast<int64_t>(b) * block, rows = std::min<int64_t>(block, total - r0);
      im2col(planes, h, w, c, oh, ow, r0, rows, dst + r0 * row, plo, row);
      im2col(planes + size, h, w, c, oh, ow, r0, rows, dst + r0 * row + kp, phi, row);
    });
  }
  const uint8_t* const rows_built = grid.groups > 1 ? built.data() : nullptr;
  parallel_for(ctx, static_cast<size_t>(grid.blocks * grid.groups), [&](size_t t) {
    thread_local std::vector<uint8_t> scratch;
    const int64_t task = static_cast<int64_t>(t) / grid.groups, group = static_cast<int64_t>(t) % grid.groups;
    const int64_t r0 = task * block, rows = std::min<int64_t>(block, total - r0);
    const uint8_t* col = rows_built != nullptr ? rows_built + r0 * row : nullptr;
    if (col == nullptr) {
      if (scratch.size() < static_cast<size_t>(block * row)) scratch.resize(static_cast<size_t>(block * row));
      im2col(planes, h, w, c, oh, ow, r0, rows, scratch.data(), plo, row);
      im2col(planes + size, h, w, c, oh, ow, r0, rows, scratch.data() + kp, phi, row);
      col = scratch.data();
    }
    alignas(64) int32_t tlo[kMR * kPanel], thi[kMR * kPanel];
    for (int64_t pn = grid.first_panel(group); pn < grid.first_panel(group + 1); ++pn) {
      const int64_t o0 = pn * kPanel;
      const int nch = static_cast<int>(std::min<int64_t>(kPanel, o - o0));
      const int nv = (nch + kLanes - 1) / kLanes;
      const int8_t* bp = packed.data() + pn * kp * kPanel;
      for (int64_t r = 0; r < rows; r += kMR) {
        const int mr = static_cast<int>(std::min<int64_t>(kMR, rows - r));
        const uint8_t* a = col + r * row;
        if (isa == 1) {
          gemm_avxvnni(a, row, bp, kp / 4, tlo, mr, nv);
          gemm_avxvnni(a + kp, row, bp, kp / 4, thi, mr, nv);
        } else {
          gemm_portable(a, row, bp, kp / 4, tlo, mr, nv);
          gemm_portable(a + kp, row, bp, kp / 4, thi, mr, nv);
        }
        for (int i = 0; i < mr; ++i)
          rq16_row(tlo + i * kPanel, thi + i * kPanel, y + (r0 + r + i) * o + o0, nch, zw64.data() + o0,
                   mult.data() + o0, cnst.data() + o0, shift.data() + o0, addend.data() + o0, bmask.data() + o0,
                   zs, lo, hi, kind);
      }
    }
  });
}

}  // namespace zonnx_native
