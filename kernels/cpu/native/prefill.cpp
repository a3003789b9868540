// A prefill chunk's attention in bf16, in one call: kernels/cpu/prefill.py builds it with the
// system's C++ compiler and engine/step/attention.py calls it through ctypes. It computes what
// `prefill_matmul` in engine/step/attention.py computes (transformers' eager attention), reading the
// keys and values where they lie in the paged cache:
//
//     score[t, j] = round(q[t] . key[j]) * scale                 j <= offset + t (causal)
//     p[t, j]     = round(softmax(score[t])[j])        (float32 exp, sum and divide, as there)
//     out[t]      = round(sum_j p[t, j] value[j])
//
// with float32 products and sums, `round` to bf16 where the eager path hands a bf16 tensor from
// one op to the next. Query heads kv * group .. kv * group + group - 1 share KV head kv.
//
// Why: the eager form's two bf16 matmuls compute the full square of scores (the softmax then
// zeroes what a query may not see) through oneDNN calls sized for larger problems, plus a
// gather of the context and the softmax pass between: ~1.2 s of a 15 s mixed-lengths workload.
// Here each KV head's keys and values are packed once into the dot-product tile's layout
// (dot_tile.h: keys as the "outputs", values transposed), and each tile of 6 query rows
// multiplies only the key blocks its last row can see.
//
// With AMX (head_dim 64 or 128) the two products run on tiles instead: prefill_amx.h.
//
// Without AVX512-BF16 (AVX2 + FMA) the same computation runs on the matmul kernel's FMA tile
// (fma_tile.h), in bf16 or float32 (where `round` is a no-op): keys and values are widened
// to float32 panels when packed. There PyTorch's SDPA was the only fast form (oneDNN has no
// bf16 matmuls on AVX2) and ran a 256-token chunk at ~30 GFLOP/s, computing the full square.

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <memory>
#include <vector>

#include "bf16.h"
#include "dot_tile.h"
#include "fma_tile.h"
#include "vec_math.h"
#include "prefill_amx.h"
#include "prefill_fma.h"
#include "prefill_schedule.h"
#include "softmax_bf16.h"

namespace {

using loragate::Chunk;
using loragate::each_item;
using loragate::kDotCols;
using loragate::kDotRows;
using loragate::round_up;
#if LORAGATE_FMA
using loragate::prefill_fma;
#endif

#if defined(__AVX512BF16__)
// At least n values that live as long as the thread, for the buffers a chunk's call packs into
// and a tile works in: allocated and zeroed each call they cost a 128-token chunk ~5% of its
// time, with page faults on longer ones (session 28). Every value read is written first.
template <typename T>
T* thread_buffer(std::vector<T>& buffer, int64_t n) {
    if (static_cast<int64_t>(buffer.size()) < n) buffer.resize(n);
    return buffer.data();
}

// keys [context, head_dim] of one KV head -> [context / 64][head_dim / 2][64][2]; values ->
// [head_dim / 64][context / 2][64][2] (pairs of keys side by side for each dimension). Rows past
// the context are zero.
void pack_head(const uint16_t* k_head, const uint16_t* v_head, const int64_t* slots,
               const Chunk& c, uint16_t* keys, uint16_t* values) {
    const int64_t hd = c.head_dim, key_blocks = round_up(c.context, kDotCols) / kDotCols;
    for (int64_t b = 0; b < key_blocks; b++)
        for (int64_t j = 0; j < kDotCols; j++) {
            const int64_t t = b * kDotCols + j;
            const uint16_t* row = t < c.context ? k_head + slots[t] * hd : nullptr;
            for (int64_t p = 0; p < hd / 2; p++) {
                uint16_t* out = keys + ((b * (hd / 2) + p) * kDotCols + j) * 2;
                out[0] = row != nullptr ? row[2 * p] : 0;
                out[1] = row != nullptr ? row[2 * p + 1] : 0;
            }
        }
    const int64_t pairs = round_up(c.context, 2) / 2;
    for (int64_t p = 0; p < pairs; p++)
        for (int64_t half = 0; half < 2; half++) {
            const int64_t t = 2 * p + half;
            const uint16_t* row = t < c.context ? v_head + slots[t] * hd : nullptr;
            for (int64_t d = 0; d < hd; d++)
                values[(((d / kDotCols) * pairs + p) * kDotCols + d % kDotCols) * 2 + half] =
                    row != nullptr ? row[d] : 0;
        }
}

// Query rows t0 .. t0 + rows - 1 of query head `head`, against its KV head's packed keys and
// values. scores: [kDotRows][context rounded up to 64] floats; probs: [kDotRows][context
// rounded up to 16] bf16.
void attend_tile(const uint16_t* q, const uint16_t* keys, const uint16_t* values, int64_t head,
                 int64_t t0, int rows, const Chunk& c, float* scores, uint16_t* probs,
                 uint16_t* out) {
    const int64_t hd = c.head_dim, width = round_up(c.context, kDotCols);
    const int64_t p_width = round_up(c.context, 16), pairs = round_up(c.context, 2) / 2;
    const int64_t visible = c.offset + t0 + rows;  // keys the tile's last row sees
    const uint16_t* qt = q + t0 * c.q_row_stride + head * c.q_head_stride;
    float sums[kDotRows][kDotCols];
    for (int64_t b = 0; b * kDotCols < visible; b++) {  // scores' sums, key block by key block
        loragate::dot_rows(rows, qt, c.q_row_stride, hd, keys + b * (hd / 2) * 2 * kDotCols, sums);
        for (int m = 0; m < rows; m++)
            std::memcpy(scores + m * width + b * kDotCols, sums[m], sizeof sums[m]);
    }
    const int64_t used = round_up(visible, 2);  // keys the values pass reads: pairs
    for (int m = 0; m < rows; m++)  // softmax over what row m sees, zeros after
        loragate::softmax_row_bf16(scores + m * width, c.offset + t0 + m + 1, used, c.scale,
                                   probs + m * p_width);
    for (int64_t db = 0; db < hd / kDotCols; db++) {  // values, 64 dimensions at a time
        loragate::dot_rows(rows, probs, p_width, used, values + db * pairs * 2 * kDotCols, sums);
        for (int m = 0; m < rows; m++) {
            uint16_t* o = out + ((t0 + m) * c.num_heads + head) * hd + db * kDotCols;
            for (int j = 0; j < 4; j++)
                _mm256_storeu_si256(reinterpret_cast<__m256i*>(o + 16 * j),
                                    (__m256i)_mm512_cvtneps_pbh(_mm512_loadu_ps(sums[m] + 16 * j)));
        }
    }
}
#endif


#if LORAGATE_AMX
// The AMX path (prefill_amx.h): KV heads packed, then items of 32 queries of a head. A
// thread's worker holds its buffers and configures the tiles for as long as it lives.
template <int64_t HD>
class AmxWorker {
    using Amx = loragate::AmxPrefill<HD>;

   public:
    AmxWorker(const uint16_t* q, const uint16_t* keys, const uint16_t* values, const Chunk& c,
              uint16_t* out)
        : q_(q), keys_(keys), values_(values), c_(c), out_(out),
          head_values_(loragate::amx_padded_context(c.context) * HD),
          // uninitialised (new T[n], not a vector): every value is written before it is read
          scores_(new float[Amx::kRows * loragate::amx_padded_context(c.context)]),
          sums_(new float[Amx::kRows * HD]),
          probs_(new uint16_t[Amx::kRows * loragate::amx_padded_context(c.context)]),
          queries_(new uint16_t[Amx::kRows * HD]) {
        Amx::begin();
    }
    ~AmxWorker() { Amx::end(); }
    AmxWorker(const AmxWorker&) = delete;
    AmxWorker& operator=(const AmxWorker&) = delete;

    void operator()(int64_t head, int64_t kv, int64_t t0, int rows) const {
        const typename Amx::Scratch scratch{scores_.get(), probs_.get(), sums_.get(),
                                            queries_.get()};
        Amx::tile(q_, c_.q_row_stride, c_.q_head_stride, keys_ + kv * head_values_,
                  values_ + kv * head_values_, head, t0, rows, c_.offset, c_.context,
                  c_.num_heads, c_.scale, scratch, out_);
    }

   private:
    const uint16_t *q_, *keys_, *values_;
    const Chunk& c_;
    uint16_t* out_;
    int64_t head_values_;
    std::unique_ptr<float[]> scores_, sums_;
    std::unique_ptr<uint16_t[]> probs_, queries_;
};

template <int64_t HD>
void prefill_amx(const uint16_t* q, const uint16_t* k_cache, const uint16_t* v_cache,
                 const int64_t* slots, const Chunk& c, uint16_t* out, int threads) {
    const int64_t head_values = loragate::amx_padded_context(c.context) * HD;
    const std::unique_ptr<uint16_t[]> keys(new uint16_t[c.kv_heads * head_values]);
    const std::unique_ptr<uint16_t[]> values(new uint16_t[c.kv_heads * head_values]);
    each_item(
        c, loragate::AmxPrefill<HD>::kRows, threads,
        [&](int64_t h) {
            loragate::AmxPrefill<HD>::pack(k_cache + h * c.num_slots * HD,
                                           v_cache + h * c.num_slots * HD, slots, c.context,
                                           keys.get() + h * head_values,
                                           values.get() + h * head_values);
        },
        [&] { return AmxWorker<HD>(q, keys.get(), values.get(), c, out); });
}
#endif

// Every prefill chunk of a step in one call: segment i is rows table[4 i] .. + table[4 i + 1]
// of q and out (out contiguous [tokens, num_heads, head_dim]), `table[4 i + 2]` tokens of its
// sequence before it, its keys' slots from slots + table[4 i + 3]. The same computation as a
// call per chunk; why: from Python each call cost its checks, a slot copy, an output tensor and
// its copy into the step's, ~0.1 ms against a 128-token chunk's ~0.1 ms of work (session 28).
template <typename T, typename One>
void prefill_many(const T* q, int64_t q_row_stride, int64_t q_head_stride, const T* k_cache,
                  const T* v_cache, int64_t num_slots, const int64_t* table, int64_t segments,
                  const int64_t* slots, T* out, int64_t num_heads, int64_t kv_heads,
                  int64_t head_dim, float scale, int threads, One one) {
    for (int64_t i = 0; i < segments; i++) {
        const int64_t* seg = table + 4 * i;
        one(q + seg[0] * q_row_stride, q_row_stride, q_head_stride, k_cache, v_cache, num_slots,
            slots + seg[3], seg[1], seg[2], out + seg[0] * num_heads * head_dim, num_heads,
            kv_heads, head_dim, scale, threads);
    }
}

}  // namespace

extern "C" {

// 1 where the bf16 entry computes: AVX512-BF16 (head_dim a multiple of 64), or AVX2 + FMA
// (a multiple of 16).
int prefill_available() {
#if defined(__AVX512BF16__) || LORAGATE_FMA
    return 1;
#else
    return 0;
#endif
}

// 1 where the float32 entry computes: AVX2 + FMA.
int prefill_f32_available() { return LORAGATE_FMA; }

// The multiple of head_dim the bf16 entry takes.
int prefill_head_dim_multiple() {
#if defined(__AVX512BF16__)
    return 64;
#else
    return 16;
#endif
}

// q [query_len, num_heads, head_dim] (rows q_row_stride apart, heads q_head_stride apart, unit
// stride within a head); k_cache, v_cache [kv_heads, num_slots, head_dim] contiguous; slots
// [context] the cache slot of each key, context = offset + query_len (this chunk's K/V already
// written); out [query_len, num_heads, head_dim] contiguous. head_dim a multiple of
// prefill_head_dim_multiple().
void prefill_attention_bf16(const uint16_t* q, int64_t q_row_stride, int64_t q_head_stride,
                            const uint16_t* k_cache, const uint16_t* v_cache, int64_t num_slots,
                            const int64_t* slots, int64_t query_len, int64_t offset,
                            uint16_t* out, int64_t num_heads, int64_t kv_heads, int64_t head_dim,
                            float scale, int threads) {
    const Chunk c{query_len, offset, offset + query_len, num_heads, kv_heads, head_dim,
                  q_row_stride, q_head_stride, num_slots, scale};
#if LORAGATE_AMX
    if (loragate::amx_permitted()) {
        if (head_dim == 64) return prefill_amx<64>(q, k_cache, v_cache, slots, c, out, threads);
        if (head_dim == 128) return prefill_amx<128>(q, k_cache, v_cache, slots, c, out, threads);
    }
#endif
#if defined(__AVX512BF16__)
    const int64_t key_values = round_up(c.context, kDotCols) * head_dim;
    const int64_t value_values = round_up(c.context, 2) * head_dim;
    static thread_local std::vector<uint16_t> key_buffer, value_buffer;
    uint16_t* keys = thread_buffer(key_buffer, kv_heads * key_values);
    uint16_t* values = thread_buffer(value_buffer, kv_heads * value_values);
    each_item(
        c, kDotRows, threads,
        [&](int64_t h) {
            pack_head(k_cache + h * num_slots * head_dim, v_cache + h * num_slots * head_dim,
                      slots, c, keys + h * key_values, values + h * value_values);
        },
        [&] {
            static thread_local std::vector<float> score_buffer;
            static thread_local std::vector<uint16_t> prob_buffer;
            float* scores = thread_buffer(score_buffer, kDotRows * round_up(c.context, kDotCols));
            uint16_t* probs = thread_buffer(prob_buffer, kDotRows * round_up(c.context, 16));
            return [&, scores, probs](int64_t head, int64_t kv, int64_t t0, int rows) {
                attend_tile(q, keys + kv * key_values, values + kv * value_values, head, t0, rows,
                            c, scores, probs, out);
            };
        });
#elif LORAGATE_FMA
    using loragate::BFloat16;
    prefill_fma(reinterpret_cast<const BFloat16*>(q), reinterpret_cast<const BFloat16*>(k_cache),
                reinterpret_cast<const BFloat16*>(v_cache), slots, c,
                reinterpret_cast<BFloat16*>(out), threads);
#else
    (void)c, (void)k_cache, (void)v_cache, (void)slots, (void)out, (void)threads;
#endif
}

// Every prefill chunk of a step in one call (prefill_many).
void prefill_attention_many_bf16(const uint16_t* q, int64_t q_row_stride, int64_t q_head_stride,
                                 const uint16_t* k_cache, const uint16_t* v_cache,
                                 int64_t num_slots, const int64_t* table, int64_t segments,
                                 const int64_t* slots, uint16_t* out, int64_t num_heads,
                                 int64_t kv_heads, int64_t head_dim, float scale, int threads) {
    prefill_many(q, q_row_stride, q_head_stride, k_cache, v_cache, num_slots, table, segments,
                 slots, out, num_heads, kv_heads, head_dim, scale, threads,
                 prefill_attention_bf16);
}

// The float32 form (AVX2 + FMA), head_dim a multiple of 16.
void prefill_attention_f32(const float* q, int64_t q_row_stride, int64_t q_head_stride,
                           const float* k_cache, const float* v_cache, int64_t num_slots,
                           const int64_t* slots, int64_t query_len, int64_t offset, float* out,
                           int64_t num_heads, int64_t kv_heads, int64_t head_dim, float scale,
                           int threads) {
    const Chunk c{query_len, offset, offset + query_len, num_heads, kv_heads, head_dim,
                  q_row_stride, q_head_stride, num_slots, scale};
#if LORAGATE_FMA
    prefill_fma(q, k_cache, v_cache, slots, c, out, threads);
#else
    (void)q, (void)c, (void)k_cache, (void)v_cache, (void)slots, (void)out, (void)threads;
#endif
}

void prefill_attention_many_f32(const float* q, int64_t q_row_stride, int64_t q_head_stride,
                                const float* k_cache, const float* v_cache, int64_t num_slots,
                                const int64_t* table, int64_t segments, const int64_t* slots,
                                float* out, int64_t num_heads, int64_t kv_heads, int64_t head_dim,
                                float scale, int threads) {
    prefill_many(q, q_row_stride, q_head_stride, k_cache, v_cache, num_slots, table, segments,
                 slots, out, num_heads, kv_heads, head_dim, scale, threads,
                 prefill_attention_f32);
}

}  // extern "C"
