// Test entry points for converters.cuh: apply one converter to every word of an array and store
// the resulting pairs' raw bits, so the GPU tests can check every input pattern exactly.
//   int4 converters: word i -> out[4i .. 4i+3] (pairs (e0,e1), (e2,e3), (e4,e5), (e6,e7))
//   int8 converters: word i -> out[2i .. 2i+1] (pairs (e0,e1), (e2,e3))
#include "common.cuh"
#include "converters.cuh"

namespace {

template <int kPairs, void (*kConvert)(uint32_t, uint32_t (&)[kPairs])>
__device__ __forceinline__ void convert_words(const uint32_t* __restrict__ words, uint32_t* __restrict__ out, int n) {
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
    uint32_t pairs[kPairs];
    kConvert(words[i], pairs);
#pragma unroll
    for (int j = 0; j < kPairs; ++j) out[static_cast<int64_t>(i) * kPairs + j] = pairs[j];
  }
}

}  // namespace

#define CONVERTER_TEST_ENTRY(name, pairs, fn)                                                  \
  extern "C" __global__ void name(const uint32_t* words, uint32_t* out, int n) {             \
    convert_words<pairs, cuops::fn>(words, out, n);                                            \
  }

CONVERTER_TEST_ENTRY(test_int4s_to_half2x4, 4, int4s_to_half2x4)
CONVERTER_TEST_ENTRY(test_uint4s_to_half2x4, 4, uint4s_to_half2x4)
CONVERTER_TEST_ENTRY(test_int4s_to_bf162x4, 4, int4s_to_bf162x4)
CONVERTER_TEST_ENTRY(test_uint4s_to_bf162x4, 4, uint4s_to_bf162x4)
CONVERTER_TEST_ENTRY(test_int8s_to_half2x2, 2, int8s_to_half2x2)
CONVERTER_TEST_ENTRY(test_uint8s_to_half2x2, 2, uint8s_to_half2x2)
CONVERTER_TEST_ENTRY(test_int8s_to_bf162x2, 2, int8s_to_bf162x2)
CONVERTER_TEST_ENTRY(test_uint8s_to_bf162x2, 2, uint8s_to_bf162x2)
