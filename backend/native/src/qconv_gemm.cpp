// The GEMMs of QConv's paths without AVX-512 VNNI, shared by QConv and QConv16 (declared in qconv_kernel.h):
// AVX-VNNI (vpdpbusd on 256-bit VEX registers) and portable C++ (compiled for x86-64-v3 and the baseline,
// picked at load). Both write the exact int32 sums of a tile; the caller requantizes them.
#include "simd.h"

#include <algorithm>
#include <cstring>

#include "qconv_kernel.h"

namespace zonnx_native {
namespace {

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

}  // namespace

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

// mk_portable for the other translation units: its target_clones dispatch stays file-local (GCC 12 gives
// the ifunc resolver of an external target_clones function default visibility, exporting it).
void gemm_portable(const uint8_t* a, int64_t lda, const int8_t* b, int64_t kq, int32_t* c, int mr, int nv) {
  mk_portable(a, lda, b, kq, c, mr, nv);
}

}  // namespace zonnx_native
