// QConv: a whole 8-bit convolution in one kernel, NHWC uint8 in, NHWC uint8 out:
//   acc[p, o] = sum_k (col[p, k] - xzp) w[k, o]            (int32, exact: K 255 128 < 2^31, checked)
//   y[p, o]   = clamp(((M[o] acc + K[o]) + A[o] + sel) >> s[o]) + zs, lo, hi)
// where col is the im2col row of output position p (columns in (kh, kw, c) order, the stored pad code xzp
// outside the input: it then adds 0) and the second line is RequantU8's int64 rule (requant.cpp) for one
// term. Per block of output positions the im2col rows are built in a thread-local buffer that stays in
// cache, multiplied by the weights (a constant input, packed once when the kernel is created), and every
// finished output tile is requantized straight away, so no int32 tensor ever reaches memory.
//
// GEMM paths, picked per kernel at creation: AVX-512 VNNI (vpdpbusd: four u8 x s8 products added to an
// int32 lane, no intermediate saturation; requantized in registers) when the CPU has it, else AVX-VNNI
// (the same instruction on 256-bit VEX registers), else portable C++ (int32 sums, compiled for x86-64-v3
// and the baseline, picked at load). Every path computes the same int32 sums exactly and the same int64
// requantization, so the results never depend on the CPU. $ZONNX_NATIVE_ISA=avx-vnni or baseline caps the
// path (tests of every path on one machine).
// This file: the 8-bit run (QConvKernel::Compute) with its AVX-512 VNNI micro-kernels and requantization;
// the kernel's other parts are listed in qconv_kernel.h.
#include "simd.h"

#include <algorithm>
#include <cstring>
#include <stdexcept>
#include <vector>

#include "qconv_kernel.h"
#include "rq_avx512.h"
#include "zonnx_native.h"

namespace zonnx_native {
namespace {

// ---- AVX-512 VNNI micro-kernels (the panel layout in qconv_kernel.h) -----------------------------------

// One row's NV accumulators (the 16-lane blocks of a panel) requantized in the float64 form and stored as
// the bytes of the panel's channels: pack64_u8's dword 4 L + b holds channels 16 b + 4 L .. + 3, which the
// permutation puts at dword 4 b + L. Not inlined: inlined into mk_vnni, GCC spills accumulators inside the
// k loop (measured: QConv 20% slower).
template <int KIND, int NV>
__attribute__((target("avx512f,avx512bw,avx512dq,avx512vnni"), noinline)) void store_f64(
    __m512i c0, __m512i c1, __m512i c2, __m512i c3, const RqArgs& rq, uint8_t* y) {
  const __m512i order = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
  const __mmask64 mask = rq.nch >= 64 ? ~__mmask64(0) : ((__mmask64(1) << rq.nch) - 1);
  _mm512_mask_storeu_epi8(y, mask, _mm512_permutexvar_epi32(order, rq64_f64<KIND, NV>(c0, c1, c2, c3, rq)));
}

// mr <= 6 rows of a tile (row r: the NV 16-lane accumulator vectors at tile + 64 r) requantized by
// F32Tables' float32 form (rq.gm set; FK: kF64Floor for floor, kF64Even for round-half-even), the tables'
// vectors loaded once per tile; a row where its test fails is computed again by the kernel's own form XK
// (the float64 one, bytes as store_f64, or the integer one, rq16_32 / rq16, M32 as mk_vnni).
template <int FK, int NV, int XK, bool M32>
__attribute__((target("avx512f,avx512bw,avx512dq,avx512vnni"), noinline)) void store_tile_f32(
    const int32_t* tile, int mr, const RqArgs& rq, uint8_t* y, int64_t ldy) {
  const __m512i order = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
  const __mmask64 mask = rq.nch >= 64 ? ~__mmask64(0) : ((__mmask64(1) << rq.nch) - 1);
  __m512 gm[4], gc[4];
  for (int v = 0; v < NV; ++v) {
    gm[v] = _mm512_loadu_ps(rq.gm + 16 * v);
    gc[v] = _mm512_loadu_ps(rq.gc + 16 * v);
  }
  const __m512 tc = _mm512_loadu_ps(rq.gt);
  for (int r = 0; r < mr; ++r, tile += kPanel, y += ldy) {
    __m512i c[4];
    for (int v = 0; v < NV; ++v) c[v] = _mm512_load_si512(tile + 16 * v);
    for (int v = NV; v < 4; ++v) c[v] = c[0];
    __m512i out;
    if (__builtin_expect(!f32_try<FK, NV>(c, gm, gc, tc, rq, out), 0)) {
      if constexpr (XK == kF64Floor || XK == kF64Even) {
        out = pack64_f64<XK, NV>(c[0], c[1], c[2], c[3], rq);
      } else {
        for (int v = 0; v < NV; ++v) {
          if constexpr (M32) rq16_32<XK>(c[v], rq, 16 * v, y);
          else rq16<XK, false>(c[v], rq, 16 * v, y);
        }
        continue;
      }
    }
    _mm512_mask_storeu_epi8(y, mask, _mm512_permutexvar_epi32(order, out));
  }
}

// Accumulators are named variables (GCC keeps them in registers; an array of vectors it spills).
#define ZN_ACC(r) __m512i c##r##0 = _mm512_setzero_si512(), c##r##1 = c##r##0, c##r##2 = c##r##0, c##r##3 = c##r##0;
#define ZN_ROW(r)                                                                  \
  if constexpr (MR > r) {                                                          \
    int32_t quad;                                                                  \
    std::memcpy(&quad, a + r * lda + 4 * q, 4);                                    \
    const __m512i av = _mm512_set1_epi32(quad);                                    \
    c##r##0 = _mm512_dpbusd_epi32(c##r##0, av, b0);                                \
    if constexpr (NV > 1) c##r##1 = _mm512_dpbusd_epi32(c##r##1, av, b1);          \
    if constexpr (NV > 2) c##r##2 = _mm512_dpbusd_epi32(c##r##2, av, b2);          \
    if constexpr (NV > 3) c##r##3 = _mm512_dpbusd_epi32(c##r##3, av, b3);          \
  }
#define ZN_TILE(r)                                                                 \
  if constexpr (MR > r) {                                                          \
    _mm512_store_si512(tile + r * kPanel, c##r##0);                                \
    if constexpr (NV > 1) _mm512_store_si512(tile + r * kPanel + 16, c##r##1);     \
    if constexpr (NV > 2) _mm512_store_si512(tile + r * kPanel + 32, c##r##2);     \
    if constexpr (NV > 3) _mm512_store_si512(tile + r * kPanel + 48, c##r##3);     \
  }
#define ZN_STORE(r)                                                                \
  if constexpr (MR > r) {                                                          \
    uint8_t* yr = y + r * ldy;                                                     \
    if constexpr (KIND == kF64Floor || KIND == kF64Even) {                         \
      store_f64<KIND, NV>(c##r##0, c##r##1, c##r##2, c##r##3, rq, yr);             \
    } else if constexpr (M32) {                                                    \
      rq16_32<KIND>(c##r##0, rq, 0, yr);                                           \
      if constexpr (NV > 1) rq16_32<KIND>(c##r##1, rq, 16, yr);                    \
      if constexpr (NV > 2) rq16_32<KIND>(c##r##2, rq, 32, yr);                    \
      if constexpr (NV > 3) rq16_32<KIND>(c##r##3, rq, 48, yr);                    \
    } else {                                                                       \
      rq16<KIND, false>(c##r##0, rq, 0, yr);                                       \
      if constexpr (NV > 1) rq16<KIND, false>(c##r##1, rq, 16, yr);                \
      if constexpr (NV > 2) rq16<KIND, false>(c##r##2, rq, 32, yr);                \
      if constexpr (NV > 3) rq16<KIND, false>(c##r##3, rq, 48, yr);                \
    }                                                                              \
  }

// MR output positions x the first NV 16-lane blocks of one 64-channel panel (NV < 4 only for the last,
// partial panel: the blocks beyond its channels hold zero weights and are skipped): the int32 sums by
// vpdpbusd, then requantized to y rows.
template <int MR, int KIND, bool M32, int NV>
__attribute__((target("avx512f,avx512bw,avx512dq,avx512vnni"))) void mk_vnni(const uint8_t* a, int64_t lda,
                                                                              const int8_t* b, int64_t kq,
                                                                              const RqArgs& rq, uint8_t* y,
                                                                              int64_t ldy) {
  ZN_ACC(0) ZN_ACC(1) ZN_ACC(2) ZN_ACC(3) ZN_ACC(4) ZN_ACC(5)
  ZN_ACC(6) ZN_ACC(7) ZN_ACC(8) ZN_ACC(9) ZN_ACC(10) ZN_ACC(11)
  for (int64_t q = 0; q < kq; ++q) {
    const int8_t* bq = b + q * kPanel * 4;
    const __m512i b0 = _mm512_loadu_si512(bq);
    const __m512i b1 = NV > 1 ? _mm512_loadu_si512(bq + 64) : b0;
    const __m512i b2 = NV > 2 ? _mm512_loadu_si512(bq + 128) : b0;
    const __m512i b3 = NV > 3 ? _mm512_loadu_si512(bq + 192) : b0;
    ZN_ROW(0) ZN_ROW(1) ZN_ROW(2) ZN_ROW(3) ZN_ROW(4) ZN_ROW(5)
    ZN_ROW(6) ZN_ROW(7) ZN_ROW(8) ZN_ROW(9) ZN_ROW(10) ZN_ROW(11)
  }
  if constexpr (KIND != kSign) {
    if (rq.gm != nullptr) {
      constexpr int kFK = KIND == kF64Floor || KIND == kPlain ? kF64Floor : kF64Even;
      alignas(64) int32_t tile[MR * kPanel];
      ZN_TILE(0) ZN_TILE(1) ZN_TILE(2) ZN_TILE(3) ZN_TILE(4) ZN_TILE(5)
      ZN_TILE(6) ZN_TILE(7) ZN_TILE(8) ZN_TILE(9) ZN_TILE(10) ZN_TILE(11)
      store_tile_f32<kFK, NV, KIND, M32>(tile, MR, rq, y, ldy);
      return;
    }
  }
  ZN_STORE(0) ZN_STORE(1) ZN_STORE(2) ZN_STORE(3) ZN_STORE(4) ZN_STORE(5)
  ZN_STORE(6) ZN_STORE(7) ZN_STORE(8) ZN_STORE(9) ZN_STORE(10) ZN_STORE(11)
}
#undef ZN_ACC
#undef ZN_ROW
#undef ZN_TILE
#undef ZN_STORE

using VnniFn = void (*)(const uint8_t*, int64_t, const int8_t*, int64_t, const RqArgs&, uint8_t*, int64_t);
template <int KIND, bool M32, int NV>
VnniFn vnni_for(int mr) {
  if constexpr (NV <= 2) {
    if (mr == kMR2) return mk_vnni<kMR2, KIND, M32, NV>;
  }
  switch (mr) {
    case 1: return mk_vnni<1, KIND, M32, NV>;
    case 2: return mk_vnni<2, KIND, M32, NV>;
    case 3: return mk_vnni<3, KIND, M32, NV>;
    case 4: return mk_vnni<4, KIND, M32, NV>;
    case 5: return mk_vnni<5, KIND, M32, NV>;
    default: return mk_vnni<6, KIND, M32, NV>;
  }
}
template <int KIND, bool M32>
VnniFn vnni_nv(int mr, int nv) {
  if (nv == 1) return vnni_for<KIND, M32, 1>(mr);
  if (nv == 2) return vnni_for<KIND, M32, 2>(mr);
  return vnni_for<KIND, M32, 4>(mr);  // 3 blocks run as 4 (the fourth holds zero weights, not stored)
}
// The micro-kernel for mr positions, nv 16-lane blocks, a rounding kind and the multipliers' width.
VnniFn vnni_kernel(int mr, int nv, int kind, bool m32) {
  if (kind == kF64Floor) return vnni_nv<kF64Floor, true>(mr, nv);
  if (kind == kF64Even) return vnni_nv<kF64Even, true>(mr, nv);
  if (kind == kParity) return m32 ? vnni_nv<kParity, true>(mr, nv) : vnni_nv<kParity, false>(mr, nv);
  if (kind == kSign) return m32 ? vnni_nv<kSign, true>(mr, nv) : vnni_nv<kSign, false>(mr, nv);
  return m32 ? vnni_nv<kPlain, true>(mr, nv) : vnni_nv<kPlain, false>(mr, nv);
}

// ---- requantization of one output position's channels (RequantU8's single-shift int64 rule) ----------
template <int KIND>
inline __attribute__((always_inline)) void rq_loop(const int32_t* __restrict acc, const int32_t* __restrict zw,
                                                   uint8_t* __restrict y, int n, const int64_t* __restrict m,
                                                   const int64_t* __restrict k, const int64_t* __restrict s,
                                                   const int64_t* __restrict a, const int64_t* __restrict b,
                                                   int64_t zs, int64_t lo, int64_t hi) {
  for (int j = 0; j < n; ++j) {
    const int64_t p = m[j] * static_cast<int64_t>(acc[j] - zw[j]) + k[j];
    y[j] = static_cast<uint8_t>(requant_tail<KIND>(p, s[j], a[j], b[j], zs, lo, hi));
  }
}

// The same with multipliers that fit int32: M acc is then one 32 x 32 -> 64-bit product (vpmuldq), the
// same integer as the int64 product.
template <int KIND>
inline __attribute__((always_inline)) void rq_loop32(const int32_t* __restrict acc, const int32_t* __restrict zw,
                                                     uint8_t* __restrict y, int n, const int32_t* __restrict m,
                                                     const int64_t* __restrict k, const int64_t* __restrict s,
                                                     const int64_t* __restrict a, const int64_t* __restrict b,
                                                     int64_t zs, int64_t lo, int64_t hi) {
  for (int j = 0; j < n; ++j) {
    const int64_t p = static_cast<int64_t>(m[j]) * static_cast<int64_t>(acc[j] - zw[j]) + k[j];
    y[j] = static_cast<uint8_t>(requant_tail<KIND>(p, s[j], a[j], b[j], zs, lo, hi));
  }
}

__attribute__((target_clones("arch=x86-64-v4", "default"))) void rq_row32(
    const int32_t* acc, const int32_t* zw, uint8_t* y, int n, const int32_t* m, const int64_t* k,
    const int64_t* s, const int64_t* a, const int64_t* b, int64_t zs, int64_t lo, int64_t hi, int kind) {
  if (kind == kPlain) rq_loop32<kPlain>(acc, zw, y, n, m, k, s, a, b, zs, lo, hi);
  else if (kind == kParity) rq_loop32<kParity>(acc, zw, y, n, m, k, s, a, b, zs, lo, hi);
  else rq_loop32<kSign>(acc, zw, y, n, m, k, s, a, b, zs, lo, hi);
}

__attribute__((target_clones("arch=x86-64-v4", "default"))) void rq_row(
    const int32_t* acc, const int32_t* zw, uint8_t* y, int n, const int64_t* m, const int64_t* k,
    const int64_t* s, const int64_t* a, const int64_t* b, int64_t zs, int64_t lo, int64_t hi, int kind) {
  if (kind == kPlain) rq_loop<kPlain>(acc, zw, y, n, m, k, s, a, b, zs, lo, hi);
  else if (kind == kParity) rq_loop<kParity>(acc, zw, y, n, m, k, s, a, b, zs, lo, hi);
  else rq_loop<kSign>(acc, zw, y, n, m, k, s, a, b, zs, lo, hi);
}

}  // namespace

void QConvKernel::Compute(OrtKernelContext* context) {
  Ort::KernelContext ctx(context);
  Ort::ConstValue xv = ctx.GetInput(0);
  auto xi = xv.GetTensorTypeAndShapeInfo();
  auto shape = xi.GetShape();
  const auto in_type = wide ? ONNX_TENSOR_ELEMENT_DATA_TYPE_INT32 : ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT8;
  if (xi.GetElementType() != in_type || shape.size() != 4)
    throw std::runtime_error(wide ? "QConv16: input must be int32 NHWC rank 4" : "QConv: input must be uint8 NHWC rank 4");
  const int64_t n = shape[0], h = shape[1], w = shape[2], c = shape[3];
  const int64_t o = outs;
  if (k != kh * kw * c) throw std::runtime_error("QConv: weight rows differ from kh kw C of the input");
  const int64_t eh = (kh - 1) * dh + 1, ew = (kw - 1) * dw + 1;
  if (h + pt + pb < eh || w + pl + pr < ew) throw std::runtime_error("QConv: kernel larger than the padded input");
  const int64_t oh = (h + pt + pb - eh) / sh + 1, ow = (w + pl + pr - ew) / sw + 1;
  const std::vector<int64_t> conv_shape{n, oh, ow, o};
  // the fused residual add: row by row in the epilogue, or after the conv when the skip tensor broadcasts
  const ResidualInput res = residual.input(ctx, conv_shape);
  Ort::UnownedValue out = ctx.GetOutput(0, residual.active ? res.out_shape : conv_shape);
  const int64_t total = n * oh * ow;
  if (total == 0) return;
  if (direct16) {
    compute16_direct(ctx, static_cast<const int32_t*>(xv.GetTensorRawData()), n, h, w, c, oh, ow,
                     static_cast<int32_t*>(out.GetTensorMutableRawData()), total);
    return;
  }
  if (wide) {
    compute16(ctx, static_cast<const int32_t*>(xv.GetTensorRawData()), n, h, w, c, oh, ow,
              static_cast<int32_t*>(out.GetTensorMutableRawData()), total);
    return;
  }
  uint8_t* y = static_cast<uint8_t*>(out.GetTensorMutableRawData());
  std::vector<uint8_t> conv_out;  // the conv's codes before a broadcast residual add
  if (!res.same) {
    conv_out.resize(static_cast<size_t>(total * o));
    y = conv_out.data();
  }
  const uint8_t* const skip = res.same ? res.skip : nullptr;  // added in the epilogue
  const uint8_t* x = static_cast<const uint8_t*>(xv.GetTensorRawData());
  // a 1x1, stride 1, unpadded conv with C % 4 == 0 reads the input rows in place
  const bool direct = kh == 1 && kw == 1 && sh == 1 && sw == 1 && pt == 0 && pl == 0 && pb == 0 && pr == 0 &&
                      kp == k;
  // positions per block: the block's im2col rows within about 256 KB, at most 96 positions, so a layer
  // splits into enough tasks for ORT's pool to keep two threads equally busy (with at most 240, ResNet-18's
  // 56x56 and 28x28 convs took 1.2-1.5x ORT's time at two threads against 1.1x at one; ORT profile)
  const int64_t block = std::clamp<int64_t>((262144 / kp) / kMR * kMR, kMR, 16 * kMR);
  const TaskGrid grid = task_grid(total, block, (o + kPanel - 1) / kPanel, kp * kPanel);
  // split into channel groups too (task_grid): every block's im2col rows are built once, before the GEMM
  // tasks, in the calling thread's buffer (as compute16's planes)
  const bool prebuilt = grid.groups > 1 && !direct;
  thread_local std::vector<uint8_t> built;
  if (prebuilt) {
    if (built.size() < static_cast<size_t>(total * kp)) built.resize(static_cast<size_t>(total * kp));
    uint8_t* const dst = built.data();
    parallel_for(ctx, static_cast<size_t>(grid.blocks), [&](size_t b) {
      const int64_t r0 = static_cast<int64_t>(b) * block, rows = std::min<int64_t>(block, total - r0);
      im2col(x, h, w, c, oh, ow, r0, rows, dst + r0 * kp, static_cast<uint8_t>(xzp), kp);
    });
  }
  const uint8_t* const rows_built = prebuilt ? built.data() : nullptr;
  parallel_for(ctx, static_cast<size_t>(grid.blocks * grid.groups), [&](size_t t) {
    thread_local std::vector<uint8_t> scratch;
    const int64_t task = static_cast<int64_t>(t) / grid.groups, group = static_cast<int64_t>(t) % grid.groups;
    const int64_t r0 = task * block, rows = std::min<int64_t>(block, total - r0);
    const uint8_t* col = x + r0 * c;
    if (prebuilt) {
      col = rows_built + r0 * kp;
    } else if (!direct) {
      if (scratch.size() < static_cast<size_t>(block * kp)) scratch.resize(static_cast<size_t>(block * kp));
      im2col(x, h, w, c, oh, ow, r0, rows, scratch.data(), static_cast<uint8_t>(xzp), kp);
      col = scratch.data();
    }
    alignas(64) int32_t tile[kMR * kPanel];
    for (int64_t pn = grid.first_panel(group); pn < grid.first_panel(group + 1); ++pn) {
      const int64_t o0 = pn * kPanel;
      const int nch = static_cast<int>(std::min<int64_t>(kPanel, o - o0));
      const int nv = (nch + kLanes - 1) / kLanes;
      const int8_t* bp = packed.data() + pn * kp * kPanel;
      const int64_t h0 = o0 / 2;
      const RqArgs rq{zw.data() + o0, mult.data() + o0, cnst.data() + o0, shift.data() + o0,
                      addend.data() + o0, bmask.data() + o0, zs, lo, hi, nch,
                      mult32.empty() ? nullptr : mult32.data() + o0, ke.data() + h0, ko.data() + h0,
                      se.data() + h0, so.data() + h0, ae.data() + h0, ao.data() + h0, be.data() + h0,
                      bo.data() + h0, f64.fm.empty() ? nullptr : f64.fm.data() + o0,
                      f64.fc.empty() ? nullptr : f64.fc.data() + o0,
                      f32.gm.empty() ? nullptr : f32.gm.data() + o0, f32.gc.empty() ? nullptr : f32.gc.data() + o0,
                      f32.gtc.empty() ? nullptr : f32.gtc.data() + o0 / 4};
      for (int64_t r = 0; r < rows;) {
        if (isa == 2) {  // tiles of kMR2 positions where nv <= 2 and they fill one, else of kMR
          const int mr = static_cast<int>(nv <= 2 && rows - r >= kMR2 ? kMR2 : std::min<int64_t>(kMR, rows - r));
          vnni_kernel(mr, nv, vkind, !mult32.empty())(col + r * kp, kp, bp, kp / 4, rq, y + (r0 + r) * o + o0, o);
          r += mr;
          continue;
        }
        const int mr = static_cast<int>(std::min<int64_t>(kMR, rows - r));
        if (isa == 1) gemm_avxvnni(col + r * kp, kp, bp, kp / 4, tile, mr, nv);
        else gemm_portable(col + r * kp, kp, bp, kp / 4, tile, mr, nv);
        for (int i = 0; i < mr; ++i) {
          uint8_t* yr = y + (r0 + r + i) * o + o0;
          if (!mult32.empty())
            rq_row32(tile + i * kPanel, zw.data() + o0, yr, nch, mult32.data() + o0, cnst.data() + o0,
                     shift.data() + o0, addend.data() + o0, bmask.data() + o0, zs, lo, hi, kind);
          else
            rq_row(tile + i * kPanel, zw.data() + o0, yr, nch, mult.data() + o0, cnst.data() + o0,
                   shift.data() + o0, addend.data() + o0, bmask.data() + o0, zs, lo, hi, kind);
        }
        r += mr;
      }
      // the block's rows of this panel, still in L1 (not right after each tile's store: a load of bytes a
      // masked store just wrote cannot be forwarded and waits for it)
      if (skip != nullptr) residual.rows(y + r0 * o + o0, skip + r0 * o + o0, o, rows, nch, o0);
    }
  });
  if (!res.same) residual.broadcast(conv_out.data(), conv_shape, res, static_cast<uint8_t*>(out.GetTensorMutableRawData()));
}

}  // namespace zonnx_native
