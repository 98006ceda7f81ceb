// The one sequential colour scale of every attention view (PNG, HTML matrix, thumbnails).
// Not configurable on purpose: the same weight looks the same everywhere.
#pragma once
#include <cstdint>

namespace attn::viz {

// ColorBrewer "Blues", light (weight 0) to dark (weight vmax), sRGB stops at evenly spaced positions;
// colours between stops are linear in sRGB. Dark cells stay readable on white paper and in greyscale.
inline constexpr uint8_t kColourStops[9][3] = {
    {247, 251, 255}, {222, 235, 247}, {198, 219, 239}, {158, 202, 225}, {107, 174, 214},
    {66, 146, 198},  {33, 113, 181},  {8, 81, 156},    {8, 48, 107}};
inline constexpr int kNumStops = 9;

}  // namespace attn::viz
