/*
 * int_gru_bidir.cu: both directions of a quantized bidirectional GRU layer at the same time
 * (qg_int_gru_forward_bidir / qg_int_gru_backward_bidir of core/qgru.h).
 *
 * Why: the integer forward and the STE backward of one direction use every stream, cuBLAS handle
 * and workspace of the context (the backward's row groups, side stream and after-loop products;
 * kernels/int_gru.cu, int_gru_backward.cu), so a second direction cannot simply run on the aux
 * stream as the float GRU's does (kernels/gru.cu). Instead direction 1 runs on the context's peer:
 * a second context on the same device with a full set of its own, created by the first call
 * that needs it (never per call) and destroyed with the context. Within one call the peer's
 * stream waits for everything queued on the context's stream so far (fork), and the context's
 * stream for everything queued on the peer's (join), so callers only ever see one stream. At
 * small and medium shapes one direction's recurrence is latency-bound on a part of the GPU and
 * the two directions overlap almost entirely (bench/bidir_qat.md).
 *
 * Bits: each direction runs the one-direction backend functions on its own state, so its codes,
 * outputs and parameter gradients are those of the one-direction call. The one value both
 * directions write is dx (ACCUMULATED): direction 1's goes to the context's spare buffer (zeroed
 * on the peer's stream) and is added into dx after the join, so dx = (dx + d0) + d1 as one after the
 * other gives wherever each direction adds its dx in one rounding (checked against the
 * one-direction calls bit for bit by tests/lua/int_gru_bidir_spec.lua).
 */
#include "cuda_common.cuh"
#include "../core/int_gru.h"   /* the layer's size (g->H) */

#include <cuda_runtime.h>
#include <string.h>

/* The context's peer, created on first use, with the context's settings (they may change between
 * calls: copied every call). */
static qg_status peer_of(qg_ctx *ctx, const char *fn, qg_ctx **out) {
  if (!ctx->peer) {
    qg_ctx *p = NULL;
    char why[sizeof ctx->error];
    const qg_status s = qg_ctx_create_why(&p, QG_CUDA, ctx->device_index, 0, why, sizeof why);
    if (s != QG_OK) return qg_fail(ctx, s, fn, "creating the second context for direction 1 failed: %s", why);
    ctx->peer = p;
  }
  qg_ctx *p = ctx->peer;
  if (p->math != ctx->math && qg_ctx_set_math(p, ctx->math) != QG_OK)
    return qg_fail(ctx, QG_ERR_DEVICE, fn, "direction 1's context: %s", p->error);
  p->kernel_path = ctx->kernel_path;
  p->exact_split = ctx->exact_split;
  p->persist_cluster = ctx->persist_cluster;
  p->persist_rows = ctx->persist_rows;
  p->persist_splits = ctx->persist_splits;
  p->persist_storage = ctx->persist_storage;
  *out = p;
  return QG_OK;
}

/* `to` waits for everything queued on `from` so far (one event of `from`'s context). */
static qg_status order_after(qg_ctx *ctx, const char *fn, qg_ctx *from, qg_ctx *to) {
  QG_CUDA_CHECK(ctx, fn, cudaEventRecord((cudaEvent_t)from->ev_join, qg_cuda_stream(from)));
  return qg_cuda_status(ctx, fn, cudaStreamWaitEvent(qg_cuda_stream(to), (cudaEvent_t)from->ev_join, 0));
}

/* The end of a call: the context's stream waits for the peer's (also after a failure, so that a
 * captured graph is never left forked), and the first failure is the context's, direction 1's
 * message named. */
static qg_status finish(qg_ctx *ctx, const char *fn, qg_ctx *p, qg_status s0, qg_status s1) {
  const qg_status sj = order_after(ctx, fn, p, ctx);
  if (s0 != QG_OK) return s0;
  if (s1 != QG_OK) {
    char msg[sizeof p->error];
    memcpy(msg, p->error, sizeof msg);
    return qg_fail(ctx, s1, fn, "direction 1: %s", msg);
  }
  return sj;
}

extern "C" qg_status qg_cuda_int_gru_forward_bidir(qg_ctx *ctx, qg_int_gru *const *g, qg_tensor *y, qg_tensor *const *hn,
                                                   const qg_int_gru_saved *const *saved, const qg_tensor *x,
                                                   const qg_tensor *const *h0, const qg_tensor *lengths) {
  const char *fn = "qg_int_gru_forward_bidir";
  qg_ctx *p = NULL;
  QG_CHECK(peer_of(ctx, fn, &p));
  QG_CHECK(order_after(ctx, fn, ctx, p));
  const qg_status s0 = qg_cuda_int_gru_forward(ctx, g[0], y, 0, hn ? hn[0] : NULL, saved ? saved[0] : NULL, NULL, x,
                                               h0 ? h0[0] : NULL, lengths, 0);
  const qg_status s1 = s0 != QG_OK ? QG_OK
                       : qg_cuda_int_gru_forward(p, g[1], y, (int)g[0]->H, hn ? hn[1] : NULL, saved ? saved[1] : NULL, NULL, x,
                                                 h0 ? h0[1] : NULL, lengths, 1);
  return finish(ctx, fn, p, s0, s1);
}

extern "C" qg_status qg_cuda_int_gru_backward_bidir(qg_ctx *ctx, qg_int_gru *const *g, qg_tensor *dx, qg_tensor *const *dW,
                                                    qg_tensor *const *dR, qg_tensor *const *dbx, qg_tensor *const *dbr,
                                                    qg_tensor *const *dh0, const qg_tensor *dy, const qg_tensor *const *dhn,
                                                    const qg_int_gru_saved *const *saved, const qg_tensor *const *h0,
                                                    const qg_tensor *lengths) {
  const char *fn = "qg_int_gru_backward_bidir";
  qg_ctx *p = NULL;
  QG_CHECK(peer_of(ctx, fn, &p));
  /* direction 1's dx: the context's spare buffer, a view with dx's shape (grown before the fork:
   * growing waits for the context's stream, where the buffer's last reader, the previous call's
   * addition, runs) */
  qg_tensor dx1;
  if (dx) {
    void *buf;
    QG_CHECK(qg_dev_spare(ctx, fn, qg_tensor_bytes(dx), &buf));
    dx1 = *dx;
    dx1.data = buf;
    dx1.owns_data = 0;
  }
  QG_CHECK(order_after(ctx, fn, ctx, p));
  const qg_status s0 = qg_cuda_int_gru_backward(ctx, g[0], dx, dW[0], dR[0], dbx[0], dbr[0], dh0 ? dh0[0] : NULL, dy, 0,
                                                dhn ? dhn[0] : NULL, saved[0], h0 ? h0[0] : NULL, lengths, 0);
  qg_status s1 = QG_OK;
  if (s0 == QG_OK && dx)
    s1 = qg_cuda_status(p, fn, cudaMemsetAsync(dx1.data, 0, (size_t)qg_tensor_bytes(dx), qg_cuda_stream(p)));
  if (s0 == QG_OK && s1 == QG_OK)
    s1 = qg_cuda_int_gru_backward(p, g[1], dx ? &dx1 : NULL, dW[1], dR[1], dbx[1], dbr[1], dh0 ? dh0[1] : NULL, dy, (int)g[0]->H,
                                  dhn ? dhn[1] : NULL, saved[1], h0 ? h0[1] : NULL, lengths, 1);
  QG_CHECK(finish(ctx, fn, p, s0, s1));
  return dx ? qg_cuda_axpy(ctx, dx, 1.0, &dx1) : QG_OK;
}
