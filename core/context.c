/*
 * context.c: the qg_ctx (device, stream, BLAS handles, workspace, RNG), error messages, argument
 * checks and the xoshiro256** generator. Everything a call needs lives in the context, so two
 * contexts never share state and nothing is global.
 */
#include "backend.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <cblas.h>

/* OpenBLAS exports this; declared here to avoid depending on openblas_config.h's layout. */
void openblas_set_num_threads(int num_threads);

int qgru_abi_version(void) { return QGRU_ABI_VERSION; }
int qgru_has_cuda(void) { return qg_dev_available(); }
int qg_cuda_device_count(void) { return qg_dev_count(); }

const char *qg_status_name(qg_status s) {
  switch (s) {
    case QG_OK: return "ok";
    case QG_ERR_ARG: return "bad argument";
    case QG_ERR_DEVICE: return "device error";
    case QG_ERR_NO_CUDA: return "no CUDA";
    case QG_ERR_MEMORY: return "out of memory";
    case QG_ERR_IO: return "I/O error";
    case QG_ERR_FORMAT: return "bad file format";
    case QG_ERR_NOT_FOUND: return "not found";
    case QG_ERR_UNSUPPORTED: return "unsupported";
  }
  return "unknown status";
}

qg_status qg_fail(qg_ctx *ctx, qg_status status, const char *fn, const char *fmt, ...) {
  if (!ctx) return status;
  int n = snprintf(ctx->error, sizeof ctx->error, "%s: ", fn);
  if (n < 0 || (size_t)n >= sizeof ctx->error) return status;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(ctx->error + n, sizeof ctx->error - (size_t)n, fmt, ap);
  va_end(ap);
  return status;
}

const char *qg_last_error(const qg_ctx *ctx) { return ctx ? ctx->error : "no context"; }

/* why: the caller's buffer (see qgru.h); formats into it when there is room */
static qg_status create_fail(char *why, size_t why_bytes, qg_status status, const char *fmt, ...) {
  if (why && why_bytes > 0) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, why_bytes, fmt, ap);
    va_end(ap);
  }
  return status;
}

qg_status qg_ctx_create_why(qg_ctx **out, int device, int device_index, uint64_t seed, char *why, size_t why_bytes) {
  if (why && why_bytes > 0) why[0] = '\0';
  if (!out) return create_fail(why, why_bytes, QG_ERR_ARG, "qg_ctx_create: out is NULL");
  *out = NULL;
  if (device != QG_CPU && device != QG_CUDA)
    return create_fail(why, why_bytes, QG_ERR_ARG, "qg_ctx_create: device %d is neither QG_CPU (0) nor QG_CUDA (1)", device);
  qg_ctx *ctx = (qg_ctx *)calloc(1, sizeof *ctx);
  if (!ctx) return create_fail(why, why_bytes, QG_ERR_MEMORY, "qg_ctx_create: cannot allocate the context (%zu bytes)", sizeof *ctx);
  ctx->device = device;
  ctx->device_index = device_index;
  qg_rng_seed_state(ctx->rng, seed);
  if (device == QG_CUDA) {
    qg_status s = qg_dev_ctx_init(ctx);
    if (s != QG_OK) {   /* the device layer wrote its reason into the context's message */
      create_fail(why, why_bytes, s, "%s", ctx->error[0] ? ctx->error : qg_status_name(s));
      free(ctx);
      return s;
    }
  }
  *out = ctx;
  return QG_OK;
}

qg_status qg_ctx_create(qg_ctx **out, int device, int device_index, uint64_t seed) {
  return qg_ctx_create_why(out, device, device_index, seed, NULL, 0);
}

void qg_ctx_destroy(qg_ctx *ctx) {
  if (!ctx) return;
  qg_ctx_destroy(ctx->peer);
  if (ctx->device == QG_CUDA) qg_dev_ctx_fini(ctx);
  free(ctx->workspace);
  free(ctx);
}

qg_status qg_ctx_synchronize(qg_ctx *ctx) {
  if (!ctx) return QG_ERR_ARG;
  return ctx->device == QG_CUDA ? qg_dev_synchronize(ctx) : QG_OK;
}

qg_status qg_ctx_timer_start(qg_ctx *ctx) {
  if (!ctx) return QG_ERR_ARG;
  if (ctx->device == QG_CUDA) QG_CHECK(qg_dev_timer(ctx, 0, NULL));
  else ctx->timer_t0 = qg_wall_time();
  ctx->timer_started = 1;
  return QG_OK;
}

qg_status qg_ctx_timer_stop(qg_ctx *ctx, double *ms) {
  if (!ctx) return QG_ERR_ARG;
  if (!ms) return qg_fail(ctx, QG_ERR_ARG, __func__, "ms is NULL");
  if (!ctx->timer_started) return qg_fail(ctx, QG_ERR_ARG, __func__, "the timer was not started (call qg_ctx_timer_start first)");
  ctx->timer_started = 0;
  if (ctx->device == QG_CUDA) return qg_dev_timer(ctx, 1, ms);
  *ms = 1000.0 * (qg_wall_time() - ctx->timer_t0);
  return QG_OK;
}

qg_status qg_ctx_set_math(qg_ctx *ctx, int math) {
  if (!ctx) return QG_ERR_ARG;
  if (math != QG_MATH_STRICT && math != QG_MATH_TF32)
    return qg_fail(ctx, QG_ERR_ARG, __func__, "math mode %d is neither QG_MATH_STRICT (0) nor QG_MATH_TF32 (1)", math);
  int old = ctx->math;
  ctx->math = math;
  if (ctx->device == QG_CUDA) {
    qg_status s = qg_dev_set_math(ctx);
    if (s != QG_OK) { ctx->math = old; return s; }
  }
  return QG_OK;
}

int qg_ctx_math(const qg_ctx *ctx) { return ctx ? ctx->math : QG_MATH_STRICT; }

qg_status qg_ctx_set_kernel_path(qg_ctx *ctx, int path) {
  if (!ctx) return QG_ERR_ARG;
  if (path != QG_PATH_AUTO && path != QG_PATH_PERSISTENT && path != QG_PATH_FALLBACK)
    return qg_fail(ctx, QG_ERR_ARG, __func__, "kernel path %d is not QG_PATH_AUTO (0), QG_PATH_PERSISTENT (1) or QG_PATH_FALLBACK (2)", path);
  ctx->kernel_path = path;
  return QG_OK;
}

int qg_ctx_kernel_path(const qg_ctx *ctx) { return ctx ? ctx->kernel_path : QG_PATH_AUTO; }

qg_status qg_ctx_set_exact_split(qg_ctx *ctx, int mode) {
  if (!ctx) return QG_ERR_ARG;
  if (mode != QG_SPLIT_AUTO && mode != QG_SPLIT_ON && mode != QG_SPLIT_OFF)
    return qg_fail(ctx, QG_ERR_ARG, __func__, "exact split mode %d is not QG_SPLIT_AUTO (0), QG_SPLIT_ON (1) or QG_SPLIT_OFF (2)", mode);
  ctx->exact_split = mode;
  return QG_OK;
}

int qg_ctx_exact_split(const qg_ctx *ctx) { return ctx ? ctx->exact_split : QG_SPLIT_AUTO; }

qg_status qg_ctx_set_persist_shape(qg_ctx *ctx, int cluster, int rows, int splits, int storage) {
  if (!ctx) return QG_ERR_ARG;
  const int auto_ = cluster == 0 && rows == 0 && splits == 0;
  const int ok_c = cluster == 1 || cluster == 2 || cluster == 4 || cluster == 8 || cluster == 16;
  const int ok_r = rows == 1 || rows == 2 || rows == 4 || rows == 8;
  if (!auto_ && !(ok_c && ok_r && splits >= 0 && splits <= 512))
    return qg_fail(ctx, QG_ERR_ARG, __func__, "cluster %d, rows %d, splits %d: expected 0, 0, 0 (automatic) or a cluster "
                   "of 1, 2, 4, 8 or 16 blocks, 1, 2, 4 or 8 rows and 0..512 splits", cluster, rows, splits);
  if (storage < 0 || storage > 5)
    return qg_fail(ctx, QG_ERR_ARG, __func__,
                   "storage %d: expected 0 (chosen), 1 (shared memory), 2 (registers), 3 (registers, the integer backward's "
                   "cell on warps of its own), 4 (as 3, the cell's inputs on warps of their own too) or 5 (the integer "
                   "forward's small-H kernel with the cell over two roles of warps)", storage);
  ctx->persist_cluster = cluster;
  ctx->persist_rows = rows;
  ctx->persist_splits = splits;
  ctx->persist_storage = storage;
  return QG_OK;
}

int64_t qg_ctx_workspace_bytes(const qg_ctx *ctx) {
  return ctx ? ctx->workspace_bytes + ctx->dev_workspace_bytes : 0;
}

qg_status qg_set_num_threads(qg_ctx *ctx, int n) {
  if (!ctx) return QG_ERR_ARG;
  if (n > 0) openblas_set_num_threads(n);
  return QG_OK;
}

double qg_wall_time(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

qg_status qg_workspace(qg_ctx *ctx, const char *fn, int64_t nbytes, void **out) {
  if (nbytes < 0) return qg_fail(ctx, QG_ERR_ARG, fn, "negative workspace size %lld", (long long)nbytes);
  if (nbytes > ctx->workspace_bytes) {
    int64_t want = nbytes + nbytes / 4 + 64;
    want = (want + 63) & ~(int64_t)63;
    void *p = NULL;
    if (posix_memalign(&p, 64, (size_t)want) != 0 || !p)
      return qg_fail(ctx, QG_ERR_MEMORY, fn, "cannot allocate %lld bytes of workspace", (long long)want);
    free(ctx->workspace);
    ctx->workspace = p;
    ctx->workspace_bytes = want;
  }
  *out = ctx->workspace;
  return QG_OK;
}

/* ---- RNG: xoshiro256** seeded through splitmix64 (Vigna's reference construction) ---- */
static uint64_t splitmix64(uint64_t *x) {
  uint64_t z = (*x += 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

void qg_rng_seed_state(uint64_t s[4], uint64_t seed) {
  uint64_t x = seed;
  for (int i = 0; i < 4; i++) s[i] = splitmix64(&x);
}

static inline uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

uint64_t qg_rng_next(uint64_t s[4]) {
  uint64_t result = rotl(s[1] * 5, 7) * 9;
  uint64_t t = s[1] << 17;
  s[2] ^= s[0]; s[3] ^= s[1]; s[1] ^= s[2]; s[0] ^= s[3];
  s[2] ^= t;
  s[3] = rotl(s[3], 45);
  return result;
}

double qg_rng_uniform01(uint64_t s[4]) { return (double)(qg_rng_next(s) >> 11) * 0x1.0p-53; }

qg_status qg_rng_seed(qg_ctx *ctx, uint64_t seed) {
  if (!ctx) return QG_ERR_ARG;
  qg_rng_seed_state(ctx->rng, seed);
  return QG_OK;
}

qg_status qg_rng_get_state(qg_ctx *ctx, uint64_t *state4) {
  if (!ctx) return QG_ERR_ARG;
  if (!state4) return qg_fail(ctx, QG_ERR_ARG, __func__, "state is NULL");
  memcpy(state4, ctx->rng, sizeof ctx->rng);
  return QG_OK;
}

qg_status qg_rng_set_state(qg_ctx *ctx, const uint64_t *state4) {
  if (!ctx) return QG_ERR_ARG;
  if (!state4) return qg_fail(ctx, QG_ERR_ARG, __func__, "state is NULL");
  if (!(state4[0] | state4[1] | state4[2] | state4[3]))
    return qg_fail(ctx, QG_ERR_ARG, __func__, "an all-zero xoshiro256** state is invalid");
  memcpy(ctx->rng, state4, sizeof ctx->rng);
  return QG_OK;
}

/* ---- argument checks ---- */
const char *qg_shape_str(char *buf, size_t n, int ndim, const int64_t *dims) {
  size_t used = 0;
  used += (size_t)snprintf(buf + used, n - used, "[");
  for (int i = 0; i < ndim && used < n; i++) {
    if (dims[i] < 0) used += (size_t)snprintf(buf + used, n - used, "%s*", i ? ", " : "");
    else used += (size_t)snprintf(buf + used, n - used, "%s%lld", i ? ", " : "", (long long)dims[i]);
  }
  if (used < n) snprintf(buf + used, n - used, "]");
  return buf;
}

qg_status qg_check_tensor(qg_ctx *ctx, const char *fn, const char *arg, const qg_tensor *t,
                          int dtype, int ndim, const int64_t *dims) {
  if (!t) return qg_fail(ctx, QG_ERR_ARG, fn, "%s is NULL", arg);
  if (dtype >= 0 && t->dtype != dtype)
    return qg_fail(ctx, QG_ERR_ARG, fn, "%s: expected dtype %s, got %s", arg, qg_dtype_name(dtype),
                   qg_dtype_name(t->dtype));
  int bad = ndim >= 0 && t->ndim != ndim;
  for (int i = 0; !bad && dims && i < ndim; i++) bad = dims[i] >= 0 && t->dims[i] != dims[i];
  if (bad) {
    char e[96], g[96];
    if (dims) qg_shape_str(e, sizeof e, ndim, dims);
    else snprintf(e, sizeof e, "%d dims", ndim);
    return qg_fail(ctx, QG_ERR_ARG, fn, "%s: expected shape %s, got %s", arg, e,
                   qg_shape_str(g, sizeof g, t->ndim, t->dims));
  }
  return QG_OK;
}

qg_status qg_need_cuda_context(qg_ctx *ctx, const char *fn) {
  return qg_fail(ctx, QG_ERR_DEVICE, fn, "the tensors are on cuda but the context is a cpu context: "
                 "pass the cuda context (its stream orders the work)");
}

qg_status qg_common_device(qg_ctx *ctx, const char *fn, int *device, int n, const qg_tensor *const *ts,
                           const char *const *names) {
  int first = -1;
  for (int i = 0; i < n; i++) {
    if (!ts[i]) continue;
    if (first < 0) { first = i; continue; }
    if (ts[i]->device != ts[first]->device)
      return qg_fail(ctx, QG_ERR_DEVICE, fn, "%s is on %s but %s is on %s: all tensors of one call must be on one device",
                     names[i], ts[i]->device == QG_CUDA ? "cuda" : "cpu", names[first],
                     ts[first]->device == QG_CUDA ? "cuda" : "cpu");
  }
  *device = first >= 0 ? ts[first]->device : ctx->device;
  return QG_OK;
}
