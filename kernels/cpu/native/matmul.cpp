// y = x W^T (+ bias) in bfloat16, for any number of rows, by AMX's tiles where the CPU has
// them (and the weight's input width is a multiple of 32), else by vdpbf16ps: the kernel
// kernels/cpu/matmul.py builds with the system's C++ compiler and calls through ctypes.
//
// Why beside (or instead of) oneDNN's packed matmul: at a few rows a step's matmuls only stream
// their weights, and oneDNN's call costs ~15-20 us before it streams (27 us for a 768 x 768
// weight already in cache, against 9 us here); over the 49 matmuls of a small-model step that
// is most of a millisecond. At more rows the vdpbf16ps loop, tiled, kept up with oneDNN on the
// AVX512-BF16 EPYCs measured (session 12: 1.1-1.7x at 1-64 rows, 1.01-1.04x at 200-2048); on
// a 2-core AMX Xeon, where oneDNN multiplies by AMX, it fell to 0.12x at 512 rows, and the AMX
// path below runs 1.3x oneDNN at 1-8 rows, 1.16x at 64, 1.03x at 512 (session 13). Where a
// start-up timing agrees (engine/step/native_matmul.py) one copy of the weights in this kernel's
// layout serves every step and oneDNN's copy is dropped.
//
// Layout (vdpbf16ps): for each block of 64 outputs, the pairs of the input dimension one after
// another, each pair's 64 x 2 values side by side ([n / 64][k / 2][64][2], the layout vdpbf16ps
// takes), so one block is one sequential stream. A block's rows are taken 6 at a time
// (dot_tile.h), reading the block from L2 after the first tile; work items are (block, up
// to 96 rows), split between threads. The AMX layout and loop: kernels/cpu/native/matmul_amx.h;
// the FMA path (float32, and bf16 without AVX512-BF16): kernels/cpu/native/matmul_fma.h; the
// epilogue every path shares (bias, rounding, the fused SiLU): kernels/cpu/native/matmul_rows.h.
//
// Values: float32 products and sums (each vdpbf16ps, or tdpbf16ps, adds exact bf16 products to
// float32 sums), the bias added in float32, one rounding to bf16 at the end: what oneDNN and
// F.linear compute, summed in another order. Without AVX512-BF16 the library builds, but
// `matmul_available` says 0 and the caller keeps oneDNN.

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include <omp.h>

#include "amx.h"
#include "bf16.h"
#include "dot_tile.h"
#include "fma_tile.h"
#include "vec_math.h"
#include "matmul_amx.h"
#include "matmul_fma.h"
#include "matmul_rows.h"
#include "steal.h"

namespace {

using loragate::BFloat16;
using loragate::to_float;

using loragate::kDotCols;
using loragate::load_bias;
using loragate::write_rows;
#if LORAGATE_AMX
using loragate::amx_matmul;
#endif
#if LORAGATE_FMA
using loragate::fma_matmul;
#endif

constexpr int64_t kChunk = 96;  // rows per work item: a block's panel reused 16 times from L2

#if defined(__AVX512BF16__)
// Rows [first, last) of one block by vdpbf16ps, six at a time. The first tile streams the block
// from memory; the others read it from L2 and leave memory idle, so they ask for `next` (the
// block this thread takes next, or null), the whole of it shared between them, at most four
// lines a step for six rows (fewer for fewer rows), and the next block's first tile finds it in
// L2. Session 16, the small model's projections at 64 rows: 384 -> 400 GFLOP/s (of 467 peak);
// at 8 rows, with the whole next block asked for by the 2-row second tile, 25% slower: hence
// the scaling by rows. Session 28 (Zen 4, a decode step's 49 matmuls): the cap was a line a
// step, which left ~60% of the next block to the first tile at 12-24 rows (streaming it at its
// compute's pace while memory idled); at four, 12 rows 8.5 -> 7.4 ms, 16 rows 9.9 -> 8.7, 24
// rows 12.2 -> 11.2, the same at 4-8 and 32-48.
//
// `spans` (a later kernel's memory: see dot_tile.h's SpanStream): each tile asks for its
// share of the thread's `lines_left` lines over its `tiles_left` tiles, at most a line a step
// (fewer for fewer rows), whatever `next` asks for beside it.
struct SpanShare {
    loragate::SpanStream stream;
    int64_t lines_left = 0;
    int64_t tiles_left = 0;

    // Lines the next tile of `rows` rows asks for over its k / 2 steps.
    int64_t quota(int64_t rows, int64_t k) {
        if (lines_left <= 0 || tiles_left <= 0) return 0;
        const int64_t share = (lines_left + tiles_left - 1) / tiles_left;
        const int64_t cap = std::max<int64_t>(1, k / 2 * rows / loragate::kDotRows);
        const int64_t lines = std::min(share, cap);
        lines_left -= lines;
        tiles_left--;
        return lines;
    }
};

template <bool Silu>
void block_rows(const uint16_t* x, int64_t x_stride, int64_t first, int64_t last, int64_t k,
                const uint16_t* w, const uint16_t* next, const BFloat16* bias, BFloat16* y,
                int64_t y_stride, int64_t cols, SpanShare& spans) {
    float sums[loragate::kDotRows][kDotCols];
    float b[kDotCols];
    load_bias(bias, cols, b);
    const int64_t tiles = (last - first + loragate::kDotRows - 1) / loragate::kDotRows;
    const int64_t block_lines = k * kDotCols * 2 / 64;  // bf16: k * 64 values
    const int64_t share =
        tiles > 1 ? std::min(2 * k, (block_lines + tiles - 2) / (tiles - 1)) : 0;
    int64_t asked = 0;  // lines of `next` asked for so far
    for (int64_t r = first, t = 0; r < last; r += loragate::kDotRows, t++) {
        const int rows = static_cast<int>(std::min<int64_t>(loragate::kDotRows, last - r));
        const char* ahead = nullptr;
        int64_t lines = 0;
        if (next != nullptr && t > 0) {  // a short tile covers fewer lines
            lines = std::min({share * rows / loragate::kDotRows, block_lines - asked});
            ahead = reinterpret_cast<const char*>(next) + 64 * asked;
            asked += lines;
        }
        loragate::dot_rows(rows, x + r * x_stride, x_stride, k, w, sums, ahead, lines,
                           &spans.stream, spans.quota(rows, k));
        write_rows<Silu, BFloat16>(sums, rows, b, y + r * y_stride, y_stride, cols);
    }
}
#endif

#if LORAGATE_FMA && !defined(__AVX512BF16__)
#define LORAGATE_FMA_BF16 1  // bf16 weights widened to float32 on the FMA path
#else
#define LORAGATE_FMA_BF16 0
#endif

// Whether an [n, k] bf16 weight is packed as column tiles of 16 outputs: for AMX (whole tiles
// of 32 inputs), or on the FMA path, whose panels are the same tiles.
bool tiled(int64_t k) {
#if LORAGATE_AMX
    return k % 32 == 0 && loragate::amx_permitted();
#else
    (void)k;
    return LORAGATE_FMA_BF16;
#endif
}

// A weight's [n, k] values into `tile_cols`-wide column tiles per block of 64 outputs, each
// [k / group][tile_cols][group] (group: inputs side by side, 2 for bf16 pairs, 1 for float32);
// outputs past n zero.
template <typename T>
void pack(const T* w, int64_t n, int64_t k, int64_t tile_cols, int64_t group, T* packed) {
    const int64_t blocks = (n + kDotCols - 1) / kDotCols;
    for (int64_t b = 0; b < blocks; b++)
        for (int64_t t = 0; t < kDotCols / tile_cols; t++)
            for (int64_t p = 0; p < k / group; p++)
                for (int64_t c = 0; c < tile_cols; c++) {
                    T* out = packed + b * kDotCols * k + t * tile_cols * k +
                             (p * tile_cols + c) * group;
                    const int64_t row = b * kDotCols + t * tile_cols + c;
                    for (int64_t g = 0; g < group; g++)
                        out[g] = row < n ? w[row * k + group * p + g] : T{};
                }
}

template <bool Silu>
void matmul(const uint16_t* x, int64_t rows, int64_t x_stride, int64_t k, const uint16_t* packed,
            const uint16_t* bias16, int64_t n, uint16_t* y16, int64_t y_stride, int threads,
            const loragate::Span* spans, int64_t num_spans) {
    const auto* bias = reinterpret_cast<const BFloat16*>(bias16);
    auto* y = reinterpret_cast<BFloat16*>(y16);
#if defined(__AVX512BF16__)
    const int64_t blocks = (n + kDotCols - 1) / kDotCols;
    const int64_t chunks = (rows + kChunk - 1) / kChunk;
    const int64_t out_cols = Silu ? kDotCols / 2 : kDotCols;  // outputs a block writes
#if LORAGATE_AMX
    if (tiled(k)) {
        amx_matmul<Silu>(x, rows, x_stride, k, packed, bias, n, y, y_stride, threads);
        return;
    }
#endif
    // Each thread takes a run of consecutive items (a block's row chunks side by side), so the
    // block it takes next is known: the next item's, where that is another block. A thread done
    // with its run takes items from the back of another's (steal.h).
    const int64_t items = blocks * chunks;
    const int64_t block_values = (k / 2) * 2 * kDotCols;
    const int64_t team_size = std::max<int64_t>(1, std::min<int64_t>(threads, items));
    loragate::StealRuns runs(items, team_size);
#pragma omp parallel num_threads(team_size)
    {
        const int64_t team = omp_get_num_threads(), t = omp_get_thread_num();
        const int64_t begin = loragate::StealRuns::first(t, items, team);
        const int64_t end = loragate::StealRuns::first(t + 1, items, team);
        SpanShare share;  // this thread's share of the spans, by count
        if (num_spans > 0) {
            share.stream.span = spans + t * num_spans / team;
            share.stream.end = spans + (t + 1) * num_spans / team;
            for (const loragate::Span* p = share.stream.span; p != share.stream.end; p++)
                share.lines_left += p->lines;
            for (int64_t item = begin; item < end; item++) {
                const int64_t first = (item % chunks) * kChunk;
                const int64_t item_rows = std::min(rows, first + kChunk) - first;
                share.tiles_left += (item_rows + loragate::kDotRows - 1) / loragate::kDotRows;
            }
        }
        auto run_item = [&](int64_t item, bool next_block) {
            const int64_t b = item / chunks, first = (item % chunks) * kChunk;
            const uint16_t* block = packed + b * block_values;
            block_rows<Silu>(x, x_stride, first, std::min(rows, first + kChunk), k, block,
                             next_block ? block + block_values : nullptr,
                             bias != nullptr ? bias + b * kDotCols : nullptr, y + b * out_cols,
                             y_stride, std::min(kDotCols, n - b * kDotCols), share);
        };
        for (int64_t item; (item = runs.take_own(t)) >= 0;)
            run_item(item, (item + 1) % chunks == 0 && runs.owns_next(t, item));
        for (int64_t item; (item = runs.steal(t)) >= 0;) run_item(item, false);
    }
#elif LORAGATE_FMA_BF16
    fma_matmul<Silu, uint16_t>(reinterpret_cast<const BFloat16*>(x), rows, x_stride, k, packed,
                               bias, n, y, y_stride, threads);
#else
    (void)x, (void)rows, (void)x_stride, (void)k, (void)packed, (void)bias, (void)n, (void)y,
        (void)y_stride, (void)threads;
#endif
    (void)spans, (void)num_spans;  // asked for on the vdpbf16ps path only
}

template <bool Silu>
void f32_matmul(const float* x, int64_t rows, int64_t x_stride, int64_t k, const float* packed,
                const float* bias, int64_t n, float* y, int64_t y_stride, int threads) {
#if LORAGATE_FMA
    fma_matmul<Silu, float>(x, rows, x_stride, k, packed, bias, n, y, y_stride, threads);
#else
    (void)x, (void)rows, (void)x_stride, (void)k, (void)packed, (void)bias, (void)n, (void)y,
        (void)y_stride, (void)threads;
#endif
}

}  // namespace

extern "C" {

// 1 where the bf16 entries compute: AVX512-BF16 (and AMX), or AVX2 + FMA (weights widened).
int matmul_available() {
#if defined(__AVX512BF16__) || LORAGATE_FMA
    return 1;
#else
    return 0;
#endif
}

// 1 where the float32 entries compute: AVX2 + FMA.
int matmul_f32_available() { return LORAGATE_FMA; }

// 1 where steps of 2 or more rows (k a multiple of 32) run on AMX's tiles: built with AMX-BF16
// and the kernel lets this process use them.
int matmul_amx() {
#if LORAGATE_AMX
    return loragate::amx_permitted() ? 1 : 0;
#else
    return 0;
#endif
}

// w [n, k] bf16 row-major -> packed, outputs past n zero (k even): for each block of 64
// outputs, [k / 2][64][2], or where `matmul_tiled(k)` four column tiles [16][k / 2][16][2].
void matmul_pack_bf16(const uint16_t* w, int64_t n, int64_t k, uint16_t* packed) {
    pack(w, n, k, tiled(k) ? 16 : kDotCols, 2, packed);
}

// w [n, k] float32 row-major -> packed: for each block of 64 outputs, four panels [k][16].
void matmul_pack_f32(const float* w, int64_t n, int64_t k, float* packed) {
    pack(w, n, k, loragate::kPanelCols, 1, packed);
}

int matmul_tiled(int64_t k) { return tiled(k) ? 1 : 0; }

// y[r, :n] = x[r, :k] W^T + bias for `rows` rows (x rows x_stride apart, y rows y_stride
// apart); bias may be null. Work items (a block of 64 outputs, up to 96 rows) are split between
// the threads, a block's row chunks next to each other so a thread reuses its panel.
void matmul_bf16(const uint16_t* x, int64_t rows, int64_t x_stride, int64_t k,
                 const uint16_t* packed, const uint16_t* bias, int64_t n, uint16_t* y,
                 int64_t y_stride, int threads) {
    matmul<false>(x, rows, x_stride, k, packed, bias, n, y, y_stride, threads, nullptr, 0);
}

// A fused gate/up projection and the SiLU after it: the weight (and bias) packed from rows
// ordered gate 0..31, up 0..31, gate 32..63, up 32..63, ... (n = 2 * width, width a multiple of
// 32); y[r, :width] = round(round(silu(gate)) * up).
void matmul_silu_bf16(const uint16_t* x, int64_t rows, int64_t x_stride, int64_t k,
                      const uint16_t* packed, const uint16_t* bias, int64_t n, uint16_t* y,
                      int64_t y_stride, int threads) {
    matmul<true>(x, rows, x_stride, k, packed, bias, n, y, y_stride, threads, nullptr, 0);
}

// matmul_bf16 that also asks for `spans` (dot_tile.h's Span, num_spans of them) while it
// computes, for the kernel that reads them next (kernels/cpu/native/decoder.cpp: the LoRA runs).
void matmul_spans_bf16(const uint16_t* x, int64_t rows, int64_t x_stride, int64_t k,
                       const uint16_t* packed, const uint16_t* bias, int64_t n, uint16_t* y,
                       int64_t y_stride, int threads, const void* spans, int64_t num_spans) {
    matmul<false>(x, rows, x_stride, k, packed, bias, n, y, y_stride, threads,
                  static_cast<const loragate::Span*>(spans), num_spans);
}

// The float32 forms of the two above, over matmul_pack_f32's layout.
void matmul_f32(const float* x, int64_t rows, int64_t x_stride, int64_t k, const float* packed,
                const float* bias, int64_t n, float* y, int64_t y_stride, int threads) {
    f32_matmul<false>(x, rows, x_stride, k, packed, bias, n, y, y_stride, threads);
}

void matmul_silu_f32(const float* x, int64_t rows, int64_t x_stride, int64_t k,
                     const float* packed, const float* bias, int64_t n, float* y,
                     int64_t y_stride, int threads) {
    f32_matmul<true>(x, rows, x_stride, k, packed, bias, n, y, y_stride, threads);
}

}  // extern "C"
