// QDwConv's interior-run AVX-512 VNNI kernels (dwconv_kernel.h): dw_vnni_run3 over a run of interior output
// pixels of a layer with at most 12 taps in the float64 requantization form, and its dispatch dw_run_for.
#include "simd.h"

#include "dwconv_kernel.h"

namespace zonnx_native {
namespace {

// A run of interior output pixels of a layer with at most 12 taps (3 quads: 3x3 and smaller) whose kernel
// rows all lie inside the input, in the float64 requantization form: tap t of the run's pixel i is at
// x0 + i step + off[t] (taps beyond the layer's hold zero weights and read a zero vector instead), so no
// per-pixel pointer table is kept; per 64-channel block the twelve weight vectors stay in registers while
// the pixels stream by. The same sums and requantization as dw_vnni_pixel. LOAD kOne: one pixel per step;
// kPairRun / kPairSplit (32 channels): two adjacent pixels per step (lanes 32-63: the next pixel's taps,
// at +32 bytes for stride 1, at + step otherwise).
template <int KIND, int LOAD>
__attribute__((target("avx512f,avx512bw,avx512dq,avx512vnni"))) void dw_vnni_run3(
    const DwVnni& v, const uint8_t* x0, const int64_t* off, int64_t step, int64_t count, int64_t c, uint8_t* y,
    int64_t zs, int64_t lo, int64_t hi) {
  const int taps = static_cast<int>(v.taps);
  const int64_t per = LOAD == kOne ? 1 : 2;  // output pixels per step
  const int64_t blocks = LOAD == kOne ? v.blocks : 1;
  for (int64_t bl = 0; bl < blocks; ++bl) {
    const int64_t c0 = 64 * bl, left = (LOAD == kOne ? c : 64) - c0;
    const __mmask64 mask = left >= 64 ? ~__mmask64(0) : ((__mmask64(1) << left) - 1);
    const int8_t* wb = v.wq.data() + bl * v.quads * 256;
    __m512i w[3][4];
    for (int g = 0; g < 3; ++g)
      for (int q = 0; q < 4; ++q)
        w[g][q] = g < v.quads ? _mm512_loadu_si512(wb + g * 256 + q * 64) : _mm512_setzero_si512();
    const RqArgs rq = v.args(bl, zs, lo, hi);
    const uint8_t* p = x0 + c0;
    uint8_t* yo = y + c0;
    for (int64_t i = 0; i < count; ++i, p += per * step, yo += per * c) {
      __m512i acc[4] = {_mm512_setzero_si512(), _mm512_setzero_si512(), _mm512_setzero_si512(),
                        _mm512_setzero_si512()};
      for (int g = 0; g < 3; ++g) {
        __m512i x[4];
        for (int e = 0; e < 4; ++e) {
          const int t = 4 * g + e;
          if (t >= taps) {
            x[e] = _mm512_setzero_si512();
          } else if constexpr (LOAD == kOne) {
            x[e] = _mm512_maskz_loadu_epi8(mask, p + off[t]);
          } else if constexpr (LOAD == kPairRun) {
            x[e] = _mm512_loadu_si512(p + off[t]);
          } else {
            const __m256i lo8 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + off[t]));
            const __m256i hi8 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + off[t] + step));
            x[e] = _mm512_inserti64x4(_mm512_castsi256_si512(lo8), hi8, 1);
          }
        }
        const __m512i ab0 = _mm512_unpacklo_epi8(x[0], x[1]), ab1 = _mm512_unpackhi_epi8(x[0], x[1]);
        const __m512i cd0 = _mm512_unpacklo_epi8(x[2], x[3]), cd1 = _mm512_unpackhi_epi8(x[2], x[3]);
        acc[0] = _mm512_dpbusd_epi32(acc[0], _mm512_unpacklo_epi16(ab0, cd0), w[g][0]);
        acc[1] = _mm512_dpbusd_epi32(acc[1], _mm512_unpackhi_epi16(ab0, cd0), w[g][1]);
        acc[2] = _mm512_dpbusd_epi32(acc[2], _mm512_unpacklo_epi16(ab1, cd1), w[g][2]);
        acc[3] = _mm512_dpbusd_epi32(acc[3], _mm512_unpackhi_epi16(ab1, cd1), w[g][3]);
      }
      const __m512i out = rq64_f64<KIND, 4>(acc[0], acc[1], acc[2], acc[3], rq);
      _mm512_mask_storeu_epi8(yo, mask, out);
    }
  }
}

}  // namespace

// The run kernel for a rounding kind and load form, or null where it does not apply (not a float64 kind).
DwRunFn dw_run_for(int kind, int load) {
  if (kind != kF64Floor && kind != kF64Even) return nullptr;
  const bool fl = kind == kF64Floor;
  if (load == kPairRun) return fl ? dw_vnni_run3<kF64Floor, kPairRun> : dw_vnni_run3<kF64Even, kPairRun>;
  if (load == kPairSplit) return fl ? dw_vnni_run3<kF64Floor, kPairSplit> : dw_vnni_run3<kF64Even, kPairSplit>;
  return fl ? dw_vnni_run3<kF64Floor, kOne> : dw_vnni_run3<kF64Even, kOne>;
}

}  // namespace zonnx_native
