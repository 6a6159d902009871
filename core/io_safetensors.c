/*
 * io_safetensors.c: reading and writing safetensors files (8-byte little-endian header length,
 * a JSON header, then raw little-endian tensor data), the format of qgru's weights and
 * checkpoints and the one PyTorch users can open with `safetensors.torch.load_file`.
 * The reader validates the whole file on open before it is used: a regular file (a directory is
 * a clear error), the header length inside the file, one JSON object and nothing after it,
 * dtypes, shapes (overflow-checked sizes), unique names, and data_offsets that tile the data
 * section exactly (no overlaps, no gaps, no trailing bytes, as the reference implementation
 * requires), so later reads cannot go wrong half-way. The writer saves to path.tmp and renames.
 */
#include "io_file.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
  char *name;
  int dtype, ndim;
  int64_t dims[QG_MAX_DIMS];
  int64_t begin, end;          /* byte offsets relative to the data section */
} st_entry;

struct qg_st_file {
  FILE *f;
  char *path;
  int64_t data_start;
  st_entry *entries;
  int64_t count;
  char **meta;                 /* key, value, key, value, ... */
  int64_t meta_count;
};

static const struct { const char *s; int dt; } st_dtypes[] = {
  {"F32", QG_F32}, {"F64", QG_F64}, {"I8", QG_I8}, {"U8", QG_U8}, {"I16", QG_I16}, {"I32", QG_I32}, {"I64", QG_I64}};

static int st_dtype(const char *s) {
  for (size_t i = 0; i < sizeof st_dtypes / sizeof st_dtypes[0]; i++) if (!strcmp(s, st_dtypes[i].s)) return st_dtypes[i].dt;
  return -1;
}

static const char *st_dtype_name(int dt) {
  for (size_t i = 0; i < sizeof st_dtypes / sizeof st_dtypes[0]; i++) if (st_dtypes[i].dt == dt) return st_dtypes[i].s;
  return NULL;
}

static char *dupstr(const char *s) {
  size_t n = strlen(s) + 1;
  char *d = (char *)malloc(n);
  if (d) memcpy(d, s, n);
  return d;
}

void qg_st_close(qg_st_file *f) {
  if (!f) return;
  if (f->f) fclose(f->f);
  for (int64_t i = 0; i < f->count; i++) free(f->entries[i].name);
  for (int64_t i = 0; i < 2 * f->meta_count; i++) free(f->meta[i]);
  free(f->entries);
  free(f->meta);
  free(f->path);
  free(f);
}

static int cmp_entry_name(const void *a, const void *b) {
  return strcmp(((const st_entry *)a)->name, ((const st_entry *)b)->name);
}

static int is_uint(const cJSON *j) {
  return cJSON_IsNumber(j) && j->valuedouble >= 0 && j->valuedouble <= 9007199254740992.0 &&
         (double)(int64_t)j->valuedouble == j->valuedouble;
}

static qg_status parse_entry(qg_ctx *ctx, const char *fn, const char *path, const cJSON *item, st_entry *e, int64_t data_bytes) {
  const cJSON *dt = cJSON_GetObjectItemCaseSensitive(item, "dtype");
  const cJSON *shape = cJSON_GetObjectItemCaseSensitive(item, "shape");
  const cJSON *offs = cJSON_GetObjectItemCaseSensitive(item, "data_offsets");
  if (!cJSON_IsObject(item) || !cJSON_IsString(dt) || !cJSON_IsArray(shape) || !cJSON_IsArray(offs) || cJSON_GetArraySize(offs) != 2)
    return qg_fail(ctx, QG_ERR_FORMAT, fn, "'%s': tensor '%s' needs \"dtype\" (string), \"shape\" (array) and \"data_offsets\" ([begin, end])",
                   path, item->string);
  e->dtype = st_dtype(dt->valuestring);
  if (e->dtype < 0)
    return qg_fail(ctx, QG_ERR_FORMAT, fn, "'%s': tensor '%s' has dtype %s; qgru reads F32 F64 I8 U8 I16 I32 I64", path, item->string, dt->valuestring);
  int nd = cJSON_GetArraySize(shape);
  if (nd > QG_MAX_DIMS) return qg_fail(ctx, QG_ERR_FORMAT, fn, "'%s': tensor '%s' has %d dims (max %d)", path, item->string, nd, QG_MAX_DIMS);
  int64_t numel = 1, nbytes = 0;
  int too_big = 0;
  e->ndim = nd ? nd : 1;
  e->dims[0] = 1;
  for (int i = 0; i < nd; i++) {
    const cJSON *d = cJSON_GetArrayItem(shape, i);
    if (!is_uint(d)) return qg_fail(ctx, QG_ERR_FORMAT, fn, "'%s': tensor '%s' has a bad shape entry", path, item->string);
    e->dims[i] = (int64_t)d->valuedouble;
  }
  if (!qg_shape_numel(e->ndim, e->dims, &numel)) too_big = 1;
  if (too_big || !qg_mul_ok(numel, qg_dtype_size(e->dtype), &nbytes)) {
    char sh[96];
    return qg_fail(ctx, QG_ERR_FORMAT, fn, "'%s': tensor '%s': shape %s of %s is too large", path, item->string,
                   qg_shape_str(sh, sizeof sh, e->ndim, e->dims), dt->valuestring);
  }
  const cJSON *b = cJSON_GetArrayItem(offs, 0), *en = cJSON_GetArrayItem(offs, 1);
  if (!is_uint(b) || !is_uint(en)) return qg_fail(ctx, QG_ERR_FORMAT, fn, "'%s': tensor '%s' has bad data_offsets", path, item->string);
  e->begin = (int64_t)b->valuedouble;
  e->end = (int64_t)en->valuedouble;
  if (e->end < e->begin || e->end - e->begin != nbytes)
    return qg_fail(ctx, QG_ERR_FORMAT, fn, "'%s': tensor '%s': data_offsets [%lld, %lld] do not match %lld elements of %s", path,
                   item->string, (long long)e->begin, (long long)e->end, (long long)numel, dt->valuestring);
  if (e->end > data_bytes)
    return qg_fail(ctx, QG_ERR_FORMAT, fn, "'%s': tensor '%s' ends at byte %lld of a %lld-byte data section (file truncated?)", path,
                   item->string, (long long)e->end, (long long)data_bytes);
  return QG_OK;
}

static int cmp_begin(const void *a, const void *b) {
  const st_entry *x = *(const st_entry *const *)a, *y = *(const st_entry *const *)b;
  if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
  return x->end < y->end ? -1 : x->end > y->end;
}

static int cmp_meta_key(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

qg_status qg_st_open(qg_ctx *ctx, qg_st_file **out, const char *path) {
  if (!ctx || !out) return QG_ERR_ARG;
  const char *fn = __func__;
  *out = NULL;
  if (!path) return qg_fail(ctx, QG_ERR_ARG, fn, "path is NULL");
  qg_st_file *sf = (qg_st_file *)calloc(1, sizeof *sf);
  if (!sf) return qg_fail(ctx, QG_ERR_MEMORY, fn, "out of memory");
  qg_status st = QG_OK;
  char *hdr = NULL;
  cJSON *root = NULL;
  st_entry **order = NULL;
  sf->path = dupstr(path);
  if (!sf->path) { st = qg_fail(ctx, QG_ERR_MEMORY, fn, "out of memory"); goto done; }
  int fd;
  int64_t fsize;
  st = qg_io_open(ctx, fn, path, &fd, &fsize);
  if (st != QG_OK) goto done;
  sf->f = fdopen(fd, "rb");
  if (!sf->f) { close(fd); st = qg_fail(ctx, QG_ERR_IO, fn, "cannot open '%s': %s", path, strerror(errno)); goto done; }
  unsigned char lb[8];
  if (fsize < 8 || fread(lb, 1, 8, sf->f) != 8) { st = qg_fail(ctx, QG_ERR_FORMAT, fn, "'%s': too short for a safetensors file (%lld bytes)", path, (long long)fsize); goto done; }
  uint64_t hlen = 0;
  for (int i = 7; i >= 0; i--) hlen = (hlen << 8) | lb[i];
  if (hlen > (uint64_t)(fsize - 8) || hlen > (100u << 20)) {
    st = qg_fail(ctx, QG_ERR_FORMAT, fn, "'%s': header length %llu does not fit in a %lld-byte file (not safetensors, or truncated)", path,
                 (unsigned long long)hlen, (long long)fsize);
    goto done;
  }
  hdr = (char *)malloc(hlen + 1);
  if (!hdr) { st = qg_fail(ctx, QG_ERR_MEMORY, fn, "out of memory"); goto done; }
  if (fread(hdr, 1, hlen, sf->f) != hlen) { st = qg_fail(ctx, QG_ERR_FORMAT, fn, "'%s': truncated header", path); goto done; }
  hdr[hlen] = 0;
  const char *err_at = NULL;
  root = cJSON_ParseWithLengthOpts(hdr, hlen, &err_at, 0);
  if (!root || !cJSON_IsObject(root)) {
    st = qg_fail(ctx, QG_ERR_FORMAT, fn, "'%s': the header is not a JSON object (parse error at byte %lld)", path,
                 (long long)(err_at ? err_at - hdr : 0));
    goto done;
  }
  for (const char *p = err_at; p && p < hdr + hlen; p++)
    if (*p != ' ' && *p != '\t' && *p != '\n' && *p != '\r') {
      st = qg_fail(ctx, QG_ERR_FORMAT, fn, "'%s': unexpected text after the JSON header object (at byte %lld)", path, (long long)(p - hdr));
      goto done;
    }
  sf->data_start = 8 + (int64_t)hlen;
  int64_t data_bytes = fsize - sf->data_start;
  int n = cJSON_GetArraySize(root), seen_meta = 0;
  sf->entries = (st_entry *)calloc((size_t)n + 1, sizeof(st_entry));
  sf->meta = (char **)calloc(2 * (size_t)n + 2, sizeof(char *));
  if (!sf->entries || !sf->meta) { st = qg_fail(ctx, QG_ERR_MEMORY, fn, "out of memory"); goto done; }
  for (cJSON *it = root->child; it; it = it->next) {
    if (!strcmp(it->string, "__metadata__")) {
      if (seen_meta++) { st = qg_fail(ctx, QG_ERR_FORMAT, fn, "'%s': duplicate \"__metadata__\"", path); goto done; }
      if (!cJSON_IsObject(it)) { st = qg_fail(ctx, QG_ERR_FORMAT, fn, "'%s': __metadata__ is not an object", path); goto done; }
      int m = cJSON_GetArraySize(it);
      char **meta = (char **)realloc(sf->meta, (2 * (size_t)n + 2 * (size_t)m + 2) * sizeof(char *));
      if (!meta) { st = qg_fail(ctx, QG_ERR_MEMORY, fn, "out of memory"); goto done; }
      sf->meta = meta;
      for (cJSON *kv = it->child; kv; kv = kv->next) {
        if (!cJSON_IsString(kv)) { st = qg_fail(ctx, QG_ERR_FORMAT, fn, "'%s': __metadata__['%s'] is not a string", path, kv->string); goto done; }
        sf->meta[2 * sf->meta_count] = dupstr(kv->string);
        sf->meta[2 * sf->meta_count + 1] = dupstr(kv->valuestring);
        sf->meta_count++;
        if (!sf->meta[2 * sf->meta_count - 2] || !sf->meta[2 * sf->meta_count - 1]) { st = qg_fail(ctx, QG_ERR_MEMORY, fn, "out of memory"); goto done; }
      }
      continue;
    }
    st_entry *e = &sf->entries[sf->count];
    st = parse_entry(ctx, fn, path, it, e, data_bytes);
    if (st != QG_OK) goto done;
    e->name = dupstr(it->string);
    sf->count++;
    if (!e->name) { st = qg_fail(ctx, QG_ERR_MEMORY, fn, "out of memory"); goto done; }
  }
  /* Names and metadata keys are unique. */
  qsort(sf->entries, (size_t)sf->count, sizeof(st_entry), cmp_entry_name);
  for (int64_t i = 1; i < sf->count; i++)
    if (!strcmp(sf->entries[i].name, sf->entries[i - 1].name)) {
      st = qg_fail(ctx, QG_ERR_FORMAT, fn, "'%s': duplicate tensor name '%s'", path, sf->entries[i].name);
      goto done;
    }
  qsort(sf->meta, (size_t)sf->meta_count, 2 * sizeof(char *), cmp_meta_key);
  for (int64_t i = 1; i < sf->meta_count; i++)
    if (!strcmp(sf->meta[2 * i], sf->meta[2 * i - 2])) {
      st = qg_fail(ctx, QG_ERR_FORMAT, fn, "'%s': duplicate __metadata__ key '%s'", path, sf->meta[2 * i]);
      goto done;
    }
  /* The tensors tile the data section: no shared bytes, no gaps, nothing after the last one. */
  order = (st_entry **)malloc(((size_t)sf->count + 1) * sizeof *order);
  if (!order) { st = qg_fail(ctx, QG_ERR_MEMORY, fn, "out of memory"); goto done; }
  for (int64_t i = 0; i < sf->count; i++) order[i] = &sf->entries[i];
  qsort(order, (size_t)sf->count, sizeof *order, cmp_begin);
  int64_t pos = 0;
  for (int64_t i = 0; i < sf->count; i++) {
    if (order[i]->begin < pos) {
      st = qg_fail(ctx, QG_ERR_FORMAT, fn, "'%s': tensors '%s' and '%s' overlap", path, order[i - 1]->name, order[i]->name);
      goto done;
    }
    if (order[i]->begin > pos) {
      st = qg_fail(ctx, QG_ERR_FORMAT, fn, "'%s': tensor '%s' begins at data byte %lld, expected %lld (a gap of unused bytes)", path,
                   order[i]->name, (long long)order[i]->begin, (long long)pos);
      goto done;
    }
    pos = order[i]->end;
  }
  if (pos != data_bytes) {
    st = qg_fail(ctx, QG_ERR_FORMAT, fn, "'%s': %lld trailing bytes after the tensor data (the tensors end at data byte %lld of %lld)", path,
                 (long long)(data_bytes - pos), (long long)pos, (long long)data_bytes);
    goto done;
  }
done:
  free(order);
  cJSON_Delete(root);
  free(hdr);
  if (st != QG_OK) { qg_st_close(sf); return st; }
  *out = sf;
  return QG_OK;
}

int64_t qg_st_count(const qg_st_file *f) { return f ? f->count : 0; }

qg_status qg_st_entry(qg_ctx *ctx, const qg_st_file *f, int64_t i, const char **name, int *dtype, int *ndim, int64_t *dims) {
  if (!ctx) return QG_ERR_ARG;
  if (!f || !name || !dtype || !ndim || !dims) return qg_fail(ctx, QG_ERR_ARG, __func__, "NULL argument");
  if (i < 0 || i >= f->count) return qg_fail(ctx, QG_ERR_ARG, __func__, "entry %lld out of range [0, %lld)", (long long)i, (long long)f->count);
  const st_entry *e = &f->entries[i];
  *name = e->name; *dtype = e->dtype; *ndim = e->ndim;
  memcpy(dims, e->dims, sizeof e->dims);
  return QG_OK;
}

qg_status qg_st_read(qg_ctx *ctx, const qg_st_file *f, const char *name, qg_tensor *dst) {
  if (!ctx) return QG_ERR_ARG;
  const char *fn = __func__;
  if (!f || !name) return qg_fail(ctx, QG_ERR_ARG, fn, "NULL argument");
  st_entry key = {0};
  key.name = (char *)name;
  const st_entry *e = (const st_entry *)bsearch(&key, f->entries, (size_t)f->count, sizeof(st_entry), cmp_entry_name);
  if (!e) return qg_fail(ctx, QG_ERR_NOT_FOUND, fn, "'%s' has no tensor '%s'", f->path, name);
  char label[256];
  snprintf(label, sizeof label, "'%s' in '%s'", name, f->path);
  QG_CHECK(qg_check_tensor(ctx, fn, label, dst, e->dtype, -1, NULL));
  int64_t numel = 1;
  for (int i = 0; i < e->ndim; i++) numel *= e->dims[i];
  if (numel != dst->numel) {
    char a[96], b[96];
    return qg_fail(ctx, QG_ERR_ARG, fn, "%s: file has shape %s, destination has %s", label,
                   qg_shape_str(a, sizeof a, e->ndim, e->dims), qg_shape_str(b, sizeof b, dst->ndim, dst->dims));
  }
  int64_t nbytes = e->end - e->begin;
  void *buf = dst->data;
  if (dst->device != QG_CPU) QG_CHECK(qg_workspace(ctx, fn, nbytes, &buf));
  if (fseek(f->f, (long)(f->data_start + e->begin), SEEK_SET) != 0 || fread(buf, 1, (size_t)nbytes, f->f) != (size_t)nbytes)
    return qg_fail(ctx, QG_ERR_IO, fn, "%s: read failed", label);
  if (dst->device != QG_CPU) return qg_dev_memcpy(ctx, dst->data, buf, nbytes, 0);
  return QG_OK;
}

const char *qg_st_metadata(const qg_st_file *f, const char *key) {
  if (!f || !key) return NULL;
  for (int64_t i = 0; i < f->meta_count; i++) if (!strcmp(f->meta[2 * i], key)) return f->meta[2 * i + 1];
  return NULL;
}

int64_t qg_st_metadata_count(const qg_st_file *f) { return f ? f->meta_count : 0; }

const char *qg_st_metadata_key(const qg_st_file *f, int64_t i) {
  return (f && i >= 0 && i < f->meta_count) ? f->meta[2 * i] : NULL;
}

/* ---- writer ---- */
struct qg_st_writer {
  char **names;
  const qg_tensor **tensors;
  int64_t count, cap;
  cJSON *meta;
};

qg_status qg_st_writer_create(qg_ctx *ctx, qg_st_writer **out) {
  if (!ctx || !out) return QG_ERR_ARG;
  *out = (qg_st_writer *)calloc(1, sizeof **out);
  if (!*out) return qg_fail(ctx, QG_ERR_MEMORY, __func__, "out of memory");
  (*out)->meta = cJSON_CreateObject();
  return QG_OK;
}

void qg_st_writer_free(qg_st_writer *w) {
  if (!w) return;
  for (int64_t i = 0; i < w->count; i++) free(w->names[i]);
  free(w->names);
  free((void *)w->tensors);
  cJSON_Delete(w->meta);
  free(w);
}

qg_status qg_st_writer_add(qg_ctx *ctx, qg_st_writer *w, const char *name, const qg_tensor *t) {
  if (!ctx) return QG_ERR_ARG;
  const char *fn = __func__;
  if (!w || !name || !*name) return qg_fail(ctx, QG_ERR_ARG, fn, "writer or name is NULL/empty");
  QG_CHECK(qg_check_tensor(ctx, fn, name, t, -1, -1, NULL));
  if (!strcmp(name, "__metadata__")) return qg_fail(ctx, QG_ERR_ARG, fn, "'__metadata__' is reserved");
  for (int64_t i = 0; i < w->count; i++)
    if (!strcmp(w->names[i], name)) return qg_fail(ctx, QG_ERR_ARG, fn, "duplicate tensor name '%s'", name);
  if (w->count == w->cap) {
    int64_t cap = w->cap ? 2 * w->cap : 16;
    char **nn = (char **)realloc(w->names, (size_t)cap * sizeof *nn);
    if (!nn) return qg_fail(ctx, QG_ERR_MEMORY, fn, "out of memory");
    w->names = nn;
    const qg_tensor **nt = (const qg_tensor **)realloc((void *)w->tensors, (size_t)cap * sizeof *nt);
    if (!nt) return qg_fail(ctx, QG_ERR_MEMORY, fn, "out of memory");
    w->tensors = nt;
    w->cap = cap;
  }
  w->names[w->count] = dupstr(name);
  w->tensors[w->count] = t;
  w->count++;
  return QG_OK;
}

qg_status qg_st_writer_metadata(qg_ctx *ctx, qg_st_writer *w, const char *key, const char *value) {
  if (!ctx) return QG_ERR_ARG;
  if (!w || !key || !value) return qg_fail(ctx, QG_ERR_ARG, __func__, "NULL argument");
  cJSON_DeleteItemFromObjectCaseSensitive(w->meta, key);
  cJSON_AddItemToObject(w->meta, key, cJSON_CreateString(value));
  return QG_OK;
}

static cJSON *raw_int(int64_t v) {
  char b[32];
  snprintf(b, sizeof b, "%lld", (long long)v);
  return cJSON_CreateRaw(b);
}

qg_status qg_st_writer_save(qg_ctx *ctx, qg_st_writer *w, const char *path) {
  if (!ctx) return QG_ERR_ARG;
  const char *fn = __func__;
  if (!w || !path) return qg_fail(ctx, QG_ERR_ARG, fn, "NULL argument");
  cJSON *root = cJSON_CreateObject();
  if (cJSON_GetArraySize(w->meta) > 0) cJSON_AddItemReferenceToObject(root, "__metadata__", w->meta);
  int64_t off = 0;
  for (int64_t i = 0; i < w->count; i++) {
    const qg_tensor *t = w->tensors[i];
    cJSON *e = cJSON_CreateObject(), *shape = cJSON_CreateArray(), *offs = cJSON_CreateArray();
    cJSON_AddStringToObject(e, "dtype", st_dtype_name(t->dtype));
    for (int d = 0; d < t->ndim; d++) cJSON_AddItemToArray(shape, raw_int(t->dims[d]));
    cJSON_AddItemToObject(e, "shape", shape);
    cJSON_AddItemToArray(offs, raw_int(off));
    off += qg_tensor_bytes(t);
    cJSON_AddItemToArray(offs, raw_int(off));
    cJSON_AddItemToObject(e, "data_offsets", offs);
    cJSON_AddItemToObject(root, w->names[i], e);
  }
  char *json = cJSON_PrintUnformatted(root);
  cJSON_Delete(root);
  if (!json) return qg_fail(ctx, QG_ERR_MEMORY, fn, "cannot format the header");
  size_t jl = strlen(json), padded = (jl + 7) & ~(size_t)7;
  char tmp[4096];
  if (snprintf(tmp, sizeof tmp, "%s.tmp", path) >= (int)sizeof tmp) { free(json); return qg_fail(ctx, QG_ERR_ARG, fn, "path too long"); }
  FILE *f = fopen(tmp, "wb");
  if (!f) { free(json); return qg_fail(ctx, QG_ERR_IO, fn, "cannot write '%s' (does the folder exist?)", tmp); }
  unsigned char lb[8];
  for (int i = 0; i < 8; i++) lb[i] = (unsigned char)(((uint64_t)padded >> (8 * i)) & 255);
  int ok = fwrite(lb, 1, 8, f) == 8 && fwrite(json, 1, jl, f) == jl;
  for (size_t i = jl; ok && i < padded; i++) ok = fputc(' ', f) != EOF;
  free(json);
  qg_status st = QG_OK;
  for (int64_t i = 0; ok && st == QG_OK && i < w->count; i++) {
    const qg_tensor *t = w->tensors[i];
    int64_t nb = qg_tensor_bytes(t);
    const void *src = t->data;
    if (t->device != QG_CPU) {
      void *buf;
      st = qg_workspace(ctx, fn, nb, &buf);
      if (st == QG_OK) st = qg_dev_memcpy(ctx, buf, t->data, nb, 1);
      src = buf;
    }
    if (st == QG_OK) ok = fwrite(src, 1, (size_t)nb, f) == (size_t)nb;
  }
  if (fclose(f) != 0) ok = 0;
  if (st == QG_OK && !ok) st = qg_fail(ctx, QG_ERR_IO, fn, "write to '%s' failed (disk full?)", tmp);
  if (st == QG_OK && rename(tmp, path) != 0) st = qg_fail(ctx, QG_ERR_IO, fn, "cannot rename '%s' to '%s'", tmp, path);
  if (st != QG_OK) remove(tmp);
  return st;
}
