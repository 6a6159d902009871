/*
 * io_idx.c: the IDX reader (the MNIST / Fashion-MNIST format), plain or gzip-compressed, through
 * zlib. The whole file is validated before the tensor is allocated: the sizes the header claims
 * are checked against the file's length (plain) or the gzip trailer's ISIZE (counting the
 * decompressed bytes when the trailer does not settle it), so a corrupt header cannot make us
 * allocate gigabytes; a truncated download, a gzip stream without its CRC/ISIZE trailer, a CRC
 * mismatch and trailing bytes are errors that name the file, never a silent short read.
 */
#include "io_file.h"

#include <stdio.h>
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

/* zlib's view of the stream after a read: "" when fine, else "; zlib: <message>" (a stream that
 * stops before its trailer says so). */
static const char *gz_why(gzFile f, char *buf, size_t n) {
  int errnum = 0;
  const char *zmsg = gzerror(f, &errnum);
  if (errnum == Z_OK) return "";
  snprintf(buf, n, "; zlib: %s%s", zmsg ? zmsg : "error",
           errnum == Z_BUF_ERROR ? " (truncated gzip stream: no CRC/ISIZE trailer)" : "");
  return buf;
}

/* Decompresses the rest of the stream to count its bytes (nothing kept); stops once more than
 * limit bytes came. Returns -1 on a zlib error (the stream is corrupt or truncated). */
static int64_t gz_count_rest(gzFile f, int64_t limit) {
  static const unsigned chunk = 1u << 16;
  unsigned char *buf = (unsigned char *)malloc(chunk);
  if (!buf) return -1;
  int64_t n = 0;
  for (;;) {
    int r = gzread(f, buf, chunk);
    if (r < 0) { n = -1; break; }
    if (r == 0) break;
    n += r;
    if (n > limit) break;
  }
  free(buf);
  int errnum = 0;
  gzerror(f, &errnum);
  return errnum == Z_OK ? n : -1;
}

qg_status qg_idx_load(qg_ctx *ctx, qg_tensor **out, const char *path) {
  if (!ctx || !out) return QG_ERR_ARG;
  const char *fn = __func__;
  *out = NULL;
  if (!path) return qg_fail(ctx, QG_ERR_ARG, fn, "path is NULL");
  int fd;
  int64_t fsize;
  QG_CHECK(qg_io_open(ctx, fn, path, &fd, &fsize));
  /* gzip: the trailer's ISIZE is the decompressed length mod 2^32 (of the last member). */
  unsigned char magic[2] = {0, 0}, tail[4];
  int is_gz = fsize >= 2 && pread(fd, magic, 2, 0) == 2 && magic[0] == 0x1f && magic[1] == 0x8b;
  int have_isize = is_gz && fsize >= 18 && pread(fd, tail, 4, (off_t)(fsize - 4)) == 4;
  uint32_t isize = have_isize ? (uint32_t)tail[0] | ((uint32_t)tail[1] << 8) | ((uint32_t)tail[2] << 16) | ((uint32_t)tail[3] << 24) : 0;
  gzFile f = gzdopen(fd, "rb");
  if (!f) { close(fd); return qg_fail(ctx, QG_ERR_MEMORY, fn, "'%s': cannot set up zlib", path); }
  qg_status st = QG_OK;
  qg_tensor *t = NULL;
  char why[160];
  unsigned char head[4];
  int got = gzread(f, head, 4);
  if (got != 4) {
    st = qg_fail(ctx, QG_ERR_FORMAT, fn, "'%s': file too short for an IDX header (%d bytes)%s", path, got < 0 ? 0 : got, gz_why(f, why, sizeof why));
    goto done;
  }
  int elsize = 0, dtype = idx_dtype(head[2], &elsize), ndim = head[3];
  if (head[0] != 0 || head[1] != 0 || dtype < 0) {
    st = qg_fail(ctx, QG_ERR_FORMAT, fn, "'%s': not an IDX file (magic bytes %02x %02x %02x %02x)", path, head[0], head[1], head[2], head[3]);
    goto done;
  }
  if (ndim < 1 || ndim > QG_MAX_DIMS) { st = qg_fail(ctx, QG_ERR_FORMAT, fn, "'%s': %d dimensions (qgru reads 1..%d)", path, ndim, QG_MAX_DIMS); goto done; }
  int64_t dims[QG_MAX_DIMS], numel = 1;
  int too_big = 0;
  for (int i = 0; i < ndim; i++) {
    unsigned char b[4];
    if (gzread(f, b, 4) != 4) { st = qg_fail(ctx, QG_ERR_FORMAT, fn, "'%s': truncated in the dimension list%s", path, gz_why(f, why, sizeof why)); goto done; }
    dims[i] = ((int64_t)b[0] << 24) | ((int64_t)b[1] << 16) | ((int64_t)b[2] << 8) | b[3];
  }
  if (!qg_shape_numel(ndim, dims, &numel)) too_big = 1;
  char shape[96];
  qg_shape_str(shape, sizeof shape, ndim, dims);
  int64_t want = 0, head_bytes = 4 + 4 * (int64_t)ndim;
  if (too_big || !qg_mul_ok(numel, elsize, &want) || want > INT64_MAX / 2) {
    st = qg_fail(ctx, QG_ERR_FORMAT, fn, "'%s': shape %s is too large", path, shape);
    goto done;
  }
  /* Check the claimed size against the file before allocating anything. */
  if (!is_gz) {
    if (fsize - head_bytes != want) {
      st = qg_fail(ctx, QG_ERR_FORMAT, fn, "'%s': %s: the header (shape %s of %s) promises %lld data bytes, the file has %lld",
                   path, fsize - head_bytes < want ? "truncated" : "trailing bytes", shape, qg_dtype_name(dtype), (long long)want,
                   (long long)(fsize - head_bytes));
      goto done;
    }
  } else if (!have_isize || isize != (uint32_t)(head_bytes + want) || want > 1100 * fsize) {
    /* The trailer does not confirm the claim (truncated, corrupt, several gzip members, or a claim
     * beyond deflate's ~1032:1 ratio): count the decompressed bytes, then rewind. */
    int64_t rest = gz_count_rest(f, want);
    if (rest < 0) { st = qg_fail(ctx, QG_ERR_FORMAT, fn, "'%s': corrupt gzip data%s", path, gz_why(f, why, sizeof why)); goto done; }
    if (rest != want) {
      st = qg_fail(ctx, QG_ERR_FORMAT, fn, "'%s': %s: the header (shape %s of %s) promises %lld data bytes, the decompressed file has %s%lld",
                   path, rest < want ? "truncated" : "trailing bytes", shape, qg_dtype_name(dtype), (long long)want,
                   rest > want ? "more than " : "", (long long)rest);
      goto done;
    }
    if (gzrewind(f) != 0 || gzseek(f, (z_off_t)head_bytes, SEEK_SET) != (z_off_t)head_bytes) {
      st = qg_fail(ctx, QG_ERR_IO, fn, "'%s': cannot rewind the gzip stream%s", path, gz_why(f, why, sizeof why));
      goto done;
    }
  }
  st = qg_tensor_create(ctx, &t, dtype, QG_CPU, ndim, dims);
  if (st != QG_OK) goto done;
  int64_t have = 0;
  while (have < want) {
    unsigned chunk = (unsigned)((want - have) > (1 << 30) ? (1 << 30) : (want - have));
    int r = gzread(f, (char *)t->data + have, chunk);
    if (r <= 0) break;
    have += r;
  }
  if (have != want) {
    st = qg_fail(ctx, QG_ERR_FORMAT, fn, "'%s': truncated: the header promises %lld data bytes, the file has %lld%s", path,
                 (long long)want, (long long)have, gz_why(f, why, sizeof why));
    goto done;
  }
  /* One more read reaches the end of the stream, where zlib checks the CRC and length trailer. */
  char extra;
  int r = gzread(f, &extra, 1);
  if (r > 0) { st = qg_fail(ctx, QG_ERR_FORMAT, fn, "'%s': trailing bytes after %lld data bytes", path, (long long)want); goto done; }
  if (*gz_why(f, why, sizeof why)) { st = qg_fail(ctx, QG_ERR_FORMAT, fn, "'%s': bad end of the gzip stream%s", path, why); goto done; }
  if (elsize > 1) swap_be(t->data, t->numel, elsize);
done:
  gzclose(f);
  if (st != QG_OK) { qg_tensor_free(t); return st; }
  *out = t;
  return QG_OK;
}
