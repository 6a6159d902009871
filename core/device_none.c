/*
 * device_none.c: the device interface of a CPU-only build (no CUDA compiler found). Every
 * device request fails with QG_ERR_NO_CUDA and a message that says how to get a CUDA build.
 */
#include "internal.h"

static qg_status no_cuda(qg_ctx *ctx, const char *fn) {
  return qg_fail(ctx, QG_ERR_NO_CUDA, fn, "libqgru was built without CUDA (no CUDA compiler was found at configure time)");
}

int qg_dev_available(void) { return 0; }
int qg_dev_count(void) { return 0; }
qg_status qg_dev_ctx_init(qg_ctx *ctx) { return no_cuda(ctx, "qg_ctx_create"); }
void qg_dev_ctx_fini(qg_ctx *ctx) { (void)ctx; }
qg_status qg_dev_malloc(qg_ctx *ctx, void **ptr, int64_t nbytes) { (void)ptr; (void)nbytes; return no_cuda(ctx, __func__); }
void qg_dev_free(void *ptr) { (void)ptr; }
qg_status qg_dev_memcpy(qg_ctx *ctx, void *dst, const void *src, int64_t nbytes, int kind) {
  (void)dst; (void)src; (void)nbytes; (void)kind; return no_cuda(ctx, __func__);
}
qg_status qg_dev_memset0(qg_ctx *ctx, void *ptr, int64_t nbytes) { (void)ptr; (void)nbytes; return no_cuda(ctx, __func__); }
qg_status qg_dev_synchronize(qg_ctx *ctx) { return no_cuda(ctx, __func__); }
qg_status qg_dev_timer(qg_ctx *ctx, int which, double *ms) { (void)which; (void)ms; return no_cuda(ctx, __func__); }
qg_status qg_dev_workspace(qg_ctx *ctx, const char *fn, int64_t nbytes, void **out) {
  (void)nbytes; *out = NULL; return no_cuda(ctx, fn);
}
qg_status qg_dev_spare(qg_ctx *ctx, const char *fn, int64_t nbytes, void **out) {
  (void)nbytes; *out = NULL; return no_cuda(ctx, fn);
}
qg_status qg_dev_set_math(qg_ctx *ctx) { (void)ctx; return QG_OK; }
