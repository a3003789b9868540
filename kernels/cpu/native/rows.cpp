// The CPU path's kernel for the rows of short runs, hand-written: kernels/cpu/rows.py builds
// it with the system's C++ compiler and calls it through ctypes; kernels/cpu/gathered.py states
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

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#if defined(__AVX512BF16__)
#include <immintrin.h>
#endif

#include "bf16.h"
#include "lora_runs.h"

namespace {

using loragate::BFloat16;
using loragate::from_float;
using loragate::round_to;
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
    for (int64_t j = 0; j < num_y; j++) y[j] = round_to<T>(y[j]);
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
        y[j] = round_to<BFloat16>(_mm512_reduce_add_ps(sum));
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

#if defined(__AVX512BF16__)
// bf16 pairs (y[k], y[k + 1]) in every 32-bit lane; y holds bf16 values (rounded in `shrink`)
inline __m512bh y_pair(const float* y, int64_t k, bool second) {
    uint32_t lo, hi = 0;
    std::memcpy(&lo, y + k, sizeof lo);
    if (second) std::memcpy(&hi, y + k + 1, sizeof hi);
    return (__m512bh)_mm512_set1_epi32(static_cast<int>((hi & 0xffff0000u) | (lo >> 16)));
}

// The same in bfloat16 with vdpbf16ps: rows of B in pairs, their 16 columns interleaved
// (b_k[c], b_k+1[c], ...) so that one instruction adds y_k b_k[c] + y_k+1 b_k+1[c] to 16
// float32 sums; the portable loop converted every weight to float32 and multiplied it apart.
template <>
void expand<BFloat16>(const float* y, const BFloat16* b, int64_t stride, int64_t r,
                      int64_t width, BFloat16* out) {
    alignas(64) static const int16_t kInterleave[32] = {
        0, 32, 1, 33, 2,  34, 3,  35, 4,  36, 5,  37, 6,  38, 7,  39,
        8, 40, 9, 41, 10, 42, 11, 43, 12, 44, 13, 45, 14, 46, 15, 47};
    const __m512i interleave = _mm512_load_si512(kInterleave);
    alignas(64) float acc[kBlock];
    for (int64_t c0 = 0; c0 < width; c0 += kBlock) {
        const int64_t len = width - c0 < kBlock ? width - c0 : kBlock;
        for (int64_t c = 0; c < len; c++) acc[c] = 0.f;
        for (int64_t k = 0; k < r; k += 4) {  // four rows of B per pass over acc
            const bool has1 = k + 1 < r, has2 = k + 2 < r, has3 = k + 3 < r;
            const __m512bh pair01 = y_pair(y, k, has1);
            const __m512bh pair23 = has2 ? y_pair(y, k + 2, has3) : (__m512bh)_mm512_setzero_si512();
            const BFloat16* b0 = b + k * stride + c0;
            const BFloat16* b1 = has1 ? b0 + stride : b0;  // weight 0 where there is no row
            const BFloat16* b2 = has2 ? b0 + 2 * stride : b0;
            const BFloat16* b3 = has3 ? b0 + 3 * stride : b0;
            for (int64_t c = 0; c < len; c += 16) {
                const __mmask16 mask =
                    static_cast<__mmask16>(len - c >= 16 ? 0xffffu : (1u << (len - c)) - 1);
                const __m512i w0 = _mm512_castsi256_si512(_mm256_maskz_loadu_epi16(mask, b0 + c));
                const __m512i w1 = _mm512_castsi256_si512(_mm256_maskz_loadu_epi16(mask, b1 + c));
                const __m512i w2 = _mm512_castsi256_si512(_mm256_maskz_loadu_epi16(mask, b2 + c));
                const __m512i w3 = _mm512_castsi256_si512(_mm256_maskz_loadu_epi16(mask, b3 + c));
                __m512 sum = _mm512_maskz_loadu_ps(mask, acc + c);
                sum = _mm512_dpbf16_ps(sum, (__m512bh)_mm512_permutex2var_epi16(w0, interleave, w1),
                                       pair01);
                sum = _mm512_dpbf16_ps(sum, (__m512bh)_mm512_permutex2var_epi16(w2, interleave, w3),
                                       pair23);
                _mm512_mask_storeu_ps(acc + c, mask, sum);
            }
        }
        for (int64_t c = 0; c < len; c++)
            out[c0 + c] = from_float<BFloat16>(to_float(out[c0 + c]) + acc[c]);
    }
}
#endif

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

// Runs of rows that share a slot, in tiles (kernels/cpu/native/lora_runs.h): segs holds num_segs
// (start, end, slot) triples of consecutive rows; the same function as lora_rows_bf16 over
// those rows. Only where the CPU has AVX512-BF16, or AVX2 + FMA (lora_runs_available); the
// caller runs the rows kernel and BLAS otherwise.
extern "C" int lora_runs_available() {
#if defined(LORAGATE_LORA_RUNS)
    return 1;
#else
    return 0;
#endif
}

extern "C" void lora_runs_bf16(const void* x, int64_t x_stride, void* out, int64_t out_stride,
                               const int64_t* segs, int64_t num_segs, const void* lora_a,
                               int64_t in_features, const void* lora_b, int64_t out_features,
                               const int32_t* slot_ranks, const int64_t* subs, int64_t n,
                               int64_t rank, int64_t threads) {
#if defined(LORAGATE_LORA_RUNS)
    using loragate::kRunRows;
    // Work items: up to kRunRows rows of one run each, in row order (a thread's items are then
    // mostly of one slot, whose weights stay in its cache).
    struct Item {
        int64_t row, end, slot;
    };
    std::vector<Item> items;
    for (int64_t s = 0; s < num_segs; s++)
        for (int64_t row = segs[3 * s]; row < segs[3 * s + 1]; row += kRunRows)
            items.push_back({row, segs[3 * s + 1], segs[3 * s + 2]});
    const auto* xb = static_cast<const BFloat16*>(x);
    auto* ob = static_cast<BFloat16*>(out);
    const auto* ab = static_cast<const BFloat16*>(lora_a);
    const auto* bb = static_cast<const BFloat16*>(lora_b);
    const int64_t num_items = static_cast<int64_t>(items.size());
#pragma omp parallel for schedule(static) num_threads(threads)
    for (int64_t t = 0; t < num_items; t++) {
        const Item item = items[t];
        const int64_t r = slot_ranks[item.slot] / n;
        if (r <= 0) continue;
        const int rows = static_cast<int>(std::min<int64_t>(item.end - item.row, kRunRows));
        loragate::run_rows(rows, xb + item.row * x_stride, x_stride, ob + item.row * out_stride,
                           out_stride, ab + item.slot * n * rank * in_features, in_features,
                           bb + item.slot * n * rank * out_features, out_features, subs, n, r);
    }
#else
    (void)x, (void)x_stride, (void)out, (void)out_stride, (void)segs, (void)num_segs;
    (void)lora_a, (void)in_features, (void)lora_b, (void)out_features, (void)slot_ranks;
    (void)subs, (void)n, (void)rank, (void)threads;
#endif
}
