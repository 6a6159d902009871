#!/usr/bin/env bash
# tests/export/run.sh: the ONNX export tests (issue 10). Creates tests/export/.venv-export (python3 -m
# venv; pip install onnx onnxruntime numpy) when it is missing, writes the cases with qgru
# (tests/export/make_cases.lua: random models, qgru's integer forward as the reference, the
# exporter's refusals) and runs them with onnxruntime (tests/export/check_onnx.py: onnx.checker,
# bit-exact integer graphs, QDQ tolerance). Ends with 'N passed, M failed'.
#   tests/export/run.sh [--fmnist]   (--fmnist: also the main job's model on all 10,000 test
#                                     sequences, tests/export/fmnist_check.lua; needs runs/qat/)
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
venv="$root/tests/export/.venv-export"
if ! "$venv/bin/python" -c "import onnx, onnxruntime, numpy" 2>/dev/null; then
  echo "tests/export: creating $venv (pip install onnx onnxruntime numpy)"
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q --disable-pip-version-check onnx onnxruntime numpy
fi
"$venv/bin/python" -c "import onnx, onnxruntime; print('tests/export: onnx', onnx.__version__, 'onnxruntime', onnxruntime.__version__)"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
QGRU_PYTHON="$venv/bin/python" ./qgru tests/export/make_cases.lua "$work/cases" | grep -v '^wrote '
"$venv/bin/python" tests/export/check_onnx.py "$work/cases"
if [ "${1:-}" = "--fmnist" ]; then
  QGRU_PYTHON="$venv/bin/python" ./qgru tests/export/fmnist_check.lua --out "$work/fmnist"
fi
