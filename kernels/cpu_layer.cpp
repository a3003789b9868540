// The element-wise work of a decoder layer, fused, for the CPU: kernels/cpu_native.py builds it
// with the system's C++ compiler and kernels/cpu_layer.py calls it through ctypes.
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
//                  kernel (kernels/cpu_attention.cpp) and engine/attention.py's decode_matmul
//                  do it: s = score * scale, p = round(exp(s - max) * (1 / sum)), 0 beyond

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "cpu_bf16.h"
#include "cpu_math.h"

namespace {

using loragate::BFloat16;
using loragate::exp_nonpositive;
using loragate::from_float;
using loragate::round_to;
using loragate::silu;
using loragate::softmax_unnormalised;
using loragate::to_float;

constexpr int64_t kLanes = 8;

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
            for (int64_t i = 0; i < dim; ++i)
                res[i] = from_float<T>(to_float(res[i]) + to_float(xr[i]));
            src = res;
        }
        // The sum of squares in double, over kLanes independent partial sums (a loop the
        // compiler vectorises: a single running sum would have to stay sequential), and 1/sqrt
        // in double: the normaliser is all but exact, so the result strays from PyTorch's only
        // by PyTorch's own rounding.
        double lanes[kLanes] = {};
        int64_t i = 0;
        for (; i + kLanes <= dim; i += kLanes)
            for (int64_t j = 0; j < kLanes; ++j) {
                const double v = to_float(src[i + j]);
                lanes[j] += v * v;
            }
        double sum = 0.0;
        for (; i < dim; ++i) {
            const double v = to_float(src[i]);
            sum += v * v;
        }
        for (int64_t j = 0; j < kLanes; ++j) sum += lanes[j];
        const float inv = static_cast<float>(1.0 / std::sqrt(sum / static_cast<double>(dim) + eps));
        for (int64_t i = 0; i < dim; ++i)
            o[i] = from_float<T>(to_float(weight[i]) * round_to<T>(to_float(src[i]) * inv));
    }
}

// One head of `head_dim` values rotated in place: x[i] cos[i] + rotate_half(x)[i] sin[i].
template <typename T>
inline void rotate(T* x, const float* cos, const float* sin, int64_t head_dim) {
    const int64_t half = head_dim / 2;
    for (int64_t i = 0; i < half; ++i) {
        const float lo = to_float(x[i]), hi = to_float(x[i + half]);
        const float c_lo = round_to<T>(cos[i]), s_lo = round_to<T>(sin[i]);
        const float c_hi = round_to<T>(cos[i + half]), s_hi = round_to<T>(sin[i + half]);
        x[i] = from_float<T>(round_to<T>(lo * c_lo) + round_to<T>(-hi * s_lo));
        x[i + half] = from_float<T>(round_to<T>(hi * c_hi) + round_to<T>(lo * s_hi));
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
        const float* cos = cos_table + pos * head_dim;
        const float* sin = sin_table + pos * head_dim;
        for (int64_t h = 0; h < num_heads; ++h) rotate(q + t * q_stride + h * head_dim, cos, sin, head_dim);
        for (int64_t h = 0; h < kv_heads; ++h) {
            T* kh = k + t * k_stride + h * head_dim;
            rotate(kh, cos, sin, head_dim);
            T* kc = k_cache + (h * num_slots + slot) * head_dim;
            T* vc = v_cache + (h * num_slots + slot) * head_dim;
            const T* vh = v + t * v_stride + h * head_dim;
            for (int64_t i = 0; i < head_dim; ++i) {
                kc[i] = kh[i];
                vc[i] = vh[i];
            }
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
        for (int64_t i = 0; i < width; ++i)
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
