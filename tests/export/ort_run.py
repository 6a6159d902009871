#!/usr/bin/env python3
"""tests/export/ort_run.py MODEL.onnx X.npy OUT_PREFIX [--lengths L.npy] [--h0 H0.npy]: runs an exported
qgru model with onnxruntime (CPU) and writes OUT_PREFIX.y.npy, .hn.npy and, with a head, .logits.npy.
Without --lengths every sequence has length T; without --h0 the initial state is zero."""
import argparse
import time

import numpy as np
import onnxruntime as ort

ap = argparse.ArgumentParser()
ap.add_argument("model")
ap.add_argument("x")
ap.add_argument("out")
ap.add_argument("--lengths")
ap.add_argument("--h0")
a = ap.parse_args()
x = np.load(a.x)
sess = ort.InferenceSession(a.model, providers=["CPUExecutionProvider"])
h0shape = [d if isinstance(d, int) else x.shape[1] for d in sess.get_inputs()[1].shape]
feeds = {"x": x, "lengths": np.load(a.lengths) if a.lengths else np.full((x.shape[1],), x.shape[0], np.int64),
         "h0": np.load(a.h0) if a.h0 else np.zeros(h0shape, np.float32)}
t0 = time.time()
outs = sess.run(None, feeds)
print("%s: %d sequences in %.2f s" % (a.model, x.shape[1], time.time() - t0))
for name, v in zip([o.name for o in sess.get_outputs()], outs):
    np.save("%s.%s.npy" % (a.out, name), v)
