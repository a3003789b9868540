// y = x W^T (+ bias) in bfloat16, for any number of rows, by AMX's tiles where the CPU has
// them (and the weight's input width is a multiple of 32), else by vdpbf16ps: the kernel
// kernels/cpu_matmul.py builds with the system's C++ compiler and calls through ctypes.
//
// Why beside (or instead of) oneDNN's packed matmul: at a few rows a step's matmuls only stream
// their weights, and oneDNN's call costs ~15-20 us before it streams (27 us for a 768 x 768
// weight already in cache, against 9 us here); over the 49 matmuls of a small-model step that
// is most of a millisecond. At more rows the vdpbf16ps loop, tiled, kept up with oneDNN on the
// AVX512-BF16 EPYCs measured (session 12: 1.1-1.7x at 1-64 rows, 1.01-1.04x at 200-2048); on
// a 2-core AMX Xeon, where oneDNN multiplies by AMX, it fell to 0.12x at 512 rows, and the AMX
// path below runs 1.3x oneDNN at 1-8 rows, 1.16x at 64, 1.03x at 512 (session 13). Where a
// start-up timing agrees (engine/native_matmul.py) one copy of the weights in this kernel's
// layout serves every step and oneDNN's copy is dropped.
//
// Layout (vdpbf16ps): for each block of 64 outputs, the pairs of the input dimension one after
// another, each pair's 64 x 2 values side by side ([n / 64][k / 2][64][2], the layout vdpbf16ps
// takes), so one block is one sequential stream. A block's rows are taken 6 at a time
// (cpu_dot_tile.h), reading the block from L2 after the first tile; work items are (block, up
// to 96 rows), split between threads. The AMX layout and loop are described where they are.
//
// Values: float32 products and sums (each vdpbf16ps, or tdpbf16ps, adds exact bf16 products to
// float32 sums), the bias added in float32, one rounding to bf16 at the end: what oneDNN and
// F.linear compute, summed in another order. Without AVX512-BF16 the library builds, but
// `matmul_available` says 0 and the caller keeps oneDNN.

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "cpu_amx.h"
#include "cpu_bf16.h"
#include "cpu_dot_tile.h"
#include "cpu_math.h"

namespace {

using loragate::BFloat16;
using loragate::from_float;
using loragate::to_float;

using loragate::kDotCols;

constexpr int64_t kChunk = 96;  // rows per work item: a block's panel reused 16 times from L2


#if defined(__AVX512BF16__)
// One tile's rows written out. Plain: the block's `cols` outputs, each the float32 sum plus the
// bias, rounded once. Silu: the block holds 32 gate and then the 32 matching up outputs
// (matmul_silu_bf16's layout), and the 32 outputs are round(round(silu(gate)) * up), gate and
// up each rounded first (what the separate matmul and kernels/cpu_layer.cpp's silu_mul
// compute). The loops over a row's outputs are plain element-wise loops, so they vectorise
// (the SiLU's exp included).
template <bool Silu>
inline void write_rows(const float (*sums)[kDotCols], int rows, const float* b, uint16_t* y,
                       int64_t y_stride, int64_t cols) {
    constexpr int64_t kHalf = kDotCols / 2;
    for (int m = 0; m < rows; m++) {
        uint16_t* out = y + m * y_stride;
        const float* s = sums[m];
        if (Silu) {
#pragma omp simd
            for (int64_t c = 0; c < kHalf; c++) {
                const float gate = loragate::round_to<BFloat16>(s[c] + b[c]);
                const float up = loragate::round_to<BFloat16>(s[c + kHalf] + b[c + kHalf]);
                const float act = loragate::round_to<BFloat16>(loragate::silu(gate));
                out[c] = from_float<BFloat16>(act * up).bits;
            }
        } else if (cols == kDotCols) {
#pragma omp simd
            for (int64_t c = 0; c < kDotCols; c++) out[c] = from_float<BFloat16>(s[c] + b[c]).bits;
        } else {  // a padded last block
            for (int64_t c = 0; c < cols; c++) out[c] = from_float<BFloat16>(s[c] + b[c]).bits;
        }
    }
}

inline void load_bias(const uint16_t* bias, int64_t cols, float* b) {
    for (int64_t c = 0; c < kDotCols; c++)
        b[c] = bias != nullptr && c < cols ? to_float(BFloat16{bias[c]}) : 0.f;
}

// Rows [first, last) of one block by vdpbf16ps, six at a time.
template <bool Silu>
void block_rows(const uint16_t* x, int64_t x_stride, int64_t first, int64_t last, int64_t k,
                const uint16_t* w, const uint16_t* bias, uint16_t* y, int64_t y_stride,
                int64_t cols) {
    float sums[loragate::kDotRows][kDotCols];
    float b[kDotCols];
    load_bias(bias, cols, b);
    for (int64_t r = first; r < last; r += loragate::kDotRows) {
        const int rows = static_cast<int>(std::min<int64_t>(loragate::kDotRows, last - r));
        loragate::dot_rows(rows, x + r * x_stride, x_stride, k, w, sums);
        write_rows<Silu>(sums, rows, b, y + r * y_stride, y_stride, cols);
    }
}
#endif

#if LORAGATE_AMX
// AMX. A block's 64 outputs are packed as four column tiles of 16, one after another, each
// [k / 2][16][2] (the pairs of the input dimension in turn, each pair's 16 x 2 values side by
// side: tdpbf16ps's B operand, 1 KB for 32 inputs). A tile of x is up to 16 rows by 32 inputs.
// A work item is a block and up to 64 rows; each tile of 16 rows multiplies all four column
// tiles (read as four sequential streams, from memory the first time and from L2 after), 32
// inputs at a time. Tiles: 0-3 the four column tiles' float32 sums, 4 the rows of x, 6-7 the
// weights, alternating so a load need not wait for the product reading the one before.
// Measured against this on the small model's matmuls (2-core AMX Xeon): the vdpbf16ps layout
// read as B tiles (a 256-byte stride) 1.1x slower at 64 rows; each column tile in turn against
// four row tiles 1.2x slower (five loads for four products, x's 64 rows from L2 each time);
// software prefetch of the weights slower still.

constexpr int64_t kAmxRows = 16;  // rows of x in one tile
constexpr int64_t kTileCols = 16;  // outputs per column tile
constexpr int64_t kAmxChunk = 4 * kAmxRows;  // rows per work item

// Tiles for row tiles of `m` rows (16, or fewer where the whole step is one short tile); per
// thread, until _tile_release.
inline void configure_tiles(int m) {
    loragate::TileConfig config;
    for (int t = 0; t < 5; t++) config.set(t, m, 64);   // the sums, x's rows
    for (int t = 6; t < 8; t++) config.set(t, 16, 64);  // weights: 16 pairs of the input
    _tile_loadconfig(&config);
}

// `tiles` row tiles of x (rows x_stride apart; whole tiles: rows past `rows` are readable) by
// one block, a row tile at a time against the block's four column tiles; writes `rows` rows
// of y.
template <bool Silu>
void amx_block(const uint16_t* x, int64_t x_stride, int rows, int tiles, int64_t k,
               const uint16_t* w, const uint16_t* bias, uint16_t* y, int64_t y_stride,
               int64_t cols) {
    alignas(64) float sums[kAmxChunk][kDotCols];
    float b[kDotCols];
    load_bias(bias, cols, b);
    const int64_t x_bytes = x_stride * 2;
    constexpr int64_t kPairRow = 2 * kTileCols;
    const int64_t tile_values = (k / 2) * kPairRow;
    for (int t = 0; t < tiles; t++) {
        _tile_zero(0);
        _tile_zero(1);
        _tile_zero(2);
        _tile_zero(3);
        const uint16_t* xt = x + t * kAmxRows * x_stride;
        for (int64_t i = 0; i < k; i += 32) {
            const uint16_t* wi = w + (i / 2) * kPairRow;
            _tile_loadd(4, xt + i, x_bytes);
            _tile_loadd(6, wi, 64);
            _tile_dpbf16ps(0, 4, 6);
            _tile_loadd(7, wi + tile_values, 64);
            _tile_dpbf16ps(1, 4, 7);
            _tile_loadd(6, wi + 2 * tile_values, 64);
            _tile_dpbf16ps(2, 4, 6);
            _tile_loadd(7, wi + 3 * tile_values, 64);
            _tile_dpbf16ps(3, 4, 7);
        }
        float* st = sums[0] + t * kAmxRows * kDotCols;
        _tile_stored(0, st, 4 * kDotCols);
        _tile_stored(1, st + 16, 4 * kDotCols);
        _tile_stored(2, st + 32, 4 * kDotCols);
        _tile_stored(3, st + 48, 4 * kDotCols);
    }
    write_rows<Silu>(sums, rows, b, y, y_stride, cols);
}

#endif

// Whether an [n, k] weight is packed (and multiplied) for AMX: whole tiles of 32 inputs.
bool tiled(int64_t k) {
#if LORAGATE_AMX
    return k % 32 == 0 && loragate::amx_permitted();
#else
    (void)k;
    return false;
#endif
}


// Without AVX512-BF16 nothing is computed: `matmul_available` says 0 and no caller gets here.
template <bool Silu>
void matmul(const uint16_t* x, int64_t rows, int64_t x_stride, int64_t k, const uint16_t* packed,
            const uint16_t* bias, int64_t n, uint16_t* y, int64_t y_stride, int threads) {
#if defined(__AVX512BF16__)
    const int64_t blocks = (n + kDotCols - 1) / kDotCols;
    const int64_t chunks = (rows + kChunk - 1) / kChunk;
    const int64_t out_cols = Silu ? kDotCols / 2 : kDotCols;  // outputs a block writes
#if LORAGATE_AMX
    if (tiled(k)) {
        // Whole row tiles: a step of more than 16 rows whose count is not a multiple of 16 is
        // copied beside zero rows; a shorter one runs as one short tile.
        std::vector<uint16_t> padded;
        const uint16_t* xp = x;
        int64_t xp_stride = x_stride;
        if (rows > kAmxRows && rows % kAmxRows) {
            padded.assign((rows + kAmxRows - 1) / kAmxRows * kAmxRows * k, 0);
            for (int64_t r = 0; r < rows; r++)
                std::memcpy(padded.data() + r * k, x + r * x_stride, k * 2);
            xp = padded.data();
            xp_stride = k;
        }
        const int64_t amx_chunks = (rows + kAmxChunk - 1) / kAmxChunk;
#pragma omp parallel num_threads(threads)
        {
            configure_tiles(static_cast<int>(std::min<int64_t>(rows, kAmxRows)));
#pragma omp for schedule(static)
            for (int64_t item = 0; item < blocks * amx_chunks; item++) {
                const int64_t b = item / amx_chunks, first = (item % amx_chunks) * kAmxChunk;
                const int64_t chunk_rows = std::min(kAmxChunk, rows - first);
                amx_block<Silu>(xp + first * xp_stride, xp_stride, static_cast<int>(chunk_rows),
                                static_cast<int>((chunk_rows + kAmxRows - 1) / kAmxRows), k,
                                packed + b * (k / 2) * 2 * kDotCols,
                                bias != nullptr ? bias + b * kDotCols : nullptr,
                                y + first * y_stride + b * out_cols, y_stride,
                                std::min(kDotCols, n - b * kDotCols));
            }
            _tile_release();
        }
        return;
    }
#endif
#pragma omp parallel for schedule(static) num_threads(threads)
    for (int64_t item = 0; item < blocks * chunks; item++) {
        const int64_t b = item / chunks, first = (item % chunks) * kChunk;
        block_rows<Silu>(x, x_stride, first, std::min(rows, first + kChunk), k,
                         packed + b * (k / 2) * 2 * kDotCols,
                         bias != nullptr ? bias + b * kDotCols : nullptr, y + b * out_cols,
                         y_stride, std::min(kDotCols, n - b * kDotCols));
    }
#else
    (void)x, (void)rows, (void)x_stride, (void)k, (void)packed, (void)bias, (void)n, (void)y,
        (void)y_stride, (void)threads;
#endif
}

}  // namespace

extern "C" {

int matmul_available() {
#if defined(__AVX512BF16__)
    return 1;
#else
    return 0;
#endif
}

// 1 where steps of 2 or more rows (k a multiple of 32) run on AMX's tiles: built with AMX-BF16
// and the kernel lets this process use them.
int matmul_amx() {
#if LORAGATE_AMX
    return loragate::amx_permitted() ? 1 : 0;
#else
    return 0;
#endif
}

// w [n, k] row-major -> packed, outputs past n zero (k even): for each block of 64 outputs,
// [k / 2][64][2], or where `matmul_tiled(k)` four column tiles [16][k / 2][16][2].
void matmul_pack_bf16(const uint16_t* w, int64_t n, int64_t k, uint16_t* packed) {
    const int64_t blocks = (n + kDotCols - 1) / kDotCols;
    const int64_t tile_cols = tiled(k) ? 16 : kDotCols;
    for (int64_t b = 0; b < blocks; b++)
        for (int64_t t = 0; t < kDotCols / tile_cols; t++)
            for (int64_t p = 0; p < k / 2; p++)
                for (int64_t c = 0; c < tile_cols; c++) {
                    uint16_t* out = packed + b * kDotCols * k + t * tile_cols * k +
                                    (p * tile_cols + c) * 2;
                    const int64_t row = b * kDotCols + t * tile_cols + c;
                    out[0] = row < n ? w[row * k + 2 * p] : 0;
                    out[1] = row < n ? w[row * k + 2 * p + 1] : 0;
                }
}

int matmul_tiled(int64_t k) { return tiled(k) ? 1 : 0; }

// y[r, :n] = x[r, :k] W^T + bias for `rows` rows (x rows x_stride apart, y rows y_stride
// apart); bias may be null. Work items (a block of 64 outputs, up to 96 rows) are split between
// the threads, a block's row chunks next to each other so a thread reuses its panel.
void matmul_bf16(const uint16_t* x, int64_t rows, int64_t x_stride, int64_t k,
                 const uint16_t* packed, const uint16_t* bias, int64_t n, uint16_t* y,
                 int64_t y_stride, int threads) {
    matmul<false>(x, rows, x_stride, k, packed, bias, n, y, y_stride, threads);
}

// A fused gate/up projection and the SiLU after it: the weight (and bias) packed from rows
// ordered gate 0..31, up 0..31, gate 32..63, up 32..63, ... (n = 2 * width, width a multiple of
// 32); y[r, :width] = round(round(silu(gate)) * up).
void matmul_silu_bf16(const uint16_t* x, int64_t rows, int64_t x_stride, int64_t k,
                      const uint16_t* packed, const uint16_t* bias, int64_t n, uint16_t* y,
                      int64_t y_stride, int threads) {
    matmul<true>(x, rows, x_stride, k, packed, bias, n, y, y_stride, threads);
}

}  // extern "C"
