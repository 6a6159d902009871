/*
 * backend_ops.h: the list of backend functions, one QG_OP(name, (parameters), (arguments)) per
 * operation; see backend.h. Included several times (no include guard). The parameters follow the
 * public front door of the same name in qgru.h (whose comment documents every shape), after the
 * front door has resolved its options; the first parameter is always qg_ctx *ctx.
 */
QG_OP(linear_forward, (qg_ctx *ctx, qg_tensor *y, const qg_tensor *x, const qg_tensor *W, const qg_tensor *b),
      (ctx, y, x, W, b))
QG_OP(linear_backward, (qg_ctx *ctx, qg_tensor *dx, qg_tensor *dW, qg_tensor *db, const qg_tensor *dy, const qg_tensor *x,
                        const qg_tensor *W),
      (ctx, dx, dW, db, dy, x, W))
QG_OP(gru_forward, (qg_ctx *ctx, qg_tensor *y, int y_offset, qg_tensor *hs, qg_tensor *gates, const qg_stats *stats,
                    const qg_tensor *x, const qg_tensor *W, const qg_tensor *R, const qg_tensor *bx, const qg_tensor *br,
                    const qg_tensor *h0, const qg_tensor *lengths, int reverse),
      (ctx, y, y_offset, hs, gates, stats, x, W, R, bx, br, h0, lengths, reverse))
QG_OP(gru_backward, (qg_ctx *ctx, qg_tensor *dx, qg_tensor *dW, qg_tensor *dR, qg_tensor *dbx, qg_tensor *dbr,
                     qg_tensor *dh0, const qg_tensor *dy, int y_offset, const qg_tensor *dhn, const qg_tensor *x,
                     const qg_tensor *W, const qg_tensor *R, const qg_tensor *hs, const qg_tensor *gates,
                     const qg_tensor *lengths, int reverse),
      (ctx, dx, dW, dR, dbx, dbr, dh0, dy, y_offset, dhn, x, W, R, hs, gates, lengths, reverse))
QG_OP(gru_forward_bidir, (qg_ctx *ctx, qg_tensor *y, qg_tensor *const *hs, qg_tensor *const *gates, const qg_tensor *x,
                          const qg_tensor *const *W, const qg_tensor *const *R, const qg_tensor *const *bx,
                          const qg_tensor *const *br, const qg_tensor *const *h0, const qg_tensor *lengths),
      (ctx, y, hs, gates, x, W, R, bx, br, h0, lengths))
QG_OP(gru_backward_bidir, (qg_ctx *ctx, qg_tensor *dx, qg_tensor *const *dW, qg_tensor *const *dR, qg_tensor *const *dbx,
                           qg_tensor *const *dbr, qg_tensor *const *dh0, const qg_tensor *dy, const qg_tensor *const *dhn,
                           const qg_tensor *x, const qg_tensor *const *W, const qg_tensor *const *R,
                           const qg_tensor *const *hs, const qg_tensor *const *gates, const qg_tensor *lengths),
      (ctx, dx, dW, dR, dbx, dbr, dh0, dy, dhn, x, W, R, hs, gates, lengths))
QG_OP(int_gru_quantize_weights, (qg_ctx *ctx, qg_int_gru *g, const qg_tensor *W, const qg_tensor *R, const qg_tensor *bx,
                                 const qg_tensor *br),
      (ctx, g, W, R, bx, br))
QG_OP(int_gru_forward, (qg_ctx *ctx, qg_int_gru *g, qg_tensor *y, int y_offset, qg_tensor *hn, const qg_int_gru_saved *saved,
                        const qg_stats *stats, const qg_tensor *x, const qg_tensor *h0, const qg_tensor *lengths, int reverse),
      (ctx, g, y, y_offset, hn, saved, stats, x, h0, lengths, reverse))
QG_OP(int_gru_backward, (qg_ctx *ctx, qg_int_gru *g, qg_tensor *dx, qg_tensor *dW, qg_tensor *dR, qg_tensor *dbx, qg_tensor *dbr,
                         qg_tensor *dh0, const qg_tensor *dy, int y_offset, const qg_tensor *dhn, const qg_int_gru_saved *saved,
                         const qg_tensor *h0, const qg_tensor *lengths, int reverse),
      (ctx, g, dx, dW, dR, dbx, dbr, dh0, dy, y_offset, dhn, saved, h0, lengths, reverse))
/* Both directions, after the front door checked both and quantized both layers' weights. */
QG_OP(int_gru_forward_bidir, (qg_ctx *ctx, qg_int_gru *const *g, qg_tensor *y, qg_tensor *const *hn,
                              const qg_int_gru_saved *const *saved, const qg_tensor *x, const qg_tensor *const *h0,
                              const qg_tensor *lengths),
      (ctx, g, y, hn, saved, x, h0, lengths))
QG_OP(int_gru_backward_bidir, (qg_ctx *ctx, qg_int_gru *const *g, qg_tensor *dx, qg_tensor *const *dW, qg_tensor *const *dR,
                               qg_tensor *const *dbx, qg_tensor *const *dbr, qg_tensor *const *dh0, const qg_tensor *dy,
                               const qg_tensor *const *dhn, const qg_int_gru_saved *const *saved, const qg_tensor *const *h0,
                               const qg_tensor *lengths),
      (ctx, g, dx, dW, dR, dbx, dbr, dh0, dy, dhn, saved, h0, lengths))
QG_OP(stats_add, (qg_ctx *ctx, const qg_stats *stats, int row, const qg_tensor *values), (ctx, stats, row, values))
/* range: host memory, [rows, 2] doubles: min and max of each row of w (f32 [rows, cols]), NaN ignored
 * (a row of NaNs gives +inf, -inf). The backend copies the result to the host before it returns. */
QG_OP(channel_minmax, (qg_ctx *ctx, double *range, const qg_tensor *w), (ctx, range, w))
/* n jobs (1..QG_W_NUM), job i: exps[i], zps[i] [rows] i32 on w[i]'s device (f32 [rows, cols] or
 * [rows]): (e, z) of each row by the minmax rule (quant_math.h qg_minmax_rule) with bitwidth[i],
 * is_symmetric[i], is_unsigned[i], on the row's min and max (NaN ignored; a row of NaNs is
 * degenerate). Ordered on the context's stream, one launch; no host synchronisation on a GPU. */
QG_OP(channel_minmax_quant, (qg_ctx *ctx, int n, int32_t *const *exps, int32_t *const *zps, const qg_tensor *const *w,
                             const int *bitwidth, const int *is_symmetric, const int *is_unsigned),
      (ctx, n, exps, zps, w, bitwidth, is_symmetric, is_unsigned))
QG_OP(fake_quant, (qg_ctx *ctx, qg_tensor *fq, qg_tensor *codes, qg_tensor *mask, const qg_tensor *x, const qg_tensor *exps,
                   const qg_tensor *zps, int bitwidth, int is_unsigned),
      (ctx, fq, codes, mask, x, exps, zps, bitwidth, is_unsigned))
QG_OP(cross_entropy, (qg_ctx *ctx, double *loss, qg_tensor *dlogits, const qg_tensor *logits, const qg_tensor *target,
                      double scale),
      (ctx, loss, dlogits, logits, target, scale))
QG_OP(count_correct, (qg_ctx *ctx, int64_t *correct, const qg_tensor *logits, const qg_tensor *target),
      (ctx, correct, logits, target))
QG_OP(mse, (qg_ctx *ctx, double *loss, qg_tensor *dpred, const qg_tensor *pred, const qg_tensor *target, double scale),
      (ctx, loss, dpred, pred, target, scale))
QG_OP(sgd_step, (qg_ctx *ctx, qg_tensor *param, qg_tensor *momentum_buf, const qg_tensor *grad, double lr, double momentum,
                 double dampening, double weight_decay, int nesterov, int first_step),
      (ctx, param, momentum_buf, grad, lr, momentum, dampening, weight_decay, nesterov, first_step))
QG_OP(adam_step, (qg_ctx *ctx, qg_tensor *param, qg_tensor *exp_avg, qg_tensor *exp_avg_sq, const qg_tensor *grad,
                  double lr, double beta1, double beta2, double eps, double weight_decay, int decoupled, int64_t step,
                  double grad_scale),
      (ctx, param, exp_avg, exp_avg_sq, grad, lr, beta1, beta2, eps, weight_decay, decoupled, step, grad_scale))
QG_OP(sgd_arena_step, (qg_ctx *ctx, qg_tensor *grad_norm, qg_tensor *params, qg_tensor *momentum_buf,
                       const qg_tensor *grads, const qg_tensor *offsets, double lr, double momentum, double dampening,
                       double weight_decay, int nesterov, int first_step, double max_norm),
      (ctx, grad_norm, params, momentum_buf, grads, offsets, lr, momentum, dampening, weight_decay, nesterov, first_step,
       max_norm))
QG_OP(adam_arena_step, (qg_ctx *ctx, qg_tensor *grad_norm, qg_tensor *params, qg_tensor *exp_avg, qg_tensor *exp_avg_sq,
                        const qg_tensor *grads, const qg_tensor *offsets, double lr, double beta1, double beta2,
                        double eps, double weight_decay, int decoupled, int64_t step, double max_norm),
      (ctx, grad_norm, params, exp_avg, exp_avg_sq, grads, offsets, lr, beta1, beta2, eps, weight_decay, decoupled, step,
       max_norm))
QG_OP(axpy, (qg_ctx *ctx, qg_tensor *y, double alpha, const qg_tensor *x), (ctx, y, alpha, x))
QG_OP(scale, (qg_ctx *ctx, qg_tensor *t, double alpha), (ctx, t, alpha))
QG_OP(sum_squares, (qg_ctx *ctx, double *out, const qg_tensor *t), (ctx, out, t))
QG_OP(argmax_rows, (qg_ctx *ctx, qg_tensor *out, const qg_tensor *x), (ctx, out, x))
QG_OP(index_select, (qg_ctx *ctx, qg_tensor *out, const qg_tensor *src, const qg_tensor *index), (ctx, out, src, index))
QG_OP(transpose01, (qg_ctx *ctx, qg_tensor *out, const qg_tensor *src), (ctx, out, src))
QG_OP(fill, (qg_ctx *ctx, qg_tensor *t, double value), (ctx, t, value))
QG_OP(convert, (qg_ctx *ctx, qg_tensor *dst, const qg_tensor *src), (ctx, dst, src))
QG_OP(count_nonfinite, (qg_ctx *ctx, int64_t *count, int64_t *first_index, const qg_tensor *t), (ctx, count, first_index, t))
