// The AMX form of a prefill chunk's bf16 attention (kernels/cpu/native/prefill.cpp states what it
// computes): the same roundings, the two products by tdpbf16ps tiles and the softmax 16 lanes
// at a time (softmax_row_bf16 in softmax_bf16.h).
//
// Why: on an AMX Xeon vdpbf16ps issues at half the EPYC's rate, so the dot-product tile ran the
// mixed-lengths workload's prefill attention at ~0.16 TFLOP/s and the start-up timing kept
// torch's SDPA (~1.3 s of a 13.8 s run, 2 cores). A tile product here is 16 query rows against
// 16 keys (scores) or 32 keys against 16 dimensions (values), 16 x 16 x 32 multiply-adds a
// tdpbf16ps.
//
// Layouts (per KV head, packed once a call; keys and values past the context are zero):
//   keys   [context / 16][head_dim / 32][16 dimension pairs][16 keys][2]: scores' B tiles
//   values [context / 32][head_dim / 16][16 key pairs][16 dimensions][2]: values' B tiles
// with the context rounded up to 32 keys. An item is 32 query rows of one query head (two row
// tiles, read from q where it lies; a last partial item from a zero-padded copy), so each B
// tile loaded serves two products: 2 x 2 blocks, tiles 0-3 the sums (row tile by key group, or
// by 16 dimensions), 4-5 the A operands (queries, or probabilities), 6-7 the B operands. One
// row tile against four key groups (each B tile one product) measured no faster (0.95 against
// 0.88 ms for a 512-token chunk on 2 cores, one run each).
#pragma once

#include "amx.h"

#if LORAGATE_AMX
#include <algorithm>
#include <cstdint>
#include <cstring>

#include "bf16.h"
#include "softmax_bf16.h"

namespace loragate {

constexpr int64_t kAmxKeys = 32;  // keys a scores step takes: the packed context's multiple

inline int64_t amx_padded_context(int64_t context) {
    return (context + kAmxKeys - 1) / kAmxKeys * kAmxKeys;
}

// Query rows t0 .. t0 + 31 (at most) of one query head attended over one KV head's packed keys
// and values. HD a multiple of 64.
template <int64_t HD>
struct AmxPrefill {
    static constexpr int64_t kChunks = HD / 32;  // A tiles of a query row
    static constexpr int64_t kDimTiles = HD / 16;  // tiles of 16 output dimensions
    static constexpr int kRows = 32;  // query rows an item takes: two row tiles

    // One KV head: keys and values at `slots` of a cache head [num_slots][HD] into the layouts
    // above (amx_padded_context(context) * HD values each), every output line written whole:
    // a row of a key tile is one dimension pair of 16 keys (a gather of 16 pairs, each a 32-bit
    // value), a row of a value tile two keys' 16 dimensions interleaved (one permute).
    static void pack(const uint16_t* k_head, const uint16_t* v_head, const int64_t* slots,
                     int64_t context, uint16_t* keys, uint16_t* values) {
        const int64_t padded = amx_padded_context(context);
        const int* k32 = reinterpret_cast<const int*>(k_head);
        for (int64_t g = 0; g < padded / 16; g++) {
            alignas(64) int rows[16];  // each key's first pair, in pairs
            const int64_t n = std::min<int64_t>(16, std::max<int64_t>(0, context - 16 * g));
            for (int64_t i = 0; i < 16; i++)
                rows[i] = i < n ? static_cast<int>(slots[16 * g + i] * (HD / 2)) : 0;
            const __m512i base = _mm512_load_si512(rows);
            const __mmask16 live = __mmask16((1u << n) - 1);
            for (int64_t pair = 0; pair < HD / 2; pair++)
                _mm512_storeu_si512(
                    keys + ((g * kChunks + pair / 16) * 16 + pair % 16) * 32,
                    _mm512_mask_i32gather_epi32(
                        _mm512_setzero_si512(), live,
                        _mm512_add_epi32(base, _mm512_set1_epi32(static_cast<int>(pair))), k32,
                        4));
        }
        // output lane 2d + e: dimension d of the pair's key e (the first 16 bf16 of the
        // permute's two inputs are key 0's dimensions, its second 32 key 1's)
        alignas(64) uint16_t order[32];
        for (int i = 0; i < 32; i++) order[i] = static_cast<uint16_t>(i / 2 + (i % 2) * 32);
        const __m512i interleave = _mm512_load_si512(order);
        for (int64_t t = 0; t < padded; t += 2) {
            const uint16_t* first = t < context ? v_head + slots[t] * HD : nullptr;
            const uint16_t* second = t + 1 < context ? v_head + slots[t + 1] * HD : nullptr;
            const int64_t chunk = t / 32, p = (t % 32) / 2;
            for (int64_t d = 0; d < HD; d += 16) {
                const __m512i a = first != nullptr
                                      ? _mm512_castsi256_si512(_mm256_loadu_si256(
                                            reinterpret_cast<const __m256i*>(first + d)))
                                      : _mm512_setzero_si512();
                const __m512i b = second != nullptr
                                      ? _mm512_castsi256_si512(_mm256_loadu_si256(
                                            reinterpret_cast<const __m256i*>(second + d)))
                                      : _mm512_setzero_si512();
                _mm512_storeu_si512(values + ((chunk * kDimTiles + d / 16) * 16 + p) * 32,
                                    _mm512_permutex2var_epi16(a, interleave, b));
            }
        }
    }

    static void begin() {
        TileConfig config;
        for (int tile = 0; tile < 8; tile++) config.set(tile, 16, 64);
        load_tiles(config);
    }
    static void end() { _tile_release(); }

    // Per-thread buffers: scores [kRows][padded] floats, probabilities [kRows][padded] bf16,
    // the output sums [kRows][HD] floats, a partial item's queries [kRows][HD] bf16.
    struct Scratch {
        float* scores;
        uint16_t* probs;
        float* sums;
        uint16_t* queries;
    };

    // out[(t0 + m) * num_heads + head] for m < rows (<= 32), as prefill.cpp's attend_tile
    // computes it: score = round(q . key) * scale, p = round(softmax), out = round(sum p value).
    static void tile(const uint16_t* q, int64_t q_row_stride, int64_t q_head_stride,
                     const uint16_t* keys, const uint16_t* values, int64_t head, int64_t t0,
                     int rows, int64_t offset, int64_t context, int64_t num_heads, float scale,
                     const Scratch& s, uint16_t* out) {
        const int64_t width = amx_padded_context(context);
        const int64_t visible = offset + t0 + rows;  // keys the item's last row sees
        const uint16_t* qt = q + t0 * q_row_stride + head * q_head_stride;
        int64_t q_stride = q_row_stride;
        if (rows < kRows) {  // a last partial item: its rows copied beside zero rows
            std::memset(s.queries, 0, kRows * HD * sizeof(uint16_t));
            for (int m = 0; m < rows; m++)
                std::memcpy(s.queries + m * HD, qt + m * q_row_stride, HD * sizeof(uint16_t));
            qt = s.queries, q_stride = HD;
        }
        const uint16_t* q_low = qt + 16 * q_stride;  // the second row tile
        const int64_t steps = (visible + kAmxKeys - 1) / kAmxKeys;
        for (int64_t b = 0; b < steps; b++) {  // scores, 32 keys at a time
            const uint16_t* group = keys + b * 2 * kChunks * 512;  // + kChunks * 512: the next
            _tile_zero(0);
            _tile_zero(1);
            _tile_zero(2);
            _tile_zero(3);
            for (int64_t j = 0; j < kChunks; j++) {
                _tile_loadd(4, qt + 32 * j, q_stride * 2);
                _tile_loadd(5, q_low + 32 * j, q_stride * 2);
                _tile_loadd(6, group + j * 512, 64);
                _tile_loadd(7, group + (kChunks + j) * 512, 64);
                _tile_dpbf16ps(0, 4, 6);
                _tile_dpbf16ps(1, 4, 7);
                _tile_dpbf16ps(2, 5, 6);
                _tile_dpbf16ps(3, 5, 7);
            }
            float* at = s.scores + b * kAmxKeys;
            _tile_stored(0, at, width * 4);
            _tile_stored(1, at + 16, width * 4);
            _tile_stored(2, at + 16 * width, width * 4);
            _tile_stored(3, at + 16 * width + 16, width * 4);
        }
        const int64_t used = steps * kAmxKeys;  // keys the values pass reads
        for (int m = 0; m < kRows; m++) {
            uint16_t* p = s.probs + m * width;
            if (m >= rows)  // a padding row: zeros, so its sums stay finite
                std::memset(p, 0, used * sizeof(uint16_t));
            else
                softmax_row_bf16(s.scores + m * width, offset + t0 + m + 1, used, scale, p);
        }
        for (int64_t d = 0; d < kDimTiles; d += 2) {  // values, 32 dimensions at a time
            _tile_zero(0);
            _tile_zero(1);
            _tile_zero(2);
            _tile_zero(3);
            for (int64_t c = 0; c < used / 32; c++) {
                const uint16_t* dims = values + (c * kDimTiles + d) * 512;
                _tile_loadd(4, s.probs + 32 * c, width * 2);
                _tile_loadd(5, s.probs + 16 * width + 32 * c, width * 2);
                _tile_loadd(6, dims, 64);
                _tile_loadd(7, dims + 512, 64);
                _tile_dpbf16ps(0, 4, 6);
                _tile_dpbf16ps(1, 4, 7);
                _tile_dpbf16ps(2, 5, 6);
                _tile_dpbf16ps(3, 5, 7);
            }
            _tile_stored(0, s.sums + d * 16, HD * 4);
            _tile_stored(1, s.sums + d * 16 + 16, HD * 4);
            _tile_stored(2, s.sums + 16 * HD + d * 16, HD * 4);
            _tile_stored(3, s.sums + 16 * HD + d * 16 + 16, HD * 4);
        }
        for (int m = 0; m < rows; m++) {
            uint16_t* o = out + ((t0 + m) * num_heads + head) * HD;
            for (int64_t d = 0; d < HD; d += 16)
                _mm256_storeu_si256(reinterpret_cast<__m256i*>(o + d),
                                    (__m256i)_mm512_cvtneps_pbh(_mm512_loadu_ps(s.sums + m * HD + d)));
        }
    }
};

}  // namespace loragate
#endif
