// QConvKernel::im2col, the A operand of QConv's GEMM, shared by the 8-bit run and QConv16's im2col path:
// the rows of a block of output positions (columns in (kh, kw, c) order, the pad code outside the input),
// built into a buffer that stays in cache. The kernel's other parts are listed in qconv_kernel.h.
#include <algorithm>
#include <cstring>

#include "qconv_kernel.h"

namespace zonnx_native {
namespace {

// memcpy of n bytes as at most two overlapping fixed-size moves for short runs (an im2col of few channels
// copies a run of a few dozen bytes per kernel row, where a library call costs more than the copy).
inline void copy_run(uint8_t* __restrict d, const uint8_t* __restrict s, size_t n) {
  if (n >= 32 && n <= 64) {
    std::memcpy(d, s, 32);
    std::memcpy(d + n - 32, s + n - 32, 32);
  } else if (n >= 16 && n < 32) {
    std::memcpy(d, s, 16);
    std::memcpy(d + n - 16, s + n - 16, 16);
  } else if (n >= 8 && n < 16) {
    std::memcpy(d, s, 8);
    std::memcpy(d + n - 8, s + n - 8, 8);
  } else if (n >= 4 && n < 8) {
    std::memcpy(d, s, 4);
    std::memcpy(d + n - 4, s + n - 4, 4);
  } else if (n < 4) {
    for (size_t i = 0; i < n; ++i) d[i] = s[i];
  } else {
    std::memcpy(d, s, n);
  }
}

inline void fill_run(uint8_t* d, uint8_t v, size_t n) {
  if (n < 16) {
    for (size_t i = 0; i < n; ++i) d[i] = v;
  } else {
    std::memset(d, v, n);
  }
}

}  // namespace

// The im2col rows of output positions [r0, r0 + rows) into col (kp bytes each, tail zero). Positions are
// taken in runs of one output row; per kernel row i the interior positions of a run (whole kernel row
// inside the input, dw == 1) copy kw c bytes each with only pointer steps, the edges tap by tap.
void QConvKernel::im2col(const uint8_t* x, int64_t h, int64_t w, int64_t c, int64_t oh, int64_t ow, int64_t r0,
                         int64_t rows, uint8_t* col, uint8_t pad, int64_t ld) const {
  const size_t run = static_cast<size_t>(kw * c);
  // interior output columns: ox * sw - pl >= 0 and ox * sw - pl + kw <= w (dw == 1)
  const int64_t in0 = std::min<int64_t>(ow, (pl + sw - 1) / sw);
  const int64_t in1 = dw == 1 && w - kw + pl >= 0 ? std::min<int64_t>(ow, (w - kw + pl) / sw + 1) : 0;
  for (int64_t r = 0; r < rows;) {
    const int64_t pix = r0 + r;
    const int64_t b = pix / (oh * ow), oy = (pix / ow) % oh, ox0 = pix % ow;
    const int64_t ox1 = std::min<int64_t>(ow, ox0 + rows - r);  // this run: [ox0, ox1) of row oy
    uint8_t* base = col + r * ld;
    for (int64_t i = 0; i < kh; ++i) {
      const int64_t iy = oy * sh - pt + i * dh;
      uint8_t* rowdst = base + i * kw * c;
      const bool inside = iy >= 0 && iy < h;
      const uint8_t* src_row = inside ? x + (b * h + iy) * w * c : nullptr;
      const int64_t a0 = inside ? std::max(ox0, in0) : ox1, a1 = inside ? std::min(ox1, in1) : ox1;
      for (int64_t ox = ox0; ox < ox1; ++ox) {
        if (ox == a0 && a0 < a1) {  // the interior: one run per position, pointer steps only
          const uint8_t* src = src_row + (a0 * sw - pl) * c;
          uint8_t* dst = rowdst + (a0 - ox0) * ld;
          for (int64_t q = a0; q < a1; ++q, src += sw * c, dst += ld) copy_run(dst, src, run);
          ox = a1 - 1;
          continue;
        }
        uint8_t* dst = rowdst + (ox - ox0) * ld;
        for (int64_t j = 0; j < kw; ++j, dst += c) {
          const int64_t ix = ox * sw - pl + j * dw;
          if (!inside || ix < 0 || ix >= w) fill_run(dst, pad, static_cast<size_t>(c));
          else copy_run(dst, src_row + ix * c, static_cast<size_t>(c));
        }
      }
    }
    for (int64_t ox = ox0; ox < ox1; ++ox) fill_run(base + (ox - ox0) * ld + k, 0, static_cast<size_t>(kp - k));
    r += ox1 - ox0;
  }
}

}  // namespace zonnx_native
