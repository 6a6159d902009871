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
