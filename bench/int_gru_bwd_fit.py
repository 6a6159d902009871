"""bench/int_gru_bwd_fit.py: fits the shared-memory cost model of the persistent STE backward
(kernels/int_gru_bwd_persist.cu, bp_step_us, R~ in shared memory) to the outputs of
bench/int_gru_bwd_shapes.lua (a QG_BP_TRACE build; one file per shape, fit_TxNxCxH.txt), and shows
what the chooser would pick with the fitted model against the best forced configuration.
    python3 bench/int_gru_bwd_fit.py DIR        (numpy and scipy; gpu_runs/s50_bwd_fit_h200.tgz)
Per step, in cycles at 1.75 GHz: waves x (c0 + c1 serial + c2 lds + c3 fma + c4 remote), where
serial = ceil(3H / S) (12 + NB) (one thread's chain), lds = Hk 3H (1 + NB) / 32, fma = Hk 3H NB / 128
(the CTA's shared loads and FMAs), remote = 3 NB Hk K for clusters (the dq values pushed to the
peers), waves = ceil(CTAs / slots); the measured step is (backward - fixed) / T, fixed = the best
backward at T = 1 where measured, else 0.062 ms (the after-loop kernels at these sizes)."""
import glob, math, os, sys
import numpy as np
from scipy.optimize import nnls

def parse(path):
    cur, cands, res = None, {}, {}
    for line in open(path):
        w = line.split()
        if not w:
            continue
        if w[0] == "TRY":
            cur = w[1]; cands[cur] = []
        elif w[0] == "BPC" and cur is not None:
            cands[cur].append({k: float(v) for k, v in zip(w[1::2], w[2::2])})
        elif w[0] == "RES":
            res[w[1]] = None if w[2] == "fail" else float(w[2])
    return cands, res

def terms(H, d):
    kd, K, NB, S, Hk = 3 * H, d["K"], d["NB"], d["S"], d["Hk"]
    waves = math.ceil(d["groups"] * K / d["slots"])
    serial = math.ceil(kd / S) * (12 + NB)
    return waves, [1.0, serial, Hk * kd * (1 + NB) / 32, Hk * kd * NB / 128, 3 * NB * Hk * K if K > 1 else 0.0]

def shmem(d):
    return d["KPT"] == 0 and d["WS"] == 0

def main(folder):
    shapes, X, Y = {}, [], []
    fixed = {}
    for f in sorted(glob.glob(os.path.join(folder, "fit_*.txt"))):
        T, N, C, H = map(int, os.path.basename(f)[4:-4].split("x"))
        cands, res = parse(f)
        if T == 1:
            fixed[(N, H)] = min(v for v in res.values() if v is not None)
            continue
        shapes[(T, N, H)] = (cands, res)
    for (T, N, H), (cands, res) in shapes.items():
        for lab, v in res.items():
            if v is None or lab == "auto" or not cands.get(lab):
                continue
            d = min(cands[lab], key=lambda d: d["est"] if d["est"] >= 0 else 1e9)
            if not shmem(d):
                continue
            w, t = terms(H, d)
            X.append([w * x for x in t])
            Y.append((v - fixed.get((N, H), 0.062)) / T * 1e3 * 1750)
    X, Y = np.array(X), np.array(Y)
    c, _ = nnls(X, Y)
    err = np.abs(X @ c - Y) / Y
    print("cycles: %s (1, serial, lds, fma, remote); %d configurations, median error %.3f" % (np.round(c, 2), len(Y), np.median(err)))
    for (T, N, H), (cands, res) in sorted(shapes.items()):
        pick = None
        for d in cands["auto"]:
            if d["est"] < 0:
                continue
            if shmem(d):
                w, t = terms(H, d)
                e = w * float(np.dot(c, t)) / 1750
            else:
                e = d["est"]
            if pick is None or e < pick[0]:
                pick = (e, d)
        e, d = pick
        st = 1 if shmem(d) else (2 if d["WS"] == 0 else 2 + int(d["WS"]))
        lab = "K%d_NB%d_S%d_st%d" % (d["K"], d["NB"], d["S"], st)
        best = min((v, k) for k, v in res.items() if v is not None)
        print("T%d N%d H%d: the fitted model picks %s (%.2f us a step): %s ms; the old model's pick %s ms; best %s %.4f ms" % (
            T, N, H, lab, e, res.get(lab), res["auto"], best[1], best[0]))

if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else ".")
