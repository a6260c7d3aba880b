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
#include "simd.h"

#include <algorithm>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <stdexcept>

#include "rq_avx512.h"
#include "zonnx_native.h"


namespace zonnx_native {
namespace {

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
TaskGrid task_grid(int64_t total, int64_t block, int64_t panels, int64_t row_macs) {
  const int64_t blocks = (total + block - 1) / block;
  int64_t groups = 1;
  if (blocks < kMinTasks) {
    const int64_t block_macs = std::min(block, total) * row_macs * panels;
    groups = std::min({panels, (kMinTasks + blocks - 1) / blocks, std::max<int64_t>(1, block_macs / kTaskMacs)});
  }
  return {blocks, groups, panels};
}

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

// ---- micro-kernels: c[r][j] = sum_{q < kq} sum_{t < 4} a[r][4q + t] b[q][j][t], j < nv 16 --------------
// b is one panel: for each k-quad q, 64 lanes x 4 bytes (lanes beyond the channels hold zero weights).

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

// AVX-VNNI (VEX, 256-bit): MR <= 3 positions x one half (32 lanes) of a panel per call, int32 sums to c.
#define ZN_ACC8(r) __m256i d##r##0 = _mm256_setzero_si256(), d##r##1 = d##r##0, d##r##2 = d##r##0, d##r##3 = d##r##0;
#define ZN_ROW8(r)                                                                 \
  if constexpr (MR > r) {                                                          \
    int32_t quad;                                                                  \
    std::memcpy(&quad, a + r * lda + 4 * q, 4);                                    \
    const __m256i av = _mm256_set1_epi32(quad);                                    \
    d##r##0 = _mm256_dpbusd_avx_epi32(d##r##0, av, b0);                            \
    d##r##1 = _mm256_dpbusd_avx_epi32(d##r##1, av, b1);                            \
    d##r##2 = _mm256_dpbusd_avx_epi32(d##r##2, av, b2);                            \
    d##r##3 = _mm256_dpbusd_avx_epi32(d##r##3, av, b3);                            \
  }
#define ZN_STORE8(r)                                                               \
  if constexpr (MR > r) {                                                          \
    int32_t* cr = c + r * kPanel + half * 32;                                      \
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(cr), d##r##0);                  \
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(cr + 8), d##r##1);              \
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(cr + 16), d##r##2);             \
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(cr + 24), d##r##3);             \
  }

template <int MR>
__attribute__((target("avx2,avxvnni"))) void mk_avxvnni(const uint8_t* a, int64_t lda, const int8_t* b, int64_t kq,
                                                       int32_t* c, int half) {
  ZN_ACC8(0) ZN_ACC8(1) ZN_ACC8(2)
  for (int64_t q = 0; q < kq; ++q) {
    const __m256i* bq = reinterpret_cast<const __m256i*>(b + q * kPanel * 4 + half * 128);
    const __m256i b0 = _mm256_loadu_si256(bq), b1 = _mm256_loadu_si256(bq + 1);
    const __m256i b2 = _mm256_loadu_si256(bq + 2), b3 = _mm256_loadu_si256(bq + 3);
    ZN_ROW8(0) ZN_ROW8(1) ZN_ROW8(2)
  }
  ZN_STORE8(0) ZN_STORE8(1) ZN_STORE8(2)
}
#undef ZN_ACC8
#undef ZN_ROW8
#undef ZN_STORE8

// mr <= 6 positions x the lanes of nv 16-lane blocks: row groups of 3, panel halves of 32 lanes.
void gemm_avxvnni(const uint8_t* a, int64_t lda, const int8_t* b, int64_t kq, int32_t* c, int mr, int nv) {
  for (int r = 0; r < mr; r += 3) {
    const int n = std::min(3, mr - r);
    for (int half = 0; half < (nv + 1) / 2; ++half) {
      if (n == 3) mk_avxvnni<3>(a + r * lda, lda, b, kq, c + r * kPanel, half);
      else if (n == 2) mk_avxvnni<2>(a + r * lda, lda, b, kq, c + r * kPanel, half);
      else mk_avxvnni<1>(a + r * lda, lda, b, kq, c + r * kPanel, half);
    }
  }
}

__attribute__((target_clones("arch=x86-64-v3", "default"))) void mk_portable(const uint8_t* a, int64_t lda,
                                                                          const int8_t* b, int64_t kq,
                                                                          int32_t* c, int mr, int nv) {
  const int n = nv * kLanes;  // lanes beyond it hold zero weights
  for (int r = 0; r < mr; ++r) {
    int32_t acc[kPanel] = {0};
    const uint8_t* ar = a + r * lda;
    for (int64_t q = 0; q < kq; ++q) {
      const int32_t x0 = ar[4 * q], x1 = ar[4 * q + 1], x2 = ar[4 * q + 2], x3 = ar[4 * q + 3];
      const int8_t* bq = b + q * kPanel * 4;
      for (int j = 0; j < n; ++j)
        acc[j] += x0 * bq[4 * j] + x1 * bq[4 * j + 1] + x2 * bq[4 * j + 2] + x3 * bq[4 * j + 3];
    }
    std::memcpy(c + r * kPanel, acc, sizeof(int32_t) * static_cast<size_t>(n));
  }
}

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

#include "qconv16_kernels.h"  // QConv16's micro-kernels (byte planes, int64 requantization)

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

// The low and high bytes of n int32-stored 16-bit codes (AVX-512 and baseline clones).
__attribute__((target_clones("arch=x86-64-v4", "default"))) void split_bytes(const int32_t* __restrict x,
                                                                          uint8_t* __restrict lo,
                                                                          uint8_t* __restrict hi, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    lo[i] = static_cast<uint8_t>(x[i] & 255);
    hi[i] = static_cast<uint8_t>((x[i] >> 8) & 255);
  }
}

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

  QConvKernel(const OrtKernelInfo* info, bool wide16) : wide(wide16) {
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
  void pack(const int8_t* w, int64_t kdim, int64_t o, int64_t seg) {
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

  // The im2col rows of output positions [r0, r0 + rows) into col (kp bytes each, tail zero). Positions are
  // taken in runs of one output row; per kernel row i the interior positions of a run (whole kernel row
  // inside the input, dw == 1) copy kw c bytes each with only pointer steps, the edges tap by tap.
  void im2col(const uint8_t* x, int64_t h, int64_t w, int64_t c, int64_t oh, int64_t ow, int64_t r0,
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

  // 16-bit codes on the AVX-512 VNNI path (direct16), with no im2col: the input is split once into its low
  // and high byte planes, each padded (pixel (b, yy, xx) of the padded input at (b hp + yy) wp + xx times C,
  // the pad code's byte outside the input; the high plane hoff bytes after the low one). The k axis of
  // output position (b, oy, ox) is then kernel rows (dw == 1: kw C contiguous bytes) or taps (C bytes), each
  // at the position's base ((b hp + oy sh) wp + ox sw) C plus the segment's offset (i dh wp (+ j dw) times
  // C), the same for every position: mk_vnni16 takes the bases and the offsets. The weights are packed in
  // the same segments, each padded with zero weights to whole quads (pack): the bytes read past a segment's
  // end (the next pixel's, or the zeroed slack after a plane) are multiplied by 0, so the sums are the
  // im2col row's, in the same order.
  void compute16_direct(const Ort::KernelContext& ctx, const int32_t* x, int64_t n, int64_t h, int64_t w,
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
  void compute16(const Ort::KernelContext& ctx, const int32_t* x, int64_t n, int64_t h, int64_t w, int64_t c,
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
            mk_portable(a, row, bp, kp / 4, tlo, mr, nv);
            mk_portable(a + kp, row, bp, kp / 4, thi, mr, nv);
          }
          for (int i = 0; i < mr; ++i)
            rq16_row(tlo + i * kPanel, thi + i * kPanel, y + (r0 + r + i) * o + o0, nch, zw64.data() + o0,
                     mult.data() + o0, cnst.data() + o0, shift.data() + o0, addend.data() + o0, bmask.data() + o0,
                     zs, lo, hi, kind);
        }
      }
    });
  }

  void Compute(OrtKernelContext* context) {
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
          else mk_portable(col + r * kp, kp, bp, kp / 4, tile, mr, nv);
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

  OrtStatusPtr ComputeV2(OrtKernelContext* context) { return guarded(this, context); }
};

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
