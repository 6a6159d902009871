/*
 * optim_cpu.c: SGD (momentum, dampening, Nesterov, weight decay) and Adam / AdamW updates of one
 * f32 parameter tensor on the CPU, with PyTorch's semantics so hyperparameters carry over.
 */
#include "internal.h"

#include <math.h>

static qg_status check_param(qg_ctx *ctx, const char *fn, const char *arg, const qg_tensor *t, const qg_tensor *like) {
  QG_CHECK(qg_check_tensor(ctx, fn, arg, t, QG_F32, like ? like->ndim : -1, like ? like->dims : NULL));
  if (t->device != QG_CPU) return qg_fail(ctx, QG_ERR_UNSUPPORTED, fn, "%s is a cuda tensor; this build's optimizers are CPU only", arg);
  return QG_OK;
}

qg_status qg_sgd_step(qg_ctx *ctx, qg_tensor *param, qg_tensor *momentum_buf, const qg_tensor *grad,
                      double lr, double momentum, double dampening, double weight_decay,
                      int nesterov, int first_step) {
  if (!ctx) return QG_ERR_ARG;
  const char *fn = __func__;
  QG_CHECK(check_param(ctx, fn, "param", param, NULL));
  QG_CHECK(check_param(ctx, fn, "grad", grad, param));
  if (momentum != 0) QG_CHECK(check_param(ctx, fn, "momentum_buf", momentum_buf, param));
  if (!(lr >= 0) || !(momentum >= 0) || !(weight_decay >= 0))
    return qg_fail(ctx, QG_ERR_ARG, fn, "lr, momentum and weight_decay must be >= 0 (got %g, %g, %g)", lr, momentum, weight_decay);
  if (nesterov && (momentum <= 0 || dampening != 0))
    return qg_fail(ctx, QG_ERR_ARG, fn, "nesterov needs momentum > 0 and dampening = 0");
  float *p = (float *)param->data, *buf = momentum != 0 ? (float *)momentum_buf->data : NULL;
  const float *g = (const float *)grad->data;
  for (int64_t i = 0; i < param->numel; i++) {
    float d = g[i] + (float)weight_decay * p[i];
    if (buf) {
      buf[i] = first_step ? d : (float)momentum * buf[i] + (float)(1.0 - dampening) * d;
      d = nesterov ? d + (float)momentum * buf[i] : buf[i];
    }
    p[i] -= (float)lr * d;
  }
  return QG_OK;
}

qg_status qg_adam_step(qg_ctx *ctx, qg_tensor *param, qg_tensor *exp_avg, qg_tensor *exp_avg_sq,
                       const qg_tensor *grad, double lr, double beta1, double beta2, double eps,
                       double weight_decay, int decoupled, int64_t step, double grad_scale) {
  if (!ctx) return QG_ERR_ARG;
  const char *fn = __func__;
  QG_CHECK(check_param(ctx, fn, "param", param, NULL));
  QG_CHECK(check_param(ctx, fn, "grad", grad, param));
  QG_CHECK(check_param(ctx, fn, "exp_avg", exp_avg, param));
  QG_CHECK(check_param(ctx, fn, "exp_avg_sq", exp_avg_sq, param));
  if (step < 1) return qg_fail(ctx, QG_ERR_ARG, fn, "step must be >= 1, got %lld", (long long)step);
  if (!(beta1 >= 0 && beta1 < 1) || !(beta2 >= 0 && beta2 < 1))
    return qg_fail(ctx, QG_ERR_ARG, fn, "betas must be in [0, 1), got (%g, %g)", beta1, beta2);
  if (!(lr >= 0) || !(eps >= 0) || !(weight_decay >= 0))
    return qg_fail(ctx, QG_ERR_ARG, fn, "lr, eps and weight_decay must be >= 0 (got %g, %g, %g)", lr, eps, weight_decay);
  const double bc1 = 1.0 - pow(beta1, (double)step), bc2 = 1.0 - pow(beta2, (double)step);
  const float step_size = (float)(lr / bc1), inv_sqrt_bc2 = (float)(1.0 / sqrt(bc2));
  const float b1 = (float)beta1, b2 = (float)beta2, wd = (float)weight_decay, gs = (float)grad_scale;
  const float decay = (float)(1.0 - lr * weight_decay);
  float *p = (float *)param->data, *m = (float *)exp_avg->data, *v = (float *)exp_avg_sq->data;
  const float *g = (const float *)grad->data;
  for (int64_t i = 0; i < param->numel; i++) {
    float gi = g[i] * gs;
    if (decoupled) p[i] *= decay;
    else gi += wd * p[i];
    m[i] = b1 * m[i] + (1.0f - b1) * gi;
    v[i] = b2 * v[i] + (1.0f - b2) * gi * gi;
    p[i] -= step_size * m[i] / (sqrtf(v[i]) * inv_sqrt_bc2 + (float)eps);
  }
  return QG_OK;
}
