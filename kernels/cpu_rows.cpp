// The CPU path's kernel for the rows of short runs, hand-written: kernels/cpu_native.py builds
// it with the system's C++ compiler and calls it through ctypes; kernels/cpu_gathered.py states
// the semantics (and is the fallback). For each row t, on slot s = slots[t] of fused rank
// slot_ranks[s] = n * r:
//
//     y[j] = round(x[rows[t]] . A[s, j])                            j < n r; sub i at [i r, i r + r)
//     out[rows[t], off_i + c] = round(out + sum_k<r y[i r + k] B[s, i r + k, off_i + c])
//
// with float32 products and sums and `round` to the activations' dtype, as the compiled kernel
// does. Nothing beyond a slot's rank is read. One row per iteration of the parallel loop (rows
// of one slot sit together, so a slot's weights stay in cache between them); inside, both
// products stream the slot's weights row by row, front to back.
//
// Why not inductor's loop nest of the same function: it runs the expand as a column strip (16
// rows of B at a time, a cache line from each) and a call costs ~20-30 us; this reads each row
// of weights front to back (bench/RESULTS.md has the figures).

#include <cstdint>

#if defined(__AVX512BF16__)
#include <immintrin.h>
#endif

#include "cpu_bf16.h"

namespace {

using loragate::BFloat16;
using loragate::from_float;
using loragate::to_float;

constexpr int64_t kBlock = 2048;  // floats of x (shrink) or of an output row (expand) in L1

// y[j] = round(x . a[j]) for the num_y rows of one slot's A (rows in_features apart).
template <typename T>
void shrink(const T* x, const T* a, int64_t in_features, int64_t num_y, float* y) {
    float xf[kBlock];
    for (int64_t j = 0; j < num_y; j++) y[j] = 0.f;
    for (int64_t i0 = 0; i0 < in_features; i0 += kBlock) {
        const int64_t len = in_features - i0 < kBlock ? in_features - i0 : kBlock;
        for (int64_t i = 0; i < len; i++) xf[i] = to_float(x[i0 + i]);
        for (int64_t j = 0; j < num_y; j++) {
            const T* row = a + j * in_features + i0;
            float sum = 0.f;
#pragma omp simd reduction(+ : sum)
            for (int64_t i = 0; i < len; i++) sum += xf[i] * to_float(row[i]);
            y[j] += sum;
        }
    }
    for (int64_t j = 0; j < num_y; j++) y[j] = to_float(from_float<T>(y[j]));
}

#if defined(__AVX512BF16__)
// The same in bfloat16 with vdpbf16ps: 32 products a instruction straight from the bf16 rows
// (exact in float32), summed in float32 lanes and reduced by a tree at the end. The portable
// loop above converted every weight to float first and summed its 16 lanes one by one.
template <>
void shrink<BFloat16>(const BFloat16* x, const BFloat16* a, int64_t in_features, int64_t num_y,
                      float* y) {
    const int64_t tail = in_features % 32;
    const __mmask32 mask = static_cast<__mmask32>((1ull << tail) - 1);
    for (int64_t j = 0; j < num_y; j++) {
        const BFloat16* row = a + j * in_features;
        __m512 sum = _mm512_setzero_ps();
        int64_t i = 0;
        for (; i + 32 <= in_features; i += 32)
            sum = _mm512_dpbf16_ps(sum, (__m512bh)_mm512_loadu_si512(row + i),
                                   (__m512bh)_mm512_loadu_si512(x + i));
        if (tail)
            sum = _mm512_dpbf16_ps(sum, (__m512bh)_mm512_maskz_loadu_epi16(mask, row + i),
                                   (__m512bh)_mm512_maskz_loadu_epi16(mask, x + i));
        y[j] = to_float(from_float<BFloat16>(_mm512_reduce_add_ps(sum)));
    }
}
#endif

// out[c] = round(out[c] + sum_k<r y[k] b[k][c]) for c < width; b's rows `stride` apart.
template <typename T>
void expand(const float* y, const T* b, int64_t stride, int64_t r, int64_t width, T* out) {
    float acc[kBlock];
    for (int64_t c0 = 0; c0 < width; c0 += kBlock) {
        const int64_t len = width - c0 < kBlock ? width - c0 : kBlock;
        for (int64_t c = 0; c < len; c++) acc[c] = 0.f;
        int64_t k = 0;
        for (; k + 4 <= r; k += 4) {  // four rows of B per pass: a quarter of acc's traffic
            const float y0 = y[k], y1 = y[k + 1], y2 = y[k + 2], y3 = y[k + 3];
            const T* b0 = b + k * stride + c0;
            const T* b1 = b0 + stride;
            const T* b2 = b1 + stride;
            const T* b3 = b2 + stride;
#pragma omp simd
            for (int64_t c = 0; c < len; c++)
                acc[c] += y0 * to_float(b0[c]) + y1 * to_float(b1[c]) + y2 * to_float(b2[c]) +
                          y3 * to_float(b3[c]);
        }
        for (; k < r; k++) {
            const float yk = y[k];
            const T* bk = b + k * stride + c0;
#pragma omp simd
            for (int64_t c = 0; c < len; c++) acc[c] += yk * to_float(bk[c]);
        }
        for (int64_t c = 0; c < len; c++)
            out[c0 + c] = from_float<T>(to_float(out[c0 + c]) + acc[c]);
    }
}

template <typename T>
void rows_kernel(const T* x, int64_t x_stride, T* out, int64_t out_stride, const int64_t* rows,
                 const int64_t* slots, int64_t num_rows, const T* lora_a, int64_t in_features,
                 const T* lora_b, int64_t out_features, const int32_t* slot_ranks,
                 const int64_t* subs, int64_t n, int64_t rank, int64_t threads) {
#pragma omp parallel for schedule(static) num_threads(threads)
    for (int64_t t = 0; t < num_rows; t++) {
        const int64_t slot = slots[t];
        const int64_t r = slot_ranks[slot] / n;
        if (r <= 0) continue;
        float y[3 * 256];  // n * r <= n * rank <= MAX_FUSED_RANK, checked in cpu_native.py
        shrink(x + rows[t] * x_stride, lora_a + slot * n * rank * in_features, in_features, n * r,
               y);
        const T* b_slot = lora_b + slot * n * rank * out_features;
        T* out_row = out + rows[t] * out_stride;
        for (int64_t i = 0; i < n; i++) {
            const int64_t offset = subs[2 * i], width = subs[2 * i + 1];
            expand(y + i * r, b_slot + i * r * out_features + offset, out_features, r, width,
                   out_row + offset);
        }
    }
}

}  // namespace

// x [*, in] rows x_stride apart; out [*, out_features'] rows out_stride apart (unit column
// stride: a column slice of a wider output is fine); lora_a [S, n rank, in] and lora_b
// [S, n rank, out_features] contiguous; subs: n (offset, width) pairs.
#define LORA_ROWS_ENTRY(name, T)                                                              \
    extern "C" void name(const void* x, int64_t x_stride, void* out, int64_t out_stride,      \
                         const int64_t* rows, const int64_t* slots, int64_t num_rows,          \
                         const void* lora_a, int64_t in_features, const void* lora_b,          \
                         int64_t out_features, const int32_t* slot_ranks, const int64_t* subs, \
                         int64_t n, int64_t rank, int64_t threads) {                           \
        rows_kernel(static_cast<const T*>(x), x_stride, static_cast<T*>(out), out_stride, rows, \
                    slots, num_rows, static_cast<const T*>(lora_a), in_features,              \
                    static_cast<const T*>(lora_b), out_features, slot_ranks, subs, n, rank,    \
                    threads);                                                                 \
    }

LORA_ROWS_ENTRY(lora_rows_bf16, BFloat16)
LORA_ROWS_ENTRY(lora_rows_f32, float)
