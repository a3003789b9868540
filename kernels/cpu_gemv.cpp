// y = x W^T (+ bias) for a decode step's few rows (1-4), bfloat16, by vdpbf16ps: the kernel
// kernels/cpu_gemv.py builds with the system's C++ compiler and calls through ctypes.
//
// Why beside oneDNN's packed matmul: at one row a step's matmuls only stream their weights, and
// oneDNN's call costs ~15-20 us before it streams (27 us for a 768 x 768 weight already in
// cache, against 9 us here); over the 49 matmuls of a small-model step that is most of a
// millisecond. Here a call starts streaming at once, and the weights lie in the order they are
// read: for each block of 64 outputs, the pairs of the input dimension one after another, each
// pair's 64 x 2 values side by side ([n / 64][k / 2][64][2], the layout vdpbf16ps takes), so
// one block is one sequential stream and a thread's blocks are one run of memory.
//
// Values: float32 products and sums (each vdpbf16ps adds a pair of exact bf16 products to its
// float32 lane), the bias added in float32, one rounding to bf16 at the end: what oneDNN and
// F.linear compute, summed in another order. Without AVX512-BF16 the library builds, but
// `gemv_available` says 0 and the caller keeps oneDNN.

#include <algorithm>
#include <cstdint>
#include <cstring>

#if defined(__AVX512BF16__)
#include <immintrin.h>
#endif

#include "cpu_bf16.h"

namespace {

using loragate::BFloat16;
using loragate::from_float;
using loragate::to_float;

constexpr int64_t kCols = 64;  // outputs per block: four 16-float registers per row
// How far ahead of the loads the prefetch runs, in bf16 values: 16 pairs of the block (8 KB).
constexpr int64_t kPrefetch = 16 * 2 * kCols;

#if defined(__AVX512BF16__)
// One block of 64 outputs for M rows (M <= 4): acc[m][j] holds outputs 16 j .. 16 j + 15.
template <int M>
void block(const uint16_t* x, int64_t k, const uint16_t* w, const uint16_t* bias, uint16_t* y,
           int64_t y_stride, int64_t cols) {
    __m512 acc[M][4];
    for (int m = 0; m < M; m++)
        for (int j = 0; j < 4; j++) acc[m][j] = _mm512_setzero_ps();
    for (int64_t p = 0; p < k / 2; p++, w += 2 * kCols) {
        _mm_prefetch(reinterpret_cast<const char*>(w + kPrefetch), _MM_HINT_T0);
        _mm_prefetch(reinterpret_cast<const char*>(w + kPrefetch + kCols), _MM_HINT_T0);
        const __m512bh w0 = (__m512bh)_mm512_loadu_si512(w);
        const __m512bh w1 = (__m512bh)_mm512_loadu_si512(w + 32);
        const __m512bh w2 = (__m512bh)_mm512_loadu_si512(w + 64);
        const __m512bh w3 = (__m512bh)_mm512_loadu_si512(w + 96);
        for (int m = 0; m < M; m++) {
            int32_t pair;  // x[m, 2p] and x[m, 2p + 1], broadcast to every lane
            std::memcpy(&pair, x + m * k + 2 * p, sizeof pair);
            const __m512bh xp = (__m512bh)_mm512_set1_epi32(pair);
            acc[m][0] = _mm512_dpbf16_ps(acc[m][0], xp, w0);
            acc[m][1] = _mm512_dpbf16_ps(acc[m][1], xp, w1);
            acc[m][2] = _mm512_dpbf16_ps(acc[m][2], xp, w2);
            acc[m][3] = _mm512_dpbf16_ps(acc[m][3], xp, w3);
        }
    }
    for (int m = 0; m < M; m++) {
        float sums[kCols];
        for (int j = 0; j < 4; j++) _mm512_storeu_ps(sums + 16 * j, acc[m][j]);
        for (int64_t c = 0; c < cols; c++) {  // cols < 64 only in a padded last block
            float v = sums[c];
            if (bias != nullptr) v += to_float(BFloat16{bias[c]});
            y[m * y_stride + c] = from_float<BFloat16>(v).bits;
        }
    }
}
#endif

}  // namespace

extern "C" {

int gemv_available() {
#if defined(__AVX512BF16__)
    return 1;
#else
    return 0;
#endif
}

// w [n, k] row-major -> packed [ceil(n / 64)][k / 2][64][2], outputs past n zero (k even).
void gemv_pack_bf16(const uint16_t* w, int64_t n, int64_t k, uint16_t* packed) {
    const int64_t blocks = (n + kCols - 1) / kCols;
    for (int64_t b = 0; b < blocks; b++)
        for (int64_t p = 0; p < k / 2; p++)
            for (int64_t c = 0; c < kCols; c++) {
                uint16_t* out = packed + ((b * (k / 2) + p) * kCols + c) * 2;
                const int64_t row = b * kCols + c;
                out[0] = row < n ? w[row * k + 2 * p] : 0;
                out[1] = row < n ? w[row * k + 2 * p + 1] : 0;
            }
}

// y[m, :n] = x[m, :k] W^T + bias for m <= 4 rows (x rows k apart, y rows y_stride apart);
// bias may be null. Blocks of 64 outputs are split between the threads.
void gemv_bf16(const uint16_t* x, int64_t m, int64_t k, const uint16_t* packed,
               const uint16_t* bias, int64_t n, uint16_t* y, int64_t y_stride, int threads) {
#if defined(__AVX512BF16__)
    const int64_t blocks = (n + kCols - 1) / kCols;
#pragma omp parallel for schedule(static) num_threads(threads)
    for (int64_t b = 0; b < blocks; b++) {
        const uint16_t* w = packed + b * (k / 2) * 2 * kCols;
        const uint16_t* bb = bias != nullptr ? bias + b * kCols : nullptr;
        const int64_t cols = std::min(kCols, n - b * kCols);
        uint16_t* yb = y + b * kCols;
        switch (m) {
            case 1: block<1>(x, k, w, bb, yb, y_stride, cols); break;
            case 2: block<2>(x, k, w, bb, yb, y_stride, cols); break;
            case 3: block<3>(x, k, w, bb, yb, y_stride, cols); break;
            default: block<4>(x, k, w, bb, yb, y_stride, cols); break;
        }
    }
#else
    (void)x, (void)m, (void)k, (void)packed, (void)bias, (void)n, (void)y, (void)y_stride,
        (void)threads;
#endif
}

}  // extern "C"
