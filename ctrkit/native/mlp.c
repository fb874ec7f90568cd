/* A hidden layer's bias and ReLU, forward and backward, for CPU training in float32 (ctrkit/models/mlp.py).
 *
 * ATen's layer makes four passes over its (B, N) output beside the two matrix products: `addmm` first copies the
 * bias into the output, ReLU reads and writes it again, and in backward `threshold_backward` writes the masked
 * gradient, which `sum` reads again for the bias's gradient. Here the matrix product writes the output (no bias),
 * one pass adds the bias and applies ReLU in place, and one backward pass writes the masked gradient and sums it.
 *
 * ReLU is ATen's: y = x < 0 ? 0 : x (NaN stays NaN); its gradient g where y > 0 (a NaN y passes g, as in
 * threshold_backward), else 0. The bias's gradient sums each column in double, in chunks of rows (each thread takes
 * whole rows), then the chunks in order, and rounds once: the result does not depend on the thread count.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "bf16.h"

void ctrkit_bias_relu_f32(float *y, const float *bias, int64_t B, int64_t N) {
#pragma omp parallel for schedule(static) if (B * N >= CTRKIT_GRAIN)
  for (int64_t i = 0; i < B; i++) {
    float *row = y + i * N;
    for (int64_t j = 0; j < N; j++) {
      const float v = row[j] + bias[j];
      row[j] = v < 0.0f ? 0.0f : v;
    }
  }
}

#define ROWS 128 /* rows per chunk of the bias's gradient: partial sums per chunk, then the chunks in order */

#if defined(__GNUC__) && !defined(__clang__)
/* gcc keeps a branch for a comparison that could trap, so the loop is not vectorized; clang does not trap */
__attribute__((optimize("no-trapping-math")))
#endif
static void masked_rows(const float *restrict g, const float *restrict y, float *restrict out,
                        double *restrict sums, int64_t rows, int64_t N) {
  for (int64_t i = 0; i < rows; i++, g += N, y += N, out += N)
    for (int64_t j = 0; j < N; j++) {
      const float gj = g[j], yj = y[j]; /* a select, not a branch: y's signs are random */
      const float v = !(yj <= 0.0f) ? gj : 0.0f; /* y > 0 or NaN */
      out[j] = v;
      sums[j] += (double)v;
    }
}

#if defined(__GNUC__) && !defined(__clang__)
__attribute__((optimize("no-trapping-math")))
#endif
static void masked_rows_in_place(float *restrict g, const float *restrict y, double *restrict sums, int64_t rows,
                                 int64_t N) {
  for (int64_t i = 0; i < rows; i++, g += N, y += N)
    for (int64_t j = 0; j < N; j++) {
      const float v = !(y[j] <= 0.0f) ? g[j] : 0.0f;
      g[j] = v;
      sums[j] += (double)v;
    }
}

/* out == NULL: the masked gradient is written over g (a gradient the caller owns: the chained MLP's), with no buffer
 * of its own to allocate and to read for ownership before writing it; the same values and sums. */
void ctrkit_relu_backward_bias_f32(float *g, const float *y, float *out, float *grad_bias, int64_t B, int64_t N) {
  const int64_t chunks = (B + ROWS - 1) / ROWS;
  double *partial = calloc((size_t)(chunks * N), sizeof(double));
#pragma omp parallel for schedule(static) if (B * N >= CTRKIT_GRAIN)
  for (int64_t c = 0; c < chunks; c++) { /* each thread writes whole rows (its own pages) */
    const int64_t first = c * ROWS, end = first + ROWS < B ? first + ROWS : B;
    if (out)
      masked_rows(g + first * N, y + first * N, out + first * N, partial + c * N, end - first, N);
    else
      masked_rows_in_place(g + first * N, y + first * N, partial + c * N, end - first, N);
  }
  for (int64_t j = 0; j < N; j++) { /* the chunks in order: the same sums whatever the thread count */
    double total = 0.0;
    for (int64_t c = 0; c < chunks; c++) total += partial[c * N + j];
    grad_bias[j] = (float)total;
  }
  free(partial);
}

/* bfloat16 (autocast) versions of the backward pass, for the chained MLP's layers whose products ran in bfloat16:
 * the masked gradient in bfloat16 (the same values as threshold_backward: g where y > 0 or y is NaN, else 0), the
 * bias's gradient summed in float over each chunk of rows, the chunks in double, rounded to bfloat16 (as ATen's
 * bfloat16 sum), returned as float. */
/* y > 0 or NaN, from the bits: not -0.0 or +0.0, and positive or NaN (integer operations, so the loops vectorize) */
static inline uint16_t passes(uint16_t h) {
  return (uint16_t)(((h & 0x7FFF) > 0x7F80) | (((h & 0x8000) == 0) & (h != 0)));
}

/* the chunk's sums in float (128 rows), the chunks' in double */
static void masked_rows_bf16(const uint16_t *restrict g, const uint16_t *restrict y, uint16_t *restrict out,
                             float *restrict sums, int64_t rows, int64_t N) {
  for (int64_t i = 0; i < rows; i++, g += N, y += N, out += N)
    for (int64_t j = 0; j < N; j++) {
      const uint16_t v = passes(y[j]) ? g[j] : (uint16_t)0;
      out[j] = v;
      sums[j] += bf16_to_float(v);
    }
}

static void masked_rows_bf16_in_place(uint16_t *restrict g, const uint16_t *restrict y, float *restrict sums,
                                      int64_t rows, int64_t N) {
  for (int64_t i = 0; i < rows; i++, g += N, y += N)
    for (int64_t j = 0; j < N; j++) {
      const uint16_t v = passes(y[j]) ? g[j] : (uint16_t)0;
      g[j] = v;
      sums[j] += bf16_to_float(v);
    }
}

/* out == NULL: the masked gradient is written over g (a gradient the caller owns) */
void ctrkit_relu_backward_bias_bf16(uint16_t *g, const uint16_t *y, uint16_t *out, float *grad_bias, int64_t B,
                                    int64_t N) {
  const int64_t chunks = (B + ROWS - 1) / ROWS;
  float *partial = calloc((size_t)(chunks * N), sizeof(float));
#pragma omp parallel for schedule(static) if (B * N >= CTRKIT_GRAIN)
  for (int64_t c = 0; c < chunks; c++) {
    const int64_t first = c * ROWS, end = first + ROWS < B ? first + ROWS : B;
    if (out)
      masked_rows_bf16(g + first * N, y + first * N, out + first * N, partial + c * N, end - first, N);
    else
      masked_rows_bf16_in_place(g + first * N, y + first * N, partial + c * N, end - first, N);
  }
  for (int64_t j = 0; j < N; j++) {
    double total = 0.0;
    for (int64_t c = 0; c < chunks; c++) total += partial[c * N + j];
    grad_bias[j] = bf16_round((float)total);
  }
  free(partial);
}
