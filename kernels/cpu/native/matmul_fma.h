// The matmul kernel's FMA path (kernels/cpu/native/matmul.cpp dispatches here for float32, and
// for bf16 on CPUs with AVX2 + FMA but no AVX512-BF16): the weights' panels by fma_tile.h's tiles.
#pragma once

#include <algorithm>
#include <cstdint>
#include <memory>
#include <type_traits>

#include <omp.h>

#include "bf16.h"
#include "dot_tile.h"
#include "fma_tile.h"
#include "matmul_rows.h"
#include "steal.h"

#if LORAGATE_FMA
namespace loragate {

// The FMA path (fma_tile.h): a block's 64 outputs are four panels of 16. The rows are first
// packed as float32 row tiles (the tile's layout, bf16 widened on the way), once for every
// block. A work item is a block and up to 16 row tiles (96 rows); the inputs are taken in
// slabs of 256, and each panel's slab (16 KB in float32) is read by every tile of the item's
// rows while it is in L1, the tiles' slab from L2 (a bf16 slab widened to float32 once per
// item of four or more tiles: session 23, on a Zen 3, 1.07x at 64 rows, 1.14x at 512). Sums
// are kept per item and written out by write_rows at the end. Items are split in runs with
// stealing (steal.h), and only a block's first chunk asks for its slabs ahead, its tiles
// sharing the asking (session 27, Zen 3, 2 threads, float32 against the first tile asking for
// every line and a static split: 1.1-1.3x at 8-32 rows, ~1.0-1.05x at 64-512; without the
// stealing 0.85-0.9x at 32-512).
constexpr int64_t kFmaTiles = 16;  // row tiles per work item
constexpr int64_t kSlab = 256;
constexpr int64_t kWidenTiles = 4;

// One work item: rows [first, last) (of the packed tiles `xt`) by one block. `cold`: the block
// is not in this core's L2 yet (the item is its first row chunk), so the slab read next is
// asked for as this one is computed; `next`: the block after it, whose first slab the last
// slab's tiles ask for (null: none, or the next item is this block's next chunk).
template <bool Silu, typename W, typename Y>
void fma_item(const float* xt, int64_t first, int64_t last, int64_t k, const W* block,
              bool cold, const W* next, const Y* bias, int64_t cols, Y* y, int64_t y_stride) {
    constexpr int kRows = loragate::kFmaRows;
    constexpr int64_t kPanels = kDotCols / loragate::kPanelCols;
    constexpr int64_t kLineValues = 64 / sizeof(W);
    const int64_t panel_values = loragate::kPanelCols * k;
    alignas(64) float sums[kFmaTiles * kRows][kDotCols];
    // bf16 weights: an item of at least kWidenTiles row tiles widens each panel's slab once
    // (loragate::widen_panel); fewer tiles widen as they read (the widening's cost is shared
    // by fewer tiles, and a step of a few rows is bound by the weights' reads)
    const bool widen = std::is_same_v<W, uint16_t> && last - first > (kWidenTiles - 1) * kRows;
    alignas(64) float wide[std::is_same_v<W, uint16_t> ? kSlab * loragate::kPanelCols : 1];
    const int64_t tiles = (last - first + kRows - 1) / kRows;
    if (last - first == 1)  // one row: every panel at once, the whole input (fma_row_panels)
        loragate::fma_row_panels<kPanels, W>(xt + first * k, k, block, panel_values, sums[0]);
    else for (int64_t k0 = 0; k0 < k; k0 += kSlab) {
        const int64_t k1 = std::min(k, k0 + kSlab);
        for (int64_t j = 0; j < kPanels; j++) {
            // The slab read next (the next panel's, or the next slab's first panel, or the
            // next block's first), asked for while this one is computed, its lines shared out
            // evenly between the tiles and over their iterations: memory streams while the
            // tiles compute from cache. All of it asked for by the first tile, a line an
            // iteration, filled L1 with two slabs (32 KB, all of it on a Zen 3) and left the
            // other tiles re-reading this one from L2. Where the block is already in L2 (a
            // later chunk), nothing is asked for: L1's own prefetcher follows the slab.
            const W* ahead = nullptr;
            int64_t ahead_inputs = 0;  // inputs of the slab it starts
            if (j + 1 == kPanels && k1 == k) {  // the block's last slab: the next block's first
                ahead = next;
                ahead_inputs = next != nullptr ? std::min(k, kSlab) : 0;
            } else if (cold && j + 1 < kPanels) {
                ahead = block + (j + 1) * panel_values + k0 * loragate::kPanelCols;
                ahead_inputs = k1 - k0;
            } else if (cold) {
                ahead = block + k1 * loragate::kPanelCols;
                ahead_inputs = std::min(k, k1 + kSlab) - k1;
            }
            const int64_t ahead_lines = ahead_inputs * loragate::kPanelCols / kLineValues;
            if constexpr (std::is_same_v<W, uint16_t>) {
                if (widen) {  // the slab widened once, every tile on the float32 loop
                    loragate::widen_panel(block + j * panel_values, k0, k1, wide, ahead);
                    for (int64_t r = first; r < last; r += kRows)
                        loragate::fma_rows<float>(
                            static_cast<int>(std::min<int64_t>(kRows, last - r)),
                            xt + r * k + k0 * kRows, 0, k1 - k0, wide,
                            sums[r - first] + j * loragate::kPanelCols, kDotCols, k0 == 0);
                    continue;
                }
            }
            for (int64_t r = first, t = 0; r < last; r += kRows, t++) {
                // tile t's share of the lines: [from, to)
                const int64_t from = t * ahead_lines / tiles;
                const int64_t to = (t + 1) * ahead_lines / tiles;
                loragate::fma_rows<W>(static_cast<int>(std::min<int64_t>(kRows, last - r)),
                                      xt + r * k, k0, k1, block + j * panel_values,
                                      sums[r - first] + j * loragate::kPanelCols, kDotCols,
                                      k0 == 0, ahead + from * kLineValues, to - from);
            }
        }
    }
    float b[kDotCols];
    load_bias(bias, cols, b);
    write_rows<Silu, Y>(sums, static_cast<int>(last - first), b, y, y_stride, cols);
}

template <bool Silu, typename W, typename X, typename Y>
void fma_matmul(const X* x, int64_t rows, int64_t x_stride, int64_t k, const W* packed,
                const Y* bias, int64_t n, Y* y, int64_t y_stride, int threads) {
    constexpr int kRows = loragate::kFmaRows;
    constexpr int64_t kChunkRows = kFmaTiles * kRows;
    const int64_t tiles = (rows + kRows - 1) / kRows;
    const int64_t blocks = (n + kDotCols - 1) / kDotCols;
    const int64_t chunks = (rows + kChunkRows - 1) / kChunkRows;
    const int64_t out_cols = Silu ? kDotCols / 2 : kDotCols;
    // not value-initialised: every element is written below (rows past the last, zero)
    std::unique_ptr<float[]> xt(new float[tiles * k * kRows]);
    // Work items (a block, a chunk of rows) in runs, a block's chunks one after another, with
    // stealing (steal.h): a static split left one thread waiting at every projection's end
    // whenever the other ran slower.
    const int64_t items = blocks * chunks;
    const int64_t team_size = std::max<int64_t>(1, std::min<int64_t>(threads, items));
    loragate::StealRuns runs(items, team_size);
    // one parallel region: the rows packed, a barrier, the work items
#pragma omp parallel num_threads(team_size)
    {
#pragma omp for schedule(static)
        for (int64_t t = 0; t < tiles; t++) {
            float* out = xt.get() + t * k * kRows;
            for (int64_t m = 0; m < kRows; m++) {
                const int64_t r = t * kRows + m;
                for (int64_t i = 0; i < k; i++)
                    out[i * kRows + m] = r < rows ? to_float(x[r * x_stride + i]) : 0.f;
            }
        }
        // An item's block is in this core's L2 where the thread's previous item was the same
        // block's previous chunk; the next block is asked for ahead by the block's last chunk
        // where the thread's next item is that block's first.
        int64_t previous = -1;
        auto run_item = [&](int64_t item, bool next_is_mine) {
            const int64_t b = item / chunks, chunk = item % chunks;
            const int64_t first = chunk * kChunkRows;
            const W* block = packed + b * kDotCols * k;
            const bool cold = chunk == 0 || previous != item - 1;
            const bool ask_next = next_is_mine && chunk == chunks - 1 && b + 1 < blocks;
            fma_item<Silu, W, Y>(xt.get(), first, std::min(rows, first + kChunkRows), k, block,
                                 cold, ask_next ? block + kDotCols * k : nullptr,
                                 bias != nullptr ? bias + b * kDotCols : nullptr,
                                 std::min(kDotCols, n - b * kDotCols),
                                 y + first * y_stride + b * out_cols, y_stride);
            previous = item;
        };
        const int64_t t = omp_get_thread_num();
        for (int64_t item; (item = runs.take_own(t)) >= 0;)
            run_item(item, runs.owns_next(t, item));
        for (int64_t item; (item = runs.steal(t)) >= 0;) run_item(item, false);
    }
}

}  // namespace loragate
#endif  // LORAGATE_FMA
