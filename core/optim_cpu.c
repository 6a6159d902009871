/*
 * optim_cpu.c: the CPU backends of the optimizers (front doors in optim.c): SGD (momentum,
 * dampening, Nesterov, weight decay) and Adam / AdamW with PyTorch's semantics, per tensor and
 * fused over a parameter arena. Both forms run the same per-element code (sgd_range, adam_range),
 * so the fused step is bit-identical to one per-tensor call per parameter with the same clip factor.
 */
#include "backend.h"

#include <math.h>

/* SGD over n elements; gs multiplies the gradient first (1 = unchanged, exactly). */
static void sgd_range(float *p, float *buf, const float *g, int64_t n, float gs, double lr, double momentum,
                      double dampening, double weight_decay, int nesterov, int first_step) {
  const float wd = (float)weight_decay, mom = (float)momentum, damp = (float)(1.0 - dampening), step = (float)lr;
  for (int64_t i = 0; i < n; i++) {
    float d = g[i] * gs + wd * p[i];
    if (buf) {
      buf[i] = first_step ? d : mom * buf[i] + damp * d;
      d = nesterov ? d + mom * buf[i] : buf[i];
    }
    p[i] -= step * d;
  }
}

/* Adam / AdamW over n elements; gs multiplies the gradient first. */
static void adam_range(float *p, float *m, float *v, const float *g, int64_t n, float gs, double lr, double beta1,
                       double beta2, double eps, double weight_decay, int decoupled, int64_t step) {
  const double bc1 = 1.0 - pow(beta1, (double)step), bc2 = 1.0 - pow(beta2, (double)step);
  const float step_size = (float)(lr / bc1), inv_sqrt_bc2 = (float)(1.0 / sqrt(bc2));
  const float b1 = (float)beta1, b2 = (float)beta2, wd = (float)weight_decay, e = (float)eps;
  const float decay = (float)(1.0 - lr * weight_decay);
  for (int64_t i = 0; i < n; i++) {
    float gi = g[i] * gs;
    if (decoupled) p[i] *= decay;
    else gi += wd * p[i];
    m[i] = b1 * m[i] + (1.0f - b1) * gi;
    v[i] = b2 * v[i] + (1.0f - b2) * gi * gi;
    p[i] -= step_size * m[i] / (sqrtf(v[i]) * inv_sqrt_bc2 + e);
  }
}

qg_status qg_cpu_sgd_step(qg_ctx *ctx, qg_tensor *param, qg_tensor *momentum_buf, const qg_tensor *grad,
                          double lr, double momentum, double dampening, double weight_decay,
                          int nesterov, int first_step) {
  (void)ctx;
  sgd_range((float *)param->data, momentum_buf ? (float *)momentum_buf->data : NULL, (const float *)grad->data,
            param->numel, 1.0f, lr, momentum, dampening, weight_decay, nesterov, first_step);
  return QG_OK;
}

qg_status qg_cpu_adam_step(qg_ctx *ctx, qg_tensor *param, qg_tensor *exp_avg, qg_tensor *exp_avg_sq,
                           const qg_tensor *grad, double lr, double beta1, double beta2, double eps,
                           double weight_decay, int decoupled, int64_t step, double grad_scale) {
  (void)ctx;
  adam_range((float *)param->data, (float *)exp_avg->data, (float *)exp_avg_sq->data, (const float *)grad->data,
             param->numel, (float)grad_scale, lr, beta1, beta2, eps, weight_decay, decoupled, step);
  return QG_OK;
}

/* The global gradient norm of the arena (each parameter's sum of squares in double in element
 * order, the parameters summed in order: the order of the per-tensor qg_sum_squares calls), its
 * clip factor (float, 1 when no clipping applies), and the norm written to grad_norm when given. */
static float clip_factor(const qg_tensor *grads, const qg_tensor *offsets, double max_norm, qg_tensor *grad_norm) {
  const float *g = (const float *)grads->data;
  const int64_t *o = (const int64_t *)offsets->data, K = offsets->numel - 1;
  double total = 0;
  for (int64_t k = 0; k < K; k++) {
    double s = 0;
    for (int64_t i = o[k]; i < o[k + 1]; i++) s += (double)g[i] * g[i];
    total += s;
  }
  const double norm = sqrt(total);
  if (grad_norm) *(double *)grad_norm->data = norm;
  return (max_norm >= 0 && norm > max_norm) ? (float)(max_norm / (norm + 1e-6)) : 1.0f;
}

qg_status qg_cpu_sgd_arena_step(qg_ctx *ctx, qg_tensor *grad_norm, qg_tensor *params, qg_tensor *momentum_buf,
                                const qg_tensor *grads, const qg_tensor *offsets, double lr, double momentum,
                                double dampening, double weight_decay, int nesterov, int first_step, double max_norm) {
  (void)ctx;
  const float gs = clip_factor(grads, offsets, max_norm, grad_norm);
  sgd_range((float *)params->data, momentum_buf ? (float *)momentum_buf->data : NULL, (const float *)grads->data,
            params->numel, gs, lr, momentum, dampening, weight_decay, nesterov, first_step);
  return QG_OK;
}

qg_status qg_cpu_adam_arena_step(qg_ctx *ctx, qg_tensor *grad_norm, qg_tensor *params, qg_tensor *exp_avg,
                                 qg_tensor *exp_avg_sq, const qg_tensor *grads, const qg_tensor *offsets, double lr,
                                 double beta1, double beta2, double eps, double weight_decay, int decoupled,
                                 int64_t step, double max_norm) {
  (void)ctx;
  const float gs = clip_factor(grads, offsets, max_norm, grad_norm);
  adam_range((float *)params->data, (float *)exp_avg->data, (float *)exp_avg_sq->data, (const float *)grads->data,
             params->numel, gs, lr, beta1, beta2, eps, weight_decay, decoupled, step);
  return QG_OK;
}
