/* Lazy Adam and Adagrad on the rows of an embedding table that a batch looked up, on the CPU, one pass per row.
 *
 * The ATen version (ctrkit/train/optim.py) sums each row's gradients (embedding_bag over the sorted ids),
 * gathers the rows of the table and of its states (index_select), updates them with torch's fused kernel and
 * writes them back (index_copy_): seven passes over (U, D) blocks, each a parallel region. Here each distinct row
 * is summed, updated and written in place in one pass.
 *
 * Inputs: the batch's gradient rows `values` (nnz, D); `order` (nnz), the stable sort of the batch's ids, so that
 * rows[u]'s gradients are values[order[starts[u]]], ..., values[order[ends[u] - 1]] (ends[u] = starts[u + 1], or
 * nnz for the last); `rows` (U) the distinct ids, ascending. All float32 and int64, contiguous. Rows are distinct,
 * so threads never write the same row; each row's gradients are summed in the batch's order, whatever the
 * thread count.
 *
 * The formulas are torch.optim.Adam's and Adagrad's (no weight decay, Adagrad without lr decay):
 *   Adam:    m = m + (1 - beta1) (g - m); v = beta2 v + (1 - beta2) g^2;
 *            w -= lr / (1 - beta1^t) * m / (sqrt(v) / sqrt(1 - beta2^t) + eps)
 *   Adagrad: s += g^2; w -= lr * g / (sqrt(s) + eps)
 */
#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define AHEAD 8 /* rows prefetched ahead of the one updated */

/* prefetches the cache lines of a row of D floats (for writing, or reading: rw 1 or 0) */
#define fetch(row, D, rw)                                                   \
  do {                                                                      \
    for (int64_t l_ = 0; l_ < (D); l_ += 16) __builtin_prefetch((row) + l_, rw); \
  } while (0)

/* g = the sum of row u's gradients, in the batch's order */
static inline void summed(float *g, const float *values, const int64_t *order, int64_t begin, int64_t end,
                          int64_t D) {
  memcpy(g, values + order[begin] * D, sizeof(float) * D);
  for (int64_t k = begin + 1; k < end; k++) {
    const float *x = values + order[k] * D;
    for (int64_t d = 0; d < D; d++) g[d] += x[d];
  }
}

void ctrkit_rows_adam_f32(float *weight, float *exp_avg, float *exp_avg_sq, const float *values,
                          const int64_t *order, const int64_t *rows, const int64_t *starts, int64_t U, int64_t nnz,
                          int64_t D, double lr, double beta1, double beta2, double eps, double step) {
  const float step_size = (float)(lr / (1.0 - pow(beta1, step)));
  const float bc2_sqrt = (float)sqrt(1.0 - pow(beta2, step));
  const float c1 = (float)(1.0 - beta1), b2 = (float)beta2, c2 = (float)(1.0 - beta2), e = (float)eps;
#pragma omp parallel if (U * D >= CTRKIT_GRAIN)
  {
    float *g = malloc(sizeof(float) * D);
#pragma omp for schedule(static)
    for (int64_t u = 0; u < U; u++) {
      if (u + AHEAD < U) { /* the rows are scattered over the table: fetch later ones while this one computes */
        const int64_t r = rows[u + AHEAD] * D;
        fetch(weight + r, D, 1);
        fetch(exp_avg + r, D, 1);
        fetch(exp_avg_sq + r, D, 1);
        fetch(values + order[starts[u + AHEAD]] * D, D, 0);
      }
      summed(g, values, order, starts[u], u + 1 < U ? starts[u + 1] : nnz, D);
      float *w = weight + rows[u] * D, *m = exp_avg + rows[u] * D, *v = exp_avg_sq + rows[u] * D;
      for (int64_t d = 0; d < D; d++) {
        const float md = m[d] + c1 * (g[d] - m[d]);
        const float vd = b2 * v[d] + c2 * g[d] * g[d];
        m[d] = md;
        v[d] = vd;
        w[d] -= step_size * md / (sqrtf(vd) / bc2_sqrt + e);
      }
    }
    free(g);
  }
}

void ctrkit_rows_adagrad_f32(float *weight, float *sum, const float *values, const int64_t *order,
                             const int64_t *rows, const int64_t *starts, int64_t U, int64_t nnz, int64_t D, double lr,
                             double eps) {
  const float l = (float)lr, e = (float)eps;
#pragma omp parallel if (U * D >= CTRKIT_GRAIN)
  {
    float *g = malloc(sizeof(float) * D);
#pragma omp for schedule(static)
    for (int64_t u = 0; u < U; u++) {
      if (u + AHEAD < U) {
        const int64_t r = rows[u + AHEAD] * D;
        fetch(weight + r, D, 1);
        fetch(sum + r, D, 1);
        fetch(values + order[starts[u + AHEAD]] * D, D, 0);
      }
      summed(g, values, order, starts[u], u + 1 < U ? starts[u + 1] : nnz, D);
      float *w = weight + rows[u] * D, *s = sum + rows[u] * D;
      for (int64_t d = 0; d < D; d++) {
        const float sd = s[d] + g[d] * g[d];
        s[d] = sd;
        w[d] -= l * g[d] / (sqrtf(sd) + e);
      }
    }
    free(g);
  }
}

/* The stable sort of a table's ids that the row optimizers group gradients by: order (n), the permutation that
 * sorts ids, stably; rows (U), the distinct ids ascending; starts (U), where each one's run begins in order. Returns
 * U, or -1 where an id lies outside [0, num_rows) (nothing sorted; the caller's own sort then says which). A least
 * significant digit radix sort of (id << 32 | position) pairs, 11 bits a pass, as many passes as num_rows needs (2
 * for 4M rows): a few linear passes against torch.sort's comparison sort. Needs num_rows and n below 2^32;
 * `scratch` holds 2n uint64. */
#define RADIX_BITS 11
int64_t ctrkit_sort_ids(const int64_t *ids, int64_t n, int64_t num_rows, int64_t *order, int64_t *rows,
                        int64_t *starts, uint64_t *scratch) {
  uint64_t *a = scratch, *b = scratch + n;
  for (int64_t i = 0; i < n; i++) {
    if ((uint64_t)ids[i] >= (uint64_t)num_rows) return -1;
    a[i] = (uint64_t)ids[i] << 32 | (uint64_t)i;
  }
  int bits = 0;
  while (bits < 32 && ((uint64_t)1 << bits) < (uint64_t)num_rows) bits++;
  int64_t counts[1 << RADIX_BITS];
  for (int shift = 32; shift < 32 + bits; shift += RADIX_BITS) {
    memset(counts, 0, sizeof(counts));
    const uint64_t mask = (1u << RADIX_BITS) - 1;
    for (int64_t i = 0; i < n; i++) counts[(a[i] >> shift) & mask]++;
    int64_t at = 0;
    for (int64_t d = 0; d <= (int64_t)mask; d++) {
      const int64_t c = counts[d];
      counts[d] = at;
      at += c;
    }
    for (int64_t i = 0; i < n; i++) b[counts[(a[i] >> shift) & mask]++] = a[i];
    uint64_t *t = a;
    a = b;
    b = t;
  }
  int64_t U = 0;
  for (int64_t i = 0; i < n; i++) {
    const int64_t id = (int64_t)(a[i] >> 32);
    order[i] = (int64_t)(a[i] & 0xffffffffu);
    if (U == 0 || rows[U - 1] != id) {
      rows[U] = id;
      starts[U++] = i;
    }
  }
  return U;
}

/* The embedding lookup of a batch's (n = B x F) ids, feature f's id i being row ids + offsets[f] of the flat
 * table: out[i] = weight[flat[i]] (D floats each), flat[i] written too (the sparse gradient's indices). ATen's
 * embedding reads the rows in order without prefetching; the rows lie scattered over the table, so nearly each
 * one is a cache miss. Here the row GATHER_AHEAD lookups later is prefetched while this one is copied. Returns the count of ids outside the table,
 * counted before anything is gathered (then nothing is). */
#define GATHER_AHEAD 64
int64_t ctrkit_gather_rows_f32(const float *weight, int64_t num_rows, const int64_t *ids, const int64_t *offsets,
                               int64_t n, int64_t F, int64_t D, float *out, int64_t *flat) {
  int64_t outside = 0;
  for (int64_t i = 0, f = 0; i < n; i++) {
    const int64_t r = ids[i] + offsets[f];
    flat[i] = r;
    outside += (uint64_t)r >= (uint64_t)num_rows;
    if (++f == F) f = 0;
  }
  if (outside) return outside;
#pragma omp parallel for schedule(static) if (n * D >= CTRKIT_GRAIN)
  for (int64_t i = 0; i < n; i++) {
    if (i + GATHER_AHEAD < n) fetch(weight + flat[i + GATHER_AHEAD] * D, D, 0);
    memcpy(out + i * D, weight + flat[i] * D, sizeof(float) * D);
  }
  return 0;
}

/* SGD on the rows a batch looked up, straight from the uncoalesced gradient: weight[ids[i]] += -lr * values[i] for
 * i = 0 .. nnz - 1, duplicates included (their sum is the row's gradient). No sort is needed: each thread scans all
 * ids and updates only the rows it owns (a multiplicative hash of the row id), so no two threads write one row and
 * each row takes its gradients in the batch's order, whatever the thread count (the ATen path's `scatter_add_`
 * adds them in the same order). The product is rounded to float before the add, as the ATen path's `mul_(-lr)`
 * then `scatter_add_` round it (no fused multiply-add). */
static inline int64_t owner(int64_t row, int64_t threads) {
  return (int64_t)(((uint64_t)(uint32_t)((uint64_t)row * 2654435761u) * (uint64_t)threads) >> 32);
}

#if defined(__GNUC__) && !defined(__clang__)
__attribute__((optimize("fp-contract=off"))) /* gcc contracts across statements by default; clang does not */
#endif
int64_t ctrkit_rows_sgd_f32(float *weight, const float *values, const int64_t *ids, int64_t nnz, int64_t D,
                            int64_t num_rows, double lr) {
  int64_t outside = 0; /* ids outside the table: counted first, and then nothing is written */
  for (int64_t i = 0; i < nnz; i++) outside += (uint64_t)ids[i] >= (uint64_t)num_rows;
  if (outside) return outside;
  const float step = (float)(-lr);
#pragma omp parallel if (nnz * D >= CTRKIT_GRAIN)
  {
    const int64_t threads = omp_get_num_threads(), me = omp_get_thread_num();
    for (int64_t i = 0; i < nnz; i++) {
      if (i + AHEAD < nnz && owner(ids[i + AHEAD], threads) == me) fetch(weight + ids[i + AHEAD] * D, D, 1);
      if (owner(ids[i], threads) != me) continue;
      float *w = weight + ids[i] * D;
      const float *x = values + i * D;
      for (int64_t d = 0; d < D; d++) {
        const float u = step * x[d]; /* rounded to float: not contracted into a fused multiply-add */
        w[d] += u;
      }
    }
  }
  return 0;
}
