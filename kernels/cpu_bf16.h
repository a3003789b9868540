// bfloat16 <-> float for the hand-written CPU kernels (kernels/cpu_*.cpp): the conversions
// PyTorch makes, written as plain integer operations so loops over them vectorise.
#pragma once

#include <cstdint>
#include <cstring>

namespace loragate {

struct BFloat16 {
    uint16_t bits;
};

inline float to_float(float v) { return v; }
inline float to_float(BFloat16 v) {
    uint32_t u = static_cast<uint32_t>(v.bits) << 16;
    float f;
    std::memcpy(&f, &u, sizeof f);
    return f;
}

// Round to nearest even, as PyTorch converts; a NaN stays a (quiet) NaN.
template <typename T> T from_float(float v);
template <> inline float from_float<float>(float v) { return v; }
template <> inline BFloat16 from_float<BFloat16>(float v) {
    uint32_t u;
    std::memcpy(&u, &v, sizeof u);
    if ((u & 0x7fffffffu) > 0x7f800000u) return {static_cast<uint16_t>((u >> 16) | 0x40u)};
    u += 0x7fffu + ((u >> 16) & 1u);
    return {static_cast<uint16_t>(u >> 16)};
}

// v as T would hold it, back in a float: what a PyTorch op with a T output hands the next op.
template <typename T> inline float round_to(float v) { return to_float(from_float<T>(v)); }

}  // namespace loragate
