// The bf16 passes of decode attention (kernels/cpu/native/attention.cpp, which states what they
// compute): by vdpbf16ps where the CPU has AVX512-BF16 (DotPasses), and with the scores by AMX
// tiles where it has AMX (AmxPasses); and what every pass shares (the per-thread tile state
// hook, the block prefetch).
#pragma once

#include <cstdint>
#include <cstring>

#if defined(__AVX512F__) || defined(__AVX2__)
#include <immintrin.h>
#endif

#include "amx.h"
#include "bf16.h"

namespace loragate {

// Per-thread state a pass keeps across a call (AMX's tile configuration): none for most.
struct NoTileState {
    static void begin(int64_t) {}
    static void end() {}
};

#if defined(__AVX512F__) || defined(__AVX2__)
// Blocks lie anywhere in the cache and each is only block_size * head_dim values (2 KiB at
// 16 x 64 in bf16): too short for the hardware prefetcher to ramp up, so the next block is
// asked for while this one is read.
template <int Hint = _MM_HINT_T0, typename T>
inline void prefetch_block(const T* block, int64_t values) {
    const char* p = reinterpret_cast<const char*>(block);
    for (int64_t i = 0; i < values * int64_t(sizeof(T)); i += 64)
        _mm_prefetch(p + i, static_cast<_mm_hint>(Hint));
}
#endif

// The pair (row, KV head) a thread takes after this one: its keys are asked for (to L2) while
// this pair's keys are scored and its values while this pair's values are summed, a block for
// each block this pair reads. Issued all at once when the pair began, they stalled on the
// memory system's queue of misses instead (session 16: 12 layers of 64 rows at 192-token
// contexts, one thread 14.5 -> 11.7 ms, two 8.2 -> 6.7-7.3).
template <typename T>
struct Ahead {
    const T* k_head = nullptr;  // null: this thread has no next pair
    const T* v_head = nullptr;
    const int64_t* table = nullptr;
    int64_t length = 0;

    void keys(int64_t block, int64_t bs, int64_t hd) const { ask(k_head, block, bs, hd); }
    void values(int64_t block, int64_t bs, int64_t hd) const { ask(v_head, block, bs, hd); }

   private:
    // GCC 12 deletes these prefetches (from -O2) unless the including file turns its mod-ref
    // analysis off (kernels/cpu/native/attention.cpp does): it counts the loads of `table` that
    // only feed a prefetch as unused. A volatile asm instead measured ~10% slower.
    void ask(const T* head, int64_t block, int64_t bs, int64_t hd) const {
#if defined(__AVX512F__) || defined(__AVX2__)
        if (head != nullptr && block * bs < length)
            prefetch_block<_MM_HINT_T1>(head + table[block] * bs * hd, bs * hd);
#else
        (void)head, (void)block, (void)bs, (void)hd;
#endif
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

    // A query head's float32 values as bf16 pairs (exact: they were bf16).
    static void to_bf16(const float* q, __m512bh out[kPairs]) {
        for (int64_t j = 0; j < kPairs; j++)
            out[j] = _mm512_cvtne2ps_pbh(_mm512_loadu_ps(q + 32 * j + 16),
                                         _mm512_loadu_ps(q + 32 * j));
    }

    // v_head: the same pair's values, asked for (to L2) while the keys are read, so the
    // second pass finds them there and each pass has twice the reads in flight. The keys
    // blocks ahead are asked for to L2 as well, not L1: on the Zen 4 EPYC, to L1 they took
    // 1.08-1.10x the time (session 21, decode steps of the mixed workload's own block
    // tables): a line asked for to L1 holds one of its few miss buffers until it arrives.
    static void scores(const BFloat16* k_head, const BFloat16* v_head, const int64_t* table,
                       int64_t length, int64_t bs,
                       int64_t, const float* qf, int64_t group, float scale, float*,
                       float* scores, const Ahead<BFloat16>& ahead) {
        const __m512 scale_v = _mm512_set1_ps(scale);
        constexpr int64_t kKept = 16;  // heads whose bf16 query stays in registers
        __m512bh queries[kKept][kPairs];  // each head back in bf16 (exact: it was bf16)
        for (int64_t g = 0; g < group && g < kKept; g++) to_bf16(qf + g * HD, queries[g]);
        const BFloat16* keys[16];
        int64_t block = 0, offset = 0;  // where key t0 lies: walked, not divided out per key
        for (int64_t t0 = 0; t0 < length; t0 += 16) {
            const int64_t n = length - t0 < 16 ? length - t0 : 16;
            for (int64_t i = 0; i < n; i++) {
                if (offset == 0) {
                    for (int64_t d = block == 0 ? 1 : kAhead; d <= kAhead; d++)  // blocks on
                        if ((block + d) * bs < length)
                            prefetch_block<_MM_HINT_T1>(k_head + table[block + d] * bs * HD,
                                                        bs * HD);
                    prefetch_block<_MM_HINT_T1>(v_head + table[block] * bs * HD, bs * HD);
                    ahead.keys(block, bs, HD);
                }
                keys[i] = k_head + (table[block] * bs + offset) * HD;
                if (++offset == bs) offset = 0, block++;
            }
            for (int64_t g = 0; g < group; g++) {
                __m512bh more[kPairs];  // a head past kKept: converted each time
                if (g >= kKept) to_bf16(qf + g * HD, more);
                const __m512bh* query = g < kKept ? queries[g] : more;
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
                _mm512_mask_storeu_ps(scores + g * length + t0, __mmask16((1u << n) - 1),
                                      _mm512_mul_ps(bf16_rounded(sums), scale_v));
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
                          int64_t bs, const float* p, float* acc, const Ahead<BFloat16>& ahead) {
        __m512 sum[G * kChunks];
#pragma GCC unroll 32
        for (int i = 0; i < G * kChunks; i++) sum[i] = _mm512_setzero_ps();
        int64_t block = 0, offset = 0;
        for (int64_t t = 0; t < length; t += 2) {
            if (offset == 0) {
                if ((block + 1) * bs < length)
                    prefetch_block(v_head + table[block + 1] * bs * HD, bs * HD);
                ahead.values(block, bs, HD);
            }
            const BFloat16* a = v_head + (table[block] * bs + offset) * HD;
            if (++offset == bs) offset = 0, block++;
            const bool pair = t + 1 < length;
            const BFloat16* b = a;
            if (pair) {
                b = v_head + (table[block] * bs + offset) * HD;
                if (offset == 0) {
                    if ((block + 1) * bs < length)
                        prefetch_block(v_head + table[block + 1] * bs * HD, bs * HD);
                    ahead.values(block, bs, HD);
                }
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
                       int64_t, const float* p, int64_t group, float*, float* acc,
                       const Ahead<BFloat16>& ahead) {
        const Ahead<BFloat16> none;
        for (int64_t g = 0; g < group; g += kHeads) {
            const float* pg = p + g * length;
            float* ag = acc + g * HD;
            const Ahead<BFloat16>& next = g == 0 ? ahead : none;  // once a pair
            switch (group - g < kHeads ? group - g : kHeads) {
                case 1: values_of<1>(v_head, table, length, bs, pg, ag, next); break;
                case 2: values_of<2>(v_head, table, length, bs, pg, ag, next); break;
                case 3: values_of<3>(v_head, table, length, bs, pg, ag, next); break;
                default: values_of<4>(v_head, table, length, bs, pg, ag, next); break;
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
// 1.87 -> 1.63 at 400; the pass is bound by reading the cache (~18 GB/s here), not the dots.
// Needs blocks of a multiple of 16 slots (a tile of keys never crosses a block) and at most
// 16 query heads a KV head.
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
        load_tiles(config);
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
        // key i's score for head g lies at sums[i][g]: a column, 16 floats apart
        const __m512i column = _mm512_setr_epi32(0, 16, 32, 48, 64, 80, 96, 112, 128, 144, 160,
                                                 176, 192, 208, 224, 240);
        const __mmask16 mask = __mmask16((1u << n) - 1);
        for (int64_t g = 0; g < group; g++) {
            const __m512 v = _mm512_i32gather_ps(
                _mm512_add_epi32(column, _mm512_set1_epi32(static_cast<int>(g))), &sums[0][0], 4);
            _mm512_mask_storeu_ps(scores + g * length + t0, mask,
                                  _mm512_mul_ps(bf16_rounded(v), scale_v));
        }
    }

    static void scores(const BFloat16* k_head, const BFloat16* v_head, const int64_t* table,
                       int64_t length, int64_t bs, int64_t, const float* qf, int64_t group,
                       float scale, float*, float* scores, const Ahead<BFloat16>& ahead) {
        // the query heads, dimension pairs by head: [kPairs][16 pairs][16 heads][2] (bf16, exact)
        alignas(64) uint16_t heads[kPairs][16][16][2];
        for (int64_t j = 0; j < kPairs; j++)
            for (int64_t p = 0; p < 16; p++)
                for (int64_t g = 0; g < group; g++)
                    for (int e = 0; e < 2; e++)
                        heads[j][p][g][e] =
                            from_float<BFloat16>(qf[g * HD + 32 * j + 2 * p + e]).bits;
        _tile_loadd(3, heads[0], 64);
        _tile_loadd(4, heads[1], 64);
        if constexpr (kPairs == 4) {
            _tile_loadd(5, heads[2], 64);
            _tile_loadd(6, heads[3], 64);
        }
        const __m512 scale_v = _mm512_set1_ps(scale);
        constexpr int64_t kAhead = DotPasses<HD>::kAhead;
        int64_t block = 0, offset = 0;  // where the next 16 keys lie
        const auto next_keys = [&]() {
            if (offset == 0) {
                for (int64_t d = block == 0 ? 1 : kAhead; d <= kAhead; d++)  // blocks on
                    if ((block + d) * bs < length)
                        prefetch_block(k_head + table[block + d] * bs * HD, bs * HD);
                prefetch_block<_MM_HINT_T1>(v_head + table[block] * bs * HD, bs * HD);
                ahead.keys(block, bs, HD);
            }
            const BFloat16* keys = k_head + (table[block] * bs + offset) * HD;
            offset += 16;
            if (offset == bs) offset = 0, block++;
            return keys;
        };
        int64_t t0 = 0;
        for (; t0 + 16 < length; t0 += 32) {  // two groups: their products overlap
            products<0>(next_keys());
            products<7>(next_keys());
            write<0>(scores, length, t0, 16, group, scale_v);
            write<7>(scores, length, t0 + 16, length - t0 - 16 < 16 ? length - t0 - 16 : 16,
                     group, scale_v);
        }
        if (t0 < length) {
            products<0>(next_keys());
            write<0>(scores, length, t0, length - t0, group, scale_v);
        }
    }
};
#endif

}  // namespace loragate
