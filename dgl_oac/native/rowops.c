/* dgl-oac's native CPU row operations: gathering and scattering table rows, and the built-in optimizers'
 * update of value || state rows. Loaded by dgl_oac/native/loader.py.
 *
 * Gather / scatter: torch's index_select / index_copy_ of rows, with the next rows' cache lines prefetched, so
 * that more random row reads are in flight at once (a table larger than the caches: each row is a miss).
 * The ids are checked against the table first; on a bad id nothing is copied and -1 is returned (the caller
 * then runs torch's op, which raises its usual IndexError).
 *
 * Row update, in two passes per row:
 * The torch path (dgl_oac/optim/kernels.py) makes one pass over [n, D] floats per op (Adagrad: 5, Adam: 10).
 * Here pass 1 computes the new state and the square root's argument (into tmp, float32[n, D] contiguous,
 * where torch's sqrt is twice as fast as on out's strided value columns), the caller takes that square root
 * in place with torch's own sqrt_ (torch's vectorised CPU sqrt is not IEEE's correctly rounded
 * one, and the results are meant to be the torch path's bit for bit), and pass 2 computes the new values.
 * Every other operation rounds as the torch path's does: compiled with -ffp-contract=off, nothing is fused
 * into a multiply-add, and each expression below is the torch path's sequence of ops.
 *
 * Layouts (float32, rows of stride *_stride floats, unit stride inside a row):
 *   ADAGRAD  [w (D) | sum (D)]                   pass 1: sum' = g * g + sum, tmp = sum' + eps
 *                                                 pass 2: w' = w + (-lr * g) / sqrt(sum' + eps)
 *   ADAM     [w (D) | m (D) | v (D) | step (1)]  pass 1: m', v', step' = step + 1, tmp = v' / c2
 *                                                 pass 2: w' = w + (-1 * ((m' / c1) * lr)) / (sqrt(v' / c2) + eps)
 *   corr: float32[n, 2], per row c1 = 1 - b1^step', c2 = 1 - b2^step' (torch's pow, computed by the caller).
 * Pass 2 returns the number of rows whose new row (values and state) is not all finite.
 */
#include <stdint.h>
#include <string.h>

/* rows prefetched ahead of the one being copied: enough misses in flight to cover memory latency */
#define AHEAD 8

static int ids_ok(int64_t n, const int64_t *ids, int64_t rows) {
  int64_t bad = 0;
  for (int64_t i = 0; i < n; i++) bad |= (ids[i] < 0) | (ids[i] >= rows);
  return bad == 0;
}

static inline void prefetch_row(const float *row, int64_t bytes, int write) {
  const char *p = (const char *)row;
  for (int64_t b = 0; b < bytes; b += 64) {
    if (write)
      __builtin_prefetch(p + b, 1, 0);
    else
      __builtin_prefetch(p + b, 0, 0);
  }
}

/* out[i, :W] = table[ids[i], :W] */
int64_t dgloac_gather(int64_t n, int64_t W, const float *table, int64_t table_rows, int64_t table_stride,
                      const int64_t *ids, float *out, int64_t out_stride) {
  if (!ids_ok(n, ids, table_rows)) return -1;
#pragma omp parallel for schedule(static) if (n * W >= 32768)
  for (int64_t i = 0; i < n; i++) {
    if (i + AHEAD < n) prefetch_row(table + ids[i + AHEAD] * table_stride, W * 4, 0);
    memcpy(out + i * out_stride, table + ids[i] * table_stride, W * sizeof(float));
  }
  return 0;
}

/* table[ids[i], :W] = src[i, :W]; ids unique (rows written by two threads would race) */
int64_t dgloac_scatter(int64_t n, int64_t W, float *table, int64_t table_rows, int64_t table_stride,
                       const int64_t *ids, const float *src, int64_t src_stride) {
  if (!ids_ok(n, ids, table_rows)) return -1;
#pragma omp parallel for schedule(static) if (n * W >= 32768)
  for (int64_t i = 0; i < n; i++) {
    if (i + AHEAD < n) prefetch_row(table + ids[i + AHEAD] * table_stride, W * 4, 1);
    memcpy(table + ids[i] * table_stride, src + i * src_stride, W * sizeof(float));
  }
  return 0;
}

enum { ADAGRAD = 1, ADAM = 2 };

/* 1 if x is NaN or +-Inf (all exponent bits set): integer ops, so the check vectorises with the loop */
static inline uint32_t nonfinite(float x) {
  uint32_t b;
  memcpy(&b, &x, sizeof b);
  return (b & 0x7f800000u) == 0x7f800000u;
}

static void adagrad_1(int64_t D, const float *restrict r, const float *restrict g, float *restrict o,
                      float *restrict t, const float *h) {
  const float eps = h[1];
  for (int64_t k = 0; k < D; k++) {
    const float s = g[k] * g[k] + r[D + k];
    o[D + k] = s;
    t[k] = s + eps;
  }
}

static uint32_t adagrad_2(int64_t D, const float *restrict r, const float *restrict g, float *restrict o,
                          const float *restrict t, const float *h) {
  const float nlr = h[0];
  uint32_t bad = 0;
  for (int64_t k = 0; k < D; k++) {
    const float w = r[k] + (nlr * g[k]) / t[k];
    o[k] = w;
    bad |= nonfinite(w) | nonfinite(o[D + k]);
  }
  return bad;
}

static void adam_1(int64_t D, const float *restrict r, const float *restrict g, float *restrict o,
                   float *restrict t, const float *h, const float *c) {
  const float b1 = h[1], b2 = h[2], ob1 = h[4], ob2 = h[5], c2 = c[1];
  for (int64_t k = 0; k < D; k++) {
    const float m = r[D + k] * b1 + g[k] * ob1;
    const float v = r[2 * D + k] * b2 + (g[k] * g[k]) * ob2;
    o[D + k] = m;
    o[2 * D + k] = v;
    t[k] = v / c2;
  }
  o[3 * D] = r[3 * D] + 1.0f;
}

static uint32_t adam_2(int64_t D, const float *restrict r, float *restrict o, const float *restrict t,
                       const float *h, const float *c) {
  const float lr = h[0], eps = h[3], c1 = c[0];
  uint32_t bad = nonfinite(o[3 * D]);
  for (int64_t k = 0; k < D; k++) {
    const float den = t[k] + eps;
    const float step = (o[D + k] / c1) * lr;
    const float w = r[k] + (-1.0f * step) / den;
    o[k] = w;
    bad |= nonfinite(w) | nonfinite(o[D + k]) | nonfinite(o[2 * D + k]);
  }
  return bad;
}

int64_t dgloac_pass(int32_t kind, int32_t pass, int64_t n, int64_t D, const float *rows, int64_t rows_stride,
                    const float *grad, int64_t grad_stride, float *out, int64_t out_stride, float *tmp,
                    const float *hyper, const float *corr) {
  int64_t bad = 0;
#pragma omp parallel for schedule(static) reduction(+ : bad) if (n * D >= 32768)
  for (int64_t i = 0; i < n; i++) {
    const float *r = rows + i * rows_stride, *g = grad + i * grad_stride;
    float *o = out + i * out_stride, *t = tmp + i * D;
    if (kind == ADAGRAD) {
      if (pass == 1)
        adagrad_1(D, r, g, o, t, hyper);
      else
        bad += adagrad_2(D, r, g, o, t, hyper) != 0;
    } else {
      if (pass == 1)
        adam_1(D, r, g, o, t, hyper, corr + 2 * i);
      else
        bad += adam_2(D, r, o, t, hyper, corr + 2 * i) != 0;
    }
  }
  return bad;
}
