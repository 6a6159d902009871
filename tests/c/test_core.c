/*
 * test_core.c: C unit tests of libqgru against hand-computed values: tensor views and copies,
 * error reporting, Linear, the losses, one GRU step, the optimizers, and the file readers on small
 * hand-written files. The Lua specs cover the rest (gradients, golden files, training).
 */
#include "qgru.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int failures = 0, checks = 0;
#define CHECK(cond) do { checks++; if (!(cond)) { failures++; fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond); } } while (0)
#define CHECK_NEAR(a, b, tol) do { double a_ = (a), b_ = (b); checks++; if (!(fabs(a_ - b_) <= (tol))) { failures++; \
  fprintf(stderr, "%s:%d: %s = %.10g, expected %.10g\n", __FILE__, __LINE__, #a, a_, b_); } } while (0)

static qg_tensor *mk(qg_ctx *ctx, int dtype, int ndim, int64_t d0, int64_t d1, int64_t d2) {
  int64_t dims[3] = {d0, d1, d2};
  qg_tensor *t = NULL;
  if (qg_tensor_create(ctx, &t, dtype, QG_CPU, ndim, dims) != QG_OK) { fprintf(stderr, "create: %s\n", qg_last_error(ctx)); exit(2); }
  return t;
}

static void set_f32(qg_tensor *t, const float *v) { memcpy(t->data, v, (size_t)t->numel * sizeof(float)); }
static float f32(const qg_tensor *t, int64_t i) { return ((const float *)t->data)[i]; }

static void test_tensors(qg_ctx *ctx) {
  qg_tensor *a = mk(ctx, QG_F32, 2, 2, 3, 0);
  CHECK(a->numel == 6 && f32(a, 5) == 0.0f);
  float v[6] = {1, 2, 3, 4, 5, 6};
  set_f32(a, v);
  int64_t vd[1] = {3};
  qg_tensor *row1 = NULL;
  CHECK(qg_tensor_view(ctx, &row1, a, 3, 1, vd) == QG_OK);
  CHECK(f32(row1, 0) == 4.0f && row1->owns_data == 0);
  qg_tensor *bad = NULL;
  CHECK(qg_tensor_view(ctx, &bad, a, 4, 1, vd) == QG_ERR_ARG && bad == NULL);
  CHECK(strstr(qg_last_error(ctx), "does not fit") != NULL);
  qg_tensor *i64 = mk(ctx, QG_I64, 1, 6, 0, 0);
  CHECK(qg_copy(ctx, i64, a) == QG_OK && ((int64_t *)i64->data)[5] == 6);
  qg_tensor *tr = mk(ctx, QG_F32, 2, 3, 2, 0);
  CHECK(qg_transpose01(ctx, tr, a) == QG_OK);
  CHECK(f32(tr, 0) == 1 && f32(tr, 1) == 4 && f32(tr, 2) == 2 && f32(tr, 5) == 6);
  double ss = 0;
  CHECK(qg_sum_squares(ctx, &ss, a) == QG_OK && ss == 91.0);
  /* A cuda tensor on a cpu context is refused with a clear message. */
  qg_tensor *c = NULL;
  int64_t d1[1] = {4};
  CHECK(qg_tensor_create(ctx, &c, QG_F32, QG_CUDA, 1, d1) == QG_ERR_DEVICE && c == NULL);
  CHECK(strstr(qg_last_error(ctx), "cuda context") != NULL);
  /* randperm is a permutation and a pure function of its seed. */
  qg_tensor *p1 = mk(ctx, QG_I64, 1, 100, 0, 0), *p2 = mk(ctx, QG_I64, 1, 100, 0, 0);
  qg_randperm(ctx, p1, 7); qg_randperm(ctx, p2, 7);
  int seen[100] = {0}, ok = 1;
  for (int i = 0; i < 100; i++) { int64_t x = ((int64_t *)p1->data)[i]; if (x < 0 || x >= 100 || seen[x]++) ok = 0; }
  CHECK(ok && memcmp(p1->data, p2->data, 800) == 0);
  qg_tensor_free(a); qg_tensor_free(row1); qg_tensor_free(i64); qg_tensor_free(tr); qg_tensor_free(p1); qg_tensor_free(p2);
}

static void test_linear_and_losses(qg_ctx *ctx) {
  qg_tensor *x = mk(ctx, QG_F32, 2, 2, 3, 0), *W = mk(ctx, QG_F32, 2, 2, 3, 0), *b = mk(ctx, QG_F32, 1, 2, 0, 0);
  qg_tensor *y = mk(ctx, QG_F32, 2, 2, 2, 0);
  float xv[6] = {1, 2, 3, -1, 0, 1}, wv[6] = {0.5f, -1, 2, 1, 1, 1}, bv[2] = {0.25f, -2};
  set_f32(x, xv); set_f32(W, wv); set_f32(b, bv);
  CHECK(qg_linear_forward(ctx, y, x, W, b) == QG_OK);
  /* row 0: 0.5-2+6+0.25 = 4.75 ; 1+2+3-2 = 4 ; row 1: -0.5+0+2+0.25 = 1.75 ; -1+0+1-2 = -2 */
  CHECK(f32(y, 0) == 4.75f && f32(y, 1) == 4.0f && f32(y, 2) == 1.75f && f32(y, 3) == -2.0f);
  qg_tensor *wrong = mk(ctx, QG_F32, 2, 2, 4, 0);
  CHECK(qg_linear_forward(ctx, y, wrong, W, b) == QG_ERR_ARG);
  CHECK(strstr(qg_last_error(ctx), "expected shape [*, 3], got [2, 4]") != NULL);

  /* Cross-entropy of logits [0, ln 3] with target 1: p = [1/4, 3/4], loss = -ln(3/4). */
  qg_tensor *lg = mk(ctx, QG_F32, 2, 1, 2, 0), *tg = mk(ctx, QG_I64, 1, 1, 0, 0), *dl = mk(ctx, QG_F32, 2, 1, 2, 0);
  float lv[2] = {0.0f, (float)log(3.0)};
  set_f32(lg, lv);
  ((int64_t *)tg->data)[0] = 1;
  double loss = 0;
  CHECK(qg_cross_entropy(ctx, &loss, dl, lg, tg, 1.0) == QG_OK);
  CHECK_NEAR(loss, -log(0.75), 1e-7);
  CHECK_NEAR(f32(dl, 0), 0.25, 1e-7);
  CHECK_NEAR(f32(dl, 1), -0.25, 1e-7);
  ((int64_t *)tg->data)[0] = 2;
  CHECK(qg_cross_entropy(ctx, &loss, NULL, lg, tg, 1.0) == QG_ERR_ARG);
  CHECK(strstr(qg_last_error(ctx), "target[0] = 2") != NULL);

  qg_tensor *p = mk(ctx, QG_F32, 1, 2, 0, 0), *t = mk(ctx, QG_F32, 1, 2, 0, 0), *dp = mk(ctx, QG_F32, 1, 2, 0, 0);
  float pv[2] = {1, 3}, tv[2] = {0, 1};
  set_f32(p, pv); set_f32(t, tv);
  CHECK(qg_mse(ctx, &loss, dp, p, t, 1.0) == QG_OK);
  CHECK_NEAR(loss, 2.5, 1e-12);                 /* (1 + 4) / 2 */
  CHECK(f32(dp, 0) == 1.0f && f32(dp, 1) == 2.0f);  /* 2 d / n */
  qg_tensor_free(x); qg_tensor_free(W); qg_tensor_free(b); qg_tensor_free(y); qg_tensor_free(wrong);
  qg_tensor_free(lg); qg_tensor_free(tg); qg_tensor_free(dl); qg_tensor_free(p); qg_tensor_free(t); qg_tensor_free(dp);
}

static double sig(double v) { return 1.0 / (1.0 + exp(-v)); }

static void test_gru_step(qg_ctx *ctx) {
  /* T=1, N=1, C=1, H=1 with h0 = 0.5, computed by hand in double. */
  qg_tensor *x = mk(ctx, QG_F32, 3, 1, 1, 1), *W = mk(ctx, QG_F32, 2, 3, 1, 0), *R = mk(ctx, QG_F32, 2, 3, 1, 0);
  qg_tensor *bx = mk(ctx, QG_F32, 1, 3, 0, 0), *br = mk(ctx, QG_F32, 1, 3, 0, 0), *h0 = mk(ctx, QG_F32, 2, 1, 1, 0);
  qg_tensor *y = mk(ctx, QG_F32, 3, 1, 1, 1), *hs = mk(ctx, QG_F32, 3, 2, 1, 1), *g = mk(ctx, QG_F32, 3, 1, 1, 4);
  float xv = 0.8f, wv[3] = {0.3f, -0.6f, 1.1f}, rv[3] = {-0.4f, 0.7f, 0.9f}, bxv[3] = {0.1f, 0.2f, -0.3f}, brv[3] = {0.05f, -0.1f, 0.4f}, hv = 0.5f;
  set_f32(x, &xv); set_f32(W, wv); set_f32(R, rv); set_f32(bx, bxv); set_f32(br, brv); set_f32(h0, &hv);
  CHECK(qg_gru_forward(ctx, y, 0, hs, g, NULL, x, W, R, bx, br, h0, NULL, 0) == QG_OK);
  double z = sig(0.3 * 0.8 + 0.1 - 0.4 * 0.5 + 0.05), r = sig(-0.6 * 0.8 + 0.2 + 0.7 * 0.5 - 0.1);
  double gg = tanh(1.1 * 0.8 - 0.3 + r * (0.9 * 0.5 + 0.4)), h = z * 0.5 + (1 - z) * gg;
  CHECK_NEAR(f32(y, 0), h, 1e-6);
  CHECK_NEAR(f32(hs, 0), 0.5, 0);
  CHECK_NEAR(f32(hs, 1), h, 1e-6);
  CHECK_NEAR(f32(g, 0), z, 1e-6);
  CHECK_NEAR(f32(g, 2), gg, 1e-6);
  CHECK_NEAR(f32(g, 3), 0.9 * 0.5 + 0.4, 1e-6);
  qg_tensor *badW = mk(ctx, QG_F32, 2, 3, 2, 0);
  CHECK(qg_gru_forward(ctx, y, 0, hs, g, NULL, x, badW, R, bx, br, h0, NULL, 0) == QG_ERR_ARG);
  CHECK(strstr(qg_last_error(ctx), "W: expected shape [3, 1], got [3, 2]") != NULL);
  CHECK(qg_gru_forward(ctx, y, 1, hs, g, NULL, x, W, R, bx, br, h0, NULL, 0) == QG_ERR_ARG);
  qg_tensor_free(x); qg_tensor_free(W); qg_tensor_free(R); qg_tensor_free(bx); qg_tensor_free(br);
  qg_tensor_free(h0); qg_tensor_free(y); qg_tensor_free(hs); qg_tensor_free(g); qg_tensor_free(badW);
}

static void test_optim(qg_ctx *ctx) {
  qg_tensor *p = mk(ctx, QG_F32, 1, 1, 0, 0), *g = mk(ctx, QG_F32, 1, 1, 0, 0), *m = mk(ctx, QG_F32, 1, 1, 0, 0), *v = mk(ctx, QG_F32, 1, 1, 0, 0);
  float pv = 1.0f, gv = 0.5f;
  set_f32(p, &pv); set_f32(g, &gv);
  /* Adam's first step moves by lr * sign(g) (bias-corrected m / sqrt(v) = g / |g|). */
  CHECK(qg_adam_step(ctx, p, m, v, g, 0.1, 0.9, 0.999, 0.0, 0.0, 0, 1, 1.0) == QG_OK);
  CHECK_NEAR(f32(p, 0), 0.9, 1e-6);
  /* SGD with momentum 0.9: first step buf = g; second buf = 0.9 g + g. */
  set_f32(p, &pv);
  CHECK(qg_sgd_step(ctx, p, m, g, 0.1, 0.9, 0.0, 0.0, 0, 1) == QG_OK);
  CHECK_NEAR(f32(p, 0), 0.95, 1e-7);
  CHECK(qg_sgd_step(ctx, p, m, g, 0.1, 0.9, 0.0, 0.0, 0, 0) == QG_OK);
  CHECK_NEAR(f32(p, 0), 0.95 - 0.1 * 0.95, 1e-6);
  CHECK(qg_adam_step(ctx, p, m, v, g, 0.1, 1.5, 0.999, 0.0, 0.0, 0, 1, 1.0) == QG_ERR_ARG);
  qg_tensor_free(p); qg_tensor_free(g); qg_tensor_free(m); qg_tensor_free(v);
}

static void write_file(const char *path, const void *data, size_t n) {
  FILE *f = fopen(path, "wb");
  fwrite(data, 1, n, f);
  fclose(f);
}

static void test_files(qg_ctx *ctx) {
  /* IDX: magic 0 0 0x08 2, dims 2 x 3, six bytes. */
  unsigned char idx[4 + 8 + 6] = {0, 0, 8, 2, 0, 0, 0, 2, 0, 0, 0, 3, 1, 2, 3, 250, 5, 6};
  write_file("test_core_tmp.idx", idx, sizeof idx);
  qg_tensor *t = NULL;
  CHECK(qg_idx_load(ctx, &t, "test_core_tmp.idx") == QG_OK);
  CHECK(t && t->ndim == 2 && t->dims[0] == 2 && t->dims[1] == 3 && t->dtype == QG_U8 && ((uint8_t *)t->data)[3] == 250);
  qg_tensor_free(t); t = NULL;
  write_file("test_core_tmp.idx", idx, sizeof idx - 1);
  CHECK(qg_idx_load(ctx, &t, "test_core_tmp.idx") == QG_ERR_FORMAT && t == NULL);
  CHECK(strstr(qg_last_error(ctx), "truncated") != NULL);
  CHECK(qg_idx_load(ctx, &t, "no/such/file.idx") == QG_ERR_IO);
  remove("test_core_tmp.idx");

  /* safetensors round trip with metadata; then a truncated copy is rejected on open. */
  qg_tensor *a = mk(ctx, QG_F32, 2, 2, 2, 0), *b = mk(ctx, QG_I64, 1, 3, 0, 0);
  float av[4] = {1.5f, -2, 3, 4};
  set_f32(a, av);
  ((int64_t *)b->data)[2] = -7;
  qg_st_writer *w = NULL;
  CHECK(qg_st_writer_create(ctx, &w) == QG_OK);
  CHECK(qg_st_writer_add(ctx, w, "b", b) == QG_OK && qg_st_writer_add(ctx, w, "a", a) == QG_OK);
  CHECK(qg_st_writer_add(ctx, w, "a", a) == QG_ERR_ARG);
  CHECK(qg_st_writer_metadata(ctx, w, "format", "pt") == QG_OK);
  CHECK(qg_st_writer_save(ctx, w, "test_core_tmp.safetensors") == QG_OK);
  qg_st_writer_free(w);
  qg_st_file *f = NULL;
  CHECK(qg_st_open(ctx, &f, "test_core_tmp.safetensors") == QG_OK);
  CHECK(qg_st_count(f) == 2 && strcmp(qg_st_metadata(f, "format"), "pt") == 0);
  const char *name; int dt, nd; int64_t dims[4];
  CHECK(qg_st_entry(ctx, f, 0, &name, &dt, &nd, dims) == QG_OK && !strcmp(name, "a") && dt == QG_F32 && nd == 2);
  qg_tensor *a2 = mk(ctx, QG_F32, 2, 2, 2, 0), *b2 = mk(ctx, QG_I64, 1, 3, 0, 0);
  CHECK(qg_st_read(ctx, f, "a", a2) == QG_OK && memcmp(a->data, a2->data, 16) == 0);
  CHECK(qg_st_read(ctx, f, "b", b2) == QG_OK && ((int64_t *)b2->data)[2] == -7);
  CHECK(qg_st_read(ctx, f, "a", b2) == QG_ERR_ARG);
  CHECK(qg_st_read(ctx, f, "zz", a2) == QG_ERR_NOT_FOUND);
  qg_st_close(f);
  FILE *in = fopen("test_core_tmp.safetensors", "rb");
  char buf[4096];
  size_t n = fread(buf, 1, sizeof buf, in);
  fclose(in);
  write_file("test_core_tmp.safetensors", buf, n - 4);
  f = NULL;
  CHECK(qg_st_open(ctx, &f, "test_core_tmp.safetensors") == QG_ERR_FORMAT && f == NULL);
  CHECK(strstr(qg_last_error(ctx), "truncated") != NULL);
  remove("test_core_tmp.safetensors");
  qg_tensor_free(a); qg_tensor_free(b); qg_tensor_free(a2); qg_tensor_free(b2);
}

int main(void) {
  CHECK(qgru_abi_version() == QGRU_ABI_VERSION);
  qg_ctx *ctx = NULL;
  if (qg_ctx_create(&ctx, QG_CPU, 0, 42) != QG_OK) { fprintf(stderr, "no context\n"); return 2; }
  test_tensors(ctx);
  test_linear_and_losses(ctx);
  test_gru_step(ctx);
  test_optim(ctx);
  test_files(ctx);
  qg_ctx_destroy(ctx);
  printf("test_core: %d checks, %d failures\n", checks, failures);
  return failures ? 1 : 0;
}
