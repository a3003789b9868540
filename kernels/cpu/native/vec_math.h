// Float math for the hand-written CPU kernels (kernels/cpu/native/*.cpp), written so loops over it
// vectorise.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#if defined(__AVX512F__)
#include <immintrin.h>
#endif

namespace loragate {

// One step of the series: p f + c, fused or rounded twice.
template <bool Fused>
inline float series_step(float p, float f, float c) {
    if constexpr (Fused) return __builtin_fmaf(p, f, c);
    return p * f + c;
}

// exp(x) for x <= 0 (a softmax after subtracting the maximum) to ~1e-7 relative, written with
// plain float and integer operations so the loop around it vectorises (libm's expf does not
// without -ffast-math). 2^(x log2 e) = 2^n 2^f, n integer, |f| <= 1/2, 2^f by its Taylor series
// to degree 7 (error below 1e-8 on that interval); 0 below -87, where expf leaves the normals.
// Fused: the series in fused multiply-adds (explicit: callers build with -ffp-contract=off),
// half the operations and other bits. Only the SiLU takes it (exp_nonpositive_fma): there the
// exp was ~half the fused gate/up epilogue, which cost that projection ~5% (session 28, Zen
// 4); the softmaxes keep exp_nonpositive's bits.
template <bool Fused>
inline float exp_series(float x) {
    const float clamped = x < -87.f ? -87.f : x;
    const float y = clamped * 1.4426950408889634f;
    const float n = __builtin_floorf(y + 0.5f);
    const float f = y - n;
    float p = 1.5252733804059841e-5f;
    p = series_step<Fused>(p, f, 1.5403530393381609e-4f);
    p = series_step<Fused>(p, f, 1.3333558146428443e-3f);
    p = series_step<Fused>(p, f, 9.6181291076284772e-3f);
    p = series_step<Fused>(p, f, 5.5504108664821580e-2f);
    p = series_step<Fused>(p, f, 2.4022650695910071e-1f);
    p = series_step<Fused>(p, f, 6.9314718055994531e-1f);
    p = series_step<Fused>(p, f, 1.f);
    const int32_t bits = (static_cast<int32_t>(n) + 127) << 23;
    float scale;
    std::memcpy(&scale, &bits, sizeof scale);
    const float keep = x < -87.f ? 0.f : 1.f;  // a select, not a branch: the loop vectorises
    return p * scale * keep;
}

inline float exp_nonpositive(float x) { return exp_series<false>(x); }
inline float exp_nonpositive_fma(float x) { return exp_series<true>(x); }

// The softmax of s[0, n), n >= 1, but for its last multiply: s[j] = exp(s[j] - max) in place,
// and 1 / their sum returned. The attention kernels scale by it and round as their dtype holds.
// silu(g) = g sigmoid(g), the sigmoid from exp(-|g|) (<= 1, never overflows): 1 / (1 + e) for
// g >= 0, e / (1 + e) below. Float32 throughout, as PyTorch's kernel computes it; the exp is
// exp_nonpositive_fma, so loops over it vectorise (within ~1e-7 of libm's). Callers build
// with -ffp-contract=off to round as PyTorch does.
inline float silu(float g) {
    const float e = exp_nonpositive_fma(-std::fabs(g));
    const float sigmoid = (g >= 0.f ? 1.f : e) / (1.f + e);
    return g * sigmoid;
}

inline float softmax_unnormalised(float* s, int64_t n) {
    float top = s[0];
#pragma omp simd reduction(max : top)
    for (int64_t j = 1; j < n; j++) top = s[j] > top ? s[j] : top;
    float total = 0.f;
#pragma omp simd reduction(+ : total)
    for (int64_t j = 0; j < n; j++) {
        s[j] = exp_nonpositive(s[j] - top);
        total += s[j];
    }
    return 1.f / total;
}

#if defined(__AVX512F__)
// exp_series on 16 floats: the same operations in the same order, so the same bits, where
// GCC's vectorisation of the scalar form came out 8 wide and slow.
template <bool Fused>
inline __m512 series_step16(__m512 p, __m512 f, float c) {
    if constexpr (Fused) return _mm512_fmadd_ps(p, f, _mm512_set1_ps(c));
    return _mm512_add_ps(_mm512_mul_ps(p, f), _mm512_set1_ps(c));
}

template <bool Fused>
inline __m512 exp_series16(__m512 x) {
    const __m512 floor_v = _mm512_set1_ps(-87.f);
    const __mmask16 low = _mm512_cmp_ps_mask(x, floor_v, _CMP_LT_OQ);
    const __m512 clamped = _mm512_mask_blend_ps(low, x, floor_v);
    const __m512 y = _mm512_mul_ps(clamped, _mm512_set1_ps(1.4426950408889634f));
    const __m512 n = _mm512_roundscale_ps(_mm512_add_ps(y, _mm512_set1_ps(0.5f)),
                                          _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
    const __m512 f = _mm512_sub_ps(y, n);
    __m512 p = _mm512_set1_ps(1.5252733804059841e-5f);
    p = series_step16<Fused>(p, f, 1.5403530393381609e-4f);
    p = series_step16<Fused>(p, f, 1.3333558146428443e-3f);
    p = series_step16<Fused>(p, f, 9.6181291076284772e-3f);
    p = series_step16<Fused>(p, f, 5.5504108664821580e-2f);
    p = series_step16<Fused>(p, f, 2.4022650695910071e-1f);
    p = series_step16<Fused>(p, f, 6.9314718055994531e-1f);
    p = series_step16<Fused>(p, f, 1.f);
    const __m512i bits = _mm512_slli_epi32(
        _mm512_add_epi32(_mm512_cvttps_epi32(n), _mm512_set1_epi32(127)), 23);
    const __m512 keep = _mm512_mask_blend_ps(low, _mm512_set1_ps(1.f), _mm512_setzero_ps());
    return _mm512_mul_ps(_mm512_mul_ps(p, _mm512_castsi512_ps(bits)), keep);
}

inline __m512 exp_nonpositive16(__m512 x) { return exp_series16<false>(x); }

// exp(x) for x <= 0 on 16 floats, cheaper than exp_nonpositive16 and not bit-equal to it (within
// ~2e-7 relative): n = round(x log2 e), 2^f by its Taylor series to degree 6 in FMAs, and 2^n
// applied by vscalefps; 0 below -87 (and for -inf). For a kernel whose softmax already sums in
// another order than its reference (kernels/cpu/native/prefill_amx.h), where the exp was half the work.
inline __m512 exp_nonpositive16_fast(__m512 x) {
    const __m512 floor_v = _mm512_set1_ps(-87.f);
    const __mmask16 keep = _mm512_cmp_ps_mask(x, floor_v, _CMP_GE_OQ);
    const __m512 y = _mm512_mul_ps(_mm512_max_ps(x, floor_v), _mm512_set1_ps(1.4426950408889634f));
    const __m512 n = _mm512_roundscale_ps(y, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    const __m512 f = _mm512_sub_ps(y, n);
    __m512 p = _mm512_set1_ps(1.5403530393381609e-4f);
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.3333558146428443e-3f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(9.6181291076284772e-3f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(5.5504108664821580e-2f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(2.4022650695910071e-1f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(6.9314718055994531e-1f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.f));
    return _mm512_maskz_scalef_ps(keep, p, n);
}

// silu on 16 floats, as `silu` computes each.
inline __m512 silu16(__m512 g) {
    const __m512 one = _mm512_set1_ps(1.f);
    const __m512 e = exp_series16<true>(_mm512_sub_ps(_mm512_setzero_ps(), _mm512_abs_ps(g)));
    const __mmask16 positive = _mm512_cmp_ps_mask(g, _mm512_setzero_ps(), _CMP_GE_OQ);
    const __m512 sigmoid =
        _mm512_div_ps(_mm512_mask_blend_ps(positive, e, one), _mm512_add_ps(one, e));
    return _mm512_mul_ps(g, sigmoid);
}
#endif

}  // namespace loragate
