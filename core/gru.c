/*
 * gru.c: front doors of the float GRU (one layer, one direction; qgru.h): argument checks (shapes,
 * dtypes, one device for every tensor, the values of lengths when they are on the host), then
 * dispatch to the device's backend (core/gru_cpu.c, kernels/gru.cu).
 *
 * qg_gru_forward_bidir / qg_gru_backward_bidir check each direction as the one-direction front
 * doors do and hand both to the backend in one call (the GPU runs them at the same time).
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

/* The tensors of one direction of a forward (everything but the device check). */
static qg_status check_forward(qg_ctx *ctx, const char *fn, qg_tensor *y, int y_offset, qg_tensor *hs, qg_tensor *gates,
                               const qg_stats *stats, const qg_tensor *x, const qg_tensor *W, const qg_tensor *R,
                               const qg_tensor *bx, const qg_tensor *br, const qg_tensor *h0, const qg_tensor *lengths) {
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
  return qg_check_gru_lengths(ctx, fn, lengths, T, N);
}

qg_status qg_gru_forward(qg_ctx *ctx, qg_tensor *y, int y_offset, qg_tensor *hs, qg_tensor *gates, const qg_stats *stats,
                         const qg_tensor *x, const qg_tensor *W, const qg_tensor *R, const qg_tensor *bx, const qg_tensor *br,
                         const qg_tensor *h0, const qg_tensor *lengths, int reverse) {
  if (!ctx) return QG_ERR_ARG;
  const char *fn = __func__;
  QG_CHECK(check_forward(ctx, fn, y, y_offset, hs, gates, stats, x, W, R, bx, br, h0, lengths));
  const qg_tensor *ts[] = {y, hs, gates, stats ? stats->range : NULL, stats ? stats->counts : NULL,
                           x, W, R, bx, br, h0, lengths};
  const char *names[] = {"y", "hs", "gates", "stats.range", "stats.counts", "x", "W", "R", "bx", "br", "h0", "lengths"};
  int dev;
  QG_CHECK(qg_common_device(ctx, fn, &dev, 12, ts, names));
  return QG_DISPATCH(ctx, dev, gru_forward, y, y_offset, hs, gates, stats, x, W, R, bx, br, h0, lengths, reverse ? 1 : 0);
}

/* The tensors of one direction of a backward (everything but the device check). */
static qg_status check_backward(qg_ctx *ctx, const char *fn, const qg_tensor *dx, const qg_tensor *dW, const qg_tensor *dR,
                                const qg_tensor *dbx, const qg_tensor *dbr, const qg_tensor *dh0, const qg_tensor *dy,
                                int y_offset, const qg_tensor *dhn, const qg_tensor *x, const qg_tensor *W,
                                const qg_tensor *R, const qg_tensor *hs, const qg_tensor *gates, const qg_tensor *lengths) {
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
  return qg_check_gru_lengths(ctx, fn, lengths, T, N);
}

qg_status qg_gru_backward(qg_ctx *ctx, qg_tensor *dx, qg_tensor *dW, qg_tensor *dR, qg_tensor *dbx, qg_tensor *dbr,
                          qg_tensor *dh0, const qg_tensor *dy, int y_offset, const qg_tensor *dhn, const qg_tensor *x,
                          const qg_tensor *W, const qg_tensor *R, const qg_tensor *hs, const qg_tensor *gates,
                          const qg_tensor *lengths, int reverse) {
  if (!ctx) return QG_ERR_ARG;
  const char *fn = __func__;
  QG_CHECK(check_backward(ctx, fn, dx, dW, dR, dbx, dbr, dh0, dy, y_offset, dhn, x, W, R, hs, gates, lengths));
  const qg_tensor *ts[] = {dx, dW, dR, dbx, dbr, dh0, dy, dhn, x, W, R, hs, gates, lengths};
  const char *names[] = {"dx", "dW", "dR", "dbx", "dbr", "dh0", "dy", "dhn", "x", "W", "R", "hs", "gates", "lengths"};
  int dev;
  QG_CHECK(qg_common_device(ctx, fn, &dev, 14, ts, names));
  return QG_DISPATCH(ctx, dev, gru_backward, dx, dW, dR, dbx, dbr, dh0, dy, y_offset, dhn, x, W, R, hs, gates, lengths,
                     reverse ? 1 : 0);
}

/* ---- both directions -------------------------------------------------------------------------- */

/* Entry d of an optional array of 2 (NULL when the array is NULL). */
#define QG_AT(a, d) ((a) ? (a)[d] : NULL)

qg_status qg_gru_forward_bidir(qg_ctx *ctx, qg_tensor *y, qg_tensor *const *hs, qg_tensor *const *gates, const qg_tensor *x,
                               const qg_tensor *const *W, const qg_tensor *const *R, const qg_tensor *const *bx,
                               const qg_tensor *const *br, const qg_tensor *const *h0, const qg_tensor *lengths) {
  if (!ctx) return QG_ERR_ARG;
  const char *fn = __func__;
  if (!hs || !W || !R || !bx || !br)
    return qg_fail(ctx, QG_ERR_ARG, fn, "hs, W, R, bx and br must be arrays of 2 tensors (one per direction), got NULL");
  int64_t H[2];
  for (int d = 0; d < 2; d++) {
    if (!R[d]) return qg_fail(ctx, QG_ERR_ARG, fn, "R[%d] is NULL", d);
    if (gates && !gates[d]) return qg_fail(ctx, QG_ERR_ARG, fn, "gates[%d] is NULL (give both directions or none)", d);
    if (h0 && !h0[d]) return qg_fail(ctx, QG_ERR_ARG, fn, "h0[%d] is NULL (give both directions or none)", d);
    H[d] = R[d]->ndim == 2 ? R[d]->dims[1] : 0;
  }
  if (H[0] != H[1]) return qg_fail(ctx, QG_ERR_ARG, fn, "R[0] has H = %lld but R[1] has H = %lld", (long long)H[0], (long long)H[1]);
  for (int d = 0; d < 2; d++)
    QG_CHECK(check_forward(ctx, fn, y, d * (int)H[0], hs[d], QG_AT(gates, d), NULL, x, W[d], R[d], bx[d], br[d],
                           QG_AT(h0, d), lengths));
  const qg_tensor *ts[] = {y, x, lengths, hs[0], hs[1], QG_AT(gates, 0), QG_AT(gates, 1), W[0], W[1], R[0], R[1],
                           bx[0], bx[1], br[0], br[1], QG_AT(h0, 0), QG_AT(h0, 1)};
  const char *names[] = {"y", "x", "lengths", "hs[0]", "hs[1]", "gates[0]", "gates[1]", "W[0]", "W[1]", "R[0]", "R[1]",
                         "bx[0]", "bx[1]", "br[0]", "br[1]", "h0[0]", "h0[1]"};
  int dev;
  QG_CHECK(qg_common_device(ctx, fn, &dev, 17, ts, names));
  return QG_DISPATCH(ctx, dev, gru_forward_bidir, y, hs, gates, x, W, R, bx, br, h0, lengths);
}

qg_status qg_gru_backward_bidir(qg_ctx *ctx, qg_tensor *dx, qg_tensor *const *dW, qg_tensor *const *dR, qg_tensor *const *dbx,
                                qg_tensor *const *dbr, qg_tensor *const *dh0, const qg_tensor *dy, const qg_tensor *const *dhn,
                                const qg_tensor *x, const qg_tensor *const *W, const qg_tensor *const *R,
                                const qg_tensor *const *hs, const qg_tensor *const *gates, const qg_tensor *lengths) {
  if (!ctx) return QG_ERR_ARG;
  const char *fn = __func__;
  if (!dW || !dR || !dbx || !dbr || !W || !R || !hs || !gates)
    return qg_fail(ctx, QG_ERR_ARG, fn, "dW, dR, dbx, dbr, W, R, hs and gates must be arrays of 2 tensors (one per direction), got NULL");
  int64_t H[2];
  for (int d = 0; d < 2; d++) {
    if (!R[d]) return qg_fail(ctx, QG_ERR_ARG, fn, "R[%d] is NULL", d);
    if (dh0 && !dh0[d]) return qg_fail(ctx, QG_ERR_ARG, fn, "dh0[%d] is NULL (give both directions or none)", d);
    if (dhn && !dhn[d]) return qg_fail(ctx, QG_ERR_ARG, fn, "dhn[%d] is NULL (give both directions or none)", d);
    H[d] = R[d]->ndim == 2 ? R[d]->dims[1] : 0;
  }
  if (H[0] != H[1]) return qg_fail(ctx, QG_ERR_ARG, fn, "R[0] has H = %lld but R[1] has H = %lld", (long long)H[0], (long long)H[1]);
  for (int d = 0; d < 2; d++)
    QG_CHECK(check_backward(ctx, fn, dx, dW[d], dR[d], dbx[d], dbr[d], QG_AT(dh0, d), dy, d * (int)H[0], QG_AT(dhn, d), x,
                            W[d], R[d], hs[d], gates[d], lengths));
  const qg_tensor *ts[] = {dx, dy, x, lengths, dW[0], dW[1], dR[0], dR[1], dbx[0], dbx[1], dbr[0], dbr[1], QG_AT(dh0, 0),
                           QG_AT(dh0, 1), QG_AT(dhn, 0), QG_AT(dhn, 1), W[0], W[1], R[0], R[1], hs[0], hs[1], gates[0], gates[1]};
  const char *names[] = {"dx", "dy", "x", "lengths", "dW[0]", "dW[1]", "dR[0]", "dR[1]", "dbx[0]", "dbx[1]", "dbr[0]",
                         "dbr[1]", "dh0[0]", "dh0[1]", "dhn[0]", "dhn[1]", "W[0]", "W[1]", "R[0]", "R[1]", "hs[0]", "hs[1]",
                         "gates[0]", "gates[1]"};
  int dev;
  QG_CHECK(qg_common_device(ctx, fn, &dev, 24, ts, names));
  return QG_DISPATCH(ctx, dev, gru_backward_bidir, dx, dW, dR, dbx, dbr, dh0, dy, dhn, x, W, R, hs, gates, lengths);
}
