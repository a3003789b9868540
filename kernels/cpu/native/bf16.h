// bfloat16 <-> float for the hand-written CPU kernels (kernels/cpu/native/*.cpp): the conversions
// PyTorch makes, written as plain integer operations so loops over them vectorise.
#pragma once

#include <cstdint>
#include <cstring>

#if defined(__AVX512F__)
#include <immintrin.h>
#endif

namespace loragate {

struct BFloat16 {
    uint16_t bits;
};

inline float to_float(float v) { return v; }
inline float to_float(BFloat16 v) {
    uint32_t u = static_cast<uint32_t>(v.bits) << 16;
    float f;
    std::memcpy(&f, &u, sizeof f);
    return f;
}

// Round to nearest even, as PyTorch converts; a NaN stays a (quiet) NaN.
template <typename T> T from_float(float v);
template <> inline float from_float<float>(float v) { return v; }
template <> inline BFloat16 from_float<BFloat16>(float v) {
    uint32_t u;
    std::memcpy(&u, &v, sizeof u);
    if ((u & 0x7fffffffu) > 0x7f800000u) return {static_cast<uint16_t>((u >> 16) | 0x40u)};
    u += 0x7fffu + ((u >> 16) & 1u);
    return {static_cast<uint16_t>(u >> 16)};
}

// v as T would hold it, back in a float: what a PyTorch op with a T output hands the next op.
template <typename T> inline float round_to(float v) { return to_float(from_float<T>(v)); }

#if defined(__AVX512F__)
// round_to<BFloat16> on 16 floats: from_float's integer rounding (nearest even, a NaN kept
// quiet), back in a float.
inline __m512 round_bf16(__m512 v) {
    const __m512i u = _mm512_castps_si512(v);
    const __m512i high = _mm512_set1_epi32(static_cast<int>(0xffff0000u));
    const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
    const __m512i rounded =
        _mm512_add_epi32(u, _mm512_add_epi32(_mm512_set1_epi32(0x7fff), lsb));
    const __m512i quiet = _mm512_or_si512(u, _mm512_set1_epi32(0x400000));
    const __mmask16 nan = _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
    return _mm512_castsi512_ps(
        _mm512_and_si512(_mm512_mask_blend_epi32(nan, rounded, quiet), high));
}

// 16 floats stored as bf16, each rounded as from_float<BFloat16> rounds.
inline void store_bf16x16(BFloat16* out, __m512 v) {
    const __m512i bits = _mm512_srli_epi32(_mm512_castps_si512(round_bf16(v)), 16);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out), _mm512_cvtepi32_epi16(bits));
}

// 16 bf16 values widened to float (exact).
inline __m512 load_bf16x16(const BFloat16* p) {
    const __m256i bits = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(bits), 16));
}
#endif

#if defined(__AVX512BF16__)
// 16 floats rounded to bf16 by vcvtneps2bf16 (nearest even; it reads a denormal as zero), back
// in float32: the rounding the bf16 attention kernels apply to their float32 sums.
inline __m512 bf16_rounded(__m512 x) {
    return _mm512_castsi512_ps(
        _mm512_slli_epi32(_mm512_cvtepu16_epi32((__m256i)_mm512_cvtneps_pbh(x)), 16));
}
#endif

}  // namespace loragate
