/* bfloat16 conversions shared by the kernels (included; ctrkit.native hashes it with the sources). */
#ifndef CTRKIT_BF16_H
#define CTRKIT_BF16_H
#include <stdint.h>
#include <string.h>

static inline float bf16_to_float(uint16_t h) {
  uint32_t u = (uint32_t)h << 16;
  float f;
  memcpy(&f, &u, 4);
  return f;
}

/* round to nearest even, as c10::BFloat16 does (NaN to the quiet NaN 0x7FC0); without a branch, so that loops
   over it vectorize */
static inline uint16_t float_to_bf16(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  const uint16_t rounded = (uint16_t)((u + 0x7FFF + ((u >> 16) & 1)) >> 16);
  return f != f ? (uint16_t)0x7FC0 : rounded;
}

static inline float bf16_round(float x) { return bf16_to_float(float_to_bf16(x)); }
#endif
