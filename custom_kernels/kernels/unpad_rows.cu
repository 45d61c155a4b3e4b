// D [M, N] = D_pad[:, :N] for the int8 GEMMs that ran on an N padded to their 16-byte stores: D_pad [M, N_pad]
// with a row pitch of `src_pitch` bytes (a multiple of 16), D contiguous with rows of `row_bytes` = N * sizeof
// (element) bytes, so D is one run of M * row_bytes bytes whatever the element type.
//
// One 16-byte vector of D per thread and trip (D's base 16-byte aligned), gathered from D_pad in LOAD_BYTES
// pieces, LOAD_BYTES = gcd(row_bytes, 16): a piece never crosses a row of D and starts LOAD_BYTES-aligned in
// D_pad as well (src_pitch % 16 == 0). The last vector, when M * row_bytes % 16 != 0, is stored piece by piece.
// torch's D_pad[:, :N].contiguous() does this as a strided element copy (H200, N = 1000 int8, M = 64: ~3.5 us
// after the GEMM).
//
// On sm_90 it is launched as the GEMM's programmatic dependent: the Sm90 GEMMs release their dependents after
// their last mainloop, so this grid is resident before the GEMM's epilogue ends and waits for its completion
// before it reads D_pad.
#include "pdl.cuh"

#ifndef LOAD_BYTES
#define LOAD_BYTES 1
#endif

template <int W> struct PieceWord;  // the type of one LOAD_BYTES piece
template <> struct PieceWord<1> { using type = uint8_t; };
template <> struct PieceWord<2> { using type = uint16_t; };
template <> struct PieceWord<4> { using type = uint32_t; };
template <> struct PieceWord<8> { using type = uint2; };
template <> struct PieceWord<16> { using type = uint4; };

template <int W>
__device__ __forceinline__ typename PieceWord<W>::type load_piece(const uint8_t* a) {
  if constexpr (W == 1) return cuops::load_u8_after_wait(a);
  else if constexpr (W == 2) return cuops::load_u16_after_wait(a);
  else if constexpr (W == 4) return cuops::load_u32_after_wait(a);
  else if constexpr (W == 8) return cuops::load_v2_after_wait(a);
  else return cuops::load_v4_after_wait(a);
}

extern "C" __global__ void unpad_rows(const uint8_t* X, uint8_t* Y, int64_t total_bytes, int row_bytes,
                                      int src_pitch) {
  constexpr int W = LOAD_BYTES;
  constexpr int kPieces = 16 / W;
  static_assert(W == 1 || W == 2 || W == 4 || W == 8 || W == 16, "LOAD_BYTES: 1, 2, 4, 8 or 16");
  cuops::pdl_wait_then_release();
  const int64_t vecs = (total_bytes + 15) / 16;
  for (int64_t idx = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; idx < vecs;
       idx += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t o = idx * 16;
    int64_t m = o / row_bytes;
    int c = static_cast<int>(o - m * row_bytes);
    using Word = typename PieceWord<W>::type;
    union {
      Word piece[kPieces];
      uint4 vec;
    } gathered;
    // total_bytes and o are multiples of W (W divides row_bytes and 16)
    const int pieces = o + 16 <= total_bytes ? kPieces : static_cast<int>(total_bytes - o) / W;
#pragma unroll
    for (int j = 0; j < kPieces; ++j) {
      if (j < pieces) gathered.piece[j] = load_piece<W>(X + m * src_pitch + c);
      c += W;
      if (c == row_bytes) {  // W divides row_bytes: the next piece starts the next row
        c = 0;
        ++m;
      }
    }
    if (pieces == kPieces) {
      reinterpret_cast<uint4*>(Y)[idx] = gathered.vec;
    } else {
      Word* y = reinterpret_cast<Word*>(Y + o);
      for (int j = 0; j < pieces; ++j) y[j] = gathered.piece[j];
    }
  }
}
