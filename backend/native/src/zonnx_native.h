// zonnx native NPU kernels: shared declarations.
// Every kernel computes exact integers, so its results do not depend on the CPU's instruction set: integer
// C++, plus one float64 form of the requantization on AVX-512 (rq_avx512.h) used only where a per-channel
// bound proves every value it forms exactly representable, and a float32 form whose every rounded value is
// certified by an error bound (else recomputed exactly); the build may add runtime-dispatched clones
// for wider vector units.
#pragma once

#define ORT_API_MANUAL_INIT
#include "onnxruntime_cxx_api.h"

#include <cstdint>
#include <exception>
#include <string>
#include <vector>

namespace zonnx_native {

// Bumped whenever an op's inputs, attributes or semantics change; checked by the Python loader.
constexpr int64_t kAbiVersion = 8;
constexpr const char* kDomain = "zonnx.native";

// Runs fn(i) for i in [0, total) on the session's intra-op thread pool.
template <typename F>
void parallel_for(const Ort::KernelContext& ctx, size_t total, F&& fn) {
  if (total == 0) return;
  if (total == 1) {
    fn(size_t{0});
    return;
  }
  struct Thunk {
    F* f;
    static void call(void* data, size_t i) { (*static_cast<Thunk*>(data)->f)(i); }
  } thunk{&fn};
  ctx.ParallelFor(&Thunk::call, total, 0, &thunk);
}

// Every kernel's ComputeV2: runs k->Compute; a C++ exception becomes one ORT_FAIL status that names the
// library (never an exception through ORT's C API).
template <typename K>
OrtStatusPtr guarded(K* k, OrtKernelContext* context) {
  try {
    k->Compute(context);
    return nullptr;
  } catch (const std::exception& e) {
    return Ort::GetApi().CreateStatus(ORT_FAIL, (std::string("zonnx.native ") + e.what()).c_str());
  }
}

// An op of one input and one output with fixed element types (UNDEFINED: any), named at registration;
// a kernel constructor that throws (bad attributes) becomes ORT_INVALID_ARGUMENT.
template <typename Kernel, ONNXTensorElementDataType In, ONNXTensorElementDataType Out>
struct UnaryOp : Ort::CustomOpBase<UnaryOp<Kernel, In, Out>, Kernel, true> {
  const char* name;
  explicit UnaryOp(const char* n) : name(n) {}
  OrtStatusPtr CreateKernelV2(const OrtApi& api, const OrtKernelInfo* info, void** kernel) const {
    try {
      *kernel = new Kernel(info);
      return nullptr;
    } catch (const std::exception& e) {
      return api.CreateStatus(ORT_INVALID_ARGUMENT, (std::string("zonnx.native ") + e.what()).c_str());
    }
  }
  const char* GetName() const { return name; }
  size_t GetInputTypeCount() const { return 1; }
  ONNXTensorElementDataType GetInputType(size_t) const { return In; }
  size_t GetOutputTypeCount() const { return 1; }
  ONNXTensorElementDataType GetOutputType(size_t) const { return Out; }
};

// Elements per parallel task (at least): below this a tensor runs on the calling thread.
constexpr int64_t kGrain = 16384;

struct RequantOp;
struct Im2colOp;
struct BytePlaneOp;
const OrtCustomOp* requant_u8_op();
const OrtCustomOp* requant_i32_op();
const OrtCustomOp* im2col_op();
const OrtCustomOp* byteplane_op();
const OrtCustomOp* dwconv_op();
const OrtCustomOp* qdwconv_op();
const OrtCustomOp* qconv_op();
const OrtCustomOp* qconv16_op();
const OrtCustomOp* maxpool_i32_op();
const OrtCustomOp* maxpool_u8_op();
const OrtCustomOp* int8_to_u8_op();
const OrtCustomOp* sum_hw_u8_op();
// The GEMM path QConv kernels created now take: 2 = AVX-512 VNNI, 1 = AVX-VNNI, 0 = portable ($ZONNX_NATIVE_ISA).
int qconv_isa();

int64_t element_count(const std::vector<int64_t>& shape);

// ---- the requantization tail, shared by every kernel ---------------------------------------------------
// The seven rounding modes of requant.rshift_round, in the order of ROUND_MODES.
enum RoundMode { kHalfUp, kHalfEven, kHalfAway, kHalfDown, kFloor, kCeil, kTrunc };

// The int64 loops round with one shift: y = (p + A + sel) >> s, where sel is 0 (floor, ceil, half_up,
// half_down: kPlain), the parity of floor(p / 2^s) (half_even: sel = (p >> s) & B, A = 2^(s-1) - 1: kParity),
// or a sign correction (half_away: sel = -[p < 0], A = 2^(s-1); trunc: sel = [p < 0] (2^s - 1), A = 0:
// kSign), B masking it. This is floor division with the remainder compared to half, rewritten without
// comparisons (so it vectorizes); with s == 0, A = B = 0 and y = p. |p| < 2^62 and A < 2^62 keep p + A + sel
// inside int64.
enum RoundKind { kPlain, kParity, kSign };

// The addend A and mask B of a rounding mode for shift s in [0, 62] (the rule above).
struct RoundParams {
  int64_t addend, bmask;
};
inline RoundParams round_params(int mode, int64_t s) {
  const int64_t half = s > 0 ? (int64_t{1} << (s - 1)) : 0, full = (int64_t{1} << s) - 1;
  switch (mode) {
    case kHalfUp: return {half, 0};
    case kHalfEven: return {s > 0 ? half - 1 : 0, s > 0 ? 1 : 0};
    case kHalfAway: return {half, s > 0 ? -1 : 0};
    case kHalfDown: return {s > 0 ? half - 1 : 0, 0};
    case kFloor: return {0, 0};
    case kCeil: return {full, 0};
    default: return {0, full};  // trunc
  }
}
inline int round_kind(int mode) {
  return mode == kHalfEven ? kParity : ((mode == kHalfAway || mode == kTrunc) ? kSign : kPlain);
}

// The float64 form of a two-term uint8 requantization (requant_f64.cpp): per channel f1 = M1 2^-s,
// f2 = M2 2^-s, fc = K' 2^-s and the rounding form; build() is false (tables empty) where a channel's
// bound does not prove the form exact, and the int64 loops then run.
struct Rq2Tables {
  std::vector<double> f1, f2, fc;
  int rounding = 0;
  bool build(const int64_t* m1, const int64_t* m2, const int64_t* k, const int64_t* s, const int64_t* a, size_t n,
             int mode, int64_t zs, int64_t lo, int64_t hi);
};
// y[j] for n elements of x1, x2 (uint8): channel c0 + j (lanes) or c0 for all; needs AVX-512.
void rq2_row(const Rq2Tables& t, const uint8_t* x1, const uint8_t* x2, uint8_t* y, int64_t n, int64_t c0, bool lanes,
             int64_t zs, int64_t lo, int64_t hi);

// A QConv's skip tensor at run time (ResidualAdd::input): its codes and shape, and the output's shape.
struct ResidualInput {
  const uint8_t* skip = nullptr;
  std::vector<int64_t> skip_shape, out_shape;
  bool same = true;  // the skip tensor has the conv output's shape: added row by row in the epilogue
};

// The residual add fused into a QConv (residual.cpp): RequantU8's two-term rule over the conv's uint8 output
// code and a skip tensor's, y = clamp(R((M1[c] v + M2[c] x + K[c]) / 2^s[c]) + zs, lo, hi).
struct ResidualAdd {
  bool active = false;  // the node has the add_* attributes (and input 2)
  bool lanes = false;   // per channel along C (else one set for every element)
  std::vector<int64_t> m1, m2, k, s, a, b;  // per channel, padded to whole panels (or one entry)
  int kind = 0;
  int64_t zs = 0, lo = 0, hi = 0;
  Rq2Tables f64;
  bool use_f64 = false;
  std::vector<int32_t> m1w, m2w, kw, sw, aw, bw;  // the int32 form (every value of the rule fits int32)
  bool use_i32 = false;
  int32_t pair_a = 0, pair_b = 0, pair_kh = 0, pair_kl = 0;  // the pair form (residual.cpp)
  bool use_pair = false;
  // Reads the add_* attributes (none: inactive); channels: the conv's outputs, padded: their panel-padded count;
  // avx512: the float64 form may run (QConv's AVX-512 VNNI path, as RequantU8 picks it).
  void init(const Ort::ConstKernelInfo& ki, int64_t channels, size_t padded, bool avx512);
  // Input 2 checked against the attributes (present iff active, uint8) and the conv output's shape.
  ResidualInput input(const Ort::KernelContext& ctx, const std::vector<int64_t>& conv_shape) const;
  // In place on mr rows ld bytes apart: y[i][j] = rule(y[i][j], x[i][j]) for the n channels from c0.
  void rows(uint8_t* y, const uint8_t* x, int64_t ld, int64_t mr, int64_t n, int64_t c0) const;
  void rows_i32(uint8_t* y, const uint8_t* x, int64_t ld, int64_t mr, int64_t n, int64_t c) const;  // int32 form
  // y (of in.out_shape) = rule(v, skip) with numpy broadcasting, v the finished conv output of conv_shape.
  void broadcast(const uint8_t* v, const std::vector<int64_t>& conv_shape, const ResidualInput& in, uint8_t* y) const;
};

// clamp(((p + A + sel) >> s) + zs, lo, hi) for p = M x + K already formed: the one requantization tail
// every kernel (Requant, QConv, QDwConv) applies per element.
template <int KIND>
inline __attribute__((always_inline)) int64_t requant_tail(int64_t p, int64_t s, int64_t a, int64_t b, int64_t zs,
                                                           int64_t lo, int64_t hi) {
  const int64_t sel = KIND == kPlain ? 0 : ((KIND == kParity ? (p >> s) : (p >> 63)) & b);
  const int64_t v = ((p + a + sel) >> s) + zs;
  return v < lo ? lo : (v > hi ? hi : v);
}

}  // namespace zonnx_native
