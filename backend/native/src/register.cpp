// Library entry points: RegisterCustomOps (ORT's custom-op library contract) and the ABI version.
#include <mutex>

#include "zonnx_native.h"

using namespace zonnx_native;

extern "C" {

__attribute__((visibility("default"))) int64_t ZonnxNativeAbiVersion() { return kAbiVersion; }

// The GEMM path of QConv kernels created now (qconv_isa): 2 = AVX-512 VNNI, 1 = AVX-VNNI, 0 = portable.
__attribute__((visibility("default"))) int64_t ZonnxNativeConvIsa() { return qconv_isa(); }

__attribute__((visibility("default"))) OrtStatus* ORT_API_CALL RegisterCustomOps(OrtSessionOptions* options,
                                                                                const OrtApiBase* api_base) {
  const OrtApi* api = api_base ? api_base->GetApi(17) : nullptr;
  if (api == nullptr) return nullptr;  // cannot report without an API; the loader checks the ops exist
  Ort::InitApi(api);
  // One domain for the process: it holds only pointers to immutable op descriptions.
  static OrtCustomOpDomain* domain = nullptr;
  static OrtStatus* failed = nullptr;
  static std::once_flag once;
  std::call_once(once, [&] {
    if ((failed = api->CreateCustomOpDomain(kDomain, &domain)) != nullptr) return;
    for (const OrtCustomOp* op : {requant_u8_op(), requant_i32_op(), im2col_op(), byteplane_op(), dwconv_op(), qdwconv_op(), qconv_op(), qconv16_op(),
                                 maxpool_i32_op(), maxpool_u8_op(), int8_to_u8_op(), sum_hw_u8_op()}) {
      if ((failed = api->CustomOpDomain_Add(domain, op)) != nullptr) return;
    }
  });
  if (failed != nullptr) return api->CreateStatus(api->GetErrorCode(failed), api->GetErrorMessage(failed));
  return api->AddCustomOpDomain(options, domain);
}

}  // extern "C"
