// A matmul tile's rows written out: the float32 sums plus the bias, rounded to the output
// dtype, or the fused gate/up SiLU of them. Every path of kernels/cpu/native/matmul.cpp (vdpbf16ps,
// AMX, FMA) ends its work items here, so they round alike.
#pragma once

#include <cstdint>
#include <type_traits>

#if defined(__AVX512F__)
#include <immintrin.h>
#endif

#include "bf16.h"
#include "dot_tile.h"
#include "vec_math.h"

namespace loragate {

#if defined(__AVX512F__)
// One fused SiLU row of a block: 32 outputs from the gate sums s[0, 32) and up sums
// s[32, 64), as write_rows' scalar loop computes them, bit for bit. Why by hand: GCC vectorised
// that loop 8 wide, each bf16 rounding a shuffle, and on the AMX Xeon the epilogue cost as much
// as a third of the fused projection's time at 64 rows (session 17: the model's 48 matmuls at
// 64 rows 10.1 -> 9.6 ms, at 512 rows 50.3 -> 44.4).
inline void silu_row(const float* s, const float* b, BFloat16* out) {
    for (int c = 0; c < 32; c += 16) {
        const __m512 gate =
            round_bf16(_mm512_add_ps(_mm512_loadu_ps(s + c), _mm512_loadu_ps(b + c)));
        const __m512 up =
            round_bf16(_mm512_add_ps(_mm512_loadu_ps(s + c + 32), _mm512_loadu_ps(b + c + 32)));
        store_bf16x16(out + c, _mm512_mul_ps(round_bf16(silu16(gate)), up));
    }
}
#endif

// One tile's rows written out (every path). Plain: the block's `cols` outputs, each the float32
// sum plus the bias, rounded once to Y. Silu: the block holds 32 gate and then the 32 matching
// up outputs (matmul_silu_*'s layout), and the 32 outputs are round(round(silu(gate)) * up),
// gate and up each rounded first (what the separate matmul and kernels/cpu/native/layer.cpp's silu_mul
// compute; in float32 the roundings are no-ops). The loops over a row's outputs are plain
// element-wise loops, so they vectorise (the SiLU's exp included); the bf16 SiLU row is written
// out by hand where the CPU has AVX-512 (silu_row).
template <bool Silu, typename Y>
inline void write_rows(const float (*sums)[kDotCols], int rows, const float* b, Y* y,
                       int64_t y_stride, int64_t cols) {
    constexpr int64_t kHalf = kDotCols / 2;
    for (int m = 0; m < rows; m++) {
        Y* out = y + m * y_stride;
        const float* s = sums[m];
#if defined(__AVX512F__)
        if constexpr (Silu && std::is_same_v<Y, BFloat16>) {
            silu_row(s, b, out);
            continue;
        }
#endif
        if (Silu) {
#pragma omp simd
            for (int64_t c = 0; c < kHalf; c++) {
                const float gate = round_to<Y>(s[c] + b[c]);
                const float up = round_to<Y>(s[c + kHalf] + b[c + kHalf]);
                const float act = round_to<Y>(silu(gate));
                out[c] = from_float<Y>(act * up);
            }
        } else if (cols == kDotCols) {
#pragma omp simd
            for (int64_t c = 0; c < kDotCols; c++) out[c] = from_float<Y>(s[c] + b[c]);
        } else {  // a padded last block
            for (int64_t c = 0; c < cols; c++) out[c] = from_float<Y>(s[c] + b[c]);
        }
    }
}

template <typename Y>
inline void load_bias(const Y* bias, int64_t cols, float* b) {
    for (int64_t c = 0; c < kDotCols; c++)
        b[c] = bias != nullptr && c < cols ? to_float(bias[c]) : 0.f;
}

}  // namespace loragate
