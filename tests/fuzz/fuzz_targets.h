/*
 * fuzz_targets.h: the loaders' fuzz targets, shared by the libFuzzer drivers (fuzz_main.c, one
 * binary per target) and the normal test suite (tests/c/test_loaders.c replays the seed and
 * regression corpora through the same functions without the fuzzer).
 */
#ifndef QGRU_FUZZ_TARGETS_H
#define QGRU_FUZZ_TARGETS_H

#include <stddef.h>
#include <stdint.h>

/* Runs one input through the loader named target ("idx", "npy", "safetensors", "json"). Returns 0;
 * a broken invariant (an error message that does not name the file, a loaded tensor larger than
 * the file allows) aborts, so the fuzzer and the replay test both see it as a crash. Returns -1
 * for an unknown target name. */
int qg_fuzz_run(const char *target, const uint8_t *data, size_t size);

/* The target names, NULL-terminated. */
extern const char *const qg_fuzz_target_names[];

#endif
