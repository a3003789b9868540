// A prefill chunk's shape and the schedule every path of kernels/cpu/native/prefill.cpp runs it by
// (AVX512-BF16, AMX in prefill_amx.h's tiles, the FMA path in prefill_fma.h).
#pragma once

#include <algorithm>
#include <cstdint>

#include <omp.h>

namespace loragate {

struct Chunk {
    int64_t query_len, offset, context, num_heads, kv_heads, head_dim;
    int64_t q_row_stride, q_head_stride, num_slots;
    float scale;
};

[[maybe_unused]] inline int64_t round_up(int64_t n, int64_t m) { return (n + m - 1) / m * m; }

// Every path's schedule: each KV head packed (pack(h), split between the threads), then every
// item, a tile of up to `tile_rows` queries of one head, by attend(head, kv, t0, rows) of this
// thread's worker (make_worker(): its buffers, and AMX's tile state). The last tiles see the
// most keys: dealt first, so the threads finish together.
template <typename Pack, typename MakeWorker>
inline void each_item(const Chunk& c, int64_t tile_rows, int threads, const Pack& pack,
                      const MakeWorker& make_worker) {
    const int64_t group = c.num_heads / c.kv_heads;
    const int64_t tiles = (c.query_len + tile_rows - 1) / tile_rows;
#pragma omp parallel num_threads(threads)
    {
#pragma omp for schedule(static)
        for (int64_t h = 0; h < c.kv_heads; h++) pack(h);
        auto attend = make_worker();
#pragma omp for schedule(dynamic, 1)
        for (int64_t item = 0; item < c.num_heads * tiles; item++) {
            const int64_t tile = tiles - 1 - item / c.num_heads, head = item % c.num_heads;
            const int64_t t0 = tile * tile_rows;
            attend(head, head / group, t0,
                   static_cast<int>(std::min<int64_t>(tile_rows, c.query_len - t0)));
        }
    }
}

}  // namespace loragate
