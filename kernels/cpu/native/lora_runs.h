// LoRA for runs of rows that share a slot, in tiles (kernels/cpu/native/rows.cpp's `lora_runs_bf16`):
// the same function as the row-at-a-time kernel beside it, for bfloat16 by vdpbf16ps, with up
// to kRunRows rows of one run multiplied together so each weight register serves them all.
//
//   shrink: kRunRows rows of x against 4 rows of A at a time: 16 accumulators, 4 + 1 loads a
//           32-input step (the row kernel: 2 loads a dot product and a reduction per y);
//   expand: kRunRows rows of y against 64 columns of B: 16 accumulators; each pair of B's rows
//           interleaved once (vpermt2w) for every row of the tile (the row kernel interleaved
//           B again for every row).
//
// Why: a prefill chunk's long runs went through two oneDNN calls a sub-projection (~20 us each
// whatever the rows) and the decode rows one at a time at ~95 GFLOP/s; bench/history/RESULTS-2026-11.md
// (session 15) has the figures. Roundings as the row kernel: y rounded to bf16 between the
// products, out + delta rounded once (round to nearest even, NaN kept).
#pragma once

#include <cstdint>
#include <cstring>

#if defined(__AVX512BF16__)
#include <immintrin.h>

#include "bf16.h"

namespace loragate {

constexpr int kRunRows = 4;        // rows of one run per tile
constexpr int64_t kRunMaxY = 3 * 256;  // n * r, checked in cpu_native.py (MAX_FUSED_RANK)

// y[m][j0 + j] = round(x_m . a_j) for M rows and J consecutive rows of A (in_features apart).
template <int M, int J>
inline void shrink_tile(const BFloat16* const* xs, const BFloat16* a, int64_t in_features,
                        float (*y)[kRunMaxY], int64_t j0) {
    __m512 acc[M][J];
#pragma GCC unroll 4
    for (int m = 0; m < M; m++)
#pragma GCC unroll 4
        for (int j = 0; j < J; j++) acc[m][j] = _mm512_setzero_ps();
    const int64_t tail = in_features % 32;
    for (int64_t i = 0; i < in_features; i += 32) {
        const __mmask32 mask =
            i + 32 <= in_features ? ~__mmask32{0} : static_cast<__mmask32>((1ull << tail) - 1);
        __m512bh w[J];
#pragma GCC unroll 4
        for (int j = 0; j < J; j++)
            w[j] = (__m512bh)_mm512_maskz_loadu_epi16(mask, a + j * in_features + i);
#pragma GCC unroll 4
        for (int m = 0; m < M; m++) {
            const __m512bh xv = (__m512bh)_mm512_maskz_loadu_epi16(mask, xs[m] + i);
#pragma GCC unroll 4
            for (int j = 0; j < J; j++) acc[m][j] = _mm512_dpbf16_ps(acc[m][j], w[j], xv);
        }
    }
#pragma GCC unroll 4
    for (int m = 0; m < M; m++)
#pragma GCC unroll 4
        for (int j = 0; j < J; j++)
            y[m][j0 + j] = round_to<BFloat16>(_mm512_reduce_add_ps(acc[m][j]));
}

template <int M>
inline void shrink_rows(const BFloat16* const* xs, const BFloat16* a, int64_t in_features,
                        int64_t num_y, float (*y)[kRunMaxY]) {
    int64_t j = 0;
    for (; j + 4 <= num_y; j += 4) shrink_tile<M, 4>(xs, a + j * in_features, in_features, y, j);
    for (; j < num_y; j++) shrink_tile<M, 1>(xs, a + j * in_features, in_features, y, j);
}

// 16 bf16 from two rows interleaved (b0[0], b1[0], b0[1], b1[1], ...): vdpbf16ps's pair layout.
inline __m512bh interleave_rows(const BFloat16* b0, const BFloat16* b1, __mmask16 mask) {
    alignas(64) static const int16_t kInterleave[32] = {
        0, 32, 1, 33, 2,  34, 3,  35, 4,  36, 5,  37, 6,  38, 7,  39,
        8, 40, 9, 41, 10, 42, 11, 43, 12, 44, 13, 45, 14, 46, 15, 47};
    const __m512i lo = _mm512_castsi256_si512(_mm256_maskz_loadu_epi16(mask, b0));
    const __m512i hi = _mm512_castsi256_si512(_mm256_maskz_loadu_epi16(mask, b1));
    return (__m512bh)_mm512_permutex2var_epi16(lo, _mm512_load_si512(kInterleave), hi);
}

// out[c] = round(out[c] + acc[c]) for the lanes of `mask`: bf16 rounded to nearest even.
inline void add_round_store(BFloat16* out, __m512 acc, __mmask16 mask) {
    const __m256i old = _mm256_maskz_loadu_epi16(mask, out);
    const __m512 sum = _mm512_add_ps(
        _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(old), 16)), acc);
    const __m512i u = _mm512_castps_si512(sum);
    const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
    __m512i bits = _mm512_srli_epi32(
        _mm512_add_epi32(_mm512_add_epi32(u, _mm512_set1_epi32(0x7fff)), lsb), 16);
    const __mmask16 nan = _mm512_cmp_ps_mask(sum, sum, _CMP_UNORD_Q);
    bits = _mm512_mask_mov_epi32(
        bits, nan, _mm512_or_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(0x40)));
    _mm256_mask_storeu_epi16(out, mask, _mm512_cvtepi32_epi16(bits));
}

// out_m[c] += sum_k<r y_m[k] b[k][c] for M rows and C blocks of 16 columns (C = 1: `mask`ed);
// pairs[m][p] holds (y_m[2p], y_m[2p + 1]) as bf16 bits, the second 0 past r.
template <int M, int C>
inline void expand_tile(const uint32_t (*pairs)[kRunMaxY / 2], const BFloat16* b, int64_t stride,
                        int64_t r, BFloat16* const* outs, int64_t c0, __mmask16 mask) {
    __m512 acc[M][C];
#pragma GCC unroll 4
    for (int m = 0; m < M; m++)
#pragma GCC unroll 4
        for (int c = 0; c < C; c++) acc[m][c] = _mm512_setzero_ps();
    for (int64_t k = 0; k < r; k += 2) {
        const BFloat16* b0 = b + k * stride + c0;
        const BFloat16* b1 = k + 1 < r ? b0 + stride : b0;  // times a zero y past the rank
        if (C == 4) {  // the next block's columns of these rows: 16+ short streams at once
            _mm_prefetch(reinterpret_cast<const char*>(b0 + 64), _MM_HINT_T0);
            _mm_prefetch(reinterpret_cast<const char*>(b0 + 96), _MM_HINT_T0);
            _mm_prefetch(reinterpret_cast<const char*>(b1 + 64), _MM_HINT_T0);
            _mm_prefetch(reinterpret_cast<const char*>(b1 + 96), _MM_HINT_T0);
        }
        __m512bh w[C];
#pragma GCC unroll 4
        for (int c = 0; c < C; c++) w[c] = interleave_rows(b0 + 16 * c, b1 + 16 * c, mask);
#pragma GCC unroll 4
        for (int m = 0; m < M; m++) {
            const __m512bh yp = (__m512bh)_mm512_set1_epi32(static_cast<int>(pairs[m][k / 2]));
#pragma GCC unroll 4
            for (int c = 0; c < C; c++) acc[m][c] = _mm512_dpbf16_ps(acc[m][c], w[c], yp);
        }
    }
#pragma GCC unroll 4
    for (int m = 0; m < M; m++)
#pragma GCC unroll 4
        for (int c = 0; c < C; c++) add_round_store(outs[m] + c0 + 16 * c, acc[m][c], mask);
}

template <int M>
inline void expand_rows(const uint32_t (*pairs)[kRunMaxY / 2], const BFloat16* b,
                        int64_t stride, int64_t r, int64_t width, BFloat16* const* outs) {
    int64_t c = 0;
    for (; c + 64 <= width; c += 64) expand_tile<M, 4>(pairs, b, stride, r, outs, c, 0xffff);
    for (; c < width; c += 16) {
        const int64_t left = width - c;
        const __mmask16 mask = left >= 16 ? 0xffff : static_cast<__mmask16>((1u << left) - 1);
        expand_tile<M, 1>(pairs, b, stride, r, outs, c, mask);
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
    uint32_t pairs[M][kRunMaxY / 2];
    for (int64_t i = 0; i < n; i++) {
        for (int m = 0; m < M; m++)
            for (int64_t k = 0; k < r; k += 2) {
                uint32_t lo, hi = 0;
                std::memcpy(&lo, &y[m][i * r + k], sizeof lo);
                if (k + 1 < r) std::memcpy(&hi, &y[m][i * r + k + 1], sizeof hi);
                pairs[m][k / 2] = (hi & 0xffff0000u) | (lo >> 16);
            }
        const int64_t offset = subs[2 * i], width = subs[2 * i + 1];
        BFloat16* sub_outs[M];
        for (int m = 0; m < M; m++) sub_outs[m] = outs[m] + offset;
        expand_rows<M>(pairs, b_slot + i * r * out_features + offset, out_features, r, width,
                       sub_outs);
    }
}

}  // namespace loragate

#elif defined(__AVX2__) && defined(__FMA__)
#include "lora_runs_fma.h"  // the same tiles by float32 FMAs on widened bf16
#endif  // __AVX512BF16__

// Where some form of the tiles is built (kernels/cpu/native/rows.cpp's lora_runs_available).
#if defined(__AVX512BF16__) || (defined(__AVX2__) && defined(__FMA__))
#define LORAGATE_LORA_RUNS 1

namespace loragate {

// run_tile (either form above) for 1 <= rows <= kRunRows.
inline void run_rows(int rows, const BFloat16* x, int64_t x_stride, BFloat16* out,
                     int64_t out_stride, const BFloat16* a_slot, int64_t in_features,
                     const BFloat16* b_slot, int64_t out_features, const int64_t* subs, int64_t n,
                     int64_t r) {
    switch (rows) {
        case 1: return run_tile<1>(x, x_stride, out, out_stride, a_slot, in_features, b_slot,
                                   out_features, subs, n, r);
        case 2: return run_tile<2>(x, x_stride, out, out_stride, a_slot, in_features, b_slot,
                                   out_features, subs, n, r);
        case 3: return run_tile<3>(x, x_stride, out, out_stride, a_slot, in_features, b_slot,
                                   out_features, subs, n, r);
        default: return run_tile<4>(x, x_stride, out, out_stride, a_slot, in_features, b_slot,
                                    out_features, subs, n, r);
    }
}

}  // namespace loragate
#endif
