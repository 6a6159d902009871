/*
 * optim.c: front doors of the optimizers (qgru.h): SGD and Adam / AdamW, per parameter tensor
 * (qg_sgd_step, qg_adam_step: the reference) and fused over a parameter arena with global
 * gradient-norm clipping (qg_sgd_arena_step, qg_adam_arena_step: one call per training step).
 * Checks hyperparameters, shapes and devices once, then dispatches to the device's backend
 * (core/optim_cpu.c, kernels/optim.cu).
 */
#include "backend.h"

#include <math.h>

static qg_status check_like(qg_ctx *ctx, const char *fn, const char *arg, const qg_tensor *t, const qg_tensor *like) {
  return qg_check_tensor(ctx, fn, arg, t, QG_F32, like ? like->ndim : -1, like ? like->dims : NULL);
}

static qg_status check_sgd_hyper(qg_ctx *ctx, const char *fn, double lr, double momentum, double dampening,
                                 double weight_decay, int nesterov) {
  if (!(lr >= 0) || !(momentum >= 0) || !(weight_decay >= 0) || !(dampening == dampening))
    return qg_fail(ctx, QG_ERR_ARG, fn, "lr, momentum and weight_decay must be >= 0 and dampening a number (got %g, %g, %g, %g)",
                   lr, momentum, weight_decay, dampening);
  if (nesterov && (momentum <= 0 || dampening != 0))
    return qg_fail(ctx, QG_ERR_ARG, fn, "nesterov needs momentum > 0 and dampening = 0");
  return QG_OK;
}

static qg_status check_adam_hyper(qg_ctx *ctx, const char *fn, double lr, double beta1, double beta2, double eps,
                                  double weight_decay, int64_t step) {
  if (step < 1) return qg_fail(ctx, QG_ERR_ARG, fn, "step must be >= 1, got %lld", (long long)step);
  if (!(beta1 >= 0 && beta1 < 1) || !(beta2 >= 0 && beta2 < 1))
    return qg_fail(ctx, QG_ERR_ARG, fn, "betas must be in [0, 1), got (%g, %g)", beta1, beta2);
  if (!(lr >= 0) || !(eps >= 0) || !(weight_decay >= 0))
    return qg_fail(ctx, QG_ERR_ARG, fn, "lr, eps and weight_decay must be >= 0 (got %g, %g, %g)", lr, eps, weight_decay);
  return QG_OK;
}

qg_status qg_sgd_step(qg_ctx *ctx, qg_tensor *param, qg_tensor *momentum_buf, const qg_tensor *grad,
                      double lr, double momentum, double dampening, double weight_decay,
                      int nesterov, int first_step) {
  if (!ctx) return QG_ERR_ARG;
  const char *fn = __func__;
  QG_CHECK(check_like(ctx, fn, "param", param, NULL));
  QG_CHECK(check_like(ctx, fn, "grad", grad, param));
  if (momentum != 0) QG_CHECK(check_like(ctx, fn, "momentum_buf", momentum_buf, param));
  else momentum_buf = NULL;
  QG_CHECK(check_sgd_hyper(ctx, fn, lr, momentum, dampening, weight_decay, nesterov));
  const qg_tensor *ts[] = {param, momentum_buf, grad};
  const char *names[] = {"param", "momentum_buf", "grad"};
  int dev;
  QG_CHECK(qg_common_device(ctx, fn, &dev, 3, ts, names));
  return QG_DISPATCH(ctx, dev, sgd_step, param, momentum_buf, grad, lr, momentum, dampening, weight_decay, nesterov,
                     first_step ? 1 : 0);
}

qg_status qg_adam_step(qg_ctx *ctx, qg_tensor *param, qg_tensor *exp_avg, qg_tensor *exp_avg_sq,
                       const qg_tensor *grad, double lr, double beta1, double beta2, double eps,
                       double weight_decay, int decoupled, int64_t step, double grad_scale) {
  if (!ctx) return QG_ERR_ARG;
  const char *fn = __func__;
  QG_CHECK(check_like(ctx, fn, "param", param, NULL));
  QG_CHECK(check_like(ctx, fn, "grad", grad, param));
  QG_CHECK(check_like(ctx, fn, "exp_avg", exp_avg, param));
  QG_CHECK(check_like(ctx, fn, "exp_avg_sq", exp_avg_sq, param));
  QG_CHECK(check_adam_hyper(ctx, fn, lr, beta1, beta2, eps, weight_decay, step));
  if (!isfinite(grad_scale)) return qg_fail(ctx, QG_ERR_ARG, fn, "grad_scale must be finite, got %g", grad_scale);
  const qg_tensor *ts[] = {param, exp_avg, exp_avg_sq, grad};
  const char *names[] = {"param", "exp_avg", "exp_avg_sq", "grad"};
  int dev;
  QG_CHECK(qg_common_device(ctx, fn, &dev, 4, ts, names));
  return QG_DISPATCH(ctx, dev, adam_step, param, exp_avg, exp_avg_sq, grad, lr, beta1, beta2, eps, weight_decay,
                     decoupled ? 1 : 0, step, grad_scale);
}

/* The arena arguments: params f32 [P], grads f32 [P], grad_norm f64 [1] or NULL, offsets i64 [K+1] on
 * the CPU with 0 = o_0 <= o_1 <= ... <= o_K = P, and max_norm (>= 0, or negative for no clipping). */
static qg_status check_arena(qg_ctx *ctx, const char *fn, const qg_tensor *grad_norm, const qg_tensor *params,
                             const qg_tensor *grads, const qg_tensor *offsets, double max_norm) {
  QG_CHECK(qg_check_tensor(ctx, fn, "params", params, QG_F32, 1, NULL));
  QG_CHECK(qg_check_tensor(ctx, fn, "grads", grads, QG_F32, 1, params->dims));
  if (grad_norm) {
    int64_t one[1] = {1};
    QG_CHECK(qg_check_tensor(ctx, fn, "grad_norm", grad_norm, QG_F64, 1, one));
  }
  QG_CHECK(qg_check_tensor(ctx, fn, "offsets", offsets, QG_I64, 1, NULL));
  if (offsets->device != QG_CPU)
    return qg_fail(ctx, QG_ERR_DEVICE, fn, "offsets must be a cpu tensor (the arena's layout, read by the host), got a cuda tensor");
  const int64_t *o = (const int64_t *)offsets->data, K = offsets->numel - 1;
  if (K < 1) return qg_fail(ctx, QG_ERR_ARG, fn, "offsets needs at least 2 entries (one parameter), got %lld", (long long)offsets->numel);
  if (o[0] != 0 || o[K] != params->numel)
    return qg_fail(ctx, QG_ERR_ARG, fn, "offsets must run from 0 to the arena size %lld, got %lld .. %lld",
                   (long long)params->numel, (long long)o[0], (long long)o[K]);
  for (int64_t k = 0; k < K; k++)
    if (o[k + 1] < o[k])
      return qg_fail(ctx, QG_ERR_ARG, fn, "offsets must not decrease: offsets[%lld] = %lld > offsets[%lld] = %lld",
                     (long long)k, (long long)o[k], (long long)(k + 1), (long long)o[k + 1]);
  if (max_norm != max_norm) return qg_fail(ctx, QG_ERR_ARG, fn, "max_norm is NaN (use a negative value for no clipping)");
  return QG_OK;
}

qg_status qg_sgd_arena_step(qg_ctx *ctx, qg_tensor *grad_norm, qg_tensor *params, qg_tensor *momentum_buf,
                            const qg_tensor *grads, const qg_tensor *offsets, double lr, double momentum,
                            double dampening, double weight_decay, int nesterov, int first_step, double max_norm) {
  if (!ctx) return QG_ERR_ARG;
  const char *fn = __func__;
  QG_CHECK(check_arena(ctx, fn, grad_norm, params, grads, offsets, max_norm));
  if (momentum != 0) QG_CHECK(check_like(ctx, fn, "momentum_buf", momentum_buf, params));
  else momentum_buf = NULL;
  QG_CHECK(check_sgd_hyper(ctx, fn, lr, momentum, dampening, weight_decay, nesterov));
  const qg_tensor *ts[] = {grad_norm, params, momentum_buf, grads};
  const char *names[] = {"grad_norm", "params", "momentum_buf", "grads"};
  int dev;
  QG_CHECK(qg_common_device(ctx, fn, &dev, 4, ts, names));
  return QG_DISPATCH(ctx, dev, sgd_arena_step, grad_norm, params, momentum_buf, grads, offsets, lr, momentum, dampening,
                     weight_decay, nesterov, first_step ? 1 : 0, max_norm);
}

qg_status qg_adam_arena_step(qg_ctx *ctx, qg_tensor *grad_norm, qg_tensor *params, qg_tensor *exp_avg,
                             qg_tensor *exp_avg_sq, const qg_tensor *grads, const qg_tensor *offsets, double lr,
                             double beta1, double beta2, double eps, double weight_decay, int decoupled,
                             int64_t step, double max_norm) {
  if (!ctx) return QG_ERR_ARG;
  const char *fn = __func__;
  QG_CHECK(check_arena(ctx, fn, grad_norm, params, grads, offsets, max_norm));
  QG_CHECK(check_like(ctx, fn, "exp_avg", exp_avg, params));
  QG_CHECK(check_like(ctx, fn, "exp_avg_sq", exp_avg_sq, params));
  QG_CHECK(check_adam_hyper(ctx, fn, lr, beta1, beta2, eps, weight_decay, step));
  const qg_tensor *ts[] = {grad_norm, params, exp_avg, exp_avg_sq, grads};
  const char *names[] = {"grad_norm", "params", "exp_avg", "exp_avg_sq", "grads"};
  int dev;
  QG_CHECK(qg_common_device(ctx, fn, &dev, 5, ts, names));
  return QG_DISPATCH(ctx, dev, adam_arena_step, grad_norm, params, exp_avg, exp_avg_sq, grads, offsets, lr, beta1, beta2,
                     eps, weight_decay, decoupled ? 1 : 0, step, max_norm);
}
