/* DLRM's dot interaction on the CPU, forward and backward, one pass over each sample's vectors.
 *
 * ATen's version is a cat of the vectors, a batched GEMM of (V x D) by (D x V) per sample, a gather of the
 * V(V-1)/2 pairs out of the V x V Gram matrix, and in backward a gather of the pairs' gradient back into a
 * V x V matrix and a second batched GEMM. Each step writes and rereads a (B, V*V) buffer, and batched GEMMs
 * of 27 x 16 matrices run far from the machine's peak. Here each sample's V vectors are read once, the
 * pairs' dots written straight into the output row, and the gradient of each vector accumulated in
 * registers from the output gradient's row.
 *
 * Layouts (all contiguous): dense (B, D) of T or none, emb (B, F, D) of E, out (B, W) of T with
 * W = D [dense copy, if any] + P [pairs] + padding [zeros]. Vector 0 is the dense vector where there is one,
 * then the F embeddings. Pairs run over i = 0..V-1, j = 0..i-1 (j = 0..i with self-interaction), the order
 * of torch.tril_indices. T is float32 or bfloat16; E is float32 or T. A float32 E under a bfloat16 T is rounded
 * to bfloat16 on load, as `embeddings.to(dense.dtype)` rounds it. Sums are in float32 in a fixed order per
 * sample, so the result does not depend on the thread count.
 *
 * Backward: grad (B, W) of T -> grad_dense (B, D) of T, grad_emb (B, F, D) float32 (the sums' dtype).
 *
 * Built by ctrkit.native with -O3 -march=native -fopenmp; where D is a multiple of VL the vectors are held as
 * VL-float vectors (GCC vector extensions, VL the width of the CPU's registers: 16 with AVX-512, 8 with AVX2, 4
 * otherwise; a vector wider than the registers compiled 16x slower for AVX2); other widths take the
 * scalar loops.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "bf16.h"

#if defined(__AVX512F__)
#define VL 16
#elif defined(__AVX__)
#define VL 8
#else
#define VL 4
#endif
typedef float vf __attribute__((vector_size(VL * 4)));
typedef uint32_t vu __attribute__((vector_size(VL * 4)));
typedef uint16_t vh __attribute__((vector_size(VL * 2)));
typedef int32_t vi __attribute__((vector_size(VL * 4)));

/* VL floats from p as float: as they are, rounded to bfloat16 as bf16_round rounds each, or widened from bfloat16
   (the vector forms of f32_id, bf16_round and bf16_to_float; the same bits). */
static inline vf load_f32v(const float *p) {
  vf x;
  memcpy(&x, p, sizeof x);
  return x;
}
/* float_to_bf16 (bf16.h) on VL lanes: each lane's bfloat16 bits, in the low half of a 32-bit lane */
static inline vu bf16_bitsv(vf x) {
  vu u;
  memcpy(&u, &x, sizeof u);
  const vu nan = (vu)(x != x);
  return (((u + 0x7FFF + ((u >> 16) & 1)) >> 16) & ~nan) | (0x7FC0 & nan);
}
static inline vf load_bf16_roundv(const float *p) {
  const vu u = bf16_bitsv(load_f32v(p)) << 16;
  vf x;
  memcpy(&x, &u, sizeof x);
  return x;
}
static inline vf load_bf16v(const uint16_t *p) {
  vh h;
  memcpy(&h, p, sizeof h);
  const vu u = __builtin_convertvector(h, vu) << 16;
  vf x;
  memcpy(&x, &u, sizeof x);
  return x;
}

/* In-register transpose of VL rows of VL floats: afterwards r[k][t] holds what r[t][k] held. log2(VL) stages; at
   stage h, rows t and t + h (bit h clear in t) exchange the upper right and lower left h x h blocks of their 2h x
   2h block: lanes j with bit h set take the other row's lane j - h (or j + h). The masks are written out, so that
   the shuffles take constant masks. */
#define STAGE(h, LO, HI)                                     \
  _Pragma("GCC unroll 16") for (int t = 0; t < VL; t++) {   \
    if (t & (h)) continue;                                   \
    const vf a_ = r[t], b_ = r[t + (h)];                     \
    r[t] = __builtin_shuffle(a_, b_, LO);                    \
    r[t + (h)] = __builtin_shuffle(a_, b_, HI);              \
  }
static inline void transpose(vf r[VL]) {
#if VL == 16
  STAGE(8, ((vi){0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23}),
        ((vi){8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31}));
  STAGE(4, ((vi){0, 1, 2, 3, 16, 17, 18, 19, 8, 9, 10, 11, 24, 25, 26, 27}),
        ((vi){4, 5, 6, 7, 20, 21, 22, 23, 12, 13, 14, 15, 28, 29, 30, 31}));
  STAGE(2, ((vi){0, 1, 16, 17, 4, 5, 20, 21, 8, 9, 24, 25, 12, 13, 28, 29}),
        ((vi){2, 3, 18, 19, 6, 7, 22, 23, 10, 11, 26, 27, 14, 15, 30, 31}));
  STAGE(1, ((vi){0, 16, 2, 18, 4, 20, 6, 22, 8, 24, 10, 26, 12, 28, 14, 30}),
        ((vi){1, 17, 3, 19, 5, 21, 7, 23, 9, 25, 11, 27, 13, 29, 15, 31}));
#elif VL == 8
  STAGE(4, ((vi){0, 1, 2, 3, 8, 9, 10, 11}), ((vi){4, 5, 6, 7, 12, 13, 14, 15}));
  STAGE(2, ((vi){0, 1, 8, 9, 4, 5, 12, 13}), ((vi){2, 3, 10, 11, 6, 7, 14, 15}));
  STAGE(1, ((vi){0, 8, 2, 10, 4, 12, 6, 14}), ((vi){1, 9, 3, 11, 5, 13, 7, 15}));
#else
  STAGE(2, ((vi){0, 1, 4, 5}), ((vi){2, 3, 6, 7}));
  STAGE(1, ((vi){0, 4, 2, 6}), ((vi){1, 5, 3, 7}));
#endif
}
#undef STAGE

/* One register of VL dots stored at o (unaligned): as float, or rounded to bfloat16 as float_to_bf16 rounds each
   (bf16.h; the same bits, NaN to 0x7FC0). */
static inline void store_f32v(float *o, vf x) { memcpy(o, &x, sizeof x); }
static inline void store_bf16v(uint16_t *o, vf x) {
  const vh h = __builtin_convertvector(bf16_bitsv(x), vh);
  memcpy(o, &h, sizeof h);
}

static inline float f32_id(float x) { return x; }

/* Loads the V vectors of sample b into float rows of `stride` floats (zero beyond D):
   vec(i) = row i. LOAD_T / LOAD_E convert one element of dense / emb to float. */
#define LOAD_VECTORS(rows, stride, LOAD_T, LOAD_E)                                \
  do {                                                                            \
    for (int64_t i_ = 0; i_ < V; i_++) {                                          \
      float *r_ = (rows) + i_ * (stride);                                         \
      if (i_ < lead)                                                              \
        for (int64_t d_ = 0; d_ < D; d_++) r_[d_] = LOAD_T(dense[b * D + d_]);    \
      else                                                                        \
        for (int64_t d_ = 0; d_ < D; d_++) r_[d_] = LOAD_E(emb[(b * F + i_ - lead) * D + d_]); \
    }                                                                             \
  } while (0)

/* Forward. Vector path (D % VL == 0, V <= 8 VL): the vectors transposed into vt[k][c] (component k of vectors
   VL c .. VL c + VL - 1), so the dots of vector i with all j are a sum over k of vt[k][i] * vt[k][:]: D
   multiply-adds of VL lanes per block of VL j, the NCC blocks' sums held in registers (NCC a constant in each
   expansion). Four rows i at once: 4 NCC independent sums, where one row's NCC would wait on the multiply-add's
   latency each k (2.5x slower with one row at a time). Each dot is summed over k in order, whatever the grouping.
   A row's pairs are stored as whole registers, the lanes past its pairs included: the next row's registers start
   where its pairs end and cover more than those lanes, and the padding's zeros follow the last row; near the end of
   the output row (W) the lanes are stored one by one, up to W. One pass of VL-lane stores where the pairs one by
   one (a scalar bfloat16 rounding each under bf16) took a third of the bf16 forward (perf annotate). */
#define ROWS_OF_DOTS(NCC, STORE_T, STORE_V)                                                       \
  for (int64_t i0 = 0; i0 < V; i0 += 4) {                                                         \
    vf a[4][NCC];                                                                                 \
    int64_t r_[4];                                                                                \
    for (int r = 0; r < 4; r++) {                                                                 \
      r_[r] = i0 + r < V ? i0 + r : V - 1; /* rows past V: computed again, not written */         \
      for (int c = 0; c < NCC; c++) a[r][c] = (vf){0};                                            \
    }                                                                                             \
    for (int64_t k = 0; k < D; k++) {                                                             \
      const vf *t = vt + k * NCC;                                                                 \
      for (int r = 0; r < 4; r++) {                                                               \
        const float s = t[r_[r] / VL][r_[r] % VL];                                                \
        for (int c = 0; c < NCC; c++) a[r][c] += s * t[c];                                        \
      }                                                                                           \
    }                                                                                             \
    for (int r = 0; r < 4 && i0 + r < V; r++) {                                                   \
      const int64_t n = i0 + r + self; /* row i0 + r's pairs, from o[p] */                        \
      for (int c = 0; c * VL < n; c++) {                                                          \
        if (p + c * VL + VL <= W)                                                                 \
          STORE_V(o + p + c * VL, a[r][c]);                                                       \
        else                                                                                      \
          for (int l = 0; l < VL && p + c * VL + l < W; l++) o[p + c * VL + l] = STORE_T(a[r][c][l]); \
      }                                                                                           \
      p += n;                                                                                     \
    }                                                                                             \
  }

#define FORWARD(T, E, LOAD_T, LOAD_E, STORE_T, STORE_V, LOADV_T, LOADV_E)                          \
  const int64_t lead = dense ? 1 : 0, V = F + lead, NC = (V + VL - 1) / VL;                        \
  const int vec = D % VL == 0 && NC <= 8;                                                         \
  _Pragma("omp parallel if (B * V * D >= CTRKIT_GRAIN)")                                          \
  {                                                                                               \
    float *rows = vec ? NULL : malloc(sizeof(float) * V * D);                                     \
    vf *vt = vec ? aligned_alloc(64, sizeof(vf) * D * NC + 64) : NULL;                               \
    _Pragma("omp for schedule(static)")                                                           \
    for (int64_t b = 0; b < B; b++) {                                                             \
      T *o = out + b * W;                                                                         \
      int64_t p = 0;                                                                              \
      if (dense) for (; p < D; p++) o[p] = dense[b * D + p];                                      \
      if (vec) { /* vt[k][c]: VL vectors' components k, by VL x VL blocks transposed in registers */   \
        for (int64_t c = 0; c < NC; c++)                                                          \
          for (int64_t q = 0; q < D; q += VL) {                                                   \
            vf r[VL];                                                                             \
            for (int t = 0; t < VL; t++) {                                                        \
              const int64_t i = c * VL + t;                                                       \
              r[t] = i >= V     ? (vf){0}                                                         \
                     : i < lead ? LOADV_T(dense + b * D + q)                                      \
                                : LOADV_E(emb + (b * F + i - lead) * D + q);                      \
            }                                                                                     \
            transpose(r);                                                                         \
            for (int t = 0; t < VL; t++) vt[(q + t) * NC + c] = r[t];                             \
          }                                                                                       \
        switch (NC) {                                                                          \
          case 1: ROWS_OF_DOTS(1, STORE_T, STORE_V) break;                   \
          case 2: ROWS_OF_DOTS(2, STORE_T, STORE_V) break;                   \
          case 3: ROWS_OF_DOTS(3, STORE_T, STORE_V) break;                   \
          case 4: ROWS_OF_DOTS(4, STORE_T, STORE_V) break;                   \
          case 5: ROWS_OF_DOTS(5, STORE_T, STORE_V) break;                   \
          case 6: ROWS_OF_DOTS(6, STORE_T, STORE_V) break;                   \
          case 7: ROWS_OF_DOTS(7, STORE_T, STORE_V) break;                   \
          default: ROWS_OF_DOTS(8, STORE_T, STORE_V) break;                \
        }                                                                                         \
      } else {                                                                                    \
        LOAD_VECTORS(rows, D, LOAD_T, LOAD_E);                                                    \
        for (int64_t i = 0; i < V; i++)                                                           \
          for (int64_t j = 0; j < i + self; j++) {                                                \
            float s = 0.f;                                                                        \
            for (int64_t k = 0; k < D; k++) s += rows[i * D + k] * rows[j * D + k];              \
            o[p++] = STORE_T(s);                                                                  \
          }                                                                                       \
      }                                                                                           \
      for (; p < W; p++) o[p] = STORE_T(0.f);                                                     \
    }                                                                                             \
    free(rows);                                                                                   \
    free(vt);                                                                                     \
  }

/* Backward: d<v_i, v_j> = g dv_i . v_j + v_i . g dv_j, so each pair adds g v_j to vector i's gradient and
   g v_i to vector j's (2 g v_i for a self pair). */
/* The vector path's rows (D % VL == 0), four at a time: their gradients' sums a[r] are independent, where one row's
   would wait on the multiply-add's latency at each j. Every sum takes its terms in the order of the row-by-row loop
   (the scalar path below): row i's pairs j < i in order, its self pair, then the later rows' pairs with it in
   their order, so the grouping changes no value. Row i's pairs start at p_i = lead D + i (i - 1) / 2 + self i. */
#define BACKWARD_GROUP(RR, LOAD_T) /* rows i0 .. i0 + RR - 1, RR a constant */                  \
  {                                                                                               \
    int64_t pr[RR];                                                                               \
    for (int r = 0; r < RR; r++) pr[r] = lead * D + (i0 + r) * (i0 + r - 1) / 2 + self * (i0 + r); \
    for (int64_t k = 0; k < D; k += VL) {                                                         \
      vf a[RR], z[RR];                                                                            \
      for (int r = 0; r < RR; r++) {                                                              \
        memcpy(&a[r], gv + (i0 + r) * D + k, sizeof(vf));                                         \
        memcpy(&z[r], rows + (i0 + r) * D + k, sizeof(vf));                                       \
      }                                                                                           \
      for (int64_t j = 0; j < i0; j++) {                                                          \
        vf x, y;                                                                                  \
        memcpy(&x, rows + j * D + k, sizeof x);                                                   \
        memcpy(&y, gv + j * D + k, sizeof y);                                                     \
        for (int r = 0; r < RR; r++) {                                                            \
          const float gp = LOAD_T(g[pr[r] + j]);                                                  \
          a[r] += gp * x;                                                                         \
          y += gp * z[r];                                                                         \
        }                                                                                         \
        memcpy(gv + j * D + k, &y, sizeof y);                                                     \
      }                                                                                           \
      for (int r = 0; r < RR; r++) {                                                              \
        for (int q = 0; q < r; q++) {                                                             \
          const float gp = LOAD_T(g[pr[r] + i0 + q]);                                             \
          a[r] += gp * z[q];                                                                      \
          a[q] += gp * z[r];                                                                      \
        }                                                                                         \
        if (self) a[r] += (2.f * LOAD_T(g[pr[r] + i0 + r])) * z[r];                               \
      }                                                                                           \
      for (int r = 0; r < RR; r++) memcpy(gv + (i0 + r) * D + k, &a[r], sizeof(vf));              \
    }                                                                                             \
  }

#define BACKWARD_ROWS(LOAD_T)                                                                     \
  {                                                                                               \
    int64_t i0 = 0;                                                                               \
    for (; i0 + 4 <= V; i0 += 4) BACKWARD_GROUP(4, LOAD_T)                                        \
    switch (V - i0) {                                                                             \
      case 3: BACKWARD_GROUP(3, LOAD_T) break;                                                    \
      case 2: BACKWARD_GROUP(2, LOAD_T) break;                                                    \
      case 1: BACKWARD_GROUP(1, LOAD_T) break;                                                    \
      default: break;                                                                             \
    }                                                                                             \
  }

#define BACKWARD(T, E, LOAD_T, LOAD_E, STORE_T)                                                   \
  const int64_t lead = dense ? 1 : 0, V = F + lead;                                               \
  const int vec = D % VL == 0;                                                                    \
  _Pragma("omp parallel if (B * V * D >= CTRKIT_GRAIN)")                                          \
  {                                                                                               \
    float *rows = malloc(sizeof(float) * V * D);                                \
    float *gv = malloc(sizeof(float) * V * D);                                  \
    float *gw = sizeof(T) == sizeof(float) ? NULL : malloc(sizeof(float) * W);                   \
    _Pragma("omp for schedule(static)")                                                           \
    for (int64_t b = 0; b < B; b++) {                                                             \
      LOAD_VECTORS(rows, D, LOAD_T, LOAD_E);                                                      \
      memset(gv, 0, sizeof(float) * V * D);                                                       \
      const T *g = grad + b * W;                                                                  \
      if (vec) { /* bfloat16: the row's gradient widened in one vector pass, each pair's then one broadcast load */ \
        const float *gf = (const float *)g;                                                       \
        if (gw) {                                                                                 \
          for (int64_t q = 0; q < W; q++) gw[q] = LOAD_T(g[q]);                                   \
          gf = gw;                                                                                \
        }                                                                                         \
        {                                                                                         \
          const float *g = gf;                                                                    \
          BACKWARD_ROWS(f32_id)                                                                   \
        }                                                                                         \
      } else {                                                                                    \
        int64_t p = lead * D;                                                                     \
        for (int64_t i = 0; i < V; p += i + self, i++) { /* row i: i + self pairs from p */       \
          float *gi = gv + i * D;                                                                 \
          const float *vi = rows + i * D;                                                         \
          for (int64_t j = 0; j < i; j++) {                                                       \
            const float gp = LOAD_T(g[p + j]);                                                    \
            for (int64_t k = 0; k < D; k++) {                                                     \
              gi[k] += gp * rows[j * D + k];                                                      \
              gv[j * D + k] += gp * vi[k];                                                        \
            }                                                                                     \
          }                                                                                       \
          if (self) {                                                                             \
            const float gp2 = 2.f * LOAD_T(g[p + i]);                                             \
            for (int64_t k = 0; k < D; k++) gi[k] += gp2 * vi[k];                                 \
          }                                                                                       \
        }                                                                                         \
      }                                                                                           \
      if (dense)                                                                                  \
        for (int64_t k = 0; k < D; k++) grad_dense[b * D + k] = STORE_T(gv[k] + LOAD_T(g[k]));    \
      memcpy(grad_emb + b * F * D, gv + lead * D, sizeof(float) * F * D);                        \
    }                                                                                             \
    free(rows);                                                                                   \
    free(gv);                                                                                     \
    free(gw);                                                                                     \
  }

#define SIGNATURE_FWD(name, T, E) \
  void name(const T *dense, const E *emb, T *out, int64_t B, int64_t F, int64_t D, int64_t W, int self)
#define SIGNATURE_BWD(name, T, E)                                                                 \
  void name(const T *grad, const T *dense, const E *emb, T *grad_dense, float *grad_emb, int64_t B, \
            int64_t F, int64_t D, int64_t W, int self)

SIGNATURE_FWD(ctrkit_dot_forward_f32, float, float) {
  FORWARD(float, float, f32_id, f32_id, f32_id, store_f32v, load_f32v, load_f32v)
}
SIGNATURE_FWD(ctrkit_dot_forward_bf16_f32, uint16_t, float) {
  FORWARD(uint16_t, float, bf16_to_float, bf16_round, float_to_bf16, store_bf16v, load_bf16v, load_bf16_roundv)
}
SIGNATURE_FWD(ctrkit_dot_forward_bf16, uint16_t, uint16_t) {
  FORWARD(uint16_t, uint16_t, bf16_to_float, bf16_to_float, float_to_bf16, store_bf16v, load_bf16v, load_bf16v)
}
SIGNATURE_BWD(ctrkit_dot_backward_f32, float, float) { BACKWARD(float, float, f32_id, f32_id, f32_id) }
SIGNATURE_BWD(ctrkit_dot_backward_bf16_f32, uint16_t, float) {
  BACKWARD(uint16_t, float, bf16_to_float, bf16_round, float_to_bf16)
}
SIGNATURE_BWD(ctrkit_dot_backward_bf16, uint16_t, uint16_t) {
  BACKWARD(uint16_t, uint16_t, bf16_to_float, bf16_to_float, float_to_bf16)
}
