// kernels/cpu/native/prefill.cpp's computation on AVX2's FMAs (fma_tile.h), in bf16 (float32
// sums, bf16 rounding where the eager path rounds) or float32: the path where the CPU has no
// AVX512-BF16.
#pragma once

#include <cstdint>
#include <vector>

#include "bf16.h"
#include "fma_tile.h"
#include "vec_math.h"
#include "prefill_schedule.h"

namespace loragate {

#if LORAGATE_FMA
// The FMA path. Per KV head: keys as float32 panels of 16 keys ([context / 16][head_dim][16]:
// the keys are the outputs of the scores' matmul), values as panels of 16 dimensions
// ([head_dim / 16][context][16]). A tile of up to 6 query rows is packed as the FMA tile takes
// its rows ([head_dim][6]), its probabilities likewise ([keys][6]).
constexpr int kFmaQueryRows = kFmaRows;

template <typename T>
inline void pack_head_fma(const T* k_head, const T* v_head, const int64_t* slots,
                          const Chunk& c, float* keys, float* values) {
    const int64_t hd = c.head_dim, panels = round_up(c.context, kPanelCols) / kPanelCols;
    for (int64_t b = 0; b < panels; b++)
        for (int64_t j = 0; j < kPanelCols; j++) {
            const int64_t t = b * kPanelCols + j;
            const T* row = t < c.context ? k_head + slots[t] * hd : nullptr;
            for (int64_t d = 0; d < hd; d++)
                keys[(b * hd + d) * kPanelCols + j] = row != nullptr ? to_float(row[d]) : 0.f;
        }
    for (int64_t t = 0; t < c.context; t++) {
        const T* row = v_head + slots[t] * hd;
        for (int64_t d = 0; d < hd; d++)
            values[((d / kPanelCols) * c.context + t) * kPanelCols + d % kPanelCols] =
                to_float(row[d]);
    }
}

// Per-thread buffers of a tile: its queries [head_dim][6], scores [6][context rounded up to
// 16], probabilities [context][6].
struct FmaScratch {
    std::vector<float> queries, scores, probs;
    FmaScratch(const Chunk& c)
        : queries(c.head_dim * kFmaQueryRows),
          scores(kFmaQueryRows * round_up(c.context, kPanelCols)),
          probs(c.context * kFmaQueryRows) {}
};

template <typename T>
inline void attend_tile_fma(const T* q, const float* keys, const float* values, int64_t head,
                            int64_t t0, int rows, const Chunk& c, FmaScratch& scratch, T* out) {
    const int64_t hd = c.head_dim, width = round_up(c.context, kPanelCols);
    const int64_t visible = c.offset + t0 + rows;  // keys the tile's last row sees
    float* qt = scratch.queries.data();
    float* scores = scratch.scores.data();
    float* pt = scratch.probs.data();
    for (int m = 0; m < kFmaQueryRows; m++) {
        const T* row = q + (t0 + m) * c.q_row_stride + head * c.q_head_stride;
        for (int64_t d = 0; d < hd; d++)
            qt[d * kFmaQueryRows + m] = m < rows ? to_float(row[d]) : 0.f;
    }
    float sums[kFmaQueryRows][kPanelCols];
    for (int64_t b = 0; b * kPanelCols < visible; b++) {  // scores, 16 keys at a time
        fma_rows<float>(rows, qt, 0, hd, keys + b * hd * kPanelCols, sums[0],
                                  kPanelCols, true, nullptr);
        for (int m = 0; m < rows; m++)
            for (int64_t j = 0; j < kPanelCols; j++)  // rounded to T, times the scale
                scores[m * width + b * kPanelCols + j] = round_to<T>(sums[m][j]) * c.scale;
    }
    for (int m = 0; m < rows; m++) {  // softmax over what row m sees, zeros after
        float* s = scores + m * width;
        const int64_t seen = c.offset + t0 + m + 1;
        const float inv = softmax_unnormalised(s, seen);
        for (int64_t j = 0; j < seen; j++) pt[j * kFmaQueryRows + m] = round_to<T>(s[j] * inv);
        for (int64_t j = seen; j < visible; j++) pt[j * kFmaQueryRows + m] = 0.f;
    }
    for (int64_t db = 0; db < hd / kPanelCols; db++) {  // values, 16 dimensions at a time
        fma_rows<float>(rows, pt, 0, visible, values + db * c.context * kPanelCols,
                                  sums[0], kPanelCols, true, nullptr);
        for (int m = 0; m < rows; m++) {
            T* o = out + ((t0 + m) * c.num_heads + head) * hd + db * kPanelCols;
            for (int64_t j = 0; j < kPanelCols; j++) o[j] = from_float<T>(sums[m][j]);
        }
    }
}

template <typename T>
inline void prefill_fma(const T* q, const T* k_cache, const T* v_cache, const int64_t* slots,
                        const Chunk& c, T* out, int threads) {
    const int64_t key_values = round_up(c.context, kPanelCols) * c.head_dim;
    const int64_t value_values = c.context * c.head_dim;
    std::vector<float> keys(c.kv_heads * key_values), values(c.kv_heads * value_values);
    const int64_t head_values = c.num_slots * c.head_dim;
    each_item(
        c, kFmaQueryRows, threads,
        [&](int64_t h) {
            pack_head_fma(k_cache + h * head_values, v_cache + h * head_values, slots, c,
                          keys.data() + h * key_values, values.data() + h * value_values);
        },
        [&] {
            return [&, scratch = FmaScratch(c)](int64_t head, int64_t kv, int64_t t0,
                                                int rows) mutable {
                attend_tile_fma(q, keys.data() + kv * key_values,
                                values.data() + kv * value_values, head, t0, rows, c, scratch,
                                out);
            };
        });
}
#endif

}  // namespace loragate
