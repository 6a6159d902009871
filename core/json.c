/*
 * json.c: a read-only JSON document for the Lua side (configs and exported parameters), parsed
 * by cJSON. A parse error reports the line and column of the problem, so a user can find it in
 * a hand-edited config.
 */
#include "internal.h"

#include <cjson/cJSON.h>
#include <string.h>

struct qg_json { cJSON node; };   /* nodes are cJSON nodes; the cast is the whole binding */

qg_status qg_json_parse(qg_ctx *ctx, qg_json **root, const char *text, int64_t length, const char *source_name) {
  if (!ctx || !root) return QG_ERR_ARG;
  *root = NULL;
  const char *src = source_name ? source_name : "<string>";
  if (!text) return qg_fail(ctx, QG_ERR_ARG, "qg_json_parse", "text is NULL");
  const char *end = NULL;
  cJSON *doc = cJSON_ParseWithLengthOpts(text, (size_t)length, &end, 0);
  if (!doc) {
    int64_t off = end ? end - text : 0, line = 1, col = 1;
    for (int64_t i = 0; i < off && i < length; i++) {
      if (text[i] == '\n') { line++; col = 1; } else col++;
    }
    if (off >= length) return qg_fail(ctx, QG_ERR_FORMAT, "qg_json_parse", "%s: malformed JSON: unexpected end of input at line %lld, column %lld",
                                      src, (long long)line, (long long)col);
    int64_t n = 0;   /* quote the rest of the line, at most 20 characters */
    while (off + n < length && n < 20 && text[off + n] != '\n' && text[off + n] != '\r') n++;
    return qg_fail(ctx, QG_ERR_FORMAT, "qg_json_parse", "%s: malformed JSON at line %lld, column %lld (near '%.*s')", src,
                   (long long)line, (long long)col, (int)n, text + off);
  }
  /* Trailing content after the document is an error too. */
  const char *p = end;
  while (p && p < text + length && (*p == ' ' || *p == '\n' || *p == '\r' || *p == '\t')) p++;
  if (p && p < text + length && *p) {
    int64_t off = p - text, line = 1, col = 1;
    for (int64_t i = 0; i < off; i++) { if (text[i] == '\n') { line++; col = 1; } else col++; }
    cJSON_Delete(doc);
    return qg_fail(ctx, QG_ERR_FORMAT, "qg_json_parse", "%s: malformed JSON: unexpected text after the document at line %lld, column %lld",
                   src, (long long)line, (long long)col);
  }
  *root = (qg_json *)doc;
  return QG_OK;
}

void qg_json_free(qg_json *root) { cJSON_Delete((cJSON *)root); }

int qg_json_type(const qg_json *node) {
  const cJSON *n = (const cJSON *)node;
  if (!n || cJSON_IsNull(n)) return QG_JSON_NULL;
  if (cJSON_IsFalse(n)) return QG_JSON_FALSE;
  if (cJSON_IsTrue(n)) return QG_JSON_TRUE;
  if (cJSON_IsNumber(n)) return QG_JSON_NUMBER;
  if (cJSON_IsString(n)) return QG_JSON_STRING;
  if (cJSON_IsArray(n)) return QG_JSON_ARRAY;
  return QG_JSON_OBJECT;
}

const char *qg_json_key(const qg_json *node) { return node ? ((const cJSON *)node)->string : NULL; }
const qg_json *qg_json_child(const qg_json *node) { return node ? (const qg_json *)((const cJSON *)node)->child : NULL; }
const qg_json *qg_json_next(const qg_json *node) { return node ? (const qg_json *)((const cJSON *)node)->next : NULL; }
double qg_json_number(const qg_json *node) { return node ? ((const cJSON *)node)->valuedouble : 0; }
const char *qg_json_string(const qg_json *node) { return node ? ((const cJSON *)node)->valuestring : NULL; }
