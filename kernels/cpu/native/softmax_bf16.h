// The softmax of a row of bf16 attention scores, 16 lanes at a time: what the prefill kernels
// (kernels/cpu/native/prefill.cpp's dot-product tile path, prefill_amx.h) do between their two
// products. Within a float32 rounding of softmax_unnormalised's loop (vec_math.h), which sums
// in another order and takes a slower exp: in the dot-product path on the Zen 4 EPYC the
// softmax and the scores' rounding pass around it cost about as much as the products.
#pragma once

#include <cstdint>

#include "bf16.h"
#include "vec_math.h"

#if defined(__AVX512BF16__)
#include <immintrin.h>

namespace loragate {

// A row of scores as the scores pass left them (float32 sums) -> its probabilities p[0,
// used): score = round(sum) * scale over the `seen` keys, their softmax rounded to bf16,
// zeros after. 16 at a time: the max of the sums (rounding and a positive scale keep the
// order, so the max score is the max sum's), then each score, its exp
// (exp_nonpositive16_fast) and the sum in 16 lanes, two vectors a step (the polynomial is a
// chain of dependent steps), added across lanes last: another order than
// softmax_unnormalised's loop, within a float32 rounding. Then the normalising multiply and
// rounding. The last partial 16 is padded with -inf, whose exp is 0: sc and p hold at least
// `seen` rounded up to 16 values (and p `used`).
inline void softmax_row_bf16(float* sc, int64_t seen, int64_t used, float scale, uint16_t* p) {
    const __m512 minus_inf = _mm512_set1_ps(-__builtin_inff());
    const int64_t n16 = (seen + 15) / 16 * 16;
    if (seen < n16) {
        const __mmask16 pad = __mmask16(0xffff << (seen + 16 - n16));
        _mm512_mask_storeu_ps(sc + n16 - 16, pad, minus_inf);
    }
    __m512 top = minus_inf;
    for (int64_t j = 0; j < n16; j += 16) top = _mm512_max_ps(top, _mm512_loadu_ps(sc + j));
    const __m512 scale_v = _mm512_set1_ps(scale);
    const __m512 top_v = _mm512_mul_ps(bf16_rounded(_mm512_set1_ps(_mm512_reduce_max_ps(top))),
                                       scale_v);
    const auto exp_at = [&](int64_t j) {
        const __m512 score = _mm512_mul_ps(bf16_rounded(_mm512_loadu_ps(sc + j)), scale_v);
        const __m512 e = exp_nonpositive16_fast(_mm512_sub_ps(score, top_v));
        _mm512_storeu_ps(sc + j, e);
        return e;
    };
    __m512 total0 = _mm512_setzero_ps(), total1 = _mm512_setzero_ps();
    int64_t j = 0;
    for (; j + 32 <= n16; j += 32) {
        total0 = _mm512_add_ps(total0, exp_at(j));
        total1 = _mm512_add_ps(total1, exp_at(j + 16));
    }
    if (j < n16) total0 = _mm512_add_ps(total0, exp_at(j));
    const __m512 inv =
        _mm512_set1_ps(1.f / _mm512_reduce_add_ps(_mm512_add_ps(total0, total1)));
    for (j = 0; j < n16; j += 16)  // rounded to bf16 (nearest even); past `seen` exp is 0
        _mm256_storeu_si256(
            reinterpret_cast<__m256i*>(p + j),
            (__m256i)_mm512_cvtneps_pbh(_mm512_mul_ps(_mm512_loadu_ps(sc + j), inv)));
    for (j = n16; j < used; j++) p[j] = 0;
}

}  // namespace loragate
#endif
