// Decode attention over the paged KV cache, hand-written for the CPU: kernels/cpu_native.py
// builds it with the system's C++ compiler and engine/attention.py calls it through ctypes.
// It computes what `decode_matmul` in engine/attention.py computes after gathering each row's
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

#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

#if defined(__AVX512F__) || defined(__AVX2__)
#include <immintrin.h>
#endif

#include "cpu_amx.h"
#include "cpu_bf16.h"
#include "cpu_math.h"

namespace {

using loragate::BFloat16;
using loragate::from_float;
using loragate::round_to;
using loragate::softmax_unnormalised;
using loragate::to_float;

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

// Per-thread state a pass keeps across a call (AMX's tile configuration): none for most.
struct NoTileState {
    static void begin(int64_t) {}
    static void end() {}
};

// The two passes over the cache, portable: each key (value) row is converted to float32 once
// and every query head of the group uses it. HD > 0: head_dim known when compiling, so the
// loops over it unroll; 0: s.head_dim.
template <typename T, int64_t HD>
struct Passes : NoTileState {
    // scores[g][t] = round(q[g] . key[t]) * scale
    static void scores(const T* k_head, const T*, const int64_t* table, int64_t length, int64_t bs,
                       int64_t hd, const float* qf, int64_t group, float scale, float* row,
                       float* scores) {
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
                       int64_t hd, const float* p, int64_t group, float* row, float* acc) {
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

// Blocks lie anywhere in the cache and each is only block_size * head_dim values (2 KiB at
// 16 x 64 in bf16): too short for the hardware prefetcher to ramp up, so the next block is
// asked for while this one is read.
template <int Hint = _MM_HINT_T0, typename T>
inline void prefetch_block(const T* block, int64_t values) {
    const char* p = reinterpret_cast<const char*>(block);
    for (int64_t i = 0; i < values * int64_t(sizeof(T)); i += 64)
        _mm_prefetch(p + i, static_cast<_mm_hint>(Hint));
}

template <typename T, int64_t HD>
struct SimdPasses : NoTileState {
    static constexpr int64_t W = Vec::kWidth;
    static_assert(HD > 0 && HD % W == 0 && HD <= 256);
    static constexpr int64_t kChunks = HD / W;

    static void scores(const T* k_head, const T*, const int64_t* table, int64_t length, int64_t bs,
                       int64_t, const float* qf, int64_t group, float scale, float*,
                       float* scores) {
        for (int64_t t0 = 0; t0 < length; t0 += bs) {
            const T* block = k_head + table[t0 / bs] * bs * HD;
            const int64_t n = length - t0 < bs ? length - t0 : bs;
            if (t0 + bs < length) prefetch_block(k_head + table[t0 / bs + 1] * bs * HD, bs * HD);
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
                       int64_t, const float* p, int64_t group, float*, float* acc) {
        for (int64_t g = 0; g < group; g++) {
            typename Vec::Reg sum[kChunks];
            for (int64_t j = 0; j < kChunks; j++) sum[j] = Vec::zero();
            const float* pg = p + g * length;
            for (int64_t t0 = 0; t0 < length; t0 += bs) {
                const T* block = v_head + table[t0 / bs] * bs * HD;
                const int64_t n = length - t0 < bs ? length - t0 : bs;
                if (g == 0 && t0 + bs < length)
                    prefetch_block(v_head + table[t0 / bs + 1] * bs * HD, bs * HD);
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

#if defined(__AVX512BF16__)
// bf16 with AVX512-BF16: the same two passes in fewer instructions. A key's dot product is
// two vdpbf16ps over its bf16 values as they lie (each adds exact bf16 products to float32
// lanes: the float32 sums of the reference, in another order), and 16 keys' lane sums are
// reduced together by a transpose tree (45 shuffles and adds, against ~10 for each key
// alone). Values are taken two keys at a time by vdpbf16ps too, for every query head of the
// group at once.
// Session 12 probe: the passes were ~50 instructions a key, against ~115 for SimdPasses.
template <int64_t HD>
struct DotPasses : NoTileState {
    static_assert(HD == 64 || HD == 128);
    static constexpr int64_t kPairs = HD / 32;   // bf16 registers a key holds
    static constexpr int64_t kChunks = HD / 16;  // float32 registers a row holds
    static constexpr int64_t kHeads = 16 / kChunks;  // query heads whose sums fit in registers
    static constexpr int64_t kAhead = 2;  // key blocks asked for ahead (1-4 measured within 5%)

    // The 16 vectors' lane sums in one vector, in the order the tree leaves them.
    static __m512 tree(__m512 v[16]) {
        for (int i = 0; i < 8; i++)  // 256-bit halves: [key 2i: 8 lanes, key 2i + 1: 8 lanes]
            v[i] = _mm512_add_ps(_mm512_shuffle_f32x4(v[2 * i], v[2 * i + 1], 0x44),
                                 _mm512_shuffle_f32x4(v[2 * i], v[2 * i + 1], 0xEE));
        for (int i = 0; i < 4; i++)  // 128-bit quarters: four keys, four lanes each
            v[i] = _mm512_add_ps(_mm512_shuffle_f32x4(v[2 * i], v[2 * i + 1], 0x88),
                                 _mm512_shuffle_f32x4(v[2 * i], v[2 * i + 1], 0xDD));
        for (int i = 0; i < 2; i++)  // pairs of lanes
            v[i] = _mm512_add_ps(_mm512_shuffle_ps(v[2 * i], v[2 * i + 1], 0x44),
                                 _mm512_shuffle_ps(v[2 * i], v[2 * i + 1], 0xEE));
        return _mm512_add_ps(_mm512_shuffle_ps(v[0], v[1], 0x88),
                             _mm512_shuffle_ps(v[0], v[1], 0xDD));
    }

    // out[i] = sum of v[i]'s lanes. The permutation back to key order is found once, by
    // running the tree on vectors whose lanes all hold their own index.
    static __m512 reduce16(__m512 v[16]) {
        static const __m512i order = [] {
            __m512 probe[16];
            for (int i = 0; i < 16; i++) probe[i] = _mm512_set1_ps(float(i));
            alignas(64) float lanes[16];
            _mm512_store_ps(lanes, tree(probe));  // lane l holds 16 x (the key it summed)
            alignas(64) int32_t where[16];
            for (int lane = 0; lane < 16; lane++) where[int(lanes[lane]) / 16] = lane;
            return _mm512_load_si512(where);
        }();
        return _mm512_permutexvar_ps(order, tree(v));
    }

    // v_head: the same pair's values, asked for (to L2) while the keys are read, so the
    // second pass finds them there and each pass has twice the reads in flight.
    static void scores(const BFloat16* k_head, const BFloat16* v_head, const int64_t* table,
                       int64_t length, int64_t bs,
                       int64_t, const float* qf, int64_t group, float scale, float*,
                       float* scores) {
        const __m512 scale_v = _mm512_set1_ps(scale);
        const BFloat16* keys[16];
        int64_t block = 0, offset = 0;  // where key t0 lies: walked, not divided out per key
        for (int64_t t0 = 0; t0 < length; t0 += 16) {
            const int64_t n = length - t0 < 16 ? length - t0 : 16;
            for (int64_t i = 0; i < n; i++) {
                if (offset == 0) {
                    for (int64_t ahead = block == 0 ? 1 : kAhead; ahead <= kAhead; ahead++)
                        if ((block + ahead) * bs < length)
                            prefetch_block(k_head + table[block + ahead] * bs * HD, bs * HD);
                    prefetch_block<_MM_HINT_T1>(v_head + table[block] * bs * HD, bs * HD);
                }
                keys[i] = k_head + (table[block] * bs + offset) * HD;
                if (++offset == bs) offset = 0, block++;
            }
            for (int64_t g = 0; g < group; g++) {
                __m512bh query[kPairs];  // the head back in bf16 (exact: it was bf16)
                for (int64_t j = 0; j < kPairs; j++)
                    query[j] = _mm512_cvtne2ps_pbh(_mm512_loadu_ps(qf + g * HD + 32 * j + 16),
                                                   _mm512_loadu_ps(qf + g * HD + 32 * j));
                __m512 v[16];
                for (int64_t i = 0; i < 16; i++) {
                    v[i] = _mm512_setzero_ps();
                    if (i >= n) continue;
                    for (int64_t j = 0; j < kPairs; j++) {
                        const __m512bh key = (__m512bh)_mm512_loadu_si512(keys[i] + 32 * j);
                        v[i] = _mm512_dpbf16_ps(v[i], query[j], key);
                    }
                }
                // round(sum) to bf16 (nearest even), back in float32, times the scale
                const __m512 sums = reduce16(v);
                const __m512 rounded = _mm512_castsi512_ps(_mm512_slli_epi32(
                    _mm512_cvtepu16_epi32((__m256i)_mm512_cvtneps_pbh(sums)), 16));
                _mm512_mask_storeu_ps(scores + g * length + t0, __mmask16((1u << n) - 1),
                                      _mm512_mul_ps(rounded, scale_v));
            }
        }
    }

    // The bf16 bits of a float holding a bf16 value (the probabilities are rounded already).
    static uint32_t bits_of(float v) {
        uint32_t u;
        std::memcpy(&u, &v, sizeof u);
        return u >> 16;
    }

    // acc[g] = sum_t p[g][t] value[t] for G query heads, two keys at a time: their values
    // interleaved (unpack) are the pairs vdpbf16ps multiplies by the pair (p[t], p[t + 1]),
    // exactly as float32 products of the bf16 values. The unpack works within 128-bit lanes, so
    // the accumulators hold the head's dimensions shuffled; they are put back in order once.
    template <int G>
    static void values_of(const BFloat16* v_head, const int64_t* table, int64_t length,
                          int64_t bs, const float* p, float* acc) {
        __m512 sum[G * kChunks];
#pragma GCC unroll 32
        for (int i = 0; i < G * kChunks; i++) sum[i] = _mm512_setzero_ps();
        int64_t block = 0, offset = 0;
        for (int64_t t = 0; t < length; t += 2) {
            if (offset == 0 && (block + 1) * bs < length)
                prefetch_block(v_head + table[block + 1] * bs * HD, bs * HD);
            const BFloat16* a = v_head + (table[block] * bs + offset) * HD;
            if (++offset == bs) offset = 0, block++;
            const bool pair = t + 1 < length;
            const BFloat16* b = a;
            if (pair) {
                b = v_head + (table[block] * bs + offset) * HD;
                if (offset == 0 && (block + 1) * bs < length)
                    prefetch_block(v_head + table[block + 1] * bs * HD, bs * HD);
                if (++offset == bs) offset = 0, block++;
            }
            __m512i lo[kPairs], hi[kPairs];
#pragma GCC unroll 4
            for (int64_t j = 0; j < kPairs; j++) {
                const __m512i x = _mm512_loadu_si512(a + 32 * j);
                // the odd last key pairs with zeros (its row past the length is never read)
                const __m512i y = pair ? _mm512_loadu_si512(b + 32 * j) : _mm512_setzero_si512();
                lo[j] = _mm512_unpacklo_epi16(x, y);
                hi[j] = _mm512_unpackhi_epi16(x, y);
            }
#pragma GCC unroll 4
            for (int g = 0; g < G; g++) {
                const uint32_t second = pair ? bits_of(p[g * length + t + 1]) : 0u;
                const __m512bh w = (__m512bh)_mm512_set1_epi32(
                    int32_t((second << 16) | bits_of(p[g * length + t])));
#pragma GCC unroll 4
                for (int64_t j = 0; j < kPairs; j++) {
                    sum[g * kChunks + 2 * j] =
                        _mm512_dpbf16_ps(sum[g * kChunks + 2 * j], w, (__m512bh)lo[j]);
                    sum[g * kChunks + 2 * j + 1] =
                        _mm512_dpbf16_ps(sum[g * kChunks + 2 * j + 1], w, (__m512bh)hi[j]);
                }
            }
        }
        // lo's lane 4L + i holds dimension 8L + i of its 32, hi's holds 8L + 4 + i
        const __m512i first = _mm512_setr_epi32(0, 1, 2, 3, 16, 17, 18, 19, 4, 5, 6, 7, 20, 21, 22, 23);
        const __m512i second = _mm512_setr_epi32(8, 9, 10, 11, 24, 25, 26, 27, 12, 13, 14, 15, 28, 29, 30, 31);
        for (int g = 0; g < G; g++)
            for (int64_t j = 0; j < kPairs; j++) {
                const __m512 l = sum[g * kChunks + 2 * j], h = sum[g * kChunks + 2 * j + 1];
                _mm512_storeu_ps(acc + g * HD + 32 * j, _mm512_permutex2var_ps(l, first, h));
                _mm512_storeu_ps(acc + g * HD + 32 * j + 16, _mm512_permutex2var_ps(l, second, h));
            }
    }

    static void values(const BFloat16* v_head, const int64_t* table, int64_t length, int64_t bs,
                       int64_t, const float* p, int64_t group, float*, float* acc) {
        for (int64_t g = 0; g < group; g += kHeads) {
            const float* pg = p + g * length;
            float* ag = acc + g * HD;
            switch (group - g < kHeads ? group - g : kHeads) {
                case 1: values_of<1>(v_head, table, length, bs, pg, ag); break;
                case 2: values_of<2>(v_head, table, length, bs, pg, ag); break;
                case 3: values_of<3>(v_head, table, length, bs, pg, ag); break;
                default: values_of<4>(v_head, table, length, bs, pg, ag); break;
            }
        }
    }
};
#endif

#if LORAGATE_AMX
// bf16 on AMX: the scores of 16 keys at a time by tdpbf16ps, the values as DotPasses takes
// them. With keys as the A operand (16 keys of a block are 16 rows of the cache, 32 dimensions
// a tile) and the group's query heads as B (their dimensions in pairs: [16][group][2]), a tile
// product gives the 16 keys' scores for every head of the group, 32 dimensions at a time:
// 2 products a 16 keys at head_dim 64, where DotPasses spends ~22 instructions a key. The
// same float32 sums of exact bf16 products, in another order. Probe (64 rows, 12 layers'
// caches, scattered blocks, 2-core AMX Xeon): 0.79 -> 0.72 ms a layer at 200-token contexts,
// 1.87 -> 1.63 at 400; the pass is bound by reading the cache (~18 GB/s here), not the dots. Needs blocks of a multiple of
// 16 slots (a tile of keys never crosses a block) and at most 16 query heads a KV head.
// Tiles: 0 and 7 the scores of alternate groups of 16 keys (one group's products need not
// wait for the last one's store), 1-2 keys, 3-6 the query heads (head_dim / 32 of them).
template <int64_t HD>
struct AmxPasses : DotPasses<HD> {
    static constexpr int64_t kPairs = HD / 32;

    static void begin(int64_t group) {
        loragate::TileConfig config;
        config.set(0, 16, static_cast<int>(4 * group));
        config.set(7, 16, static_cast<int>(4 * group));
        config.set(1, 16, 64);
        config.set(2, 16, 64);
        for (int j = 0; j < kPairs; j++) config.set(3 + j, 16, static_cast<int>(4 * group));
        _tile_loadconfig(&config);
    }
    static void end() { _tile_release(); }

    // Scores of the 16 keys at `keys` into tile C (0 or 7: GCC's tile intrinsics take the
    // tile's number as a literal, so the two are spelled out).
#define LORAGATE_KEY_PRODUCTS(C)                 \
    do {                                         \
        _tile_zero(C);                           \
        _tile_loadd(1, keys, HD * 2);            \
        _tile_dpbf16ps(C, 1, 3);                 \
        _tile_loadd(2, keys + 32, HD * 2);       \
        _tile_dpbf16ps(C, 2, 4);                 \
        if constexpr (kPairs == 4) {             \
            _tile_loadd(1, keys + 64, HD * 2);   \
            _tile_dpbf16ps(C, 1, 5);             \
            _tile_loadd(2, keys + 96, HD * 2);   \
            _tile_dpbf16ps(C, 2, 6);             \
        }                                        \
    } while (0)
    template <int C>
    static void products(const BFloat16* keys) {
        if constexpr (C == 0)
            LORAGATE_KEY_PRODUCTS(0);
        else
            LORAGATE_KEY_PRODUCTS(7);
    }
#undef LORAGATE_KEY_PRODUCTS

    // scores[g][t0 + i] = round(sum[i][g]) * scale for the first n of 16 keys
    template <int C>
    static void write(float* scores, int64_t length, int64_t t0, int64_t n, int64_t group,
                      __m512 scale_v) {
        alignas(64) float sums[16][16];
        if constexpr (C == 0)
            _tile_stored(0, sums, 64);
        else
            _tile_stored(7, sums, 64);
        const __m512i column = _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15), _mm512_set1_epi32(16));
        const __mmask16 mask = __mmask16((1u << n) - 1);
        for (int64_t g = 0; g < group; g++) {
            const __m512 v = _mm512_i32gather_ps(
                _mm512_add_epi32(column, _mm512_set1_epi32(static_cast<int>(g))), &sums[0][0], 4);
            const __m512 rounded = _mm512_castsi512_ps(_mm512_slli_epi32(
                _mm512_cvtepu16_epi32((__m256i)_mm512_cvtneps_pbh(v)), 16));
            _mm512_mask_storeu_ps(scores + g * length + t0, mask, _mm512_mul_ps(rounded, scale_v));
        }
    }

    static void scores(const BFloat16* k_head, const BFloat16* v_head, const int64_t* table,
                       int64_t length, int64_t bs, int64_t, const float* qf, int64_t group,
                       float scale, float*, float* scores) {
        // the query heads, dimension pairs by head: [kPairs][16 pairs][16 heads][2] (bf16, exact)
        alignas(64) uint16_t heads[kPairs][16][16][2];
        for (int64_t j = 0; j < kPairs; j++)
            for (int64_t p = 0; p < 16; p++)
                for (int64_t g = 0; g < group; g++)
                    for (int e = 0; e < 2; e++)
                        heads[j][p][g][e] = from_float<BFloat16>(qf[g * HD + 32 * j + 2 * p + e]).bits;
        _tile_loadd(3, heads[0], 64);
        _tile_loadd(4, heads[1], 64);
        if constexpr (kPairs == 4) {
            _tile_loadd(5, heads[2], 64);
            _tile_loadd(6, heads[3], 64);
        }
        const __m512 scale_v = _mm512_set1_ps(scale);
        constexpr int64_t kAhead = DotPasses<HD>::kAhead;
        int64_t block = 0, offset = 0;  // where key t0 lies
        const auto keys_at = [&](int64_t t0) {
            if (offset == 0) {
                for (int64_t ahead = block == 0 ? 1 : kAhead; ahead <= kAhead; ahead++)
                    if ((block + ahead) * bs < length)
                        prefetch_block(k_head + table[block + ahead] * bs * HD, bs * HD);
                prefetch_block<_MM_HINT_T1>(v_head + table[block] * bs * HD, bs * HD);
            }
            const BFloat16* keys = k_head + (table[block] * bs + offset) * HD;
            (void)t0;
            offset += 16;
            if (offset == bs) offset = 0, block++;
            return keys;
        };
        int64_t t0 = 0;
        for (; t0 + 16 < length; t0 += 32) {  // two groups: their products overlap
            products<0>(keys_at(t0));
            products<7>(keys_at(t0 + 16));
            write<0>(scores, length, t0, 16, group, scale_v);
            write<7>(scores, length, t0 + 16, length - t0 - 16 < 16 ? length - t0 - 16 : 16,
                     group, scale_v);
        }
        if (t0 < length) {
            products<0>(keys_at(t0));
            write<0>(scores, length, t0, length - t0, group, scale_v);
        }
    }
};
#endif

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
                std::vector<float>& scratch) {
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
              scores);
    for (int64_t g = 0; g < group; g++) {  // softmax, then p as the dtype would hold it
        float* sg = scores + g * length;
        const float inv = softmax_unnormalised(sg, length);
#pragma omp simd
        for (int64_t t = 0; t < length; t++) sg[t] = round_to<T>(sg[t] * inv);
    }
    P::values(v_cache + kv * s.num_slots * hd, table, length, bs, hd, scores, group, row, acc);
    for (int64_t g = 0; g < group; g++) {
        T* oh = out + (kv * group + g) * hd;
        for (int64_t d = 0; d < hd; d++) oh[d] = from_float<T>(acc[g * hd + d]);
    }
}

template <typename T, int64_t HD, typename P>
void paged_decode(const T* q, const T* k_cache, const T* v_cache, const int64_t* tables,
                  const int64_t* lengths, T* out, int64_t rows, const Shape& s, float scale,
                  int64_t threads) {
    const int64_t pairs = rows * s.kv_heads;
#pragma omp parallel num_threads(threads)
    {
        std::vector<float> scratch;  // one per thread, grown to the longest context it meets
        P::begin(s.num_heads / s.kv_heads);
#pragma omp for schedule(dynamic, 1)
        for (int64_t i = 0; i < pairs; i++) {
            const int64_t b = i / s.kv_heads, kv = i % s.kv_heads;
            attend_one<T, HD, P>(q + b * s.q_row_stride, k_cache, v_cache, tables + b * s.table_stride,
                       lengths[b], out + b * s.num_heads * s.head_dim, s, kv, scale, scratch);
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
