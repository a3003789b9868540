// The element-wise work of a decoder layer, fused, for the CPU: kernels/cpu/rows.py builds it
// with the system's C++ compiler and kernels/cpu/layer.py calls it through ctypes.
//
// Why: at a decode step of one sequence the eager layer runs ~30 small PyTorch operators beside
// its four matmuls (RMSNorm as cast, norm, cast, multiply; the residual add; RoPE as two halves,
// a negation, a concatenation, four multiplies and two adds; two K/V copies into the cache), and
// each costs its dispatch (~5-10 us) whatever its size: ~3 ms of a ~12 ms step in bfloat16.
// Here each group is one call.
//
// Each entry computes what the eager operators compute, rounding to the activations' dtype
// wherever an eager operator hands a tensor of that dtype to the next (a no-op in float32), so
// that results equal theirs; only the RMSNorm's normaliser differs,
// computed in double where PyTorch rounds it in float32. Built
// with -ffp-contract=off: a fused multiply-add would round once where PyTorch rounds twice.
//
//   add_rms_norm:  residual = round(residual + x)                              (if add)
//                  out = round(weight * round(s * rsqrt(mean(s^2) + eps)))      s: that sum, or x
//   rope_kv:       q, k rotated in place (transformers' rotate_half form, cos and sin rounded to
//                  the dtype, each product and the sum rounded), then k and v written to the
//                  paged cache at each token's slot
//   silu_mul:      out = round(round(silu(gate)) * up)
//   causal_softmax: in place over a prefill chunk's scores (query row t of a chunk whose first
//                  token sits at position `offset` sees keys 0 .. offset + t), as the decode
//                  kernel (kernels/cpu/native/attention.cpp) and engine/step/attention.py's decode_matmul
//                  do it: s = score * scale, p = round(exp(s - max) * (1 / sum)), 0 beyond

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>
#include <vector>

#if defined(__AVX512F__)
#include <immintrin.h>
#endif

#include "bf16.h"
#include "vec_math.h"

namespace {

using loragate::BFloat16;
using loragate::exp_nonpositive;
using loragate::from_float;
using loragate::round_to;
using loragate::silu;
using loragate::softmax_unnormalised;
using loragate::to_float;
#if defined(__AVX512F__)
using loragate::load_bf16x16;
using loragate::round_bf16;
using loragate::silu16;
using loragate::store_bf16x16;
#endif

constexpr int64_t kLanes = 8;

// The sum of a row's squares in double: each square is exact there, so the order of the sums
// does not matter at float precision and the normaliser is all but exact (the result strays
// from PyTorch's only by PyTorch's own rounding). With AVX-512, 8 values at a time widened into
// four running sums of 8 doubles; the portable loop keeps kLanes partial sums, which GCC
// vectorised only 2 doubles wide (~0.3 us a row of 768, most of the kernel's time).
#if defined(__AVX512F__)
inline __m256 load8(const float* p) { return _mm256_loadu_ps(p); }
inline __m256 load8(const BFloat16* p) {
    const __m128i bits = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(bits), 16));
}
#endif

template <typename T>
inline double sum_squares(const T* v, int64_t n) {
    double sum = 0.0;
    int64_t i = 0;
#if defined(__AVX512F__)
    __m512d acc[4] = {_mm512_setzero_pd(), _mm512_setzero_pd(), _mm512_setzero_pd(),
                      _mm512_setzero_pd()};
    for (; i + 32 <= n; i += 32)
        for (int j = 0; j < 4; ++j) {
            const __m512d d = _mm512_cvtps_pd(load8(v + i + 8 * j));
            acc[j] = _mm512_fmadd_pd(d, d, acc[j]);
        }
    sum = _mm512_reduce_add_pd(
        _mm512_add_pd(_mm512_add_pd(acc[0], acc[1]), _mm512_add_pd(acc[2], acc[3])));
#else
    double lanes[kLanes] = {};
    for (; i + kLanes <= n; i += kLanes)
        for (int64_t j = 0; j < kLanes; ++j) {
            const double d = to_float(v[i + j]);
            lanes[j] += d * d;
        }
    for (int64_t j = 0; j < kLanes; ++j) sum += lanes[j];
#endif
    for (; i < n; ++i) {
        const double d = to_float(v[i]);
        sum += d * d;
    }
    return sum;
}

template <typename T>
void add_rms_norm(const T* x, int64_t x_stride, T* residual, int64_t residual_stride, int64_t add,
                  const T* weight, T* out, int64_t out_stride, int64_t rows, int64_t dim,
                  float eps, int64_t threads) {
#pragma omp parallel for num_threads(threads) if (rows > 8)
    for (int64_t r = 0; r < rows; ++r) {
        const T* xr = x + r * x_stride;
        T* res = residual + r * residual_stride;
        T* o = out + r * out_stride;
        const T* src = xr;
        if (add) {
            int64_t i = 0;
#if defined(__AVX512F__)
            if constexpr (std::is_same_v<T, BFloat16>)  // the loop below, 16 at a time
                for (; i + 16 <= dim; i += 16)
                    store_bf16x16(res + i, _mm512_add_ps(load_bf16x16(res + i),
                                                         load_bf16x16(xr + i)));
#endif
#pragma omp simd
            for (int64_t j = i; j < dim; ++j)
                res[j] = from_float<T>(to_float(res[j]) + to_float(xr[j]));
            src = res;
        }
        const double sum = sum_squares(src, dim);
        const float inv = static_cast<float>(1.0 / std::sqrt(sum / static_cast<double>(dim) + eps));
        int64_t i = 0;
#if defined(__AVX512F__)
        // GCC vectorised these loops 8 wide with a shuffle a bf16 rounding (~20 us a call at
        // 64 rows of 768 on the AMX Xeon); the same operations 16 at a time, the same bits
        if constexpr (std::is_same_v<T, BFloat16>) {
            const __m512 inv_v = _mm512_set1_ps(inv);
            for (; i + 16 <= dim; i += 16)
                store_bf16x16(o + i, _mm512_mul_ps(load_bf16x16(weight + i),
                                                   round_bf16(_mm512_mul_ps(load_bf16x16(src + i),
                                                                            inv_v))));
        }
#endif
#pragma omp simd
        for (int64_t j = i; j < dim; ++j)
            o[j] = from_float<T>(to_float(weight[j]) * round_to<T>(to_float(src[j]) * inv));
    }
}

// The most a head holds for the rotation's per-token tables below; larger heads (none of the
// models served) round cos and sin per head instead.
constexpr int64_t kMaxHeadDim = 512;

// One head of `head_dim` values rotated in place: x[i] cos[i] + rotate_half(x)[i] sin[i], with
// cos and sin already rounded to T (`c`, `s`: the token's, head_dim each).
template <typename T>
inline void rotate(T* x, const float* c, const float* s, int64_t head_dim) {
    const int64_t half = head_dim / 2;
    int64_t first = 0;
#if defined(__AVX512F__)
    // the loop below 16 at a time (GCC's 8-wide form spent a shuffle a bf16 rounding)
    if constexpr (std::is_same_v<T, BFloat16>) {
        const __m512 sign = _mm512_set1_ps(-0.f);  // -hi exactly, zeros and NaNs included
        for (; first + 16 <= half; first += 16) {
            const int64_t i = first, j = first + half;
            const __m512 lo = load_bf16x16(x + i), hi = load_bf16x16(x + j);
            const __m512 ci = _mm512_loadu_ps(c + i), si = _mm512_loadu_ps(s + i);
            const __m512 cj = _mm512_loadu_ps(c + j), sj = _mm512_loadu_ps(s + j);
            const __m512 minus_hi = _mm512_xor_ps(hi, sign);
            store_bf16x16(x + i, _mm512_add_ps(round_bf16(_mm512_mul_ps(lo, ci)),
                                               round_bf16(_mm512_mul_ps(minus_hi, si))));
            store_bf16x16(x + j, _mm512_add_ps(round_bf16(_mm512_mul_ps(hi, cj)),
                                               round_bf16(_mm512_mul_ps(lo, sj))));
        }
    }
#endif
    // x[i] and x[i + half] are read before either is written: no iteration sees another's
#pragma omp simd
    for (int64_t i = first; i < half; ++i) {
        const float lo = to_float(x[i]), hi = to_float(x[i + half]);
        x[i] = from_float<T>(round_to<T>(lo * c[i]) + round_to<T>(-hi * s[i]));
        x[i + half] = from_float<T>(round_to<T>(hi * c[i + half]) + round_to<T>(lo * s[i + half]));
    }
}

template <typename T>
int64_t rope_kv(T* q, int64_t q_stride, T* k, int64_t k_stride, const T* v, int64_t v_stride,
                const float* cos_table, const float* sin_table, const int64_t* positions,
                int64_t num_positions, int64_t tokens, int64_t num_heads, int64_t kv_heads,
                int64_t head_dim, T* k_cache, T* v_cache, int64_t num_slots,
                const int64_t* slots, int64_t threads) {
    int64_t bad = 0;
#pragma omp parallel for num_threads(threads) if (tokens > 8) reduction(+ : bad)
    for (int64_t t = 0; t < tokens; ++t) {
        const int64_t pos = positions[t], slot = slots[t];
        if (pos < 0 || pos >= num_positions || slot < 0 || slot >= num_slots) {
            ++bad;  // the caller raises; nothing of this token is written
            continue;
        }
        // cos and sin rounded to T once for the token, not once a head
        float cos[kMaxHeadDim], sin[kMaxHeadDim];
        const int64_t d = std::min(head_dim, kMaxHeadDim);
#pragma omp simd
        for (int64_t i = 0; i < d; ++i) {
            cos[i] = round_to<T>(cos_table[pos * head_dim + i]);
            sin[i] = round_to<T>(sin_table[pos * head_dim + i]);
        }
        const auto turn = [&](T* x) {
            if (head_dim <= kMaxHeadDim) return rotate(x, cos, sin, head_dim);
            std::vector<float> c(head_dim), s(head_dim);
            for (int64_t i = 0; i < head_dim; ++i) {
                c[i] = round_to<T>(cos_table[pos * head_dim + i]);
                s[i] = round_to<T>(sin_table[pos * head_dim + i]);
            }
            rotate(x, c.data(), s.data(), head_dim);
        };
        for (int64_t h = 0; h < num_heads; ++h) turn(q + t * q_stride + h * head_dim);
        for (int64_t h = 0; h < kv_heads; ++h) {
            T* kh = k + t * k_stride + h * head_dim;
            turn(kh);
            T* kc = k_cache + (h * num_slots + slot) * head_dim;
            T* vc = v_cache + (h * num_slots + slot) * head_dim;
            const T* vh = v + t * v_stride + h * head_dim;
            // memcpy: GCC left the loop of 2-byte copies scalar (the pointers may alias), ~60%
            // of this kernel's time in a mixed-lengths run's prefill steps (session 28)
            std::memcpy(kc, kh, head_dim * sizeof(T));
            std::memcpy(vc, vh, head_dim * sizeof(T));
        }
    }
    return bad;
}

template <typename T>
void silu_mul(const T* gate_up, int64_t stride, T* out, int64_t out_stride, int64_t rows,
              int64_t width, int64_t threads) {
#pragma omp parallel for num_threads(threads) if (rows * width > 65536)
    for (int64_t r = 0; r < rows; ++r) {
        const T* gate = gate_up + r * stride;
        const T* up = gate + width;
        T* o = out + r * out_stride;
        int64_t i = 0;
#if defined(__AVX512F__)
        if constexpr (std::is_same_v<T, BFloat16>)  // the loop below, 16 at a time (same bits)
            for (; i + 16 <= width; i += 16)
                store_bf16x16(o + i, _mm512_mul_ps(round_bf16(silu16(load_bf16x16(gate + i))),
                                                   load_bf16x16(up + i)));
#endif
        for (; i < width; ++i)
            o[i] = from_float<T>(round_to<T>(silu(to_float(gate[i]))) * to_float(up[i]));
    }
}

// Rows are [num_heads_in_groups x query_len] of `cols` keys, rows of one head's chunk in order.
template <typename T>
void causal_softmax(T* scores, int64_t rows, int64_t cols, int64_t query_len, int64_t offset,
                    float scale, int64_t threads) {
#pragma omp parallel num_threads(threads) if (rows * cols > 16384)
    {
        std::vector<float> buffer(static_cast<size_t>(cols));
        float* s = buffer.data();
#pragma omp for schedule(static)
        for (int64_t r = 0; r < rows; ++r) {
            T* row = scores + r * cols;
            const int64_t seen = std::min(cols, offset + r % query_len + 1);
#pragma omp simd
            for (int64_t j = 0; j < seen; ++j) s[j] = to_float(row[j]) * scale;
            const float inv = softmax_unnormalised(s, seen);
#pragma omp simd
            for (int64_t j = 0; j < seen; ++j) row[j] = from_float<T>(s[j] * inv);
            for (int64_t j = seen; j < cols; ++j) row[j] = from_float<T>(0.f);
        }
    }
}

// out[r] = the index of row r's largest value, as torch.argmax picks it: the first of equal
// maxima, the first NaN where a row has one. One pass for the maximum (vectorised), one for
// where it first is (testing 64 values at a time first measured no faster).
template <typename T>
void argmax_rows(const T* x, int64_t x_stride, int64_t rows, int64_t cols, int64_t* out,
                 int64_t threads) {
#pragma omp parallel for schedule(static) num_threads(threads) if (rows * cols > 65536)
    for (int64_t r = 0; r < rows; ++r) {
        const T* row = x + r * x_stride;
        float best = -std::numeric_limits<float>::infinity();
        int nan = 0;
#pragma omp simd reduction(max : best) reduction(| : nan)
        for (int64_t j = 0; j < cols; ++j) {
            const float v = to_float(row[j]);
            best = v > best ? v : best;
            nan |= v != v;
        }
        int64_t at = 0;
        for (int64_t j = 0; j < cols; ++j) {
            const float v = to_float(row[j]);
            if (nan ? v != v : v == best) {
                at = j;
                break;
            }
        }
        out[r] = at;
    }
}

}  // namespace

#define LORAGATE_LAYER_ENTRIES(T, suffix)                                                         \
    extern "C" void add_rms_norm_##suffix(const T* x, int64_t x_stride, T* residual,              \
                                          int64_t residual_stride, int64_t add, const T* weight,  \
                                          T* out, int64_t out_stride, int64_t rows, int64_t dim,  \
                                          float eps, int64_t threads) {                           \
        add_rms_norm(x, x_stride, residual, residual_stride, add, weight, out, out_stride, rows,  \
                     dim, eps, threads);                                                          \
    }                                                                                             \
    extern "C" int64_t rope_kv_##suffix(                                                          \
        T* q, int64_t q_stride, T* k, int64_t k_stride, const T* v, int64_t v_stride,             \
        const float* cos_table, const float* sin_table, const int64_t* positions,                 \
        int64_t num_positions, int64_t tokens, int64_t num_heads, int64_t kv_heads,               \
        int64_t head_dim, T* k_cache, T* v_cache, int64_t num_slots, const int64_t* slots,        \
        int64_t threads) {                                                                        \
        return rope_kv(q, q_stride, k, k_stride, v, v_stride, cos_table, sin_table, positions,    \
                       num_positions, tokens, num_heads, kv_heads, head_dim, k_cache, v_cache,    \
                       num_slots, slots, threads);                                                \
    }                                                                                             \
    extern "C" void silu_mul_##suffix(const T* gate_up, int64_t stride, T* out,                   \
                                      int64_t out_stride, int64_t rows, int64_t width,            \
                                      int64_t threads) {                                          \
        silu_mul(gate_up, stride, out, out_stride, rows, width, threads);                         \
    }                                                                                             \
    extern "C" void causal_softmax_##suffix(T* scores, int64_t rows, int64_t cols,                \
                                            int64_t query_len, int64_t offset, float scale,       \
                                            int64_t threads) {                                    \
        causal_softmax(scores, rows, cols, query_len, offset, scale, threads);                    \
    }                                                                                             \
    extern "C" void argmax_rows_##suffix(const T* x, int64_t x_stride, int64_t rows,              \
                                         int64_t cols, int64_t* out, int64_t threads) {           \
        argmax_rows(x, x_stride, rows, cols, out, threads);                                       \
    }

LORAGATE_LAYER_ENTRIES(BFloat16, bf16)
LORAGATE_LAYER_ENTRIES(float, f32)
