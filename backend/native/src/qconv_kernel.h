// QConvKernel, the kernel of QConv and QConv16 (a whole 8- or 16-bit convolution), and what its translation
// units share: the panel and tile constants, the task grid and the GEMMs of the paths without AVX-512 VNNI.
// Its parts: qconv_create.cpp (attributes, requantization tables, GEMM path, weight packing, the ORT ops),
// qconv_im2col.cpp (the im2col rows), qconv_gemm.cpp (the AVX-VNNI and portable GEMMs), qconv.cpp (the
// 8-bit run with its AVX-512 VNNI micro-kernels), qconv16.cpp (the 16-bit run; micro-kernels in
// qconv16_kernels.h).
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "rq_avx512.h"
#include "zonnx_native.h"

namespace zonnx_native {

constexpr int kMR = 6;      // output positions per micro-tile
constexpr int kMR2 = 12;    // the same for panels of at most 32 channels (NV <= 2) on AVX-512 VNNI
constexpr int kLanes = 16;  // output channels per vector block
constexpr int kNV = 4;      // vector blocks per panel: a panel is 64 output channels
static_assert(kNV == 4, "mk_vnni names four accumulators per row");
constexpr int kPanel = kLanes * kNV;

// The parallel tasks of a conv: blocks of output positions x groups of 64-channel panels. A conv with few
// output positions (a CNN's late layers at batch 1: 7x7 = 49 positions fit one block) would run on one
// thread, so while there are fewer than kMinTasks blocks the panels are split into groups too, each task
// keeping at least kTaskMacs multiply-adds; the im2col rows are then built once for all groups. Every
// output element is computed exactly as with one task, so the split changes speed only.
constexpr int64_t kMinTasks = 8;
constexpr int64_t kTaskMacs = int64_t{1} << 20;

struct TaskGrid {
  int64_t blocks, groups, panels;
  int64_t first_panel(int64_t group) const { return group * panels / groups; }
};

// ``row_macs``: multiply-adds of one output position against one panel.
inline TaskGrid task_grid(int64_t total, int64_t block, int64_t panels, int64_t row_macs) {
  const int64_t blocks = (total + block - 1) / block;
  int64_t groups = 1;
  if (blocks < kMinTasks) {
    const int64_t block_macs = std::min(block, total) * row_macs * panels;
    groups = std::min({panels, (kMinTasks + blocks - 1) / blocks, std::max<int64_t>(1, block_macs / kTaskMacs)});
  }
  return {blocks, groups, panels};
}

// ---- micro-kernels: c[r][j] = sum_{q < kq} sum_{t < 4} a[r][4q + t] b[q][j][t], j < nv 16 --------------
// b is one panel: for each k-quad q, 64 lanes x 4 bytes (lanes beyond the channels hold zero weights).
// The GEMMs without AVX-512 VNNI (qconv_gemm.cpp), shared by QConv and QConv16: c[r][j] (rows kPanel apart)
// = the int32 sums of mr <= 6 rows of a (lda apart) against the first nv 16-lane blocks of the panel b.
void gemm_avxvnni(const uint8_t* a, int64_t lda, const int8_t* b, int64_t kq, int32_t* c, int mr, int nv);
void gemm_portable(const uint8_t* a, int64_t lda, const int8_t* b, int64_t kq, int32_t* c, int mr, int nv);

struct QConvKernel {
  int64_t kh, kw, sh, sw, dh, dw, pt, pl, pb, pr, xzp;
  int64_t zs, lo, hi;
  int kind;
  std::vector<int64_t> mult, cnst, shift, addend, bmask;
  std::vector<int32_t> mult32;  // the multipliers as int32 when all fit, else empty
  int64_t channels = 0;          // output channels (the arrays above are padded to whole panels)
  std::vector<int64_t> ke, ko, se, so, ae, ao, be, bo;  // even / odd channels of each 16-group (rq16_32)
  int isa;  // select_isa() at creation
  // packed weights, made at creation from the constant weight input: panels of 64 channels
  int64_t k = 0, kp = 0, outs = 0;
  std::vector<int8_t> packed;
  std::vector<int32_t> zw;    // xzp sum_k w[k, o]
  std::vector<int64_t> zw64;  // the same in int64 (16-bit inputs: xzp up to 65535)
  bool wide;                  // QConv16: int32-stored 16-bit input codes, int32 output codes
  std::vector<int64_t> xm;    // per channel: max |acc - zw| = xzp-centred input range x sum |w|
  std::vector<int64_t> xa;    // per channel: max |acc| = 255 sum |w| (F32Tables)
  F64Tables f64;              // the float64 requantization where exact (rq_avx512.h)
  F32Tables f32;              // its certified float32 shortcut where the error bound is small (rq_avx512.h)
  int vkind = kPlain;         // the VNNI path's rounding kind: kind, or kF64Floor / kF64Even
  bool direct16 = false;      // QConv16 by compute16_direct (the weights packed in its segments)
  bool w32 = false;           // QConv16 on AVX-512 with int32 multipliers: rq16_wide32 (kwe, kwo)
  std::vector<int64_t> kwe, kwo;  // its K - M zs sum w (+ A for kPlain), even / odd channels of each 16-group
  int64_t kseg = 0;           // weight rows per packed segment (pack)
  ResidualAdd residual;       // a fused residual add on the uint8 output (residual.cpp), if add_* are given

  QConvKernel(const OrtKernelInfo* info, bool wide16);  // qconv_create.cpp
  void pack(const int8_t* w, int64_t kdim, int64_t o, int64_t seg);  // qconv_create.cpp
  void im2col(const uint8_t* x, int64_t h, int64_t w, int64_t c, int64_t oh, int64_t ow, int64_t r0,
              int64_t rows, uint8_t* col, uint8_t pad, int64_t ld) const;  // qconv_im2col.cpp
  void compute16_direct(const Ort::KernelContext& ctx, const int32_t* x, int64_t n, int64_t h, int64_t w,
                        int64_t c, int64_t oh, int64_t ow, int32_t* y, int64_t total) const;  // qconv16.cpp
  void compute16(const Ort::KernelContext& ctx, const int32_t* x, int64_t n, int64_t h, int64_t w, int64_t c,
                 int64_t oh, int64_t ow, int32_t* y, int64_t total) const;  // qconv16.cpp
  void Compute(OrtKernelContext* context);  // qconv.cpp

  OrtStatusPtr ComputeV2(OrtKernelContext* context) { return guarded(this, context); }
};

}  // namespace zonnx_native
