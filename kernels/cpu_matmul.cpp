// y = x W^T (+ bias) in bfloat16 by vdpbf16ps, for any number of rows: the kernel
// kernels/cpu_matmul.py builds with the system's C++ compiler and calls through ctypes.
//
// Why beside (or instead of) oneDNN's packed matmul: at a few rows a step's matmuls only stream
// their weights, and oneDNN's call costs ~15-20 us before it streams (27 us for a 768 x 768
// weight already in cache, against 9 us here); over the 49 matmuls of a small-model step that
// is most of a millisecond. At more rows the same loop, tiled, kept up with oneDNN on the
// AVX512-BF16 EPYCs measured (session 12: 1.1-1.7x at 1-64 rows, 1.01-1.04x at 200-2048), so
// where a start-up timing agrees (engine/native_matmul.py) one copy of the weights in this
// layout serves every step and oneDNN's copy is dropped.
//
// Layout: for each block of 64 outputs, the pairs of the input dimension one after another,
// each pair's 64 x 2 values side by side ([n / 64][k / 2][64][2], the layout vdpbf16ps takes),
// so one block is one sequential stream. A block's rows are taken 6 at a time (cpu_dot_tile.h),
// reading the block from L2 after the first tile; work items are (block, up to 96 rows), split
// between threads.
//
// Values: float32 products and sums (each vdpbf16ps adds a pair of exact bf16 products to its
// float32 lane), the bias added in float32, one rounding to bf16 at the end: what oneDNN and
// F.linear compute, summed in another order. Without AVX512-BF16 the library builds, but
// `matmul_available` says 0 and the caller keeps oneDNN.

#include <algorithm>
#include <cstdint>
#include <cstring>

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
// Rows [first, last) of one block, six at a time. Plain: the block's `cols` outputs, each the
// float32 sum plus the bias, rounded once. Silu: the block holds 32 gate and then the 32
// matching up outputs (matmul_silu_bf16's layout), and the 32 outputs are
// round(round(silu(gate)) * up), gate and up each rounded first (what the separate matmul and
// kernels/cpu_layer.cpp's silu_mul compute). The loops over a row's outputs are plain
// element-wise loops, so they vectorise (the SiLU's exp included).
template <bool Silu>
void block_rows(const uint16_t* x, int64_t x_stride, int64_t first, int64_t last, int64_t k,
                const uint16_t* w, const uint16_t* bias, uint16_t* y, int64_t y_stride,
                int64_t cols) {
    float sums[loragate::kDotRows][kDotCols];
    float b[kDotCols];
    for (int64_t c = 0; c < kDotCols; c++)
        b[c] = bias != nullptr && c < cols ? to_float(BFloat16{bias[c]}) : 0.f;
    constexpr int64_t kHalf = kDotCols / 2;
    for (int64_t r = first; r < last; r += loragate::kDotRows) {
        const int rows = static_cast<int>(std::min<int64_t>(loragate::kDotRows, last - r));
        loragate::dot_rows(rows, x + r * x_stride, x_stride, k, w, sums);
        for (int m = 0; m < rows; m++) {
            uint16_t* out = y + (r + m) * y_stride;
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
}

#endif

// Without AVX512-BF16 nothing is computed: `matmul_available` says 0 and no caller gets here.
template <bool Silu>
void matmul(const uint16_t* x, int64_t rows, int64_t x_stride, int64_t k, const uint16_t* packed,
            const uint16_t* bias, int64_t n, uint16_t* y, int64_t y_stride, int threads) {
#if defined(__AVX512BF16__)
    const int64_t blocks = (n + kDotCols - 1) / kDotCols;
    const int64_t chunks = (rows + kChunk - 1) / kChunk;
    const int64_t out_cols = Silu ? kDotCols / 2 : kDotCols;  // outputs a block writes
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

// w [n, k] row-major -> packed [ceil(n / 64)][k / 2][64][2], outputs past n zero (k even).
void matmul_pack_bf16(const uint16_t* w, int64_t n, int64_t k, uint16_t* packed) {
    const int64_t blocks = (n + kDotCols - 1) / kDotCols;
    for (int64_t b = 0; b < blocks; b++)
        for (int64_t p = 0; p < k / 2; p++)
            for (int64_t c = 0; c < kDotCols; c++) {
                uint16_t* out = packed + ((b * (k / 2) + p) * kDotCols + c) * 2;
                const int64_t row = b * kDotCols + c;
                out[0] = row < n ? w[row * k + 2 * p] : 0;
                out[1] = row < n ? w[row * k + 2 * p + 1] : 0;
            }
}

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
