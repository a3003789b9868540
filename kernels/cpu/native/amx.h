// AMX for the hand-written kernels (kernels/cpu/native/matmul.cpp, kernels/cpu/native/attention.cpp): whether
// the build has it, the tile configuration's layout, and the process's permission to use it.
#pragma once

#if defined(__AVX512BF16__) && defined(__AMX_TILE__) && defined(__AMX_BF16__)
#define LORAGATE_AMX 1
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cstdint>
#else
#define LORAGATE_AMX 0
#endif

#if LORAGATE_AMX
namespace loragate {

// ldtilecfg's 64-byte operand, palette 1: each tile's rows and bytes a row (0: unused).
struct TileConfig {
    uint8_t palette = 1;
    uint8_t start_row = 0;
    uint8_t reserved[14] = {};
    uint16_t colsb[16] = {};
    uint8_t rows[16] = {};

    void set(int tile, int tile_rows, int bytes_a_row) {
        rows[tile] = static_cast<uint8_t>(tile_rows);
        colsb[tile] = static_cast<uint16_t>(bytes_a_row);
    }
};

// ldtilecfg from `config`. The empty asm with a memory clobber first: GCC 12 does not count the
// builtin as reading the whole struct. A variant of amx_matmul (session 20: its items run by
// hand instead of `omp for`) had the stores of tiles 0-3's widths dropped as dead, so
// ldtilecfg met rows without bytes and faulted (#GP) on every thread.
inline void load_tiles(const TileConfig& config) {
    asm volatile("" : : "r"(&config) : "memory");
    _tile_loadconfig(&config);
}

// Linux hands a process AMX's tile state only when asked (arch_prctl ARCH_REQ_XCOMP_PERM for
// XFEATURE_XTILEDATA); asked once, for the whole process. False: the kernel refused (an old
// kernel, a hypervisor without it) and the callers keep their other loops.
inline bool amx_permitted() {
    constexpr long kArchReqXcompPerm = 0x1023;
    constexpr long kXfeatureXtiledata = 18;
    static const bool permitted =
        syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0;
    return permitted;
}

}  // namespace loragate
#endif
