// The matmul kernel's AMX path (kernels/cpu/native/matmul.cpp dispatches here where the CPU has
// AMX-BF16 and the weight's input width is a multiple of 32).
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "amx.h"
#include "bf16.h"
#include "dot_tile.h"
#include "matmul_rows.h"

#if LORAGATE_AMX
namespace loragate {

// AMX. A block's 64 outputs are packed as four column tiles of 16, one after another, each
// [k / 2][16][2] (the pairs of the input dimension in turn, each pair's 16 x 2 values side by
// side: tdpbf16ps's B operand, 1 KB for 32 inputs). A tile of x is up to 16 rows by 32 inputs.
// A work item is a block and up to 64 rows; each tile of 16 rows multiplies all four column
// tiles (read as four sequential streams), 32 inputs at a time, in chunks of inputs that every
// row tile takes in turn (amx_block). Tiles: 0-3 the four column tiles' float32 sums, 4 the rows of x, 6-7 the
// weights, alternating so a load need not wait for the product reading the one before.
// Measured against this on the small model's matmuls (2-core AMX Xeon): the vdpbf16ps layout
// read as B tiles (a 256-byte stride) 1.1x slower at 64 rows; each column tile in turn against
// four row tiles 1.2x slower (five loads for four products, x's 64 rows from L2 each time);
// software prefetch of the next block, or of chunks further ahead than the next, slower
// still (ask_next_chunk asks for the next chunk only).

constexpr int64_t kAmxRows = 16;  // rows of x in one tile
constexpr int64_t kTileCols = 16;  // outputs per column tile
constexpr int64_t kAmxChunk = 4 * kAmxRows;  // rows per work item
// Inputs a row tile takes at a time (amx_block): 64 in steps of up to kShortRows rows (the
// chunk's slice of each column tile stays in L1 while the weights stream from memory), 256 in
// longer steps (a 32 KB slice of the block in L1 for all of an item's row tiles; whole k read
// it from L2 for each). Session 29 (AMX Xeon, the small model's 48 layer matmuls and LM head):
// 256 against whole k 0.92x the time at 525 rows, 0.87-0.93x at 1024, 0.93x at 2048, 0.93x at
// 200; 64 against 256 about the same at 39-128 rows, where the next chunk is asked for too.
constexpr int64_t kAmxKChunk = 64;
constexpr int64_t kAmxLongKChunk = 256;
constexpr int64_t kShortRows = 128;

// Tiles for row tiles of `m` rows (16, or fewer where the whole step is one short tile); per
// thread, until _tile_release.
inline void configure_tiles(int m) {
    loragate::TileConfig config;
    for (int t = 0; t < 5; t++) config.set(t, m, 64);   // the sums, x's rows
    for (int t = 6; t < 8; t++) config.set(t, 16, 64);  // weights: 16 pairs of the input
    load_tiles(config);
}

// In a short step the first row tile of a chunk waits on the weights from memory and the later
// ones work from L1, with nothing asked for meanwhile: they ask for the next 64-input slice of
// the block's four column tiles (the next block's first where this was the last), each its
// share of the lines, to L1. Session 29 (AMX Xeon, the 48 layer matmuls and LM head): 0.93x
// the time at 39 and 64 rows; two or three chunks ahead, or to L2, slower.
inline void ask_next_chunk(const uint16_t* w, int64_t k, int64_t k1, int t, int tiles) {
    constexpr int64_t kPairRow = 2 * kTileCols;
    const int64_t tile_values = (k / 2) * kPairRow;
    const uint16_t* base = k1 < k ? w + (k1 / 2) * kPairRow : w + 4 * tile_values;
    const int64_t next = k1 < k ? k1 : 0;
    const int64_t lines = (std::min(k, next + kAmxKChunk) - next) * kPairRow / 64;  // a tile's
    const int64_t share = (lines + tiles - 2) / (tiles - 1);
    const int64_t first = (t - 1) * share, end = std::min(lines, t * share);
    for (int c = 0; c < 4; c++) {
        const char* p = reinterpret_cast<const char*>(base + c * tile_values);
        for (int64_t l = first; l < end; l++) _mm_prefetch(p + l * 64, _MM_HINT_T0);
    }
}

// `tiles` row tiles of x (rows x_stride apart) by one block, a row tile at a time against the
// block's four column tiles; writes `rows` rows of y. `tail`, where not null: the last row
// tile's rows, k apart, beside zero rows up to the tile's 16 (x's own rows end before).
// `k_chunk` inputs at a time (a multiple of 32, or k): every row tile takes the chunk before
// the next chunk begins, its sums put back in between (float32, so the same sums bit for
// bit), so the chunk's slice of the block (8 KB at 64 inputs, 32 KB at 256) stays in L1 for
// the later row tiles instead of coming from L2 or memory. Session 17 (AMX Xeon, the small
// model's 48 layer matmuls): chunks of 64 inputs 0.89x the time at 64 rows, 0.90x at 256,
// the same at 512 and 1.22x at 2048; 32 inputs 1.14x at 64 rows. Session 29: kAmxLongKChunk.
template <bool Silu>
void amx_block(const uint16_t* x, int64_t x_stride, const uint16_t* tail, int rows, int tiles,
               int64_t k, int64_t k_chunk, const uint16_t* w, const BFloat16* bias, BFloat16* y,
               int64_t y_stride, int64_t cols) {
    alignas(64) float sums[kAmxChunk][kDotCols];
    float b[kDotCols];
    load_bias(bias, cols, b);
    const int64_t x_bytes = x_stride * 2;
    constexpr int64_t kPairRow = 2 * kTileCols;
    const int64_t tile_values = (k / 2) * kPairRow;
    for (int64_t k0 = 0; k0 < k; k0 += k_chunk) {
        const int64_t k1 = std::min(k, k0 + k_chunk);
        for (int t = 0; t < tiles; t++) {
            float* st = sums[0] + t * kAmxRows * kDotCols;
            if (k0 == 0) {
                _tile_zero(0);
                _tile_zero(1);
                _tile_zero(2);
                _tile_zero(3);
            } else {
                _tile_loadd(0, st, 4 * kDotCols);
                _tile_loadd(1, st + 16, 4 * kDotCols);
                _tile_loadd(2, st + 32, 4 * kDotCols);
                _tile_loadd(3, st + 48, 4 * kDotCols);
            }
            const bool padded = tail != nullptr && t == tiles - 1;
            const uint16_t* xt = padded ? tail : x + t * kAmxRows * x_stride;
            const int64_t xt_bytes = padded ? k * 2 : x_bytes;
            // chunks of kAmxKChunk: a short step's (amx_matmul)
            if (t > 0 && k_chunk == kAmxKChunk) ask_next_chunk(w, k, k1, t, tiles);
            for (int64_t i = k0; i < k1; i += 32) {
                const uint16_t* wi = w + (i / 2) * kPairRow;
                _tile_loadd(4, xt + i, xt_bytes);
                _tile_loadd(6, wi, 64);
                _tile_dpbf16ps(0, 4, 6);
                _tile_loadd(7, wi + tile_values, 64);
                _tile_dpbf16ps(1, 4, 7);
                _tile_loadd(6, wi + 2 * tile_values, 64);
                _tile_dpbf16ps(2, 4, 6);
                _tile_loadd(7, wi + 3 * tile_values, 64);
                _tile_dpbf16ps(3, 4, 7);
            }
            _tile_stored(0, st, 4 * kDotCols);
            _tile_stored(1, st + 16, 4 * kDotCols);
            _tile_stored(2, st + 32, 4 * kDotCols);
            _tile_stored(3, st + 48, 4 * kDotCols);
        }
    }
    write_rows<Silu, BFloat16>(sums, rows, b, y, y_stride, cols);
}

// y = x W^T (+ bias) for `rows` rows over weights packed as column tiles (matmul_pack_bf16):
// work items of a block and up to 64 rows, split between the threads.
template <bool Silu>
void amx_matmul(const uint16_t* x, int64_t rows, int64_t x_stride, int64_t k,
                const uint16_t* packed, const BFloat16* bias, int64_t n, BFloat16* y,
                int64_t y_stride, int threads) {
    const int64_t blocks = (n + kDotCols - 1) / kDotCols;
    const int64_t out_cols = Silu ? kDotCols / 2 : kDotCols;  // outputs a block writes
    // Whole row tiles: in a step of more than 16 rows whose count is not a multiple of 16,
    // the last tile's rows are copied beside zero rows (copying every row instead cost
    // ~0.1 ms a matmul at 520 rows); a shorter step runs as one short tile.
    std::vector<uint16_t> tail;
    const int64_t whole = rows / kAmxRows * kAmxRows;
    if (rows > kAmxRows && rows > whole) {
        tail.assign(kAmxRows * k, 0);
        for (int64_t r = whole; r < rows; r++)
            std::memcpy(tail.data() + (r - whole) * k, x + r * x_stride, k * 2);
    }
    const int64_t amx_chunks = (rows + kAmxChunk - 1) / kAmxChunk;
    // inputs in chunks where a step has more than one row tile
    const int64_t k_chunk = rows <= kAmxRows      ? k
                            : rows <= kShortRows ? std::min(k, kAmxKChunk)
                                                 : std::min(k, kAmxLongKChunk);
#pragma omp parallel num_threads(threads)
    {
        configure_tiles(static_cast<int>(std::min<int64_t>(rows, kAmxRows)));
#pragma omp for schedule(static)
        for (int64_t item = 0; item < blocks * amx_chunks; item++) {
            const int64_t b = item / amx_chunks, first = (item % amx_chunks) * kAmxChunk;
            const int64_t chunk_rows = std::min(kAmxChunk, rows - first);
            const bool last = first + chunk_rows == rows;
            amx_block<Silu>(x + first * x_stride, x_stride,
                            last && !tail.empty() ? tail.data() : nullptr,
                            static_cast<int>(chunk_rows),
                            static_cast<int>((chunk_rows + kAmxRows - 1) / kAmxRows), k,
                            k_chunk, packed + b * (k / 2) * 2 * kDotCols,
                            bias != nullptr ? bias + b * kDotCols : nullptr,
                            y + first * y_stride + b * out_cols, y_stride,
                            std::min(kDotCols, n - b * kDotCols));
        }
        _tile_release();
    }
}

}  // namespace loragate
#endif
