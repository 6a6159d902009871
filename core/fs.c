/*
 * fs.c: file-system helpers the Lua side needs without a shell. qg_mkdir_p creates a directory
 * and its parents (like `mkdir -p`) from the path taken literally, so user strings (run names,
 * paths from the command line) never reach /bin/sh. Errors name the component that failed.
 */
#define _POSIX_C_SOURCE 200809L
#include "internal.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>

/* Creates one directory; an existing directory is fine. */
static qg_status make_one(qg_ctx *ctx, const char *dir, const char *path) {
  if (mkdir(dir, 0777) == 0) return QG_OK;
  int err = errno;
  struct stat st;
  if (err == EEXIST) {
    if (stat(dir, &st) == 0 && S_ISDIR(st.st_mode)) return QG_OK;
    return qg_fail(ctx, QG_ERR_IO, "qg_mkdir_p", "cannot create directory '%s': '%s' exists and is not a directory",
                   path, dir);
  }
  return qg_fail(ctx, QG_ERR_IO, "qg_mkdir_p", "cannot create directory '%s': '%s': %s", path, dir, strerror(err));
}

qg_status qg_mkdir_p(qg_ctx *ctx, const char *path) {
  if (!path) return qg_fail(ctx, QG_ERR_ARG, __func__, "path is NULL");
  size_t n = strlen(path);
  if (n == 0) return qg_fail(ctx, QG_ERR_ARG, __func__, "path is empty");
  char *buf = malloc(n + 1);
  if (!buf) return qg_fail(ctx, QG_ERR_MEMORY, __func__, "out of memory for a path of %zu bytes", n);
  memcpy(buf, path, n + 1);
  qg_status st = QG_OK;
  /* every prefix that ends before a '/' (skipping the root and repeated slashes), then the whole path */
  for (size_t i = 1; i < n && st == QG_OK; i++) {
    if (buf[i] == '/' && buf[i - 1] != '/') {
      buf[i] = '\0';
      st = make_one(ctx, buf, path);
      buf[i] = '/';
    }
  }
  if (st == QG_OK) st = make_one(ctx, buf, path);
  free(buf);
  return st;
}
