/* The embedding tables' initial values: a block of rows and columns of one table, each value a fixed function of
 * the table's key and the value's place, so any part of a table can be drawn alone, on any thread, in any order.
 *
 * Value (row, col) of a table of `dim` columns is the n-th value of the SplitMix64 stream started at `key`,
 * n = row * dim + col + 1: z = finalise(key + n * GOLDEN). Its top 25 bits, made odd, less 2^24, give an odd integer
 * j in (-2^24, 2^24), exact in a float; the value is (float)j * scale, one correctly rounded product (scale is
 * bound / 2^24 rounded to a float): U(-bound, bound) at 2^24 evenly spaced points. Integer steps and one float
 * product give the same bits on every machine, and the same as ctrkit/models/table_draw.py's torch operations,
 * which draw where this is not built and on a GPU (a test holds them equal).
 *
 * out: rows x cols floats, row r at out + r * stride; its first value is the table's (row0, col0).
 */
#include <stdint.h>

#define GOLDEN 0x9E3779B97F4A7C15ULL

static inline uint64_t finalise(uint64_t z) {
  z ^= z >> 30;
  z *= 0xBF58476D1CE4E5B9ULL;
  z ^= z >> 27;
  z *= 0x94D049BB133111EBULL;
  z ^= z >> 31;
  return z;
}

void ctrkit_draw_uniform_f32(float *out, int64_t rows, int64_t cols, int64_t stride, uint64_t key, int64_t row0,
                             int64_t col0, int64_t dim, float scale) {
#pragma omp parallel for schedule(static) if (rows * cols >= CTRKIT_GRAIN)
  for (int64_t r = 0; r < rows; r++) {
    float *o = out + r * stride;
    const uint64_t first = key + (uint64_t)((row0 + r) * dim + col0 + 1) * GOLDEN;
    for (int64_t c = 0; c < cols; c++) {
      const uint64_t z = finalise(first + (uint64_t)c * GOLDEN);
      const int32_t j = (int32_t)((z >> 39) | 1) - (1 << 24);
      o[c] = (float)j * scale;
    }
  }
}
