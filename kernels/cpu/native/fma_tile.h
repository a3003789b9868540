// The float32 FMA tile of kernels/cpu/native/matmul.cpp for CPUs without bf16 dot-product instructions
// (AVX2 + FMA; an AVX-512 CPU without AVX512-BF16 builds it too, on 256-bit registers): M rows
// of x, in float32, against one panel of 16 outputs of a packed weight, over inputs [k0, k1).
// x is packed too, as row tiles [k][kFmaRows] (each input's values of the tile's rows side by
// side: the broadcasts read one stream; read as rows k * 4 bytes apart, rows a multiple of 4 KB
// apart fell in one L1 set). The panel is either
//
//   float32  [k][16]         each input's 16 weights side by side (two registers), or
//   bf16     [k / 2][16][2]  each pair of inputs' 16 x 2 weights side by side: a register holds
//                            8 outputs' pairs, widened exactly to float32 by a shift (the even
//                            input) and a mask (the odd one), so a bf16 weight streams half the
//                            bytes and multiplies at the float32 rate.
//
// sums[m][c] (+)= sum_i x[m, i] w[c, i], float32 products and sums: what oneDNN's and MKL's
// float32 matmuls compute, summed in another order.
#pragma once

#include <algorithm>
#include <cstdint>

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define LORAGATE_FMA 1
#else
#define LORAGATE_FMA 0
#endif

namespace loragate {

constexpr int64_t kPanelCols = 16;  // outputs per panel

#if LORAGATE_FMA

// Rows a tile takes: 12 accumulators, the panel's two registers and a broadcast fit the 16
// vector registers (bf16: the odd inputs are widened after the even ones' products, from a
// second read of the line, so no mask register or loaded line is kept; with them, 5 rows fit,
// and 16-row steps ran ~10% slower).
constexpr int kFmaRows = 6;

// 8 outputs' pairs of bf16 weights (one register) widened to float32: the even inputs by a shift
// left, the odd ones by clearing the even halves with an AND. Why not two shifts: on Zen 3
// vector shifts issue on one of the two FMA pipes and took FMA slots; an AND issues on any of
// the four vector pipes.
inline __m256i pairs(const uint16_t* w) {
    return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w));
}
inline __m256 even_inputs(const uint16_t* w) {
    return _mm256_castsi256_ps(_mm256_slli_epi32(pairs(w), 16));
}
inline __m256 odd_inputs(const uint16_t* w) {
    return _mm256_castsi256_ps(_mm256_and_si256(pairs(w), _mm256_set1_epi32(0xffff0000u)));
}

template <typename W> inline void prefetch_line(const W* p) {
    _mm_prefetch(reinterpret_cast<const char*>(p), _MM_HINT_T0);
}

// `lines` lines from `base` asked for over `iterations` loop iterations, one every
// `iterations / lines` of them (a countdown: no division in the loop, whose iterations take a
// few cycles each). Where no lines are asked for, `at` is a decrement that never reaches zero.
struct SpreadAhead {
    const char* base;
    int64_t lines;
    int64_t every;
    int64_t countdown;

    SpreadAhead(const void* ahead, int64_t ahead_lines, int64_t iterations)
        : base(static_cast<const char*>(ahead)),
          lines(ahead != nullptr ? std::min(ahead_lines, iterations) : 0),
          every(lines > 0 ? iterations / lines : 0),
          countdown(lines > 0 ? 1 : iterations + 1) {}

    inline void at() {
        if (--countdown != 0) return;
        _mm_prefetch(base, _MM_HINT_T0);
        base += 64;
        countdown = --lines > 0 ? every : INT64_MAX;
    }
};

// `x`: a row tile ([k][kFmaRows], M <= kFmaRows rows used). `first`: the sums start at
// zero (the first slab of inputs), else they are read and added to. `ahead` (or null): the
// start of `ahead_lines` lines asked for as this panel's slab is read, spread evenly over its
// iterations (at most one an iteration: a slab is one line an iteration in both layouts).
// Every loop over acc is unrolled so its indices are constants and acc stays in registers.
template <int M, typename W>
inline void fma_tile(const float* x, int64_t k0, int64_t k1, const W* panel, float* sums,
                     int64_t sums_stride, bool first, const W* ahead, int64_t ahead_lines) {
    constexpr int64_t R = kFmaRows;
    SpreadAhead asks(ahead, ahead_lines, sizeof(W) == 4 ? k1 - k0 : (k1 - k0) / 2);
    __m256 acc[M][2];
#pragma GCC unroll 6
    for (int m = 0; m < M; m++) {
        acc[m][0] = first ? _mm256_setzero_ps() : _mm256_loadu_ps(sums + m * sums_stride);
        acc[m][1] = first ? _mm256_setzero_ps() : _mm256_loadu_ps(sums + m * sums_stride + 8);
    }
    if constexpr (sizeof(W) == 4) {
        const float* w = reinterpret_cast<const float*>(panel) + k0 * kPanelCols;
        for (int64_t i = k0; i < k1; i++, w += kPanelCols) {
            asks.at();
            const __m256 w0 = _mm256_loadu_ps(w);
            const __m256 w1 = _mm256_loadu_ps(w + 8);
#pragma GCC unroll 6
            for (int m = 0; m < M; m++) {
                const __m256 xi = _mm256_broadcast_ss(x + i * R + m);
                acc[m][0] = _mm256_fmadd_ps(xi, w0, acc[m][0]);
                acc[m][1] = _mm256_fmadd_ps(xi, w1, acc[m][1]);
            }
        }
    } else {
        const uint16_t* w = reinterpret_cast<const uint16_t*>(panel) + k0 * kPanelCols;
        for (int64_t i = k0; i < k1; i += 2, w += 2 * kPanelCols) {
            asks.at();
            const __m256 even0 = even_inputs(w);
            const __m256 even1 = even_inputs(w + 16);
#pragma GCC unroll 6
            for (int m = 0; m < M; m++) {
                const __m256 xi = _mm256_broadcast_ss(x + i * R + m);
                acc[m][0] = _mm256_fmadd_ps(xi, even0, acc[m][0]);
                acc[m][1] = _mm256_fmadd_ps(xi, even1, acc[m][1]);
            }
            const __m256 odd0 = odd_inputs(w);
            const __m256 odd1 = odd_inputs(w + 16);
#pragma GCC unroll 6
            for (int m = 0; m < M; m++) {
                const __m256 xi = _mm256_broadcast_ss(x + (i + 1) * R + m);
                acc[m][0] = _mm256_fmadd_ps(xi, odd0, acc[m][0]);
                acc[m][1] = _mm256_fmadd_ps(xi, odd1, acc[m][1]);
            }
        }
    }
#pragma GCC unroll 6
    for (int m = 0; m < M; m++) {
        _mm256_storeu_ps(sums + m * sums_stride, acc[m][0]);
        _mm256_storeu_ps(sums + m * sums_stride + 8, acc[m][1]);
    }
}

// A bf16 panel's inputs [k0, k1) widened to the float32 panel layout ([k1 - k0][16], exact),
// asking for `ahead` (or null) a line a pair of inputs. Where many row tiles read one panel's
// slab, widening it once and running the float32 loop beats widening it in every tile: the
// widening's shifts take FMA slots, and the bf16 loop ran at ~80% of the float32 one's rate
// with its operands in L1 (Zen 3). Same products, summed in the same order: same values.
inline void widen_panel(const uint16_t* panel, int64_t k0, int64_t k1, float* out,
                        const uint16_t* ahead) {
    const uint16_t* w = panel + k0 * kPanelCols;
    for (int64_t i = k0; i < k1; i += 2, w += 2 * kPanelCols, out += 2 * kPanelCols) {
        if (ahead != nullptr) prefetch_line(ahead + (i - k0) * kPanelCols);
        _mm256_store_ps(out, even_inputs(w));
        _mm256_store_ps(out + 8, even_inputs(w + 16));
        _mm256_store_ps(out + 16, odd_inputs(w));
        _mm256_store_ps(out + 24, odd_inputs(w + 16));
    }
}

// One row of x against P panels at once, over all k inputs: a decode step of one sequence.
// fma_tile<1> takes a panel at a time, and its two accumulators are each a chain of dependent
// FMAs, one every FMA latency: a Zen 3 core read bf16 weights at ~12 GB/s that way, under half
// what it can stream. P panels give 2P independent chains and P sequential weight streams (a
// panel's inputs are contiguous; no slabs: with one row nothing is reused from L1). Each
// output's products are summed in fma_tile<1>'s order (input by input from zero, even before
// odd): the same values. `x`: the row tile ([k][kFmaRows], row 0); sums[c] for the P * 16
// outputs. No software prefetch: the hardware's follows P sequential streams (asking for the
// next block into L2 as these were read measured no faster on the Zen 3).
template <int P, typename W>
__attribute__((noinline)) void fma_row_panels(const float* x, int64_t k, const W* panels,
                                              int64_t panel_values, float* sums) {
    constexpr int64_t R = kFmaRows;
    __m256 acc[P][2];
#pragma GCC unroll 8
    for (int j = 0; j < P; j++) acc[j][0] = acc[j][1] = _mm256_setzero_ps();
    if constexpr (sizeof(W) == 4) {
        const float* w = reinterpret_cast<const float*>(panels);
        for (int64_t i = 0; i < k; i++) {
            const __m256 xi = _mm256_broadcast_ss(x + i * R);
#pragma GCC unroll 8
            for (int j = 0; j < P; j++) {
                const float* wj = w + j * panel_values + i * kPanelCols;
                acc[j][0] = _mm256_fmadd_ps(xi, _mm256_loadu_ps(wj), acc[j][0]);
                acc[j][1] = _mm256_fmadd_ps(xi, _mm256_loadu_ps(wj + 8), acc[j][1]);
            }
        }
    } else {
        const uint16_t* w = reinterpret_cast<const uint16_t*>(panels);
        for (int64_t i = 0; i < k; i += 2) {
            const __m256 xe = _mm256_broadcast_ss(x + i * R);
            const __m256 xo = _mm256_broadcast_ss(x + (i + 1) * R);
#pragma GCC unroll 8
            for (int j = 0; j < P; j++) {
                const uint16_t* wj = w + j * panel_values + i * kPanelCols;
                acc[j][0] = _mm256_fmadd_ps(xe, even_inputs(wj), acc[j][0]);
                acc[j][1] = _mm256_fmadd_ps(xe, even_inputs(wj + 16), acc[j][1]);
                acc[j][0] = _mm256_fmadd_ps(xo, odd_inputs(wj), acc[j][0]);
                acc[j][1] = _mm256_fmadd_ps(xo, odd_inputs(wj + 16), acc[j][1]);
            }
        }
    }
#pragma GCC unroll 8
    for (int j = 0; j < P; j++) {
        _mm256_storeu_ps(sums + j * kPanelCols, acc[j][0]);
        _mm256_storeu_ps(sums + j * kPanelCols + 8, acc[j][1]);
    }
}

// fma_tile for any 1 <= rows <= kFmaRows. Never inlined, as dot_rows (dot_tile.h): an
// epilogue's registers beside the loop made GCC spill the accumulators there.
template <typename W>
__attribute__((noinline)) void fma_rows(int rows, const float* x, int64_t k0, int64_t k1,
                                        const W* panel, float* sums, int64_t sums_stride,
                                        bool first, const W* ahead = nullptr,
                                        int64_t ahead_lines = 0) {
    const int64_t n = ahead_lines;
    switch (rows) {
        case 1: return fma_tile<1, W>(x, k0, k1, panel, sums, sums_stride, first, ahead, n);
        case 2: return fma_tile<2, W>(x, k0, k1, panel, sums, sums_stride, first, ahead, n);
        case 3: return fma_tile<3, W>(x, k0, k1, panel, sums, sums_stride, first, ahead, n);
        case 4: return fma_tile<4, W>(x, k0, k1, panel, sums, sums_stride, first, ahead, n);
        case 5: return fma_tile<5, W>(x, k0, k1, panel, sums, sums_stride, first, ahead, n);
        default: return fma_tile<6, W>(x, k0, k1, panel, sums, sums_stride, first, ahead, n);
    }
}

#endif  // LORAGATE_FMA

}  // namespace loragate
