// LoRA for runs of rows that share a slot, in tiles, on CPUs with AVX2 + FMA but no AVX512-BF16
// (kernels/cpu/native/lora_runs.h has the AVX512-BF16 tiles and says what the entry computes): the
// same function with float32 FMAs on bf16 widened in registers, up to kRunRows rows of one run
// per tile so each widened weight serves them all.
//
//   shrink: kRunRows rows of x against 2 rows of A, 16 inputs a step: each 16 bf16 load is
//           widened into its even and its odd elements (a shift and an AND, as
//           kernels/cpu/native/fma_tile.h does), and x's even lanes meet A's even lanes;
//   expand: kRunRows rows of y (bf16 values in floats) against 16 columns of B: B's even and
//           odd columns in separate sums, which recombine into 16 bf16 outputs with no
//           permute (an even column's bits are a 32-bit lane's low half, an odd one's its high).
//
// Why: without it an adapter step on such a CPU ran eager, its long runs by float32 BLAS on
// weights widened into temporaries for each call, and the native decoder declined adapter
// steps (bench/history/RESULTS-2026-11.md, session 24). Roundings as the other kernels: y rounded to bf16
// between the products, out + delta rounded once (nearest even, NaN kept).
#pragma once

#include <immintrin.h>

#include <cstdint>

#include "bf16.h"

namespace loragate {

constexpr int kRunRows = 4;            // rows of one run per tile
constexpr int64_t kRunMaxY = 3 * 256;  // n * r, checked in cpu_native.py (MAX_FUSED_RANK)

inline __m256i load16(const BFloat16* p) {
    return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
}
// Elements 0, 2, ..., 14 (the low half of each 32-bit lane) and 1, 3, ..., 15 as floats.
inline __m256 even_floats(__m256i v) { return _mm256_castsi256_ps(_mm256_slli_epi32(v, 16)); }
inline __m256 odd_floats(__m256i v) {
    return _mm256_castsi256_ps(
        _mm256_and_si256(v, _mm256_set1_epi32(static_cast<int>(0xffff0000u))));
}

inline float sum8(__m256 v) {
    const __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    const __m128 t = _mm_add_ps(s, _mm_movehl_ps(s, s));
    return _mm_cvtss_f32(_mm_add_ss(t, _mm_movehdup_ps(t)));
}

// from_float<BFloat16> on 8 lanes, the 16 bits in each lane's low half.
inline __m256i bf16_bits(__m256 v) {
    const __m256i u = _mm256_castps_si256(v);
    const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
    const __m256i rounded = _mm256_srli_epi32(
        _mm256_add_epi32(u, _mm256_add_epi32(_mm256_set1_epi32(0x7fff), lsb)), 16);
    const __m256i quiet = _mm256_or_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(0x40));
    const __m256i nan = _mm256_castps_si256(_mm256_cmp_ps(v, v, _CMP_UNORD_Q));
    return _mm256_blendv_epi8(rounded, quiet, nan);
}

// y[m][j0 + j] = round(x_m . a_j) for M rows and J consecutive rows of A (in_features apart).
template <int M, int J>
inline void shrink_tile(const BFloat16* const* xs, const BFloat16* a, int64_t in_features,
                        float (*y)[kRunMaxY], int64_t j0) {
    __m256 acc[M][J];
#pragma GCC unroll 4
    for (int m = 0; m < M; m++)
#pragma GCC unroll 2
        for (int j = 0; j < J; j++) acc[m][j] = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 16 <= in_features; i += 16) {
        __m256 we[J], wo[J];
#pragma GCC unroll 2
        for (int j = 0; j < J; j++) {
            const __m256i w = load16(a + j * in_features + i);
            we[j] = even_floats(w);
            wo[j] = odd_floats(w);
        }
#pragma GCC unroll 4
        for (int m = 0; m < M; m++) {
            const __m256i xv = load16(xs[m] + i);
            const __m256 xe = even_floats(xv), xo = odd_floats(xv);
#pragma GCC unroll 2
            for (int j = 0; j < J; j++)
                acc[m][j] = _mm256_fmadd_ps(wo[j], xo, _mm256_fmadd_ps(we[j], xe, acc[m][j]));
        }
    }
#pragma GCC unroll 4
    for (int m = 0; m < M; m++)
#pragma GCC unroll 2
        for (int j = 0; j < J; j++) {
            float sum = sum8(acc[m][j]);
            for (int64_t t = i; t < in_features; t++)
                sum += to_float(xs[m][t]) * to_float(a[j * in_features + t]);
            y[m][j0 + j] = round_to<BFloat16>(sum);
        }
}

template <int M>
inline void shrink_rows(const BFloat16* const* xs, const BFloat16* a, int64_t in_features,
                        int64_t num_y, float (*y)[kRunMaxY]) {
    int64_t j = 0;
    for (; j + 2 <= num_y; j += 2) shrink_tile<M, 2>(xs, a + j * in_features, in_features, y, j);
    for (; j < num_y; j++) shrink_tile<M, 1>(xs, a + j * in_features, in_features, y, j);
}

// out_m[c0 + c] = round(out_m[c0 + c] + sum_k<r ys_m[k] b[k][c0 + c]) for 16 columns, M rows.
template <int M>
inline void expand_tile(const float* const* ys, const BFloat16* b, int64_t stride, int64_t r,
                        BFloat16* const* outs, int64_t c0) {
    __m256 even[M], odd[M];
#pragma GCC unroll 4
    for (int m = 0; m < M; m++) even[m] = odd[m] = _mm256_setzero_ps();
    for (int64_t k = 0; k < r; k++) {
        const __m256i w = load16(b + k * stride + c0);
        const __m256 we = even_floats(w), wo = odd_floats(w);
#pragma GCC unroll 4
        for (int m = 0; m < M; m++) {
            const __m256 yk = _mm256_set1_ps(ys[m][k]);
            even[m] = _mm256_fmadd_ps(yk, we, even[m]);
            odd[m] = _mm256_fmadd_ps(yk, wo, odd[m]);
        }
    }
#pragma GCC unroll 4
    for (int m = 0; m < M; m++) {
        BFloat16* out = outs[m] + c0;
        const __m256i old = load16(out);
        const __m256i lo = bf16_bits(_mm256_add_ps(even_floats(old), even[m]));
        const __m256i hi = bf16_bits(_mm256_add_ps(odd_floats(old), odd[m]));
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(out),
                            _mm256_or_si256(lo, _mm256_slli_epi32(hi, 16)));
    }
}

template <int M>
inline void expand_rows(const float* const* ys, const BFloat16* b, int64_t stride, int64_t r,
                        int64_t width, BFloat16* const* outs) {
    int64_t c = 0;
    for (; c + 16 <= width; c += 16) expand_tile<M>(ys, b, stride, r, outs, c);
    for (; c < width; c++)  // the last width % 16 columns, one at a time
        for (int m = 0; m < M; m++) {
            float sum = 0.f;
            for (int64_t k = 0; k < r; k++) sum += ys[m][k] * to_float(b[k * stride + c]);
            outs[m][c] = from_float<BFloat16>(to_float(outs[m][c]) + sum);
        }
}

// One tile: M consecutive rows of x and out, one slot of fused rank n * r.
template <int M>
void run_tile(const BFloat16* x, int64_t x_stride, BFloat16* out, int64_t out_stride,
              const BFloat16* a_slot, int64_t in_features, const BFloat16* b_slot,
              int64_t out_features, const int64_t* subs, int64_t n, int64_t r) {
    const BFloat16* xs[M];
    BFloat16* outs[M];
    for (int m = 0; m < M; m++) {
        xs[m] = x + m * x_stride;
        outs[m] = out + m * out_stride;
    }
    float y[M][kRunMaxY];
    shrink_rows<M>(xs, a_slot, in_features, n * r, y);
    for (int64_t i = 0; i < n; i++) {
        const int64_t offset = subs[2 * i], width = subs[2 * i + 1];
        const float* ys[M];  // sub-projection i's r values of each row
        BFloat16* sub_outs[M];
        for (int m = 0; m < M; m++) {
            ys[m] = y[m] + i * r;
            sub_outs[m] = outs[m] + offset;
        }
        expand_rows<M>(ys, b_slot + i * r * out_features + offset, out_features, r, width,
                       sub_outs);
    }
}

}  // namespace loragate
