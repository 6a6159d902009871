/*
 * io_npy.c: NumPy .npy files (format versions 1, 2 and 3; little-endian; C order), so users can
 * bring their own features. The header dictionary is parsed strictly: an unknown dtype, Fortran
 * order (or any fortran_order but False), big-endian data, a malformed shape or a size that does
 * not match the file is an error naming the file. Sizes are checked against the file's length
 * before the tensor is allocated, so a header claiming 40 GB costs nothing.
 */
#include "io_file.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int npy_dtype(const char *d, int *es) {
  static const struct { const char *s; int dt, es; } map[] = {
    {"<f4", QG_F32, 4}, {"<f8", QG_F64, 8}, {"|i1", QG_I8, 1}, {"|u1", QG_U8, 1}, {"|b1", QG_U8, 1},
    {"<i2", QG_I16, 2}, {"<i4", QG_I32, 4}, {"<i8", QG_I64, 8}, {"i1", QG_I8, 1}, {"u1", QG_U8, 1}};
  for (size_t i = 0; i < sizeof map / sizeof map[0]; i++)
    if (!strcmp(d, map[i].s)) { *es = map[i].es; return map[i].dt; }
  return -1;
}

static const char *npy_descr(int dtype) {
  switch (dtype) {
    case QG_F32: return "<f4"; case QG_F64: return "<f8"; case QG_I8: return "|i1"; case QG_U8: return "|u1";
    case QG_I16: return "<i2"; case QG_I32: return "<i4"; case QG_I64: return "<i8";
  }
  return NULL;
}

/* Finds 'key': in the header dict and returns a pointer just after the colon (and spaces). */
static const char *dict_value(const char *h, const char *key) {
  char pat[32];
  snprintf(pat, sizeof pat, "'%s'", key);
  const char *p = strstr(h, pat);
  if (!p) return NULL;
  p += strlen(pat);
  while (*p == ' ') p++;
  if (*p != ':') return NULL;
  p++;
  while (*p == ' ') p++;
  return p;
}

/* 1 when the text at v is the Python literal word followed by the end of a value. */
static int is_word(const char *v, const char *word) {
  size_t n = strlen(word);
  return !strncmp(v, word, n) && (v[n] == ',' || v[n] == ' ' || v[n] == '}');
}

/* A short printable quote of the text at v for error messages: up to the first character of stop
 * (a tuple, v starting with '(': up to and including its ')'). */
static const char *quote_value(char *buf, size_t n, const char *v) {
  const char *stop = *v == '(' ? ")}" : ",}";
  size_t i = 0;
  for (; i + 2 < n && i < 24 && v[i] && !strchr(stop, v[i]); i++) buf[i] = (v[i] >= 32 && v[i] < 127) ? v[i] : '?';
  if (*v == '(' && v[i] == ')') buf[i++] = ')';
  buf[i] = 0;
  return buf;
}

qg_status qg_npy_load(qg_ctx *ctx, qg_tensor **out, const char *path) {
  if (!ctx || !out) return QG_ERR_ARG;
  const char *fn = __func__;
  *out = NULL;
  if (!path) return qg_fail(ctx, QG_ERR_ARG, fn, "path is NULL");
  int fd;
  int64_t fsize;
  QG_CHECK(qg_io_open(ctx, fn, path, &fd, &fsize));
  FILE *f = fdopen(fd, "rb");
  if (!f) { close(fd); return qg_fail(ctx, QG_ERR_IO, fn, "cannot open '%s': %s", path, strerror(errno)); }
  qg_status st = QG_OK;
  char *header = NULL;
  qg_tensor *t = NULL;
  unsigned char pre[10];
  char q[32];
  if (fread(pre, 1, 8, f) != 8 || memcmp(pre, "\x93NUMPY", 6) != 0) {
    st = qg_fail(ctx, QG_ERR_FORMAT, fn, "'%s': not a .npy file (bad magic)", path); goto done;
  }
  int major = pre[6];
  uint32_t hlen = 0;
  int64_t hstart;
  if (major == 1) {
    if (fread(pre + 8, 1, 2, f) != 2) { st = qg_fail(ctx, QG_ERR_FORMAT, fn, "'%s': truncated header", path); goto done; }
    hlen = (uint32_t)pre[8] | ((uint32_t)pre[9] << 8);
    hstart = 10;
  } else if (major == 2 || major == 3) {
    unsigned char b[4];
    if (fread(b, 1, 4, f) != 4) { st = qg_fail(ctx, QG_ERR_FORMAT, fn, "'%s': truncated header", path); goto done; }
    hlen = (uint32_t)b[0] | ((uint32_t)b[1] << 8) | ((uint32_t)b[2] << 16) | ((uint32_t)b[3] << 24);
    hstart = 12;
  } else { st = qg_fail(ctx, QG_ERR_FORMAT, fn, "'%s': unsupported .npy version %d (qgru reads 1, 2, 3)", path, major); goto done; }
  if (hlen > (1u << 24) || hstart + (int64_t)hlen > fsize) {
    st = qg_fail(ctx, QG_ERR_FORMAT, fn, "'%s': header length %u does not fit in a %lld-byte file", path, hlen, (long long)fsize); goto done;
  }
  header = (char *)malloc(hlen + 1);
  if (!header) { st = qg_fail(ctx, QG_ERR_MEMORY, fn, "out of memory"); goto done; }
  if (fread(header, 1, hlen, f) != hlen) { st = qg_fail(ctx, QG_ERR_FORMAT, fn, "'%s': truncated header", path); goto done; }
  header[hlen] = 0;
  const char *h = header;
  while (*h == ' ') h++;
  if (*h != '{' || !strchr(h, '}')) { st = qg_fail(ctx, QG_ERR_FORMAT, fn, "'%s': the header is not a Python dict literal", path); goto done; }

  const char *v = dict_value(h, "descr");
  char descr[16] = {0};
  if (!v || *v != '\'' || sscanf(v + 1, "%15[^']", descr) != 1) {
    st = qg_fail(ctx, QG_ERR_FORMAT, fn, "'%s': header has no 'descr'", path); goto done;
  }
  int es = 0, dtype = npy_dtype(descr, &es);
  if (dtype < 0) { st = qg_fail(ctx, QG_ERR_FORMAT, fn, "'%s': unsupported dtype '%s' (qgru reads <f4 <f8 i1 u1 b1 <i2 <i4 <i8)", path, descr); goto done; }
  v = dict_value(h, "fortran_order");
  if (!v) { st = qg_fail(ctx, QG_ERR_FORMAT, fn, "'%s': header has no 'fortran_order'", path); goto done; }
  if (is_word(v, "True")) { st = qg_fail(ctx, QG_ERR_FORMAT, fn, "'%s': Fortran order not supported (save with np.ascontiguousarray)", path); goto done; }
  if (!is_word(v, "False")) {
    st = qg_fail(ctx, QG_ERR_FORMAT, fn, "'%s': 'fortran_order' must be False, got '%s'", path, quote_value(q, sizeof q, v)); goto done;
  }
  v = dict_value(h, "shape");
  if (!v || *v != '(') { st = qg_fail(ctx, QG_ERR_FORMAT, fn, "'%s': header has no 'shape' tuple", path); goto done; }
  int64_t dims[QG_MAX_DIMS], numel = 1;
  int ndim = 0, too_big = 0;
  const char *p = v + 1;
  for (;;) {
    while (*p == ' ') p++;
    if (*p == ')') break;
    if (*p < '0' || *p > '9') { st = qg_fail(ctx, QG_ERR_FORMAT, fn, "'%s': bad 'shape' %s", path, quote_value(q, sizeof q, v)); goto done; }
    if (ndim == QG_MAX_DIMS) { st = qg_fail(ctx, QG_ERR_FORMAT, fn, "'%s': more than %d dimensions", path, QG_MAX_DIMS); goto done; }
    int64_t d = 0;
    for (; *p >= '0' && *p <= '9'; p++) {
      if (!qg_mul_ok(d, 10, &d) || d > INT64_MAX - 9) { too_big = 1; d = 0; }
      d += *p - '0';
    }
    while (*p == ' ') p++;
    if (*p == ',') p++;
    else if (*p != ')') { st = qg_fail(ctx, QG_ERR_FORMAT, fn, "'%s': bad 'shape' %s", path, quote_value(q, sizeof q, v)); goto done; }
    dims[ndim++] = d;
  }
  if (ndim == 0) dims[ndim++] = 1;   /* a 0-d scalar becomes [1] */
  if (!qg_shape_numel(ndim, dims, &numel)) too_big = 1;
  char shape[96];
  qg_shape_str(shape, sizeof shape, ndim, dims);
  int64_t want = 0, have = fsize - hstart - (int64_t)hlen;
  if (too_big || !qg_mul_ok(numel, es, &want)) { st = qg_fail(ctx, QG_ERR_FORMAT, fn, "'%s': shape %s is too large", path, shape); goto done; }
  /* Check the claimed size against the file before allocating. */
  if (want != have) {
    st = qg_fail(ctx, QG_ERR_FORMAT, fn, "'%s': %s: the header (shape %s of %s) promises %lld data bytes, the file has %lld", path,
                 have < want ? "truncated" : "trailing bytes after the data", shape, descr, (long long)want, (long long)have);
    goto done;
  }
  st = qg_tensor_create(ctx, &t, dtype, QG_CPU, ndim, dims);
  if (st != QG_OK) goto done;
  size_t got = fread(t->data, 1, (size_t)want, f);
  if (got != (size_t)want) { st = qg_fail(ctx, QG_ERR_IO, fn, "'%s': read failed after %zu of %lld data bytes", path, got, (long long)want); goto done; }
done:
  fclose(f);
  free(header);
  if (st != QG_OK) { qg_tensor_free(t); return st; }
  *out = t;
  return QG_OK;
}

qg_status qg_npy_save(qg_ctx *ctx, const char *path, const qg_tensor *t) {
  if (!ctx) return QG_ERR_ARG;
  const char *fn = __func__;
  if (!path) return qg_fail(ctx, QG_ERR_ARG, fn, "path is NULL");
  QG_CHECK(qg_check_tensor(ctx, fn, "t", t, -1, -1, NULL));
  if (t->device != QG_CPU) return qg_fail(ctx, QG_ERR_DEVICE, fn, "t must be a cpu tensor (copy it to the cpu first)");
  char dict[256], shape[128];
  size_t used = 0;
  for (int i = 0; i < t->ndim; i++) used += (size_t)snprintf(shape + used, sizeof shape - used, "%lld,%s", (long long)t->dims[i], i + 1 < t->ndim ? " " : "");
  if (t->ndim > 1) shape[used - 1] = 0;
  int n = snprintf(dict, sizeof dict, "{'descr': '%s', 'fortran_order': False, 'shape': (%s), }", npy_descr(t->dtype), shape);
  int total = 10 + n + 1, pad = (64 - total % 64) % 64;
  FILE *f = fopen(path, "wb");
  if (!f) return qg_fail(ctx, QG_ERR_IO, fn, "cannot write '%s'", path);
  unsigned hl = (unsigned)(n + pad + 1);
  unsigned char pre[10] = {0x93, 'N', 'U', 'M', 'P', 'Y', 1, 0, (unsigned char)(hl & 255), (unsigned char)(hl >> 8)};
  int ok = fwrite(pre, 1, 10, f) == 10 && fwrite(dict, 1, (size_t)n, f) == (size_t)n;
  for (int i = 0; ok && i < pad; i++) ok = fputc(' ', f) != EOF;
  ok = ok && fputc('\n', f) != EOF;
  ok = ok && fwrite(t->data, 1, (size_t)qg_tensor_bytes(t), f) == (size_t)qg_tensor_bytes(t);
  if (fclose(f) != 0) ok = 0;
  return ok ? QG_OK : qg_fail(ctx, QG_ERR_IO, fn, "write to '%s' failed", path);
}
