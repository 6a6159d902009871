/*
 * fuzz_targets.c: one function per C loader that feeds it an arbitrary byte string and checks what
 * must hold for every input: no crash or sanitizer report, failures name the file, and a tensor
 * that loads is no larger than its file allows (so a header cannot make the loader allocate more
 * than the file holds). File loaders read the bytes through a memfd (/proc/self/fd/N), so the
 * real path-based API is exercised without touching the disk. The IDX target has a second mode
 * (first byte 0xC0..0xFF) that gzip-compresses the rest of the input itself, so mutations reach
 * the gzip path with valid CRCs, optionally cutting 1..15 bytes off the end of the stream (such a
 * file must never load).
 */
#define _GNU_SOURCE
#include "fuzz_targets.h"

#include "qgru.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>
#include <zlib.h>

const char *const qg_fuzz_target_names[] = {"idx", "npy", "safetensors", "json", NULL};

static qg_ctx *fuzz_ctx(void) {
  static qg_ctx *ctx = NULL;
  if (!ctx && qg_ctx_create(&ctx, QG_CPU, 0, 1) != QG_OK) abort();
  return ctx;
}

static void must(int cond, const char *what, const qg_ctx *ctx) {
  if (cond) return;
  fprintf(stderr, "fuzz invariant broken: %s (last error: %s)\n", what, ctx ? qg_last_error(ctx) : "");
  abort();
}

/* The input as a file: a memfd holding the bytes; path receives its /proc name. */
static int as_file(const uint8_t *data, size_t size, char *path, size_t n) {
  int fd = memfd_create("qgru-fuzz", MFD_CLOEXEC);
  if (fd < 0) { perror("memfd_create"); abort(); }
  size_t done = 0;
  while (done < size) {
    ssize_t w = write(fd, data + done, size - done);
    if (w <= 0) { perror("write"); abort(); }
    done += (size_t)w;
  }
  snprintf(path, n, "/proc/self/fd/%d", fd);
  return fd;
}

static void check_failure(qg_ctx *ctx, qg_status st, const char *path) {
  must(st == QG_ERR_FORMAT || st == QG_ERR_IO, "a bad file fails with QG_ERR_FORMAT or QG_ERR_IO", ctx);
  must(strstr(qg_last_error(ctx), path) != NULL, "the error names the file", ctx);
}

static void touch_tensor(qg_ctx *ctx, const qg_tensor *t) {
  int64_t count = 0, first = 0;
  must(qg_count_nonfinite(ctx, &count, &first, t) == QG_OK, "qg_count_nonfinite works on a loaded tensor", ctx);
  must(count >= 0 && count <= t->numel && (count == 0) == (first == -1) && first < t->numel, "qg_count_nonfinite is consistent", ctx);
}

/* gzip of data[0..size) into a new buffer (*out, *n); 0 on failure. */
static int gzip_bytes(const uint8_t *data, size_t size, uint8_t **out, size_t *n) {
  z_stream z;
  memset(&z, 0, sizeof z);
  if (deflateInit2(&z, 6, Z_DEFLATED, 15 + 16, 8, Z_DEFAULT_STRATEGY) != Z_OK) return 0;
  size_t cap = deflateBound(&z, (uLong)size) + 32;
  *out = (uint8_t *)malloc(cap);
  if (!*out) { deflateEnd(&z); return 0; }
  z.next_in = (Bytef *)data; z.avail_in = (uInt)size;
  z.next_out = *out; z.avail_out = (uInt)cap;
  int ok = deflate(&z, Z_FINISH) == Z_STREAM_END;
  *n = cap - z.avail_out;
  deflateEnd(&z);
  if (!ok) { free(*out); *out = NULL; }
  return ok;
}

static void fuzz_tensor_file(const uint8_t *data, size_t size, int npy) {
  qg_ctx *ctx = fuzz_ctx();
  char path[64];
  uint8_t *gz = NULL;
  size_t cut = 0, orig = size;
  if (!npy && size >= 1 && data[0] >= 0xC0) {
    size_t n = 0;
    if (!gzip_bytes(data + 1, size - 1, &gz, &n)) abort();
    cut = (data[0] & 0x10) ? (size_t)(data[0] & 0x0F) : 0;
    if (cut > n) cut = n;
    data = gz;
    size = n - cut;
  }
  int fd = as_file(data, size, path, sizeof path);
  qg_tensor *t = NULL;
  qg_status st = npy ? qg_npy_load(ctx, &t, path) : qg_idx_load(ctx, &t, path);
  if (st == QG_OK) {
    must(t != NULL && t->ndim >= 1 && t->ndim <= QG_MAX_DIMS, "a loaded tensor has 1..4 dims", ctx);
    int64_t bytes = t->numel * qg_dtype_size(t->dtype);
    /* A gzip IDX can be larger than its file (deflate compresses at most about 1032:1). */
    int is_gz = size >= 2 && data[0] == 0x1f && data[1] == 0x8b;
    must(bytes <= (int64_t)size * (is_gz ? 1100 : 1), "a loaded tensor is no larger than its file allows", ctx);
    must(bytes <= (int64_t)orig, "a loaded tensor is no larger than the fuzz input", ctx);
    must(cut == 0, "a gzip stream missing trailer bytes never loads", ctx);
    touch_tensor(ctx, t);
    qg_tensor_free(t);
  } else {
    must(t == NULL, "a failed load returns no tensor", ctx);
    check_failure(ctx, st, path);
  }
  close(fd);
  free(gz);
}

static void fuzz_safetensors(const uint8_t *data, size_t size) {
  qg_ctx *ctx = fuzz_ctx();
  char path[64];
  int fd = as_file(data, size, path, sizeof path);
  qg_st_file *f = NULL;
  qg_status st = qg_st_open(ctx, &f, path);
  if (st == QG_OK) {
    int64_t n = qg_st_count(f), total = 0;
    for (int64_t i = 0; i < n; i++) {
      const char *name = NULL;
      int dtype = 0, ndim = 0;
      int64_t dims[QG_MAX_DIMS];
      must(qg_st_entry(ctx, f, i, &name, &dtype, &ndim, dims) == QG_OK, "every listed entry can be described", ctx);
      qg_tensor *t = NULL;
      must(qg_tensor_create(ctx, &t, dtype, QG_CPU, ndim, dims) == QG_OK, "an entry's shape can be allocated", ctx);
      total += t->numel * qg_dtype_size(dtype);
      must(total <= (int64_t)size, "the entries fit in the file", ctx);
      must(qg_st_read(ctx, f, name, t) == QG_OK, "every listed entry can be read", ctx);
      touch_tensor(ctx, t);
      qg_tensor_free(t);
    }
    for (int64_t i = 0; i < qg_st_metadata_count(f); i++) {
      const char *key = qg_st_metadata_key(f, i);
      must(key != NULL && qg_st_metadata(f, key) != NULL, "every metadata key has a value", ctx);
    }
    qg_st_close(f);
  } else {
    must(f == NULL, "a failed open returns no file", ctx);
    check_failure(ctx, st, path);
  }
  close(fd);
}

static int64_t walk(const qg_json *node, int depth) {
  int64_t n = 1;
  int type = qg_json_type(node);
  must(type >= QG_JSON_NULL && type <= QG_JSON_OBJECT, "a node has a known type", NULL);
  if (type == QG_JSON_STRING) must(qg_json_string(node) != NULL, "a string node has a string", NULL);
  for (const qg_json *c = qg_json_child(node); c; c = qg_json_next(c)) {
    if (type == QG_JSON_OBJECT) must(qg_json_key(c) != NULL, "an object member has a key", NULL);
    n += walk(c, depth + 1);
  }
  return n;
}

static void fuzz_json(const uint8_t *data, size_t size) {
  qg_ctx *ctx = fuzz_ctx();
  /* The text is not NUL-terminated: a copy of exactly size bytes lets ASan catch over-reads. */
  char *text = (char *)malloc(size ? size : 1);
  if (!text) abort();
  if (size) memcpy(text, data, size);
  qg_json *root = NULL;
  qg_status st = qg_json_parse(ctx, &root, text, (int64_t)size, "fuzz.json");
  if (st == QG_OK) {
    must(root != NULL, "a parsed document has a root", ctx);
    walk(root, 0);
    qg_json_free(root);
  } else {
    must(root == NULL && st == QG_ERR_FORMAT, "a parse failure is QG_ERR_FORMAT with no root", ctx);
    must(strstr(qg_last_error(ctx), "fuzz.json") != NULL, "the error names the source", ctx);
  }
  free(text);
}

int qg_fuzz_run(const char *target, const uint8_t *data, size_t size) {
  if (!strcmp(target, "idx")) fuzz_tensor_file(data, size, 0);
  else if (!strcmp(target, "npy")) fuzz_tensor_file(data, size, 1);
  else if (!strcmp(target, "safetensors")) fuzz_safetensors(data, size);
  else if (!strcmp(target, "json")) fuzz_json(data, size);
  else return -1;
  return 0;
}
