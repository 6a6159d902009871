#!/usr/bin/env python3
"""tests/export/check_onnx.py DIR: runs the ONNX export cases that tests/export/make_cases.lua wrote
into DIR with onnxruntime and compares them with qgru's integer forward (y_ref.npy, hn_ref.npy):
  - model.onnx (the integer graph): onnx.checker (full check) passes, and y and hn have the same
    float32 bits as qgru's at every step (equal bits = equal output.h codes); logits (float head)
    within 1e-5 relative
  - model_qdq.onnx (GRU node with QuantizeLinear/DequantizeLinear, an approximation): checker
    passes and it runs; on the int8 cases its outputs stay within QDQ_TOL of qgru's
Prints one line per check and 'N passed, M failed'; exits 1 on any failure."""
import json
import os
import sys

import numpy as np
import onnx
import onnxruntime as ort

# The QDQ form runs the GRU gates in float (qgru: integer gates with 8-bit codes), so its outputs
# drift from qgru's by some 8-bit steps of output.h (2^-7 here), more through a second layer;
# stated tolerances (max, mean of |y_qdq - y_qgru|), per kind of case:
QDQ_TOL = {"8": (0.35, 0.02),       # int8 models (calibrated): measured max 0.055 (1 layer), 0.27 (2 layers)
           "16": (2e-3, 2e-4)}      # 16-bit models with wide ranges (near float): measured max 6e-4


def reduction_identity():
    """tools/onnx_export.py forms the bias-aligned sums from a smaller integer (guard and sticky
    bits, reduce_sum); check rne(S / 2^k) == rne((A V + C) / 2^sexp) exactly (Python integers)
    over random exponents, bias codes and variable parts, every branch of the reduction."""
    import random
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tools"))
    import onnx_export as oe
    rng = random.Random(10)
    branches, bad = set(), 0
    for _ in range(20000):
        ev, eb, e = rng.randint(-8, 20), rng.randint(-8, 30), rng.randint(-8, 20)
        code = rng.randint(-40000, 40000)
        a, c, se = oe.reduce_sum(ev, code, eb, e)
        em = max(ev, eb)
        g, k = em - ev, em - e
        branches.add(0 if k <= 0 else (1 if k <= g + 1 else 2))
        for _ in range(5):
            v = rng.randint(-70000, 70000)
            s = v * 2 ** (em - ev) + code * 2 ** (em - eb)
            if oe.rne_div(s, k) != oe.rne_div(a * v + c, se):
                bad += 1
    return bad == 0 and branches == {0, 1, 2}, "reduction identity of the aligned sums: %d mismatches in 100000 draws, branches %s" % (
        bad, sorted(branches))


def main(d):
    cases = json.load(open(os.path.join(d, "cases.json")))
    passed, failed = 0, 0

    def check(ok, what):
        nonlocal passed, failed
        print(("ok    " if ok else "FAIL  ") + what)
        if ok:
            passed += 1
        else:
            failed += 1

    check(*reduction_identity())
    for c in cases:
        cd = os.path.join(d, c["dir"])
        doc = json.load(open(os.path.join(cd, "model.json")))
        x = np.load(os.path.join(cd, "x.npy"))
        N = x.shape[1]
        LD = doc["layers"] * doc["directions"]
        h0p = os.path.join(cd, "h0.npy")
        lp = os.path.join(cd, "lengths.npy")
        feeds = {"x": x,
                 "h0": np.load(h0p) if os.path.exists(h0p) else np.zeros((LD, N, doc["hidden_size"]), np.float32),
                 "lengths": np.load(lp) if os.path.exists(lp) else np.full((N,), x.shape[0], np.int64)}
        yr, hr = np.load(os.path.join(cd, "y_ref.npy")), np.load(os.path.join(cd, "hn_ref.npy"))
        lg = os.path.join(cd, "logits_ref.npy")
        for kind in (("model_qdq.onnx",) if c["qdq_only"] else ("model.onnx", "model_qdq.onnx")):
            path = os.path.join(cd, kind)
            try:
                onnx.checker.check_model(onnx.load(path), full_check=True)
                check(True, "%s %s: onnx.checker" % (c["name"], kind))
            except Exception as e:  # noqa: BLE001
                check(False, "%s %s: onnx.checker: %s" % (c["name"], kind, e))
                continue
            sess = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
            out = sess.run(None, feeds)
            y, hn = out[0], out[1]
            if kind == "model.onnx":
                diff = np.flatnonzero(y.view(np.uint32) != yr.view(np.uint32))
                check(y.shape == yr.shape and diff.size == 0,
                      "%s integer (opset %d%s): y bit-exact with qgru at every step (%d values%s)" % (
                          c["name"], c["opset"], ", unrolled" if c["unroll"] else "", yr.size,
                          "" if diff.size == 0 else ", %d differ, first at %d: %r vs %r" % (diff.size, diff[0], y.flat[diff[0]], yr.flat[diff[0]])))
                check(np.array_equal(hn.view(np.uint32), hr.view(np.uint32)), "%s integer: h_n bit-exact" % c["name"])
                if os.path.exists(lg):
                    ref = np.load(lg)
                    err = float(np.max(np.abs(out[2] - ref) / (1 + np.abs(ref))))
                    check(err <= 1e-5, "%s integer: logits (float head) within 1e-5 (%.2g)" % (c["name"], err))
            else:
                dy = np.abs(y - yr)
                if c["qdq"]:
                    tmax, tmean = QDQ_TOL[c["qdq"]]
                    check(float(dy.max()) <= tmax and float(dy.mean()) <= tmean,
                          "%s QDQ approximation: max |dy| %.4g <= %.3g, mean %.3g <= %.3g" % (
                              c["name"], dy.max(), tmax, dy.mean(), tmean))
                else:
                    check(np.all(np.isfinite(y)), "%s QDQ runs (mixed low bitwidths: max |dy| %.3f, not compared)" % (c["name"], dy.max()))
    print("%d passed, %d failed" % (passed, failed))
    return 0 if failed == 0 else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
