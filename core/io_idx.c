/*
 * io_idx.c: the IDX reader (the MNIST / Fashion-MNIST format), plain or gzip-compressed, through
 * zlib. Every size is checked against what the file holds, so a truncated or corrupt download is
 * an error that names the file, never a silent short read.
 */
#include "internal.h"

#include <stdlib.h>
#include <string.h>
#include <zlib.h>

static int idx_dtype(int code, int *elsize) {
  switch (code) {
    case 0x08: *elsize = 1; return QG_U8;
    case 0x09: *elsize = 1; return QG_I8;
    case 0x0B: *elsize = 2; return QG_I16;
    case 0x0C: *elsize = 4; return QG_I32;
    case 0x0D: *elsize = 4; return QG_F32;
    case 0x0E: *elsize = 8; return QG_F64;
  }
  return -1;
}

/* IDX stores multi-byte values big-endian; swap each element in place. */
static void swap_be(void *data, int64_t n, int elsize) {
  unsigned char *p = (unsigned char *)data;
  for (int64_t i = 0; i < n; i++, p += elsize)
    for (int a = 0, b = elsize - 1; a < b; a++, b--) { unsigned char t = p[a]; p[a] = p[b]; p[b] = t; }
}

qg_status qg_idx_load(qg_ctx *ctx, qg_tensor **out, const char *path) {
  if (!ctx || !out) return QG_ERR_ARG;
  const char *fn = __func__;
  *out = NULL;
  if (!path) return qg_fail(ctx, QG_ERR_ARG, fn, "path is NULL");
  gzFile f = gzopen(path, "rb");
  if (!f) return qg_fail(ctx, QG_ERR_IO, fn, "cannot open '%s'", path);
  qg_status st = QG_OK;
  qg_tensor *t = NULL;
  unsigned char head[4];
  int got = gzread(f, head, 4);
  if (got != 4) { st = qg_fail(ctx, QG_ERR_FORMAT, fn, "'%s': file too short for an IDX header (%d bytes)", path, got < 0 ? 0 : got); goto done; }
  int elsize = 0, dtype = idx_dtype(head[2], &elsize), ndim = head[3];
  if (head[0] != 0 || head[1] != 0 || dtype < 0) {
    st = qg_fail(ctx, QG_ERR_FORMAT, fn, "'%s': not an IDX file (magic bytes %02x %02x %02x %02x)", path, head[0], head[1], head[2], head[3]);
    goto done;
  }
  if (ndim < 1 || ndim > QG_MAX_DIMS) { st = qg_fail(ctx, QG_ERR_FORMAT, fn, "'%s': %d dimensions (qgru reads 1..%d)", path, ndim, QG_MAX_DIMS); goto done; }
  int64_t dims[QG_MAX_DIMS];
  for (int i = 0; i < ndim; i++) {
    unsigned char b[4];
    if (gzread(f, b, 4) != 4) { st = qg_fail(ctx, QG_ERR_FORMAT, fn, "'%s': truncated in the dimension list", path); goto done; }
    dims[i] = ((int64_t)b[0] << 24) | ((int64_t)b[1] << 16) | ((int64_t)b[2] << 8) | b[3];
  }
  st = qg_tensor_create(ctx, &t, dtype, QG_CPU, ndim, dims);
  if (st != QG_OK) goto done;
  int64_t want = t->numel * elsize, have = 0;
  while (have < want) {
    unsigned chunk = (unsigned)((want - have) > (1 << 30) ? (1 << 30) : (want - have));
    int r = gzread(f, (char *)t->data + have, chunk);
    if (r <= 0) break;
    have += r;
  }
  if (have != want) {
    int errnum = 0;
    const char *zmsg = gzerror(f, &errnum);
    st = qg_fail(ctx, QG_ERR_FORMAT, fn, "'%s': truncated: the header promises %lld data bytes, the file has %lld%s%s", path,
                 (long long)want, (long long)have, errnum ? "; zlib: " : "", errnum ? zmsg : "");
    goto done;
  }
  char extra;
  if (gzread(f, &extra, 1) > 0) { st = qg_fail(ctx, QG_ERR_FORMAT, fn, "'%s': trailing bytes after %lld data bytes", path, (long long)want); goto done; }
  if (elsize > 1) swap_be(t->data, t->numel, elsize);
done:
  gzclose(f);
  if (st != QG_OK) { qg_tensor_free(t); return st; }
  *out = t;
  return QG_OK;
}
