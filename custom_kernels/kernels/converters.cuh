// Fast integer -> fp16 / bf16 converters for weight-only kernels (no I2F instructions).
//
// Every converter turns one 32-bit word of packed weights into pairs (x2 vectors, returned as
// raw uint32 bit patterns) holding the integer values exactly:
//   int4, INTERLEAVED order (cutlass_ops.formats): nibble i of the word holds element
//     [0,2,4,6,1,3,5,7][i] of 8 consecutive K elements, so masking nibbles (0,4), (1,5), (2,6),
//     (3,7) yields the pairs (e0,e1), (e2,e3), (e4,e5), (e6,e7) in order -> out[4].
//   int8 / uint8, natural order: byte i = element i -> pairs (e0,e1), (e2,e3) -> out[2].
// Signed int4 is stored biased, u = q + 8 in [0, 15]; the "-8" is folded into the subtraction.
// The AWQ-style unsigned variants return u itself.
#pragma once

#include "common.cuh"

namespace cuops {

// lop3 immediate of F(a, b, c) = (a & b) | c: F applied to the canonical operands a=0xF0, b=0xCC, c=0xAA.
constexpr uint32_t kLop3AndOr = (0xF0 & 0xCC) | 0xAA;

// (x & kMask) | kMagic in one instruction: drop the selected nibbles into the mantissa of a magic float.
template <uint32_t kMask, uint32_t kMagic>
__device__ __forceinline__ uint32_t lop3_and_or(uint32_t x) {
  uint32_t r;
  asm("lop3.b32 %0, %1, %2, %3, %4;\n" : "=r"(r) : "r"(x), "n"(kMask), "n"(kMagic), "n"(kLop3AndOr));
  return r;
}

// prmt: byte j of the result is byte selector[4j+3:4j] of the 8-byte pair {b, a} (a = bytes 0..3).
__device__ __forceinline__ uint32_t prmt(uint32_t a, uint32_t b, uint32_t selector) {
  uint32_t r;
  asm("prmt.b32 %0, %1, %2, %3;\n" : "=r"(r) : "r"(a), "r"(b), "r"(selector));
  return r;
}

__device__ __forceinline__ uint32_t sub_f16x2(uint32_t a, uint32_t b) {
  uint32_t r;
  asm("sub.f16x2 %0, %1, %2;\n" : "=r"(r) : "r"(a), "r"(b));
  return r;
}

__device__ __forceinline__ uint32_t fma_f16x2(uint32_t a, uint32_t b, uint32_t c) {
  uint32_t r;
  asm("fma.rn.f16x2 %0, %1, %2, %3;\n" : "=r"(r) : "r"(a), "r"(b), "r"(c));
  return r;
}

// bf16x2 arithmetic exists from sm_80 (fma.rn.bf16x2); older targets go through fp32.
__device__ __forceinline__ uint32_t fma_bf16x2(uint32_t a, uint32_t b, uint32_t c) {
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800
  uint32_t r;
  asm("fma.rn.bf16x2 %0, %1, %2, %3;\n" : "=r"(r) : "r"(a), "r"(b), "r"(c));
  return r;
#else
  // bf16 is the top half of an fp32: widen, compute in fp32, round back to nearest even.
  const float a0 = __uint_as_float(a << 16), a1 = __uint_as_float(a & 0xffff0000u);
  const float b0 = __uint_as_float(b << 16), b1 = __uint_as_float(b & 0xffff0000u);
  const float c0 = __uint_as_float(c << 16), c1 = __uint_as_float(c & 0xffff0000u);
  __nv_bfloat162 r = __floats2bfloat162_rn(fmaf(a0, b0, c0), fmaf(a1, b1, c1));
  return *reinterpret_cast<uint32_t*>(&r);
#endif
}

// ---------------------------------------------------------------------------------------------
// int4 -> fp16
// ---------------------------------------------------------------------------------------------

// fp16 0x6400 = 1024.0 has exponent 2^10 and a 10-bit mantissa whose unit is 1, so
// 0x6400 | n == 1024 + n for n < 1024: OR-ing a nibble in converts it to fp16 exactly.
constexpr uint32_t kF16Magic1024 = 0x64006400;
constexpr uint32_t kLowNibbles = 0x000f000f;   // nibbles 0 and 4 of the word: one per fp16 half
constexpr uint32_t kHighNibbles = 0x00f000f0;  // nibbles 1 and 5: land at mantissa bit 4, i.e. 16 * n

template <bool kSigned>
__device__ __forceinline__ void int4_to_half2x4_impl(uint32_t w, uint32_t (&out)[4]) {
  // Shift once so nibbles (2,6) and (3,7) take the places of (0,4) and (1,5).
  const uint32_t w_hi = w >> 8;
  out[0] = lop3_and_or<kLowNibbles, kF16Magic1024>(w);     // {1024 + u0, 1024 + u1}
  out[1] = lop3_and_or<kHighNibbles, kF16Magic1024>(w);    // {1024 + 16 u2, 1024 + 16 u3}
  out[2] = lop3_and_or<kLowNibbles, kF16Magic1024>(w_hi);  // {1024 + u4, 1024 + u5}
  out[3] = lop3_and_or<kHighNibbles, kF16Magic1024>(w_hi); // {1024 + 16 u6, 1024 + 16 u7}
  // Signed: subtract 1032 = 1024 + 8 (fp16 0x6408), removing the magic and the +8 bias at once.
  // Unsigned (AWQ): subtract only the magic 1024 (0x6400).
  constexpr uint32_t kSub = kSigned ? 0x64086408 : 0x64006400;
  // fp16 0x2c00 = 1/16 undoes the 4-bit shift of the high nibbles: (1024 + 16u)/16 = 64 + u.
  constexpr uint32_t kOneSixteenth = 0x2c002c00;
  // Then add -72 (fp16 0xd480) = -(64 + 8) for signed, or -64 (0xd400) for unsigned, in the same fma.
  constexpr uint32_t kNegBias = kSigned ? 0xd480d480 : 0xd400d400;
  out[0] = sub_f16x2(out[0], kSub);
  out[1] = fma_f16x2(out[1], kOneSixteenth, kNegBias);
  out[2] = sub_f16x2(out[2], kSub);
  out[3] = fma_f16x2(out[3], kOneSixteenth, kNegBias);
}

// Interleaved int4 word (u = q + 8) -> q as fp16 pairs (e0,e1), (e2,e3), (e4,e5), (e6,e7).
__device__ __forceinline__ void int4s_to_half2x4(uint32_t w, uint32_t (&out)[4]) {
  int4_to_half2x4_impl<true>(w, out);
}

// Interleaved uint4 word (AWQ: values u in [0, 15]) -> u as fp16 pairs.
__device__ __forceinline__ void uint4s_to_half2x4(uint32_t w, uint32_t (&out)[4]) {
  int4_to_half2x4_impl<false>(w, out);
}

// ---------------------------------------------------------------------------------------------
// int4 -> bf16
// ---------------------------------------------------------------------------------------------

// bf16 0x4300 = 128.0 has exponent 2^7 and a 7-bit mantissa whose unit is 1: 0x4300 | n == 128 + n
// for n < 128. Only the low nibble fits below bit 7, so each nibble pair is shifted down (no fma trick).
constexpr uint32_t kBf16Magic128 = 0x43004300;
constexpr uint32_t kBf16One = 0x3f803f80;  // bf16 {1.0, 1.0}: turns fma into a subtraction (no sub.bf16x2 before sm_90)

template <bool kSigned>
__device__ __forceinline__ void int4_to_bf162x4_impl(uint32_t w, uint32_t (&out)[4]) {
  out[0] = lop3_and_or<kLowNibbles, kBf16Magic128>(w);        // {128 + u0, 128 + u1}
  out[1] = lop3_and_or<kLowNibbles, kBf16Magic128>(w >> 4);   // {128 + u2, 128 + u3}
  out[2] = lop3_and_or<kLowNibbles, kBf16Magic128>(w >> 8);   // {128 + u4, 128 + u5}
  out[3] = lop3_and_or<kLowNibbles, kBf16Magic128>(w >> 12);  // {128 + u6, 128 + u7}
  // Signed: add -136 (bf16 0xc308) = -(128 + 8); unsigned: add -128 (bf16 0xc300). Exact: results are small ints.
  constexpr uint32_t kNegBias = kSigned ? 0xc308c308 : 0xc300c300;
#pragma unroll
  for (int i = 0; i < 4; ++i) out[i] = fma_bf16x2(out[i], kBf16One, kNegBias);
}

// Interleaved int4 word (u = q + 8) -> q as bf16 pairs (e0,e1), (e2,e3), (e4,e5), (e6,e7).
__device__ __forceinline__ void int4s_to_bf162x4(uint32_t w, uint32_t (&out)[4]) {
  int4_to_bf162x4_impl<true>(w, out);
}

// Interleaved uint4 word (values u) -> u as bf16 pairs.
__device__ __forceinline__ void uint4s_to_bf162x4(uint32_t w, uint32_t (&out)[4]) {
  int4_to_bf162x4_impl<false>(w, out);
}

// ---------------------------------------------------------------------------------------------
// int8 -> fp16
// ---------------------------------------------------------------------------------------------

// fp16 0x64 high byte: byte 0x64 followed by a data byte n is the fp16 1024 + n (n < 256 < 1024).
constexpr uint32_t kF16MagicBytes = 0x64646464;
// prmt selectors (bytes 4..7 are the magic word): {byte0, 0x64, byte1, 0x64} and {byte2, 0x64, byte3, 0x64}.
constexpr uint32_t kSelectElt01 = 0x5150;
constexpr uint32_t kSelectElt23 = 0x5352;
// XOR of the sign bits maps signed q to the unsigned byte q + 128 (two's complement bias trick).
constexpr uint32_t kFlipSignBits = 0x80808080;

template <bool kSigned>
__device__ __forceinline__ void int8_to_half2x2_impl(uint32_t w, uint32_t (&out)[2]) {
  const uint32_t u = kSigned ? (w ^ kFlipSignBits) : w;
  out[0] = prmt(u, kF16MagicBytes, kSelectElt01);  // {1024 + u0, 1024 + u1}
  out[1] = prmt(u, kF16MagicBytes, kSelectElt23);  // {1024 + u2, 1024 + u3}
  // Signed: subtract 1152 = 1024 + 128 (fp16 0x6480); unsigned: subtract 1024 (0x6400).
  constexpr uint32_t kSub = kSigned ? 0x64806480 : 0x64006400;
  out[0] = sub_f16x2(out[0], kSub);
  out[1] = sub_f16x2(out[1], kSub);
}

// Four int8 (bytes e0..e3) -> fp16 pairs (e0,e1), (e2,e3).
__device__ __forceinline__ void int8s_to_half2x2(uint32_t w, uint32_t (&out)[2]) {
  int8_to_half2x2_impl<true>(w, out);
}

// Four uint8 -> fp16 pairs.
__device__ __forceinline__ void uint8s_to_half2x2(uint32_t w, uint32_t (&out)[2]) {
  int8_to_half2x2_impl<false>(w, out);
}

// ---------------------------------------------------------------------------------------------
// int8 -> bf16
// ---------------------------------------------------------------------------------------------

// Unsigned: bf16 has only 7 mantissa bits, too few for a byte, so go through fp32: 0x4B000000 = 2^23 has a
// mantissa unit of 1, and prmt writes a data byte into its lowest byte -> the float 2^23 + n.
constexpr uint32_t kF32Magic2p23 = 0x4B000000;
// Selector {byte i, 0x00, 0x00, 0x4B} = 0x7650 + i: bytes 5, 6, 7 of the pair are the magic's 0x00, 0x00, 0x4B.
constexpr uint32_t kSelectToF32 = 0x7650;
// prmt {a.byte2, a.byte3, b.byte2, b.byte3}: the upper halves of two fp32 = their bf16 truncation,
// exact here because the values are integers of at most 8 significant bits.
constexpr uint32_t kSelectHighHalves = 0x7632;

// Four uint8 -> bf16 pairs.
__device__ __forceinline__ void uint8s_to_bf162x2(uint32_t w, uint32_t (&out)[2]) {
  float f[4];  // 2^23 + u - 2^23: exact
#pragma unroll
  for (int i = 0; i < 4; ++i) f[i] = __uint_as_float(prmt(w, kF32Magic2p23, kSelectToF32 + i)) - 8388608.0f;
  out[0] = prmt(__float_as_uint(f[0]), __float_as_uint(f[1]), kSelectHighHalves);
  out[1] = prmt(__float_as_uint(f[2]), __float_as_uint(f[3]), kSelectHighHalves);
}

// Signed int8 without fp32 (8 instructions per word against 11): the low 7 bits m of a byte under a 0x43 high byte are
// the bf16 128 + m; its sign bit s under the same high byte is 0x4300 = 128 or 0x4380 = 256, i.e. 128 + 128 s; the
// difference m - 128 s is q (two's complement). Exact: every value is a small integer.
constexpr uint32_t kBf16HighBytes = 0x43434343;
constexpr uint32_t kBf16MinusOne = 0xbf80bf80;  // bf16 {-1.0, -1.0}: fma(b, -1, a) = a - b

// Four int8 -> bf16 pairs (e0,e1), (e2,e3).
__device__ __forceinline__ void int8s_to_bf162x2(uint32_t w, uint32_t (&out)[2]) {
  const uint32_t low7 = w & 0x7f7f7f7fu, sign = w & 0x80808080u;
  // prmt selectors {byte i, 0x43, byte i + 1, 0x43} as for fp16 (bytes 4..7 are the 0x43 word).
  const uint32_t value01 = prmt(low7, kBf16HighBytes, kSelectElt01), bias01 = prmt(sign, kBf16HighBytes, kSelectElt01);
  const uint32_t value23 = prmt(low7, kBf16HighBytes, kSelectElt23), bias23 = prmt(sign, kBf16HighBytes, kSelectElt23);
  out[0] = fma_bf16x2(bias01, kBf16MinusOne, value01);
  out[1] = fma_bf16x2(bias23, kBf16MinusOne, value23);
}

// ---------------------------------------------------------------------------------------------
// Typed front end for the kernels: one word of the stored weight format -> pairs of T holding q.
// ---------------------------------------------------------------------------------------------

template <typename T, int kBits> struct WeightWord;

template <> struct WeightWord<__half, 4> {
  static constexpr int kPairs = 4;  // 8 int4 per word
  static __device__ __forceinline__ void to_pairs(uint32_t w, uint32_t (&out)[4]) { int4s_to_half2x4(w, out); }
};
template <> struct WeightWord<__nv_bfloat16, 4> {
  static constexpr int kPairs = 4;
  static __device__ __forceinline__ void to_pairs(uint32_t w, uint32_t (&out)[4]) { int4s_to_bf162x4(w, out); }
};
template <> struct WeightWord<__half, 8> {
  static constexpr int kPairs = 2;  // 4 int8 per word
  static __device__ __forceinline__ void to_pairs(uint32_t w, uint32_t (&out)[2]) { int8s_to_half2x2(w, out); }
};
template <> struct WeightWord<__nv_bfloat16, 8> {
  static constexpr int kPairs = 2;
  static __device__ __forceinline__ void to_pairs(uint32_t w, uint32_t (&out)[2]) { int8s_to_bf162x2(w, out); }
};

// Integer values of one 32-bit weight word as floats, K order (exact: the fp16 converters are exact), for the
// kernels that scale in fp32 (dequant_weight.cu, conv_dequant.cu).
template <int kBits>
__device__ __forceinline__ void word_to_floats(uint32_t w, float (&q)[32 / kBits]) {
  constexpr int kPairs = 16 / kBits;  // half2 pairs per word: 4 (int4), 2 (int8)
  uint32_t h[kPairs];
  if constexpr (kBits == 4) {
    int4s_to_half2x4(w, h);
  } else {
    int8s_to_half2x2(w, h);
  }
#pragma unroll
  for (int p = 0; p < kPairs; ++p) {
    const float2 f = __half22float2(*reinterpret_cast<const __half2*>(&h[p]));
    q[2 * p] = f.x;
    q[2 * p + 1] = f.y;
  }
}

// w = q * scale + offset on a pair, in the pair's own type (one rounding, fma).
template <typename T> __device__ __forceinline__ uint32_t fma_pair(uint32_t a, uint32_t b, uint32_t c);
template <> __device__ __forceinline__ uint32_t fma_pair<__half>(uint32_t a, uint32_t b, uint32_t c) {
  return fma_f16x2(a, b, c);
}
template <> __device__ __forceinline__ uint32_t fma_pair<__nv_bfloat16>(uint32_t a, uint32_t b, uint32_t c) {
  return fma_bf16x2(a, b, c);
}

// Broadcast the low / high 16-bit half of a packed (scale, offset) word to both halves.
__device__ __forceinline__ uint32_t low_half_x2(uint32_t so) { return prmt(so, so, 0x1010); }
__device__ __forceinline__ uint32_t high_half_x2(uint32_t so) { return prmt(so, so, 0x3232); }

// Integer value of element `e` (0..7 in K order) of an interleaved int4 word, for the scalar paths:
// element e sits in nibble (e >> 1) + 4 * (e & 1) (formats.INT4_DEINTERLEAVE).
__device__ __forceinline__ int int4_element(uint32_t w, int e) {
  const int nibble = (e >> 1) + 4 * (e & 1);
  return static_cast<int>((w >> (4 * nibble)) & 0xfu) - 8;
}

}  // namespace cuops
