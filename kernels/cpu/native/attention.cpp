// Decode attention over the paged KV cache, hand-written for the CPU: kernels/cpu/rows.py
// builds it with the system's C++ compiler and engine/step/attention.py calls it through ctypes.
// It computes what `decode_matmul` in engine/step/attention.py computes after gathering each row's
// blocks, for one query row per sequence:
//
//     keys[t]   = k_cache[kv, table[b, t / block_size] * block_size + t % block_size]
//     score[t]  = round(q[b, h] . keys[t]) * scale                               t < length[b]
//     p[t]      = round(softmax(score)[t])                      (float32 exp, sum and divide)
//     out[b, h] = round(sum_t p[t] values[t])
//
// with float32 products and sums, and `round` to the activations' dtype where the eager path
// hands a bf16 tensor from one op to the next (a no-op in float32). Query heads
// kv * group .. kv * group + group - 1 share KV head kv (grouped-query attention).
//
// Why: the eager path copies every row's blocks into one dense [kv_heads, rows, context,
// head_dim] tensor per layer before two matmuls; that copy alone was about half of decode
// attention's time at batch 64 (bench/RESULTS.md). Here each (row, KV head) pair reads its
// keys and values where they lie, once, block by block; no copy and no padding.

// GCC's mod-ref analysis would delete the prefetches of the next pair (Ahead, in
// attention_bf16.h): before any function is defined.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC optimize("no-ipa-modref")
#endif

#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

#include <omp.h>

#if defined(__AVX512F__) || defined(__AVX2__)
#include <immintrin.h>
#endif

#include "attention_bf16.h"
#include "bf16.h"
#include "vec_math.h"

namespace {

using loragate::BFloat16;
using loragate::from_float;
using loragate::round_to;
using loragate::softmax_unnormalised;
using loragate::to_float;
using loragate::Ahead;
using loragate::NoTileState;
#if defined(__AVX512F__) || defined(__AVX2__)
using loragate::prefetch_block;
#endif
#if defined(__AVX512BF16__)
using loragate::DotPasses;
#endif
#if LORAGATE_AMX
using loragate::AmxPasses;
#endif

struct Shape {
    int64_t num_heads, kv_heads, head_dim, block_size, num_slots;
    int64_t q_row_stride, q_head_stride, table_stride;
};

// f(t, row) for each of a sequence's `length` rows in the head's cache, block by block.
template <typename T, typename F>
void for_each_row(const T* head, const int64_t* table, int64_t length, int64_t bs, int64_t hd,
                  F f) {
    for (int64_t t0 = 0; t0 < length; t0 += bs) {
        const T* block = head + table[t0 / bs] * bs * hd;
        const int64_t n = length - t0 < bs ? length - t0 : bs;
        for (int64_t t = 0; t < n; t++) f(t0 + t, block + t * hd);
    }
}


// The two passes over the cache, portable: each key (value) row is converted to float32 once
// and every query head of the group uses it. HD > 0: head_dim known when compiling, so the
// loops over it unroll; 0: s.head_dim.
template <typename T, int64_t HD>
struct Passes : NoTileState {
    // scores[g][t] = round(q[g] . key[t]) * scale
    static void scores(const T* k_head, const T*, const int64_t* table, int64_t length, int64_t bs,
                       int64_t hd, const float* qf, int64_t group, float scale, float* row,
                       float* scores, const Ahead<T>&) {
        for_each_row(k_head, table, length, bs, hd, [&](int64_t t, const T* key) {
            for (int64_t d = 0; d < hd; d++) row[d] = to_float(key[d]);
            for (int64_t g = 0; g < group; g++) {
                const float* qg = qf + g * hd;
                float sum = 0.f;
#pragma omp simd reduction(+ : sum)
                for (int64_t d = 0; d < hd; d++) sum += qg[d] * row[d];
                scores[g * length + t] = round_to<T>(sum) * scale;
            }
        });
    }

    // acc[g] = sum_t p[g][t] value[t]
    static void values(const T* v_head, const int64_t* table, int64_t length, int64_t bs,
                       int64_t hd, const float* p, int64_t group, float* row, float* acc,
                       const Ahead<T>&) {
        for (int64_t i = 0; i < group * hd; i++) acc[i] = 0.f;
        for_each_row(v_head, table, length, bs, hd, [&](int64_t t, const T* value) {
            for (int64_t d = 0; d < hd; d++) row[d] = to_float(value[d]);
            for (int64_t g = 0; g < group; g++) {
                const float pg = p[g * length + t];
                float* ag = acc + g * hd;
#pragma omp simd
                for (int64_t d = 0; d < hd; d++) ag[d] += pg * row[d];
            }
        });
    }
};

#if defined(__AVX512F__) || (defined(__AVX2__) && defined(__FMA__))
// The same passes in vector registers, for head sizes a multiple of the register width known
// when compiling: AVX-512 (16 floats) where the CPU has it, else AVX2 with FMA (8 floats).
// Portable C left the compiler reducing each dot product lane by lane (dependent scalar adds)
// and keeping the accumulators in memory: ~300 cycles a key at head_dim 64 with AVX-512.

#if defined(__AVX512F__)
struct Vec {
    using Reg = __m512;
    static constexpr int64_t kWidth = 16;
    static Reg load(const float* p) { return _mm512_loadu_ps(p); }
    static Reg load(const BFloat16* p) {
        const __m256i half = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
        return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(half), 16));
    }
    static Reg zero() { return _mm512_setzero_ps(); }
    static Reg splat(float v) { return _mm512_set1_ps(v); }
    static Reg mul(Reg a, Reg b) { return _mm512_mul_ps(a, b); }
    static Reg fmadd(Reg a, Reg b, Reg c) { return _mm512_fmadd_ps(a, b, c); }
    static float sum(Reg a) { return _mm512_reduce_add_ps(a); }
    static void store(float* p, Reg a) { _mm512_storeu_ps(p, a); }
};
#else
struct Vec {
    using Reg = __m256;
    static constexpr int64_t kWidth = 8;
    static Reg load(const float* p) { return _mm256_loadu_ps(p); }
    static Reg load(const BFloat16* p) {
        const __m128i half = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
        return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(half), 16));
    }
    static Reg zero() { return _mm256_setzero_ps(); }
    static Reg splat(float v) { return _mm256_set1_ps(v); }
    static Reg mul(Reg a, Reg b) { return _mm256_mul_ps(a, b); }
    static Reg fmadd(Reg a, Reg b, Reg c) { return _mm256_fmadd_ps(a, b, c); }
    static float sum(Reg a) {
        const __m128 pair = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
        const __m128 two = _mm_add_ps(pair, _mm_movehl_ps(pair, pair));
        return _mm_cvtss_f32(_mm_add_ss(two, _mm_shuffle_ps(two, two, 1)));
    }
    static void store(float* p, Reg a) { _mm256_storeu_ps(p, a); }
};
#endif


template <typename T, int64_t HD>
struct SimdPasses : NoTileState {
    static constexpr int64_t W = Vec::kWidth;
    static_assert(HD > 0 && HD % W == 0 && HD <= 256);
    static constexpr int64_t kChunks = HD / W;

    static void scores(const T* k_head, const T*, const int64_t* table, int64_t length, int64_t bs,
                       int64_t, const float* qf, int64_t group, float scale, float*,
                       float* scores, const Ahead<T>& ahead) {
        for (int64_t t0 = 0; t0 < length; t0 += bs) {
            const T* block = k_head + table[t0 / bs] * bs * HD;
            const int64_t n = length - t0 < bs ? length - t0 : bs;
            if (t0 + bs < length) prefetch_block(k_head + table[t0 / bs + 1] * bs * HD, bs * HD);
            ahead.keys(t0 / bs, bs, HD);
            for (int64_t t = 0; t < n; t++) {
                typename Vec::Reg key[kChunks];
                for (int64_t j = 0; j < kChunks; j++) key[j] = Vec::load(block + t * HD + W * j);
                for (int64_t g = 0; g < group; g++) {
                    const float* qg = qf + g * HD;
                    typename Vec::Reg sum = Vec::mul(Vec::load(qg), key[0]);
                    for (int64_t j = 1; j < kChunks; j++)
                        sum = Vec::fmadd(Vec::load(qg + W * j), key[j], sum);
                    scores[g * length + t0 + t] = round_to<T>(Vec::sum(sum)) * scale;
                }
            }
        }
    }

    // One query head at a time, so its accumulators stay in registers; the values are read
    // `group` times, from L2 after the first.
    static void values(const T* v_head, const int64_t* table, int64_t length, int64_t bs,
                       int64_t, const float* p, int64_t group, float*, float* acc,
                       const Ahead<T>& ahead) {
        for (int64_t g = 0; g < group; g++) {
            typename Vec::Reg sum[kChunks];
            for (int64_t j = 0; j < kChunks; j++) sum[j] = Vec::zero();
            const float* pg = p + g * length;
            for (int64_t t0 = 0; t0 < length; t0 += bs) {
                const T* block = v_head + table[t0 / bs] * bs * HD;
                const int64_t n = length - t0 < bs ? length - t0 : bs;
                if (g == 0 && t0 + bs < length)
                    prefetch_block(v_head + table[t0 / bs + 1] * bs * HD, bs * HD);
                if (g == 0) ahead.values(t0 / bs, bs, HD);
                for (int64_t t = 0; t < n; t++) {
                    const typename Vec::Reg weight = Vec::splat(pg[t0 + t]);
                    for (int64_t j = 0; j < kChunks; j++)
                        sum[j] = Vec::fmadd(weight, Vec::load(block + t * HD + W * j), sum[j]);
                }
            }
            for (int64_t j = 0; j < kChunks; j++) Vec::store(acc + g * HD + W * j, sum[j]);
        }
    }
};


template <typename T, int64_t HD>
using FastPasses = SimdPasses<T, HD>;
#else
template <typename T, int64_t HD>
using FastPasses = Passes<T, HD>;
#endif

// One (row, KV head) pair: its `group` query heads against its `length` keys and values.
template <typename T, int64_t HD, typename P>
void attend_one(const T* q, const T* k_cache, const T* v_cache, const int64_t* table,
                int64_t length, T* out, const Shape& s, int64_t kv, float scale,
                std::vector<float>& scratch, const Ahead<T>& ahead) {
    const int64_t group = s.num_heads / s.kv_heads, bs = s.block_size;
    const int64_t hd = HD > 0 ? HD : s.head_dim;
    scratch.resize(static_cast<size_t>(group * (length + 2 * hd) + hd));
    float* scores = scratch.data();       // [group][length]
    float* qf = scores + group * length;  // [group][hd]
    float* acc = qf + group * hd;         // [group][hd]
    float* row = acc + group * hd;        // [hd]: one key or value row in float32
    for (int64_t g = 0; g < group; g++) {
        const T* qh = q + (kv * group + g) * s.q_head_stride;
        for (int64_t d = 0; d < hd; d++) qf[g * hd + d] = to_float(qh[d]);
    }
    P::scores(k_cache + kv * s.num_slots * hd, v_cache + kv * s.num_slots * hd, table, length, bs, hd, qf, group, scale, row,
              scores, ahead);
    for (int64_t g = 0; g < group; g++) {  // softmax, then p as the dtype would hold it
        float* sg = scores + g * length;
        const float inv = softmax_unnormalised(sg, length);
#pragma omp simd
        for (int64_t t = 0; t < length; t++) sg[t] = round_to<T>(sg[t] * inv);
    }
    P::values(v_cache + kv * s.num_slots * hd, table, length, bs, hd, scores, group, row, acc,
              ahead);
    for (int64_t g = 0; g < group; g++) {
        T* oh = out + (kv * group + g) * hd;
        for (int64_t d = 0; d < hd; d++) oh[d] = from_float<T>(acc[g * hd + d]);
    }
}

// The first pair (row * kv_heads + kv) of each thread's share, [threads + 1]: consecutive pairs
// whose keys add up to about a thread's part of the whole (a row's pairs weigh its length, plus
// a little for the per-pair work).
inline std::vector<int64_t> split_pairs(const int64_t* lengths, int64_t rows, int64_t kv_heads,
                                        int64_t threads) {
    constexpr int64_t kPairCost = 16;  // keys' worth of work a pair costs beyond its keys
    int64_t total = 0;
    for (int64_t b = 0; b < rows; b++) total += kv_heads * (lengths[b] + kPairCost);
    std::vector<int64_t> first(static_cast<size_t>(threads + 1), rows * kv_heads);
    first[0] = 0;
    int64_t done = 0, t = 1;
    for (int64_t i = 0; i < rows * kv_heads && t < threads; i++) {
        done += lengths[i / kv_heads] + kPairCost;
        while (t < threads && done * threads >= total * t) first[static_cast<size_t>(t++)] = i + 1;
    }
    return first;
}

// Pairs are split between the threads in consecutive runs (split_pairs), so a thread knows the
// pair it takes next and asks for its keys and values while it works on this one (Ahead): one
// pair's blocks (2 KB each at 16 x 64 in bf16, anywhere in the cache) are too short a stream
// for the hardware prefetcher, and without this each pair began with its keys' latency (the
// dynamic split it replaces balanced the same work without knowing what came next).
template <typename T, int64_t HD, typename P>
void paged_decode(const T* q, const T* k_cache, const T* v_cache, const int64_t* tables,
                  const int64_t* lengths, T* out, int64_t rows, const Shape& s, float scale,
                  int64_t threads) {
    const int64_t pairs = rows * s.kv_heads;
    if (threads > pairs) threads = pairs > 0 ? pairs : 1;
    const std::vector<int64_t> first = split_pairs(lengths, rows, s.kv_heads, threads);
    const int64_t hd = HD > 0 ? HD : s.head_dim;
#pragma omp parallel num_threads(threads)
    {
        std::vector<float> scratch;  // one per thread, grown to the longest context it meets
        P::begin(s.num_heads / s.kv_heads);
        const int64_t t = omp_get_thread_num();
        const int64_t end = first[static_cast<size_t>(t + 1)];
        for (int64_t i = first[static_cast<size_t>(t)]; i < end; i++) {
            const int64_t b = i / s.kv_heads, kv = i % s.kv_heads;
            Ahead<T> ahead;
            if (i + 1 < end) {
                const int64_t nb = (i + 1) / s.kv_heads, nkv = (i + 1) % s.kv_heads;
                ahead = {k_cache + nkv * s.num_slots * hd, v_cache + nkv * s.num_slots * hd,
                         tables + nb * s.table_stride, lengths[nb]};
            }
            attend_one<T, HD, P>(q + b * s.q_row_stride, k_cache, v_cache, tables + b * s.table_stride,
                       lengths[b], out + b * s.num_heads * s.head_dim, s, kv, scale, scratch,
                       ahead);
        }
        P::end();
    }
}

// The passes for a dtype and head size: DotPasses for bf16 where the CPU has AVX512-BF16.
template <typename T, int64_t HD>
struct BestOf {
    using type = FastPasses<T, HD>;
};
#if defined(__AVX512BF16__)
template <int64_t HD>
struct BestOf<BFloat16, HD> {
    using type = DotPasses<HD>;
};
#endif
template <typename T, int64_t HD>
using Best = typename BestOf<T, HD>::type;

template <typename T>
void paged_decode_any(const T* q, const T* k_cache, const T* v_cache, const int64_t* tables,
                      const int64_t* lengths, T* out, int64_t rows, const Shape& s, float scale,
                      int64_t threads) {
#if LORAGATE_AMX
    if constexpr (std::is_same_v<T, BFloat16>) {
        const int64_t group = s.num_heads / s.kv_heads;
        if (s.block_size % 16 == 0 && group <= 16 && (s.head_dim == 64 || s.head_dim == 128) &&
            loragate::amx_permitted()) {
            if (s.head_dim == 64)
                return paged_decode<T, 64, AmxPasses<64>>(q, k_cache, v_cache, tables, lengths,
                                                          out, rows, s, scale, threads);
            return paged_decode<T, 128, AmxPasses<128>>(q, k_cache, v_cache, tables, lengths,
                                                        out, rows, s, scale, threads);
        }
    }
#endif
    switch (s.head_dim) {  // the common head sizes get their own unrolled copy
        case 64:
            return paged_decode<T, 64, Best<T, 64>>(q, k_cache, v_cache, tables, lengths, out,
                                                    rows, s, scale, threads);
        case 128:
            return paged_decode<T, 128, Best<T, 128>>(q, k_cache, v_cache, tables, lengths, out,
                                                      rows, s, scale, threads);
        default:
            return paged_decode<T, 0, Passes<T, 0>>(q, k_cache, v_cache, tables, lengths, out,
                                                     rows, s, scale, threads);
    }
}

}  // namespace

// q [rows, num_heads, head_dim] (rows q_row_stride apart, heads q_head_stride apart, unit
// stride within a head); k_cache and v_cache [kv_heads, num_slots, head_dim] contiguous;
// tables [rows, table_stride] and lengths [rows] int64; out [rows, num_heads, head_dim]
// contiguous. Every length >= 1 and every block a row reads lies in the cache.
#define PAGED_DECODE_ENTRY(name, T)                                                            \
    extern "C" void name(const void* q, int64_t q_row_stride, int64_t q_head_stride,           \
                         const void* k_cache, const void* v_cache, int64_t num_slots,          \
                         const int64_t* tables, int64_t table_stride, const int64_t* lengths,  \
                         void* out, int64_t rows, int64_t num_heads, int64_t kv_heads,         \
                         int64_t head_dim, int64_t block_size, float scale, int64_t threads) { \
        const Shape shape{num_heads, kv_heads,      head_dim,    block_size,                   \
                          num_slots, q_row_stride, q_head_stride, table_stride};                \
        paged_decode_any(static_cast<const T*>(q), static_cast<const T*>(k_cache),                 \
                     static_cast<const T*>(v_cache), tables, lengths, static_cast<T*>(out),    \
                     rows, shape, scale, threads);                                             \
    }

PAGED_DECODE_ENTRY(paged_decode_bf16, BFloat16)
PAGED_DECODE_ENTRY(paged_decode_f32, float)
