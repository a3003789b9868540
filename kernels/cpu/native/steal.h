// Work items split between an OpenMP team in consecutive runs, with stealing: thread t owns the
// run [t * items / team, (t + 1) * items / team) and takes it from the front, one item at a
// time; a thread whose run is empty takes items from the back of the others' runs. Why: a
// static split leaves a thread waiting at the region's end whenever the other one ran slower
// (a vCPU descheduled, a busier memory stream, the main thread late from Python), and a
// region ends every projection; an owner still knows the item it takes next (so it can ask
// for that item's memory ahead), which a shared counter would not tell it.
//
// Which thread computes an item never changes what the item computes: results stay the same.
#pragma once

#include <atomic>
#include <cstdint>
#include <vector>

namespace loragate {

class StealRuns {
   public:
    StealRuns(int64_t items, int64_t team) : runs_(static_cast<size_t>(team)), team_(team) {
        for (int64_t t = 0; t < team; t++)
            bounds(t).store(pack(first(t, items, team), first(t + 1, items, team)),
                            std::memory_order_relaxed);
    }

    // The first item of thread t's run as dealt (thread t's run ends where t + 1's begins).
    static int64_t first(int64_t t, int64_t items, int64_t team) { return t * items / team; }

    // The next item of thread t's own run, or -1 when it is empty (taken or stolen).
    int64_t take_own(int64_t t) {
        std::atomic<uint64_t>& b = bounds(t);
        uint64_t cur = b.load(std::memory_order_relaxed);
        for (;;) {
            const int64_t lo = low(cur), hi = high(cur);
            if (lo >= hi) return -1;
            if (b.compare_exchange_weak(cur, pack(lo + 1, hi), std::memory_order_relaxed))
                return lo;
        }
    }

    // Whether the item after `item` in thread t's run is still there to take (a hint only: it
    // may be stolen before t gets to it).
    bool owns_next(int64_t t, int64_t item) const {
        return item + 1 < high(bounds(t).load(std::memory_order_relaxed));
    }

    // The last item of another thread's run (the fullest first), or -1 when every run is empty.
    int64_t steal(int64_t t) {
        for (;;) {
            int64_t victim = -1, most = 0;
            for (int64_t v = 0; v < team_; v++) {
                if (v == t) continue;
                const uint64_t cur = bounds(v).load(std::memory_order_relaxed);
                if (high(cur) - low(cur) > most) most = high(cur) - low(cur), victim = v;
            }
            if (victim < 0) return -1;
            std::atomic<uint64_t>& b = bounds(victim);
            uint64_t cur = b.load(std::memory_order_relaxed);
            const int64_t lo = low(cur), hi = high(cur);
            if (lo < hi &&
                b.compare_exchange_strong(cur, pack(lo, hi - 1), std::memory_order_relaxed))
                return hi - 1;
        }
    }

   private:
    // One cache line a run, so the owners' front takes do not contend.
    struct alignas(64) Run {
        std::atomic<uint64_t> bounds{0};
    };

    std::atomic<uint64_t>& bounds(int64_t t) { return runs_[static_cast<size_t>(t)].bounds; }
    const std::atomic<uint64_t>& bounds(int64_t t) const {
        return runs_[static_cast<size_t>(t)].bounds;
    }

    static uint64_t pack(int64_t lo, int64_t hi) {
        return static_cast<uint64_t>(lo) << 32 | static_cast<uint64_t>(hi);
    }
    static int64_t low(uint64_t v) { return static_cast<int64_t>(v >> 32); }
    static int64_t high(uint64_t v) { return static_cast<int64_t>(v & 0xffffffffu); }

    std::vector<Run> runs_;
    int64_t team_;
};

}  // namespace loragate
