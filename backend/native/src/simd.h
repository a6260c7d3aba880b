// <immintrin.h> with GCC 12's -Wuninitialized false positive silenced inside it: some of its intrinsics
// (_mm512_cvtepi32_pd, _mm512_extracti64x4_epi64, ...) start from a self-initialized placeholder
// (`__m256d __Y = __Y;`), which GCC then reports at every inlined use. Only warnings located in the
// header are silenced; an uninitialized read in zonnx's own code still warns.
#pragma once

#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#include <immintrin.h>
#pragma GCC diagnostic pop
