/*
 * linear_cpu.c: the CPU backend of the fully connected layer y = x W^T + b (CBLAS) and its
 * backward. Arguments were checked by the front doors in linear.c.
 */
#include "backend.h"

#include <cblas.h>

qg_status qg_cpu_linear_forward(qg_ctx *ctx, qg_tensor *y, const qg_tensor *x, const qg_tensor *W, const qg_tensor *b) {
  (void)ctx;
  const int64_t N = x->dims[0], O = W->dims[0], In = W->dims[1];
  float *yp = (float *)y->data;
  if (b) {
    const float *bp = (const float *)b->data;
    for (int64_t n = 0; n < N; n++) for (int64_t o = 0; o < O; o++) yp[n * O + o] = bp[o];
  }
  if (N > 0 && O > 0 && In > 0)
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)N, (int)O, (int)In, 1.0f, (const float *)x->data, (int)In,
                (const float *)W->data, (int)In, b ? 1.0f : 0.0f, yp, (int)O);
  else if (!b)
    for (int64_t i = 0; i < N * O; i++) yp[i] = 0.0f;
  return QG_OK;
}

qg_status qg_cpu_linear_backward(qg_ctx *ctx, qg_tensor *dx, qg_tensor *dW, qg_tensor *db,
                                 const qg_tensor *dy, const qg_tensor *x, const qg_tensor *W) {
  (void)ctx;
  const int64_t N = x->dims[0], O = W->dims[0], In = W->dims[1];
  const float *dyp = (const float *)dy->data;
  if (N > 0 && O > 0 && In > 0) {
    if (dx)
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)N, (int)In, (int)O, 1.0f, dyp, (int)O,
                  (const float *)W->data, (int)In, 0.0f, (float *)dx->data, (int)In);
    if (dW)
      cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, (int)O, (int)In, (int)N, 1.0f, dyp, (int)O,
                  (const float *)x->data, (int)In, 1.0f, (float *)dW->data, (int)In);
  } else if (dx) {
    for (int64_t i = 0; i < N * In; i++) ((float *)dx->data)[i] = 0.0f;
  }
  if (db) {
    float *dbp = (float *)db->data;
    for (int64_t n = 0; n < N; n++) for (int64_t o = 0; o < O; o++) dbp[o] += dyp[n * O + o];
  }
  return QG_OK;
}
