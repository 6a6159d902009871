/*
 * test_cuda_gru.c: the CUDA float GRU against the CPU backend from C (no LuaJIT in the process, so
 * compute-sanitizer's memcheck and racecheck can run it on the GPU machine; tests/gpu/device_check.sh).
 * Each case runs qg_gru_forward / qg_gru_backward (or the _bidir forms) on the CPU and on the GPU
 * with the same inputs and requires ||gpu - cpu|| / ||cpu|| < 1e-5 for y, hs, gates, dx, dW, dR,
 * dbx, dbr and dh0, on the persistent path (several forced shapes) and the fallback path. Without
 * a CUDA device it prints a skip line and succeeds. Argument "quick": a smaller set.
 */
#include "qgru.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int failures = 0;

#define CK(call)                                                                                      \
  do {                                                                                                \
    qg_status s_ = (call);                                                                            \
    if (s_ != QG_OK) {                                                                                \
      fprintf(stderr, "%s:%d: %s -> %s: %s\n", __FILE__, __LINE__, #call, qg_status_name(s_),       \
              qg_last_error(ctx_err));                                                                \
      exit(2);                                                                                        \
    }                                                                                                 \
  } while (0)

static qg_ctx *cpu, *gpu, *ctx_err;

static qg_tensor *tensor(int dev, int dtype, int nd, int64_t a, int64_t b, int64_t c) {
  int64_t d[3] = {a, b, c};
  qg_tensor *t;
  ctx_err = dev == QG_CPU ? cpu : gpu;
  CK(qg_tensor_create(dev == QG_CPU ? cpu : gpu, &t, dtype, dev, nd, d));
  return t;
}

static qg_tensor *rnd(int nd, int64_t a, int64_t b, int64_t c, double k) {
  qg_tensor *t = tensor(QG_CPU, QG_F32, nd, a, b, c);
  ctx_err = cpu;
  CK(qg_uniform(cpu, t, -k, k));
  return t;
}

static qg_tensor *to_gpu(const qg_tensor *t) {
  qg_tensor *g = tensor(QG_CUDA, t->dtype, t->ndim, t->dims[0], t->ndim > 1 ? t->dims[1] : 0, t->ndim > 2 ? t->dims[2] : 0);
  ctx_err = gpu;
  CK(qg_copy(gpu, g, t));
  return g;
}

static qg_tensor *clone_cpu(const qg_tensor *t) {
  qg_tensor *c = tensor(QG_CPU, t->dtype, t->ndim, t->dims[0], t->ndim > 1 ? t->dims[1] : 0, t->ndim > 2 ? t->dims[2] : 0);
  ctx_err = cpu;
  CK(qg_copy(cpu, c, t));
  return c;
}

/* a GPU tensor of t's shape filled with 7 (outputs must overwrite it) */
static qg_tensor *poison_like(const qg_tensor *t) {
  qg_tensor *h = clone_cpu(t);
  ctx_err = cpu;
  CK(qg_fill(cpu, h, 7.0));
  qg_tensor *g = to_gpu(h);
  qg_tensor_free(h);
  return g;
}

/* ||(g - base) - (c - base)|| / ||c - base|| with g on the GPU */
static double relerr(const qg_tensor *g, const qg_tensor *c, const qg_tensor *base) {
  qg_tensor *h = clone_cpu(g);
  const float *pg = (const float *)h->data, *pc = (const float *)c->data, *pb = base ? (const float *)base->data : NULL;
  double num = 0, den = 0;
  for (int64_t i = 0; i < c->numel; i++) {
    const double o = pb ? pb[i] : 0.0, a = pg[i] - o, b = pc[i] - o;
    if (a != a || b != b) { qg_tensor_free(h); return NAN; }
    num += (a - b) * (a - b);
    den += b * b;
  }
  qg_tensor_free(h);
  return den == 0 ? (num == 0 ? 0 : INFINITY) : sqrt(num / den);
}

static void expect(const char *name, const char *what, double e) {
  if (!(e < 1e-5)) {
    printf("FAIL %s: %s relative error %.3g\n", name, what, e);
    failures++;
  }
}

typedef struct {
  int T, N, C, H, reverse, h0, lengths, bidir;
  int path, K, NB, S, storage;   /* QG_PATH_*, forced persistent shape (0: chosen), R's storage */
} tcase;

static void run(const tcase *c) {
  char name[160];
  snprintf(name, sizeof name, "T%d N%d C%d H%d rev%d h0%d len%d bidir%d path%d K%d NB%d S%d storage%d", c->T, c->N, c->C,
           c->H, c->reverse, c->h0, c->lengths, c->bidir, c->path, c->K, c->NB, c->S, c->storage);
  const int64_t T = c->T, N = c->N, C = c->C, H = c->H, D = c->bidir ? 2 : 1;
  const double k = 1.2 / sqrt((double)H);
  ctx_err = cpu;
  CK(qg_rng_seed(cpu, (uint64_t)(T * 7919 + N * 131 + C * 17 + H)));
  qg_tensor *W[2], *R[2], *bx[2], *br[2], *h0[2] = {NULL, NULL}, *dW0[2], *dR0[2], *db0[2];
  for (int d = 0; d < D; d++) {
    W[d] = rnd(2, 3 * H, C, 0, k); R[d] = rnd(2, 3 * H, H, 0, k); bx[d] = rnd(1, 3 * H, 0, 0, k); br[d] = rnd(1, 3 * H, 0, 0, k);
    if (c->h0) h0[d] = rnd(2, N, H, 0, 0.8);
    dW0[d] = rnd(2, 3 * H, C, 0, 0.5); dR0[d] = rnd(2, 3 * H, H, 0, 0.5); db0[d] = rnd(1, 3 * H, 0, 0, 0.5);
  }
  qg_tensor *x = rnd(3, T, N, C, 1.0), *dy = rnd(3, T, N, D * H, 1.0), *dx0 = rnd(3, T, N, C, 0.5);
  qg_tensor *len = NULL;
  if (c->lengths) {
    len = tensor(QG_CPU, QG_I64, 1, N, 0, 0);
    for (int64_t n = 0; n < N; n++) ((int64_t *)len->data)[n] = (n * 5 + 2) % T + 1;
    ((int64_t *)len->data)[N > 1 ? 1 : 0] = T;
  }
  /* the results of one device: [0] cpu, [1] gpu */
  qg_tensor *y[2], *hs[2][2], *gates[2][2], *dx[2], *dW[2][2], *dR[2][2], *dbx[2][2], *dbr[2][2], *dh0[2][2];
  for (int dev = 0; dev < 2; dev++) {
    qg_ctx *cx = dev ? gpu : cpu;
    ctx_err = cx;
    const qg_tensor *xi = dev ? to_gpu(x) : x, *dyi = dev ? to_gpu(dy) : dy, *li = len ? (dev ? to_gpu(len) : len) : NULL;
    const qg_tensor *Wi[2], *Ri[2], *bxi[2], *bri[2], *h0i[2];
    y[dev] = dev ? poison_like(dy) : clone_cpu(dy);
    if (!dev) CK(qg_fill(cpu, y[0], 7.0));
    dx[dev] = dev ? to_gpu(dx0) : clone_cpu(dx0);
    for (int d = 0; d < D; d++) {
      Wi[d] = dev ? to_gpu(W[d]) : W[d]; Ri[d] = dev ? to_gpu(R[d]) : R[d];
      bxi[d] = dev ? to_gpu(bx[d]) : bx[d]; bri[d] = dev ? to_gpu(br[d]) : br[d];
      h0i[d] = h0[d] ? (dev ? to_gpu(h0[d]) : h0[d]) : NULL;
      hs[dev][d] = tensor(dev ? QG_CUDA : QG_CPU, QG_F32, 3, T + 1, N, H);
      gates[dev][d] = tensor(dev ? QG_CUDA : QG_CPU, QG_F32, 3, T, N, 4 * H);
      dW[dev][d] = dev ? to_gpu(dW0[d]) : clone_cpu(dW0[d]);
      dR[dev][d] = dev ? to_gpu(dR0[d]) : clone_cpu(dR0[d]);
      dbx[dev][d] = dev ? to_gpu(db0[d]) : clone_cpu(db0[d]);
      dbr[dev][d] = dev ? to_gpu(db0[d]) : clone_cpu(db0[d]);
      dh0[dev][d] = tensor(dev ? QG_CUDA : QG_CPU, QG_F32, 2, N, H, 0);
    }
    if (c->bidir) {
      const qg_tensor *hsc[2] = {hs[dev][0], hs[dev][1]}, *gc[2] = {gates[dev][0], gates[dev][1]};
      CK(qg_gru_forward_bidir(cx, y[dev], hs[dev], gates[dev], xi, Wi, Ri, bxi, bri, c->h0 ? h0i : NULL, li));
      CK(qg_gru_backward_bidir(cx, dx[dev], dW[dev], dR[dev], dbx[dev], dbr[dev], dh0[dev], dyi, NULL, xi, Wi, Ri, hsc, gc, li));
    } else {
      CK(qg_gru_forward(cx, y[dev], 0, hs[dev][0], gates[dev][0], NULL, xi, Wi[0], Ri[0], bxi[0], bri[0], h0i[0], li,
                        c->reverse));
      CK(qg_gru_backward(cx, dx[dev], dW[dev][0], dR[dev][0], dbx[dev][0], dbr[dev][0], dh0[dev][0], dyi, 0, NULL, xi, Wi[0],
                         Ri[0], hs[dev][0], gates[dev][0], li, c->reverse));
    }
    if (dev) {
      CK(qg_ctx_synchronize(gpu));
      qg_tensor_free((qg_tensor *)xi); qg_tensor_free((qg_tensor *)dyi); qg_tensor_free((qg_tensor *)li);
      for (int d = 0; d < D; d++) {
        qg_tensor_free((qg_tensor *)Wi[d]); qg_tensor_free((qg_tensor *)Ri[d]); qg_tensor_free((qg_tensor *)bxi[d]);
        qg_tensor_free((qg_tensor *)bri[d]); qg_tensor_free((qg_tensor *)h0i[d]);
      }
    }
  }
  expect(name, "y", relerr(y[1], y[0], NULL));
  expect(name, "dx", relerr(dx[1], dx[0], dx0));
  for (int d = 0; d < D; d++) {
    expect(name, "hs", relerr(hs[1][d], hs[0][d], NULL));
    expect(name, "gates", relerr(gates[1][d], gates[0][d], NULL));
    expect(name, "dW", relerr(dW[1][d], dW[0][d], dW0[d]));
    expect(name, "dR", relerr(dR[1][d], dR[0][d], dR0[d]));
    expect(name, "dbx", relerr(dbx[1][d], dbx[0][d], db0[d]));
    expect(name, "dbr", relerr(dbr[1][d], dbr[0][d], db0[d]));
    expect(name, "dh0", relerr(dh0[1][d], dh0[0][d], NULL));
  }
  printf("%s %s\n", failures ? "(failures so far)" : "ok", name);
  for (int dev = 0; dev < 2; dev++) {
    qg_tensor_free(y[dev]); qg_tensor_free(dx[dev]);
    for (int d = 0; d < D; d++) {
      qg_tensor_free(hs[dev][d]); qg_tensor_free(gates[dev][d]); qg_tensor_free(dW[dev][d]); qg_tensor_free(dR[dev][d]);
      qg_tensor_free(dbx[dev][d]); qg_tensor_free(dbr[dev][d]); qg_tensor_free(dh0[dev][d]);
    }
  }
  for (int d = 0; d < D; d++) {
    qg_tensor_free(W[d]); qg_tensor_free(R[d]); qg_tensor_free(bx[d]); qg_tensor_free(br[d]); qg_tensor_free(h0[d]);
    qg_tensor_free(dW0[d]); qg_tensor_free(dR0[d]); qg_tensor_free(db0[d]);
  }
  qg_tensor_free(x); qg_tensor_free(dy); qg_tensor_free(dx0); qg_tensor_free(len);
}

int main(int argc, char **argv) {
  const int quick = argc > 1 && strcmp(argv[1], "quick") == 0;
  if (!qgru_has_cuda() || qg_cuda_device_count() == 0) {
    printf("skipped: no CUDA device (libqgru %s)\n", qgru_has_cuda() ? "has CUDA, no GPU visible" : "built without CUDA");
    return 0;
  }
  ctx_err = NULL;
  if (qg_ctx_create(&cpu, QG_CPU, 0, 1) != QG_OK || qg_ctx_create(&gpu, QG_CUDA, 0, 1) != QG_OK) {
    fprintf(stderr, "cannot create the contexts\n");
    return 2;
  }
  const tcase all[] = {
    {6, 3, 5, 7, 1, 1, 1, 0, QG_PATH_PERSISTENT, 0, 0, 0, 0},
    {6, 3, 5, 7, 1, 1, 1, 0, QG_PATH_FALLBACK, 0, 0, 0, 0},
    {5, 4, 3, 33, 0, 1, 1, 1, QG_PATH_PERSISTENT, 0, 0, 0, 0},
    {5, 4, 3, 33, 0, 1, 1, 1, QG_PATH_FALLBACK, 0, 0, 0, 0},
    {7, 11, 9, 61, 1, 1, 1, 0, QG_PATH_PERSISTENT, 2, 8, 0, 1},
    {7, 11, 9, 61, 0, 1, 1, 0, QG_PATH_PERSISTENT, 2, 4, 16, 2},
    {7, 11, 9, 61, 0, 0, 1, 0, QG_PATH_PERSISTENT, 16, 2, 0, 1},
    {7, 11, 9, 61, 1, 1, 0, 0, QG_PATH_PERSISTENT, 1, 4, 3, 1},
    {7, 11, 9, 61, 1, 1, 1, 1, QG_PATH_PERSISTENT, 16, 8, 8, 2},
    {9, 5, 4, 130, 0, 1, 1, 1, QG_PATH_PERSISTENT, 4, 2, 0, 0},
    {9, 17, 300, 130, 1, 1, 1, 0, QG_PATH_FALLBACK, 0, 0, 0, 0},
    {4, 4, 8, 520, 0, 0, 1, 0, QG_PATH_PERSISTENT, 0, 0, 0, 0},
  };
  const int n = quick ? 6 : (int)(sizeof all / sizeof all[0]);
  for (int i = 0; i < n; i++) {
    ctx_err = gpu;
    CK(qg_ctx_set_kernel_path(gpu, all[i].path));
    CK(qg_ctx_set_persist_shape(gpu, all[i].K, all[i].NB, all[i].S, all[i].storage));
    run(&all[i]);
  }
  qg_ctx_destroy(gpu);
  qg_ctx_destroy(cpu);
  printf("%d failure(s)\n", failures);
  return failures ? 1 : 0;
}
