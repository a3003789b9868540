// A step's decoder layers in one call: kernels/cpu/decoder.py builds it and
// engine/step/native_decoder.py hands it the model and the step (decode rows, and prefill chunks
// after them where the step has some: see Step).
//
// Why: a decode step of the small model makes ~100 kernel calls (four matmuls, two norms, RoPE
// with the cache write and attention per layer), and from Python each costs its dispatch, its
// checks, an output allocation and a ctypes call with a dozen arguments. With 64 rows that was
// ~15% of a step's wall time on the main thread while the other threads waited for the next
// kernel (bench/history/RESULTS-2026-11.md, session 16). Here the same kernels run in the same order over
// buffers the caller allocated, so the values are the eager native path's, bit for bit.
//
// The kernels are the other libraries' extern "C" entries, reached through the function
// pointers in `Entries` (the caller reads them from the libraries it already loaded), so each
// keeps one build and one copy of its code. Per layer, as engine/models/llama.py runs it:
//
//     normed   = add_rms_norm(hidden, residual += hidden)      layer 0: norm(residual), no add
//     qkv      = normed W_qkv^T (+ b)
//     q, k     = rope(q, k); k, v -> the paged cache at each row's slot
//     attn     = paged decode attention of q over the row's blocks
//     hidden   = attn W_o^T (+ b)
//     normed   = add_rms_norm(hidden, residual += hidden)
//     act      = round(round(silu(gate)) * up) of normed W_gate_up^T (the fused pass)
//     hidden   = act W_down^T (+ b)
//
// and after the last layer out = add_rms_norm(hidden, residual += hidden) with the final norm.
// In an adapter step each projection then adds its rows' deltas by the LoRA runs kernel
// (kernels/cpu/native/lora_runs.h, as lora_add_cpu does eager) where some row's adapter targets it;
// the gate/up projection's before its SiLU, so there the matmul, its outputs put back in
// [gate | up] order, the delta and silu_mul run as four steps, as the eager path runs them.
//
// There each targeted projection's matmul also asks for the adapter stacks its LoRA runs
// read next (a few hundred KB a distinct adapter: see lora_spans), a line at a time as its
// tiles compute (dot_tile.h's SpanStream). Why: with many adapters in a step the runs
// wait on memory (34 rows of 34 rank-16 adapters: 177 MB of stacks, ~8 ms from memory against
// ~3 from cache) while the matmuls before them leave memory half idle. Measured (session 19,
// bench/RESULTS.md): such a decode step 1.5-2.6 ms faster in three runs of four.

#include <cstdint>
#include <cstring>
#include <vector>

#include "dot_tile.h"

namespace {

using loragate::Span;

using Matmul = void (*)(const void* x, int64_t rows, int64_t x_stride, int64_t k,
                        const void* packed, const void* bias, int64_t n, void* y,
                        int64_t y_stride, int threads);
using MatmulSpans = void (*)(const void* x, int64_t rows, int64_t x_stride, int64_t k,
                             const void* packed, const void* bias, int64_t n, void* y,
                             int64_t y_stride, int threads, const Span* spans,
                             int64_t num_spans);
using AddRmsNorm = void (*)(const void* x, int64_t x_stride, void* residual,
                            int64_t residual_stride, int64_t add, const void* weight, void* out,
                            int64_t out_stride, int64_t rows, int64_t dim, float eps,
                            int64_t threads);
using RopeKv = int64_t (*)(void* q, int64_t q_stride, void* k, int64_t k_stride, const void* v,
                           int64_t v_stride, const float* cos_table, const float* sin_table,
                           const int64_t* positions, int64_t num_positions, int64_t tokens,
                           int64_t num_heads, int64_t kv_heads, int64_t head_dim, void* k_cache,
                           void* v_cache, int64_t num_slots, const int64_t* slots,
                           int64_t threads);
using PagedDecode = void (*)(const void* q, int64_t q_row_stride, int64_t q_head_stride,
                             const void* k_cache, const void* v_cache, int64_t num_slots,
                             const int64_t* tables, int64_t table_stride,
                             const int64_t* lengths, void* out, int64_t rows, int64_t num_heads,
                             int64_t kv_heads, int64_t head_dim, int64_t block_size,
                             float scale, int64_t threads);

using PrefillMany = void (*)(const void* q, int64_t q_row_stride, int64_t q_head_stride,
                             const void* k_cache, const void* v_cache, int64_t num_slots,
                             const int64_t* table, int64_t segments, const int64_t* slots,
                             void* out, int64_t num_heads, int64_t kv_heads, int64_t head_dim,
                             float scale, int threads);

using SiluMul = void (*)(const void* gate_up, int64_t stride, void* out, int64_t out_stride,
                         int64_t rows, int64_t width, int64_t threads);
using LoraRuns = void (*)(const void* x, int64_t x_stride, void* out, int64_t out_stride,
                          const int64_t* segs, int64_t num_segs, const void* lora_a,
                          int64_t in_features, const void* lora_b, int64_t out_features,
                          const int32_t* slot_ranks, const int64_t* subs, int64_t n, int64_t rank,
                          int64_t threads);

constexpr int64_t kGateUpGroup = 32;  // kernels/cpu/matmul.py's GATE_UP_GROUP

}  // namespace

extern "C" {

// Field order and types mirror kernels/cpu/decoder.py's ctypes structures.
struct Entries {
    Matmul matmul;
    Matmul matmul_silu;
    AddRmsNorm add_rms_norm;
    RopeKv rope_kv;
    PagedDecode paged_decode;
    SiluMul silu_mul;
    LoraRuns lora_runs;  // null: no adapter step runs here
    // The matmul that also asks for memory as it computes (kernels/cpu/native/matmul.cpp's
    // matmul_spans_bf16); null: `matmul` alone, nothing asked for
    MatmulSpans matmul_spans;
    // Every prefill chunk's attention in one call (kernels/cpu/native/prefill.cpp's
    // prefill_attention_many); null: no step with prefill chunks runs here
    PrefillMany prefill_many;
};

// One projection's adapter slot stacks (lora/layers.py): a [slots, n * rank, in_features],
// b_rows [slots, n * rank, out_features], the n sub-projections' (offset, width) in `subs`.
struct Lora {
    const void* a;  // null: the projection has no adapter wrapper
    int64_t in_features;
    const void* b_rows;
    int64_t out_features;
    const int64_t* subs;
    int64_t n;
};

struct Linear {
    const void* packed;  // the matmul kernel's layout
    const void* bias;    // [n] or null
    int64_t n, k;
};

struct Layer {
    const void* input_norm;  // [hidden]
    const void* post_norm;   // [hidden]
    Linear qkv, o, gate_up, down;  // gate_up: interleaved for the fused SiLU, n = 2 * intermediate
    void* k_cache;                 // [kv_heads, num_slots, head_dim]
    void* v_cache;
    Lora lora[4];  // qkv, o, gate_up, down
};

struct Model {
    Entries entries;
    const Layer* layers;
    int64_t num_layers;
    const void* final_norm;  // [hidden]
    const float* cos_table;  // [num_positions, head_dim] float32
    const float* sin_table;
    int64_t num_positions;
    int64_t hidden, num_heads, kv_heads, head_dim, intermediate;
    int64_t num_slots, block_size;
    float eps, scale;
    int64_t element_size;  // bytes per value of the activations (2: bf16, 4: float32)
};

// One step's rows and buffers, each [rows, width] contiguous in the model's dtype.
struct Step {
    int64_t rows;
    const int64_t* positions;  // [rows]
    const int64_t* slots;      // [rows]: where each row's K/V goes
    const int64_t* tables;     // [rows, table_stride]: block tables
    int64_t table_stride;
    const int64_t* lengths;  // [rows]: context lengths, this token included
    void* residual;          // [rows, hidden]: the embeddings in, the residual stream after
    void* hidden;            // [rows, hidden]
    void* normed;            // [rows, hidden]
    void* qkv;               // [rows, q + 2 kv]
    void* attn;              // [rows, q]
    void* act;               // [rows, intermediate]
    void* out;               // [rows, hidden]: the final norm's output
    // An adapter step (lora_on null: none): the rows' runs of one slot, (start, end, slot)
    // each; each slot's rank times n for stacks of n sub-projections (slot_ranks[n - 1]); the
    // stacks' rank; which projections of which layer some row's adapter targets
    // ([layers][4]); the gate/up projection's outputs where it adds a delta before its SiLU.
    const int64_t* segments;
    int64_t num_segments;
    const int32_t* slot_ranks[3];
    int64_t rank;
    const uint8_t* lora_on;
    void* gate_up_mixed;  // [rows, 2 intermediate]: the interleaved matmul output
    void* gate_up;        // [rows, 2 intermediate]: [gate | up], the delta added
    // A step with prefill chunks (num_chunks 0: every row decodes): rows [0, decodes) decode
    // (`tables` and `lengths` are theirs alone), the chunks' rows follow, described as
    // prefill_attention_many takes them (per chunk: first row, rows, tokens before it, where
    // its key slots start in chunk_slots).
    int64_t decodes;
    const int64_t* chunks;  // [num_chunks, 4]
    int64_t num_chunks;
    const int64_t* chunk_slots;
    // The rows the last layer keeps after its attention (engine/models/llama.py's KeptRows:
    // the sampling rows, increasing); its projections, MLP and the final norm run on them
    // alone and `out` holds them first. Null: every row.
    const int64_t* kept;
    int64_t num_kept;
};

namespace {

// Whether some row's adapter targets projection `p` of layer `l` this step.
bool targeted(const Step& s, const Layer& layer, int64_t l, int p) {
    return s.lora_on != nullptr && layer.lora[p].a != nullptr && s.lora_on[4 * l + p];
}

// out += the adapters' delta of projection `p` of layer `l` for x's rows, where `targeted`
// (the eager path's LoRALinear, through lora_add_cpu's tiled runs).
void add_lora(const Model& m, const Step& s, const Layer& layer, int64_t l, int p, const void* x,
              int64_t x_stride, void* out, int64_t out_stride, int64_t threads) {
    if (!targeted(s, layer, l, p)) return;
    const Lora& lora = layer.lora[p];
    m.entries.lora_runs(x, x_stride, out, out_stride, s.segments, s.num_segments, lora.a,
                        lora.in_features, lora.b_rows, lora.out_features,
                        s.slot_ranks[lora.n - 1], lora.subs, lora.n, s.rank, threads);
}

// [rows, 2 width] outputs of the interleaved gate/up weight (gate 0..31, up 0..31, gate
// 32..63, ...) back in [gate | up] order (kernels/cpu/matmul.py's deinterleave_outputs).
void deinterleave(const char* mixed, char* out, int64_t rows, int64_t width, int64_t size) {
    const int64_t group = kGateUpGroup * size;
    for (int64_t r = 0; r < rows; r++) {
        const char* in = mixed + r * 2 * width * size;
        char* row = out + r * 2 * width * size;
        for (int64_t g = 0; g < width / kGateUpGroup; g++) {
            std::memcpy(row + g * group, in + 2 * g * group, group);
            std::memcpy(row + width * size + g * group, in + (2 * g + 1) * group, group);
        }
    }
}

// What the LoRA runs kernel reads for projection `p` of layer `l` this step (where
// `targeted`): each distinct slot's A rows, then its B rows' sub-projection columns.
void lora_spans(const Model& m, const Step& s, const Layer& layer, int64_t l, int p,
                std::vector<Span>& out) {
    out.clear();
    if (!targeted(s, layer, l, p)) return;
    const Lora& lora = layer.lora[p];
    const int64_t es = m.element_size, n = lora.n;
    const int32_t* ranks = s.slot_ranks[n - 1];
    const auto push = [&](const char* begin, int64_t bytes) {
        const char* first = reinterpret_cast<const char*>(reinterpret_cast<uintptr_t>(begin) &
                                                          ~uintptr_t{63});
        out.push_back({first, (begin + bytes - first + 63) / 64});
    };
    int64_t last = -1;  // the rows come sorted by slot: a slot's runs are adjacent
    for (int64_t g = 0; g < s.num_segments; g++) {
        const int64_t slot = s.segments[3 * g + 2];
        if (slot < 0 || slot == last) continue;
        last = slot;
        const int64_t r = ranks[slot] / n;
        if (r <= 0) continue;
        const int64_t first_row = slot * n * s.rank;
        push(static_cast<const char*>(lora.a) + first_row * lora.in_features * es,
             n * r * lora.in_features * es);
        for (int64_t i = 0; i < n; i++)
            for (int64_t k = 0; k < r; k++)
                push(static_cast<const char*>(lora.b_rows) +
                         ((first_row + i * r + k) * lora.out_features + lora.subs[2 * i]) * es,
                     lora.subs[2 * i + 1] * es);
    }
}

// y = x W^T (+ b) for projection `p` of layer `l`, asking for the stacks its LoRA runs read
// right after (lora_spans) while it computes, where the step has some and the entry is there.
void project(const Model& m, const Step& s, const Layer& layer, int64_t l, int p,
             const Linear& w, int64_t rows, const void* x, int64_t x_stride, void* y,
             int64_t y_stride, int64_t threads, std::vector<Span>& spans) {
    const Entries& e = m.entries;
    lora_spans(m, s, layer, l, p, spans);
    if (e.matmul_spans != nullptr && !spans.empty()) {
        e.matmul_spans(x, rows, x_stride, w.k, w.packed, w.bias, w.n, y, y_stride,
                       int(threads), spans.data(), static_cast<int64_t>(spans.size()));
        return;
    }
    e.matmul(x, rows, x_stride, w.k, w.packed, w.bias, w.n, y, y_stride, int(threads));
}

// Rows kept[0..n) of x [rows, width] moved to rows 0..n, in place (kept increasing, so a row
// is read before anything is written over it).
void keep_rows(char* x, int64_t width_bytes, const int64_t* kept, int64_t n) {
    for (int64_t i = 0; i < n; i++)
        if (kept[i] != i) std::memcpy(x + i * width_bytes, x + kept[i] * width_bytes, width_bytes);
}

}  // namespace

// Runs every layer and the final norm; returns rope_kv's count of rows whose position or slot
// was out of range, having stopped at that layer (the caller raises).
int64_t decoder_forward(const Model* m, const Step* s, int64_t threads) {
    const Entries& e = m->entries;
    const int64_t hidden = m->hidden, hd = m->head_dim;
    int64_t rows = s->rows;  // the kept rows' count once the last layer has attended
    const int64_t decodes = s->num_chunks > 0 ? s->decodes : rows;
    const int64_t q_size = m->num_heads * hd, kv_size = m->kv_heads * hd;
    const int64_t qkv_width = q_size + 2 * kv_size;
    char* qkv = static_cast<char*>(s->qkv);
    int64_t bad = 0;
    std::vector<Span> spans;  // lora_spans' list, reused
    for (int64_t l = 0; l < m->num_layers; l++) {
        const Layer& layer = m->layers[l];
        // layer 0 normalises the embeddings themselves (eager adds a zero hidden: exact)
        e.add_rms_norm(l == 0 ? s->residual : s->hidden, hidden, s->residual, hidden, l > 0,
                       layer.input_norm, s->normed, hidden, rows, hidden, m->eps, threads);
        project(*m, *s, layer, l, 0, layer.qkv, rows, s->normed, hidden, qkv, qkv_width, threads,
                spans);
        add_lora(*m, *s, layer, l, 0, s->normed, hidden, qkv, qkv_width, threads);
        void* k = qkv + q_size * m->element_size;
        void* v = qkv + (q_size + kv_size) * m->element_size;
        bad += e.rope_kv(qkv, qkv_width, k, qkv_width, v, qkv_width, m->cos_table, m->sin_table,
                         s->positions, m->num_positions, rows, m->num_heads, m->kv_heads, hd,
                         layer.k_cache, layer.v_cache, m->num_slots, s->slots, threads);
        if (bad) return bad;  // a row's K/V is missing: attention would read stale values
        if (decodes > 0)
            e.paged_decode(qkv, qkv_width, hd, layer.k_cache, layer.v_cache, m->num_slots,
                           s->tables, s->table_stride, s->lengths, s->attn, decodes, m->num_heads,
                           m->kv_heads, hd, m->block_size, m->scale, threads);
        if (s->num_chunks > 0)
            e.prefill_many(qkv, qkv_width, hd, layer.k_cache, layer.v_cache, m->num_slots,
                           s->chunks, s->num_chunks, s->chunk_slots, s->attn, m->num_heads,
                           m->kv_heads, hd, m->scale, int(threads));
        if (l + 1 == m->num_layers && s->kept != nullptr) {  // no later layer reads the others
            keep_rows(static_cast<char*>(s->attn), q_size * m->element_size, s->kept,
                      s->num_kept);
            keep_rows(static_cast<char*>(s->residual), hidden * m->element_size, s->kept,
                      s->num_kept);
            rows = s->num_kept;
            if (rows == 0) return bad;  // every chunk ends inside its prompt: nothing sampled
        }
        project(*m, *s, layer, l, 1, layer.o, rows, s->attn, q_size, s->hidden, hidden, threads,
                spans);
        add_lora(*m, *s, layer, l, 1, s->attn, q_size, s->hidden, hidden, threads);
        e.add_rms_norm(s->hidden, hidden, s->residual, hidden, 1, layer.post_norm, s->normed,
                       hidden, rows, hidden, m->eps, threads);
        const int64_t inter = m->intermediate;
        if (targeted(*s, layer, l, 2)) {
            // a delta comes before the SiLU: the matmul, its outputs in order, the delta, then
            // silu_mul (what the fused pass computes, in two steps)
            project(*m, *s, layer, l, 2, layer.gate_up, rows, s->normed, hidden, s->gate_up_mixed,
                    2 * inter, threads, spans);
            deinterleave(static_cast<const char*>(s->gate_up_mixed),
                         static_cast<char*>(s->gate_up), rows, inter, m->element_size);
            add_lora(*m, *s, layer, l, 2, s->normed, hidden, s->gate_up, 2 * inter, threads);
            e.silu_mul(s->gate_up, 2 * inter, s->act, inter, rows, inter, threads);
        } else {
            e.matmul_silu(s->normed, rows, hidden, hidden, layer.gate_up.packed,
                          layer.gate_up.bias, layer.gate_up.n, s->act, inter, int(threads));
        }
        project(*m, *s, layer, l, 3, layer.down, rows, s->act, inter, s->hidden, hidden, threads,
                spans);
        add_lora(*m, *s, layer, l, 3, s->act, inter, s->hidden, hidden, threads);
    }
    e.add_rms_norm(s->hidden, hidden, s->residual, hidden, 1, m->final_norm, s->out, hidden, rows,
                   hidden, m->eps, threads);
    return bad;
}

}  // extern "C"
