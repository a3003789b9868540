// The bf16 dot-product tile shared by the hand-written kernels that multiply against a packed
// block (kernels/cpu/native/matmul.cpp, kernels/cpu/native/prefill.cpp): M rows of x (M <= 6) against one
// block of 64 outputs packed as [k / 2][64][2] (the pairs of the input dimension one after
// another, each pair's 64 x 2 values side by side: the layout vdpbf16ps takes).
//
// sums[m][c] = sum_i x[m, i] w[c, i] in float32: each vdpbf16ps adds a pair of exact bf16
// products to its lane. 24 accumulators, four weight registers and a broadcast: 29 of the 32
// vector registers at M = 6.
#pragma once

#include <cstdint>
#include <cstring>

#if defined(__AVX512F__) || defined(__AVX2__)
#include <immintrin.h>
#endif

namespace loragate {

constexpr int64_t kDotCols = 64;  // outputs per packed block
constexpr int kDotRows = 6;       // rows per tile, at most
// How far ahead of the loads the prefetch runs, in bf16 values: 16 pairs of the block (8 KB).
constexpr int64_t kDotPrefetch = 16 * 2 * kDotCols;

// Memory a kernel asks for while it computes, for a later kernel (kernels/cpu/native/decoder.cpp:
// the adapter stacks its LoRA runs read): spans of whole cache lines, asked for (to L2) a line
// at a time by `ask`, so the misses spread over the compute instead of queueing at once.
struct Span {
    const char* begin;  // 64-byte aligned
    int64_t lines;
};

struct SpanStream {
    const Span* span = nullptr;  // the current span; == end: nothing left
    const Span* end = nullptr;
    int64_t line = 0;  // lines of *span asked for

    bool done() const { return span == end; }
#if defined(__AVX512F__) || defined(__AVX2__)
    inline void ask() {
        _mm_prefetch(span->begin + 64 * line, _MM_HINT_T1);
        if (++line == span->lines) line = 0, ++span;
    }
#endif
};

#if defined(__AVX512BF16__)

// Every loop over acc is unrolled so its indices are constants: GCC then keeps acc in
// registers (with one loop left rolled it stored all 24 to the stack every step, 2.4x slower).
// `ahead`: `ahead_lines` cache lines from there asked for (to L2) over the tile's steps, spread
// evenly (the caller's next block, a slice a tile: see matmul.cpp's block_rows); and
// `extra_lines` lines of `extra` the same way (none where it is null).
// Extra: whether `extra` is asked for at all; a template argument, so the tiles that ask for
// none run the loop they ran before it existed (a per-step test cost 8-row matmuls ~15%).
template <int M, bool Extra>
inline void dot_tile(const uint16_t* x, int64_t x_stride, int64_t k, const uint16_t* w,
                     float (*sums)[kDotCols], const char* ahead, int64_t ahead_lines,
                     SpanStream* extra, int64_t extra_lines) {
    static_assert(M >= 1 && M <= kDotRows);
    __m512 acc[M][4];
#pragma GCC unroll 6
    for (int m = 0; m < M; m++)
#pragma GCC unroll 4
        for (int j = 0; j < 4; j++) acc[m][j] = _mm512_setzero_ps();
    // lines asked for a step: ahead_lines over the k / 2 steps, rounded up
    const int64_t per_step = ahead_lines > 0 ? (ahead_lines + k / 2 - 1) / (k / 2) : 0;
    const char* const ahead_end = ahead + 64 * ahead_lines;
    const int64_t extra_step = Extra ? (extra_lines + k / 2 - 1) / (k / 2) : 0;
    for (int64_t p = 0; p < k / 2; p++, w += 2 * kDotCols) {
        _mm_prefetch(reinterpret_cast<const char*>(w + kDotPrefetch), _MM_HINT_T0);
        _mm_prefetch(reinterpret_cast<const char*>(w + kDotPrefetch + kDotCols), _MM_HINT_T0);
        for (int64_t j = 0; j < per_step && ahead < ahead_end; j++, ahead += 64)
            _mm_prefetch(ahead, _MM_HINT_T1);
        if constexpr (Extra)
            for (int64_t j = 0; j < extra_step && extra_lines > 0 && !extra->done(); j++)
                extra->ask(), extra_lines--;
        const __m512bh w0 = (__m512bh)_mm512_loadu_si512(w);
        const __m512bh w1 = (__m512bh)_mm512_loadu_si512(w + 32);
        const __m512bh w2 = (__m512bh)_mm512_loadu_si512(w + 64);
        const __m512bh w3 = (__m512bh)_mm512_loadu_si512(w + 96);
#pragma GCC unroll 6
        for (int m = 0; m < M; m++) {
            int32_t pair;  // x[m, 2p] and x[m, 2p + 1], broadcast to every lane
            std::memcpy(&pair, x + m * x_stride + 2 * p, sizeof pair);
            const __m512bh xp = (__m512bh)_mm512_set1_epi32(pair);
            acc[m][0] = _mm512_dpbf16_ps(acc[m][0], xp, w0);
            acc[m][1] = _mm512_dpbf16_ps(acc[m][1], xp, w1);
            acc[m][2] = _mm512_dpbf16_ps(acc[m][2], xp, w2);
            acc[m][3] = _mm512_dpbf16_ps(acc[m][3], xp, w3);
        }
    }
#pragma GCC unroll 6
    for (int m = 0; m < M; m++)
#pragma GCC unroll 4
        for (int j = 0; j < 4; j++) _mm512_storeu_ps(sums[m] + 16 * j, acc[m][j]);
}

template <bool Extra>
inline void dot_tile_rows(int rows, const uint16_t* x, int64_t x_stride, int64_t k,
                          const uint16_t* w, float (*sums)[kDotCols], const char* ahead,
                          int64_t ahead_lines, SpanStream* extra, int64_t extra_lines) {
    switch (rows) {
        case 1: return dot_tile<1, Extra>(x, x_stride, k, w, sums, ahead, ahead_lines,
                                              extra, extra_lines);
        case 2: return dot_tile<2, Extra>(x, x_stride, k, w, sums, ahead, ahead_lines,
                                              extra, extra_lines);
        case 3: return dot_tile<3, Extra>(x, x_stride, k, w, sums, ahead, ahead_lines,
                                              extra, extra_lines);
        case 4: return dot_tile<4, Extra>(x, x_stride, k, w, sums, ahead, ahead_lines,
                                              extra, extra_lines);
        case 5: return dot_tile<5, Extra>(x, x_stride, k, w, sums, ahead, ahead_lines,
                                              extra, extra_lines);
        default: return dot_tile<6, Extra>(x, x_stride, k, w, sums, ahead, ahead_lines,
                                               extra, extra_lines);
    }
}

// dot_tile for any 1 <= rows <= 6. Never inlined: inlined into a caller whose epilogue needs
// registers of its own (the fused SiLU's exp), GCC spilled the accumulators in the loop
// (1.9x slower).
__attribute__((noinline)) inline void dot_rows(int rows, const uint16_t* x, int64_t x_stride,
                                               int64_t k, const uint16_t* w,
                                               float (*sums)[kDotCols],
                                               const char* ahead = nullptr,
                                               int64_t ahead_lines = 0,
                                               SpanStream* extra = nullptr,
                                               int64_t extra_lines = 0) {
    if (extra != nullptr && extra_lines > 0)
        return dot_tile_rows<true>(rows, x, x_stride, k, w, sums, ahead, ahead_lines, extra,
                                   extra_lines);
    dot_tile_rows<false>(rows, x, x_stride, k, w, sums, ahead, ahead_lines, nullptr, 0);
}

#endif  // __AVX512BF16__

}  // namespace loragate
