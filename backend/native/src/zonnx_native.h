// zonnx native NPU kernels: shared declarations.
// Every kernel is pure integer C++ (no floating point), so its results do not depend on the CPU's
// instruction set; the build may add runtime-dispatched clones for wider vector units.
#pragma once

#define ORT_API_MANUAL_INIT
#include "onnxruntime_cxx_api.h"

#include <cstdint>
#include <string>
#include <vector>

namespace zonnx_native {

// Bumped whenever an op's inputs, attributes or semantics change; checked by the Python loader.
constexpr int64_t kAbiVersion = 3;
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
const OrtCustomOp* qconv_op();
// The GEMM path QConv kernels created now take: 2 = AVX-512 VNNI, 1 = AVX-VNNI, 0 = portable ($ZONNX_NATIVE_ISA).
int qconv_isa();

int64_t element_count(const std::vector<int64_t>& shape);

}  // namespace zonnx_native
