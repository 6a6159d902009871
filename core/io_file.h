/*
 * io_file.h: what the file readers (io_idx.c, io_npy.c, io_safetensors.c) share: opening a path
 * as a regular file and learning its length before anything is read or allocated (so a
 * directory, a FIFO or a missing file is a clear error, and every size a header claims can be
 * checked against the file first), and overflow-checked size arithmetic.
 */
#ifndef QGRU_IO_FILE_H
#define QGRU_IO_FILE_H

#include "internal.h"

#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* Opens path read-only; *fd and *size (bytes) on success. Fails naming the path: cannot open
 * (with the system's reason), is a directory, or is not a regular file. */
static inline qg_status qg_io_open(qg_ctx *ctx, const char *fn, const char *path, int *fd, int64_t *size) {
  *fd = -1;
  *size = 0;
  int d = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);   /* O_NONBLOCK: a FIFO must not block the open */
  if (d < 0) return qg_fail(ctx, QG_ERR_IO, fn, "cannot open '%s': %s", path, strerror(errno));
  struct stat sb;
  if (fstat(d, &sb) != 0) {
    int e = errno;
    close(d);
    return qg_fail(ctx, QG_ERR_IO, fn, "cannot stat '%s': %s", path, strerror(e));
  }
  if (S_ISDIR(sb.st_mode)) { close(d); return qg_fail(ctx, QG_ERR_IO, fn, "'%s' is a directory, not a file", path); }
  if (!S_ISREG(sb.st_mode)) { close(d); return qg_fail(ctx, QG_ERR_IO, fn, "'%s' is not a regular file", path); }
  int fl = fcntl(d, F_GETFL);
  if (fl != -1) (void)fcntl(d, F_SETFL, fl & ~O_NONBLOCK);
  *fd = d;
  *size = (int64_t)sb.st_size;
  return QG_OK;
}

/* *r = a * b for a, b >= 0; returns 0 (and leaves *r alone) when the product exceeds INT64_MAX. */
static inline int qg_mul_ok(int64_t a, int64_t b, int64_t *r) {
  int64_t p;
  if (a < 0 || b < 0 || __builtin_mul_overflow(a, b, &p)) return 0;
  *r = p;
  return 1;
}

/* *numel = the product of dims[0..ndim-1] under qg_tensor_create's limit (every partial product
 * times 16 fits in int64, so even a shape with a zero somewhere is refused here, with the file
 * named, rather than by qg_tensor_create later); returns 0 when the shape is too large. */
static inline int qg_shape_numel(int ndim, const int64_t *dims, int64_t *numel) {
  int64_t n = 1;
  for (int i = 0; i < ndim; i++) {
    if (dims[i] < 0) return 0;
    if (dims[i] > 0 && n > INT64_MAX / 16 / dims[i]) return 0;
    n *= dims[i];
  }
  *numel = n;
  return 1;
}

#endif
