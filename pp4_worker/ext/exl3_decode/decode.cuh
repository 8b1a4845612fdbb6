// EXL3's trellis decode, written from its format (exllamav3 1.6.5): which bits of a tile's stream
// form a weight's 16-bit state, and which function of the state gives the weight.
//
// A 16x16 tile is a circular bitstream of 256*bits bits, stored as 16*bits int16 words whose 32-bit
// pairs hold the stream's bits most significant first (word 2i+1's bits precede word 2i's). Weight
// p of the tile (p = 0..255) is the 16 bits ending at stream bit (p+1)*bits, wrapping to the end.
// Lane t of a warp decodes weights 8t..8t+7, which are the tensor-core B-fragment layout of the
// tile: rows (the K axis) 2(t%4), +1, +8, +9 of column (the N axis) t/4 for weights 8t..8t+3 and of
// column t/4 + 8 for 8t+4..8t+7.
#pragma once

#include <cuda_fp16.h>

#include <cstdint>
#include <cstring>
#include <type_traits>
#include <utility>

namespace pp4_exl3 {

// The functions below also compile for the host, where the intrinsics become plain C++ of the same
// result: tests/test_exl3_decode_host.py runs the decode's index arithmetic on the CPU that way.
#define PP4_EXL3_HD __host__ __device__ __forceinline__

// The 32 bits of hi:lo (a 64-bit value) starting `shift` bits up.
PP4_EXL3_HD uint32_t funnel_right(uint32_t lo, uint32_t hi, int shift) {
#if defined(__CUDA_ARCH__)
  return __funnelshift_r(lo, hi, shift);
#else
  return static_cast<uint32_t>(((static_cast<uint64_t>(hi) << 32) | lo) >> (shift & 31));
#endif
}

// c + the sum of x's four bytes.
PP4_EXL3_HD uint32_t byte_sum_plus(uint32_t x, uint32_t c) {
#if defined(__CUDA_ARCH__)
  return __dp4a(x, 0x01010101u, c);
#else
  return c + (x & 0xff) + ((x >> 8) & 0xff) + ((x >> 16) & 0xff) + (x >> 24);
#endif
}

// The 32 most significant bits of hi:lo (a 64-bit value) shifted `shift` bits up.
PP4_EXL3_HD uint32_t funnel_left(uint32_t lo, uint32_t hi, int shift) {
#if defined(__CUDA_ARCH__)
  return __funnelshift_l(lo, hi, shift);
#else
  return static_cast<uint32_t>((((static_cast<uint64_t>(hi) << 32) | lo) << (shift & 31)) >> 32);
#endif
}

// Bytes of y:x (x bytes 0-3, y bytes 4-7) picked by sel's four nibbles, output byte i from nibble i.
PP4_EXL3_HD uint32_t byte_perm(uint32_t x, uint32_t y, uint32_t sel) {
#if defined(__CUDA_ARCH__)
  return __byte_perm(x, y, sel);
#else
  const uint64_t v = (static_cast<uint64_t>(y) << 32) | x;
  uint32_t r = 0;
  for (int i = 0; i < 4; ++i) r |= static_cast<uint32_t>((v >> (8 * ((sel >> (4 * i)) & 7))) & 0xff) << (8 * i);
  return r;
#endif
}

// The 16 bits starting Q bits below the top of a 32-bit word (Q <= 16). At a byte boundary that is
// one instruction (a shift, a byte permute with zeros, an and) where elsewhere it takes two.
template <int Q>
PP4_EXL3_HD uint32_t bits16_in_word(uint32_t word) {
  static_assert(Q >= 0 && Q <= 16, "16 bits lie in the word");
  if constexpr (Q == 0) return word >> 16;
  else if constexpr (Q == 8) return byte_perm(word, 0u, 0x4421);
  else if constexpr (Q == 16) return word & 0xffffu;
  else return (word >> (16 - Q)) & 0xffffu;
}

// The 16 bits starting P bits below the top of the 96-bit value hi:mid:lo (P known at compile time,
// so each state is one or two shifts).
template <int P>
PP4_EXL3_HD uint32_t bits16_at(uint32_t hi, uint32_t mid, uint32_t lo) {
  static_assert(P >= 0 && P + 16 <= 96, "a state lies in the lane's 96 bits");
  if constexpr (P + 16 <= 32) return bits16_in_word<P>(hi);
  else if constexpr (P < 32) return funnel_right(mid, hi, 48 - P) & 0xffffu;
  else if constexpr (P + 16 <= 64) return bits16_in_word<P - 32>(mid);
  else if constexpr (P < 64) return funnel_right(lo, mid, 80 - P) & 0xffffu;
  else return bits16_in_word<P - 64>(lo);
}

// Where a bit width's lanes all start at the same bit of a word (4 and 8 bits: a lane's 8*BITS
// bits are whole words), the states' places in the three words are known at compile time. A state
// at a byte boundary inside one word is then one instruction; any other is read from a 32-bit
// window of the words (one funnel shift) that it shares with the states 8 and 16 bits after it.
// FIRST: the first state's first bit below the top of w0.
template <int FIRST, int P>
PP4_EXL3_HD uint32_t state_in_words(uint32_t w0, uint32_t w1, uint32_t w2) {
  static_assert(P >= FIRST && P + 16 <= 96, "a state lies in the lane's three words");
  const uint32_t words[3] = {w0, w1, w2};
  constexpr int q = P % 32;
  if constexpr (q % 8 == 0 && q + 16 <= 32) {
    return bits16_in_word<q>(words[P / 32]);
  } else {
    constexpr int start = P - 16 >= FIRST ? P - 16 : P - 8 >= FIRST ? P - 8 : P;
    static_assert(start + 32 <= 96, "the window lies in the lane's three words");
    if constexpr (start % 32 == 0) return bits16_in_word<P - start>(words[start / 32]);
    else return bits16_in_word<P - start>(funnel_left(words[start / 32 + 1], words[start / 32], start % 32));
  }
}

template <int BITS, int... J>
PP4_EXL3_HD void states_in_words(uint32_t w0, uint32_t w1, uint32_t w2, uint32_t (&states)[8],
                                 std::integer_sequence<int, J...>) {
  constexpr int first = ((BITS - 16) % 32 + 32) % 32;
  ((states[J] = state_in_words<first, first + J * BITS>(w0, w1, w2)), ...);
}

// The states when the first one's bits start at the top of hi (hi:mid:lo, every state at a fixed place).
template <int BITS, int... J>
PP4_EXL3_HD void states_from_top(uint32_t hi, uint32_t mid, uint32_t lo, uint32_t (&states)[8],
                                 std::integer_sequence<int, J...>) {
  ((states[J] = bits16_at<J * BITS>(hi, mid, lo)), ...);
}

// The states of lane `lane`'s weights 8*lane .. 8*lane+7. They lie in 16 + 7*BITS <= 72 stream bits
// from the first state's first bit on, within three 32-bit words.
template <int BITS>
PP4_EXL3_HD void lane_states(const uint32_t* words, int lane, uint32_t (&states)[8]) {
  constexpr int kWords = 8 * BITS;  // 32-bit words per tile
  int first = lane * 8 * BITS + BITS - 16;  // weight 8*lane's first bit; lane 0's wraps to the end
  if (first < 0) first += 256 * BITS;
  const int w = first >> 5;
  const int w1 = w + 1 < kWords ? w + 1 : w + 1 - kWords;
  const int w2 = w + 2 < kWords ? w + 2 : w + 2 - kWords;
  if constexpr (BITS % 4 == 0) {
    states_in_words<BITS>(words[w], words[w1], words[w2], states, std::make_integer_sequence<int, 8>());
  } else {
    // Other widths start at a bit that differs between lanes: the words are shifted so that the
    // first state's bits start at the top, after which every state is at a fixed place.
    const int offset = first & 31;
    const uint32_t a = words[w], b = words[w1], c = words[w2];
    states_from_top<BITS>(funnel_left(b, a, offset), funnel_left(c, b, offset), c << offset, states,
                          std::make_integer_sequence<int, 8>());
  }
}

// Two weights from two states: codebook CB as exllamav3's decode_3inst / mcg / mul1 compute it,
// with the same fp16 roundings (one per weight: a half add or a half fma of exact operands).
template <int CB>
PP4_EXL3_HD half2 decode_pair(uint32_t x0, uint32_t x1) {
  if constexpr (CB == 2) {  // mul1: byte sum of the product, as an fp16 1024..2047, then an fma
    x0 *= 0x83DCD12Du;
    x1 *= 0x83DCD12Du;
    const uint32_t sum0 = byte_sum_plus(x0, 0x6400u);
    const uint32_t sum1 = byte_sum_plus(x1, 0x6400u);
    const half2 h = __halves2half2(__ushort_as_half(static_cast<unsigned short>(sum0)),
                                   __ushort_as_half(static_cast<unsigned short>(sum1)));
#if defined(__CUDA_ARCH__)
    return __hfma2(h, __half2half2(__ushort_as_half(0x1eee)), __half2half2(__ushort_as_half(0xc931)));
#else
    // h * k_inv (11 x 11 significant bits) and the sum (below 16, on a 2^-18 grid) are exact in
    // float, so the one rounding to half is the fma's.
    const float k_inv = __half2float(__ushort_as_half(0x1eee)), k_bias = __half2float(__ushort_as_half(0xc931));
    return __floats2half2_rn(__low2float(h) * k_inv + k_bias, __high2float(h) * k_inv + k_bias);
#endif
  } else {
    if constexpr (CB == 1) {  // mcg
      x0 *= 0xCBAC1FEDu;
      x1 *= 0xCBAC1FEDu;
    } else {  // 3inst
      x0 = x0 * 89226354u + 64248484u;
      x1 = x1 * 89226354u + 64248484u;
    }
    x0 = (x0 & 0x8fff8fffu) ^ 0x3b603b60u;  // two fp16 bit patterns per word
    x1 = (x1 & 0x8fff8fffu) ^ 0x3b603b60u;
#if defined(__CUDA_ARCH__)
    const half2 h0 = *reinterpret_cast<const half2*>(&x0);
    const half2 h1 = *reinterpret_cast<const half2*>(&x1);
    return __hadd2(__lows2half2(h0, h1), __highs2half2(h0, h1));  // (lo0 + hi0, lo1 + hi1)
#else
    auto half_of = [](uint32_t bits) { return __half2float(__ushort_as_half(static_cast<unsigned short>(bits))); };
    return __floats2half2_rn(half_of(x0) + half_of(x0 >> 16), half_of(x1) + half_of(x1 >> 16));  // exact sums
#endif
  }
}

// Lane `lane`'s eight weights of one tile as two B fragments (columns t/4 and t/4 + 8), each two
// half2 registers of (row 2(t%4), +1) and (row 2(t%4)+8, +9).
template <int BITS, int CB>
PP4_EXL3_HD void decode_lane(const uint32_t* words, int lane, uint32_t (&b0)[2], uint32_t (&b1)[2]) {
  uint32_t states[8], r[4];
  lane_states<BITS>(words, lane, states);
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const half2 d = decode_pair<CB>(states[2 * j], states[2 * j + 1]);
    std::memcpy(&r[j], &d, 4);  // not a pointer cast: the host compiler's aliasing rules may drop that read
  }
  b0[0] = r[0];
  b0[1] = r[1];
  b1[0] = r[2];
  b1[1] = r[3];
}

// Calls f(std::integral_constant<int, B>()) for the bit width B = bits (2..8): the kernels are
// instantiated per width. False for a width without kernels.
template <typename F>
bool with_bits(int bits, F&& f) {
  switch (bits) {
    case 2: f(std::integral_constant<int, 2>()); return true;
    case 3: f(std::integral_constant<int, 3>()); return true;
    case 4: f(std::integral_constant<int, 4>()); return true;
    case 5: f(std::integral_constant<int, 5>()); return true;
    case 6: f(std::integral_constant<int, 6>()); return true;
    case 7: f(std::integral_constant<int, 7>()); return true;
    case 8: f(std::integral_constant<int, 8>()); return true;
    default: return false;
  }
}

}  // namespace pp4_exl3
