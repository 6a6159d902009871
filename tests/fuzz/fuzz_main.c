/*
 * fuzz_main.c: the libFuzzer entry point of one loader's fuzz target; CMake builds it once per
 * target with QG_FUZZ_TARGET set to the target's name (see tests/fuzz/run.sh).
 */
#include "fuzz_targets.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  qg_fuzz_run(QG_FUZZ_TARGET, data, size);
  return 0;
}
