/*
 * gru.c: front doors of the float GRU (one layer, one direction; qgru.h): argument checks (shapes,
 * dtypes, one device for every tensor, the values of lengths when they are on the host), then
 * dispatch to the device's backend (core/gru_cpu.c, kernels/gru.cu).
 *
 * qg_check_gru_args is shared with the quantized GRU's front doors (it checks x, W, R and reads
 * the sizes), and qg_check_gru_lengths with every GRU that takes per-row lengths.
 */
#include "backend.h"

qg_status qg_check_gru_args(qg_ctx *ctx, const char *fn, const qg_tensor *x, const qg_tensor *W,
                            const qg_tensor *R, int64_t *T, int64_t *N, int64_t *C, int64_t *H) {
  QG_CHECK(qg_check_tensor(ctx, fn, "x", x, QG_F32, 3, NULL));
  QG_CHECK(qg_check_tensor(ctx, fn, "R", R, QG_F32, 2, NULL));
  *T = x->dims[0]; *N = x->dims[1]; *C = x->dims[2]; *H = R->dims[1];
  int64_t w[2] = {3 * *H, *C}, r[2] = {3 * *H, *H};
  QG_CHECK(qg_check_tensor(ctx, fn, "W", W, QG_F32, 2, w));
  QG_CHECK(qg_check_tensor(ctx, fn, "R", R, QG_F32, 2, r));
  return QG_OK;
}

qg_status qg_check_gru_lengths(qg_ctx *ctx, const char *fn, const qg_tensor *lengths, int64_t T, int64_t N) {
  if (!lengths) return QG_OK;
  int64_t d[1] = {N};
  QG_CHECK(qg_check_tensor(ctx, fn, "lengths", lengths, QG_I64, 1, d));
  if (lengths->device != QG_CPU) return QG_OK;   /* a device's values are checked by its backend's use */
  const int64_t *L = (const int64_t *)lengths->data;
  for (int64_t n = 0; n < N; n++)
    if (L[n] < 1 || L[n] > T)
      return qg_fail(ctx, QG_ERR_ARG, fn, "lengths[%lld] = %lld: expected a length in 1..T = 1..%lld (row %lld)",
                     (long long)n, (long long)L[n], (long long)T, (long long)n);
  return QG_OK;
}

/* y (or dy) [T, N, Hy] f32 with columns [y_offset, y_offset + H) inside its last dim. */
static qg_status check_y(qg_ctx *ctx, const char *fn, const char *arg, const qg_tensor *y, int y_offset,
                         int64_t T, int64_t N, int64_t H) {
  int64_t d[3] = {T, N, -1};
  QG_CHECK(qg_check_tensor(ctx, fn, arg, y, QG_F32, 3, d));
  if (y_offset < 0 || y_offset + H > y->dims[2])
    return qg_fail(ctx, QG_ERR_ARG, fn, "%s: columns [%d, %lld) do not fit in its last dim %lld", arg, y_offset,
                   (long long)(y_offset + H), (long long)y->dims[2]);
  return QG_OK;
}

qg_status qg_check_gru_stats(qg_ctx *ctx, const char *fn, const qg_stats *stats) {
  if (!stats) return QG_OK;
  int64_t rd[2] = {QG_Q_NUM_ACT, 4}, cd[2] = {QG_Q_NUM_ACT, QG_STATS_BINS};
  QG_CHECK(qg_check_tensor(ctx, fn, "stats.range", stats->range, QG_F64, 2, rd));
  QG_CHECK(qg_check_tensor(ctx, fn, "stats.counts", stats->counts, QG_I64, 2, cd));
  return QG_OK;
}

qg_status qg_gru_forward(qg_ctx *ctx, qg_tensor *y, int y_offset, qg_tensor *hs, qg_tensor *gates, const qg_stats *stats,
                         const qg_tensor *x, const qg_tensor *W, const qg_tensor *R, const qg_tensor *bx, const qg_tensor *br,
                         const qg_tensor *h0, const qg_tensor *lengths, int reverse) {
  if (!ctx) return QG_ERR_ARG;
  const char *fn = __func__;
  int64_t T, N, C, H;
  QG_CHECK(qg_check_gru_args(ctx, fn, x, W, R, &T, &N, &C, &H));
  int64_t b3[1] = {3 * H}, hsd[3] = {T + 1, N, H}, gd[3] = {T, N, 4 * H}, h0d[2] = {N, H};
  QG_CHECK(qg_check_tensor(ctx, fn, "bx", bx, QG_F32, 1, b3));
  QG_CHECK(qg_check_tensor(ctx, fn, "br", br, QG_F32, 1, b3));
  QG_CHECK(check_y(ctx, fn, "y", y, y_offset, T, N, H));
  QG_CHECK(qg_check_tensor(ctx, fn, "hs", hs, QG_F32, 3, hsd));
  if (gates) QG_CHECK(qg_check_tensor(ctx, fn, "gates", gates, QG_F32, 3, gd));
  if (h0) QG_CHECK(qg_check_tensor(ctx, fn, "h0", h0, QG_F32, 2, h0d));
  QG_CHECK(qg_check_gru_stats(ctx, fn, stats));
  const qg_tensor *ts[] = {y, hs, gates, stats ? stats->range : NULL, stats ? stats->counts : NULL,
                           x, W, R, bx, br, h0, lengths};
  const char *names[] = {"y", "hs", "gates", "stats.range", "stats.counts", "x", "W", "R", "bx", "br", "h0", "lengths"};
  int dev;
  QG_CHECK(qg_common_device(ctx, fn, &dev, 12, ts, names));
  QG_CHECK(qg_check_gru_lengths(ctx, fn, lengths, T, N));
  return QG_DISPATCH(ctx, dev, gru_forward, y, y_offset, hs, gates, stats, x, W, R, bx, br, h0, lengths, reverse ? 1 : 0);
}

qg_status qg_gru_backward(qg_ctx *ctx, qg_tensor *dx, qg_tensor *dW, qg_tensor *dR, qg_tensor *dbx, qg_tensor *dbr,
                          qg_tensor *dh0, const qg_tensor *dy, int y_offset, const qg_tensor *dhn, const qg_tensor *x,
                          const qg_tensor *W, const qg_tensor *R, const qg_tensor *hs, const qg_tensor *gates,
                          const qg_tensor *lengths, int reverse) {
  if (!ctx) return QG_ERR_ARG;
  const char *fn = __func__;
  int64_t T, N, C, H;
  QG_CHECK(qg_check_gru_args(ctx, fn, x, W, R, &T, &N, &C, &H));
  int64_t b3[1] = {3 * H}, hsd[3] = {T + 1, N, H}, gd[3] = {T, N, 4 * H}, nh[2] = {N, H};
  int64_t xd[3] = {T, N, C}, wd[2] = {3 * H, C}, rd[2] = {3 * H, H};
  if (!gates) return qg_fail(ctx, QG_ERR_ARG, fn, "gates is NULL: run the forward in training mode first");
  QG_CHECK(qg_check_tensor(ctx, fn, "hs", hs, QG_F32, 3, hsd));
  QG_CHECK(qg_check_tensor(ctx, fn, "gates", gates, QG_F32, 3, gd));
  if (dx) QG_CHECK(qg_check_tensor(ctx, fn, "dx", dx, QG_F32, 3, xd));
  QG_CHECK(qg_check_tensor(ctx, fn, "dW", dW, QG_F32, 2, wd));
  QG_CHECK(qg_check_tensor(ctx, fn, "dR", dR, QG_F32, 2, rd));
  QG_CHECK(qg_check_tensor(ctx, fn, "dbx", dbx, QG_F32, 1, b3));
  QG_CHECK(qg_check_tensor(ctx, fn, "dbr", dbr, QG_F32, 1, b3));
  if (dh0) QG_CHECK(qg_check_tensor(ctx, fn, "dh0", dh0, QG_F32, 2, nh));
  if (dy) QG_CHECK(check_y(ctx, fn, "dy", dy, y_offset, T, N, H));
  if (dhn) QG_CHECK(qg_check_tensor(ctx, fn, "dhn", dhn, QG_F32, 2, nh));
  const qg_tensor *ts[] = {dx, dW, dR, dbx, dbr, dh0, dy, dhn, x, W, R, hs, gates, lengths};
  const char *names[] = {"dx", "dW", "dR", "dbx", "dbr", "dh0", "dy", "dhn", "x", "W", "R", "hs", "gates", "lengths"};
  int dev;
  QG_CHECK(qg_common_device(ctx, fn, &dev, 14, ts, names));
  QG_CHECK(qg_check_gru_lengths(ctx, fn, lengths, T, N));
  return QG_DISPATCH(ctx, dev, gru_backward, dx, dW, dR, dbx, dbr, dh0, dy, y_offset, dhn, x, W, R, hs, gates, lengths,
                     reverse ? 1 : 0);
}
