/*
 * optim.cu: the CUDA backends of the optimizers (front doors in core/optim.c, CPU backends in
 * core/optim_cpu.c): SGD (momentum, dampening, Nesterov, weight decay) and Adam / AdamW, per
 * tensor and fused over a parameter arena with global gradient-norm clipping.
 *
 * Every element is updated by the CPU's float expressions in the CPU's order, with the
 * hyperparameters rounded to float on the host exactly as core/optim_cpu.c does; this file is in
 * the --fmad=false list, so no FMA contraction changes a rounding and an update equals the CPU's
 * bit for bit given the same clip factor.
 *
 * The arena step is two launches and no host round trip: (1) per-block partial sums of g^2 in
 * double over a grid fixed by the arena size; (2) the update, where every block first adds the
 * partials in the same fixed order (reduce.cuh), takes the norm and the clip factor (the CPU's
 * double formula), block 0 writes the norm to the grad_norm tensor, and all blocks update their
 * elements. With no clipping and no grad_norm output, (1) is skipped. The norm equals the CPU's up
 * to the order of the double sum.
 */
#include "cuda_common.cuh"
#include "reduce.cuh"

#include <math.h>

/* The float hyperparameters of core/optim_cpu.c's sgd_range / adam_range, rounded the same way. */
struct sgd_hyper {
  float wd, mom, damp, step;
  int nesterov, first_step;
};

struct adam_hyper {
  float step_size, inv_sqrt_bc2, b1, b2, wd, e, decay;
  int decoupled;
};

static sgd_hyper make_sgd(double lr, double momentum, double dampening, double weight_decay, int nesterov, int first_step) {
  sgd_hyper h;
  h.wd = (float)weight_decay; h.mom = (float)momentum; h.damp = (float)(1.0 - dampening); h.step = (float)lr;
  h.nesterov = nesterov; h.first_step = first_step;
  return h;
}

static adam_hyper make_adam(double lr, double beta1, double beta2, double eps, double weight_decay, int decoupled, int64_t step) {
  const double bc1 = 1.0 - pow(beta1, (double)step), bc2 = 1.0 - pow(beta2, (double)step);
  adam_hyper h;
  h.step_size = (float)(lr / bc1); h.inv_sqrt_bc2 = (float)(1.0 / sqrt(bc2));
  h.b1 = (float)beta1; h.b2 = (float)beta2; h.wd = (float)weight_decay; h.e = (float)eps;
  h.decay = (float)(1.0 - lr * weight_decay);
  h.decoupled = decoupled;
  return h;
}

/* One element of SGD (buf NULL without momentum); gs multiplies the gradient first. */
__device__ __forceinline__ void sgd_update(float *p, float *buf, const float *g, int64_t i, float gs, const sgd_hyper &h) {
  float d = g[i] * gs + h.wd * p[i];
  if (buf) {
    buf[i] = h.first_step ? d : h.mom * buf[i] + h.damp * d;
    d = h.nesterov ? d + h.mom * buf[i] : buf[i];
  }
  p[i] -= h.step * d;
}

/* One element of Adam / AdamW; gs multiplies the gradient first. */
__device__ __forceinline__ void adam_update(float *p, float *m, float *v, const float *g, int64_t i, float gs, const adam_hyper &h) {
  float gi = g[i] * gs;
  if (h.decoupled) p[i] *= h.decay;
  else gi += h.wd * p[i];
  m[i] = h.b1 * m[i] + (1.0f - h.b1) * gi;
  v[i] = h.b2 * v[i] + (1.0f - h.b2) * gi * gi;
  p[i] -= h.step_size * m[i] / (sqrtf(v[i]) * h.inv_sqrt_bc2 + h.e);
}

/* The clip factor of the arena from the g^2 partial sums (NULL: none, factor 1); block 0 writes
 * the norm to grad_norm when given. Every thread of the block calls it and gets the factor. */
__device__ __forceinline__ float arena_clip_factor(const double *partials, int nparts, double max_norm, double *grad_norm) {
  __shared__ double shared[32];
  if (!partials) return 1.0f;
  double s = 0;
  for (int i = threadIdx.x; i < nparts; i += blockDim.x) s += partials[i];
  const double norm = sqrt(qg_block_sum(s, shared));
  if (grad_norm && blockIdx.x == 0 && threadIdx.x == 0) *grad_norm = norm;
  return (max_norm >= 0 && norm > max_norm) ? (float)(max_norm / (norm + 1e-6)) : 1.0f;
}

__global__ void sgd_step_kernel(float *p, float *buf, const float *g, int64_t n, sgd_hyper h, const double *partials, int nparts,
                                double max_norm, double *grad_norm) {
  const float gs = arena_clip_factor(partials, nparts, max_norm, grad_norm);
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
    sgd_update(p, buf, g, i, gs, h);
}

__global__ void adam_step_kernel(float *p, float *m, float *v, const float *g, int64_t n, adam_hyper h, float grad_scale,
                                 const double *partials, int nparts, double max_norm, double *grad_norm) {
  const float gs = partials ? arena_clip_factor(partials, nparts, max_norm, grad_norm) : grad_scale;
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
    adam_update(p, m, v, g, i, gs, h);
}

extern "C" qg_status qg_cuda_sgd_step(qg_ctx *ctx, qg_tensor *param, qg_tensor *momentum_buf, const qg_tensor *grad, double lr,
                                      double momentum, double dampening, double weight_decay, int nesterov, int first_step) {
  const int64_t n = param->numel;
  if (n == 0) return QG_OK;
  sgd_step_kernel<<<qg_grid(n), QG_THREADS, 0, qg_cuda_stream(ctx)>>>(
      (float *)param->data, momentum_buf ? (float *)momentum_buf->data : NULL, (const float *)grad->data, n,
      make_sgd(lr, momentum, dampening, weight_decay, nesterov, first_step), NULL, 0, -1.0, NULL);
  return qg_cuda_launched(ctx, "qg_sgd_step");
}

extern "C" qg_status qg_cuda_adam_step(qg_ctx *ctx, qg_tensor *param, qg_tensor *exp_avg, qg_tensor *exp_avg_sq,
                                       const qg_tensor *grad, double lr, double beta1, double beta2, double eps,
                                       double weight_decay, int decoupled, int64_t step, double grad_scale) {
  const int64_t n = param->numel;
  if (n == 0) return QG_OK;
  adam_step_kernel<<<qg_grid(n), QG_THREADS, 0, qg_cuda_stream(ctx)>>>(
      (float *)param->data, (float *)exp_avg->data, (float *)exp_avg_sq->data, (const float *)grad->data, n,
      make_adam(lr, beta1, beta2, eps, weight_decay, decoupled, step), (float)grad_scale, NULL, 0, -1.0, NULL);
  return qg_cuda_launched(ctx, "qg_adam_step");
}

/* Launch (1) of an arena step when the norm is needed (clipping on, or grad_norm asked for):
 * *partials gets the device address of the per-block sums, *nparts their count; else NULL, 0. */
static qg_status arena_norm(qg_ctx *ctx, const char *fn, const qg_tensor *grads, const qg_tensor *grad_norm, double max_norm,
                            double **partials, int *nparts) {
  *partials = NULL;
  *nparts = 0;
  if (max_norm < 0 && !grad_norm) return QG_OK;
  const int64_t n = grads->numel;
  const unsigned blocks = qg_grid(n);
  QG_CHECK(qg_dev_workspace(ctx, fn, (int64_t)blocks * (int64_t)sizeof(double), (void **)partials));
  sum_squares_partial_kernel<float><<<blocks, QG_THREADS, 0, qg_cuda_stream(ctx)>>>(*partials, (const float *)grads->data, n);
  *nparts = (int)blocks;
  return qg_cuda_launched(ctx, fn);
}

extern "C" qg_status qg_cuda_sgd_arena_step(qg_ctx *ctx, qg_tensor *grad_norm, qg_tensor *params, qg_tensor *momentum_buf,
                                            const qg_tensor *grads, const qg_tensor *offsets, double lr, double momentum,
                                            double dampening, double weight_decay, int nesterov, int first_step, double max_norm) {
  (void)offsets;   /* the slices matter only for the CPU's summation order */
  const char *fn = "qg_sgd_arena_step";
  double *partials;
  int nparts;
  QG_CHECK(arena_norm(ctx, fn, grads, grad_norm, max_norm, &partials, &nparts));
  const int64_t n = params->numel;
  sgd_step_kernel<<<qg_grid(n), QG_THREADS, 0, qg_cuda_stream(ctx)>>>(
      (float *)params->data, momentum_buf ? (float *)momentum_buf->data : NULL, (const float *)grads->data, n,
      make_sgd(lr, momentum, dampening, weight_decay, nesterov, first_step), partials, nparts, max_norm,
      grad_norm ? (double *)grad_norm->data : NULL);
  return qg_cuda_launched(ctx, fn);
}

extern "C" qg_status qg_cuda_adam_arena_step(qg_ctx *ctx, qg_tensor *grad_norm, qg_tensor *params, qg_tensor *exp_avg,
                                             qg_tensor *exp_avg_sq, const qg_tensor *grads, const qg_tensor *offsets, double lr,
                                             double beta1, double beta2, double eps, double weight_decay, int decoupled,
                                             int64_t step, double max_norm) {
  (void)offsets;
  const char *fn = "qg_adam_arena_step";
  double *partials;
  int nparts;
  QG_CHECK(arena_norm(ctx, fn, grads, grad_norm, max_norm, &partials, &nparts));
  const int64_t n = params->numel;
  adam_step_kernel<<<qg_grid(n), QG_THREADS, 0, qg_cuda_stream(ctx)>>>(
      (float *)params->data, (float *)exp_avg->data, (float *)exp_avg_sq->data, (const float *)grads->data, n,
      make_adam(lr, beta1, beta2, eps, weight_decay, decoupled, step), 1.0f, partials, nparts, max_norm,
      grad_norm ? (double *)grad_norm->data : NULL);
  return qg_cuda_launched(ctx, fn);
}
