"""bench/shape_sweep_table.py: the table of bench/shape_sweep_device.sh.

  python3 bench/shape_sweep_table.py QGRU_BENCH_JSON CUDNN_LOG [DEVICE_LOG]

QGRU_BENCH_JSON: runs/<name>/bench.json of recipes/bench.lua; CUDNN_LOG: the JSON lines of
bench/cudnn_shapes.py (or bench_cudnn.py). Prints a markdown table per shape: our float and QAT
int8 train steps and inference in strict and tf32 mode, cuDNN's in fp32 / tf32 / fp16, and the
ratios the issue's targets name (ours / cuDNN fp32 in strict mode, ours / the faster of cuDNN fp32
and tf32 in tf32 mode; below 1 is faster), with the shapes where a ratio exceeds 1 listed after.
"""
import json, sys


def num(v):
    return v if isinstance(v, (int, float)) else None


def main():
    ours = json.load(open(sys.argv[1]))
    peers = {}
    loop = {}
    for line in open(sys.argv[2]):
        line = line.strip()
        if not line.startswith("{"):
            continue
        r = json.loads(line)
        if r.get("anchor") == "cudnn":
            peers[(r["shape"], r["prec"])] = r
        elif r.get("anchor") == "torch-fakequant-loop":
            loop[r["shape"]] = r
    dev = open(sys.argv[3]).readline().strip() if len(sys.argv) > 3 else ""
    shapes = []
    for r in ours:
        if r["shape"] not in shapes:
            shapes.append(r["shape"])

    def get(shape, kind, math):
        for r in ours:
            if r["shape"] == shape and r["kind"] == kind and r["math"] == math and r.get("path", "auto") == "auto":
                return r
        return None

    print("Device: %s. ms, medians (qgru: recipes/bench.lua, CUDA events; cuDNN: bench_cudnn.py's method)." % dev)
    print("Ratios: ours / peer (below 1: ours faster). strict vs cuDNN fp32 (TF32 off); tf32 vs the faster of cuDNN fp32 / tf32.")
    print()
    print("| T N C H | float train strict / tf32 | QAT int8 train strict / tf32 | int8 infer | cuDNN train fp32 / tf32 | cuDNN infer fp32 / tf32 / fp16 "
          "| float train / cuDNN (strict, tf32) | QAT train / cuDNN (strict, tf32) | int8 infer / fastest cuDNN infer | loop train / QAT strict |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    misses = []
    f3 = lambda v: "%.3f" % v if num(v) is not None else str(v)
    rat = lambda a, b: "%.2f" % (a / b) if num(a) is not None and num(b) else "-"
    for s in shapes:
        fs, ft = get(s, "float", "strict"), get(s, "float", "tf32")
        qs, qt = get(s, "qat-int8", "strict"), get(s, "qat-int8", "tf32")
        c32, ctf, c16 = peers.get((s, "fp32-strict")), peers.get((s, "tf32")), peers.get((s, "fp16"))
        if not (fs and c32 and ctf):
            print("| %s | (missing rows) |" % s)
            continue
        T, N, C, H = fs["T"], fs["N"], fs["C"], fs["H"]
        ctr32, ctrtf = c32["train_ms"], ctf["train_ms"]
        cbest_tr = min(ctr32, ctrtf)
        cinf = [c["infer_ms"] for c in (c32, ctf, c16) if c]
        qi = qs["infer_ms"] if qs else None
        lp = loop.get(s)
        cells = [
            "%d %d %d %d" % (T, N, C, H),
            "%s / %s" % (f3(fs["train_ms"]), f3(ft["train_ms"] if ft else "-")),
            "%s / %s" % (f3(qs["train_ms"] if qs else "-"), f3(qt["train_ms"] if qt else "-")),
            f3(qi if qi is not None else "-"),
            "%s / %s" % (f3(ctr32), f3(ctrtf)),
            " / ".join(f3(v) for v in cinf),
            "%s, %s" % (rat(fs["train_ms"], ctr32), rat(ft["train_ms"] if ft else None, cbest_tr)),
            "%s, %s" % (rat(qs["train_ms"] if qs else None, ctr32), rat(qt["train_ms"] if qt else None, cbest_tr)),
            rat(qi, min(cinf)),
            "%.1fx" % (lp["train_ms"] / qs["train_ms"]) if lp and qs and num(qs["train_ms"]) else "-",
        ]
        print("| " + " | ".join(cells) + " |")
        checks = [("float train strict vs cuDNN fp32", fs["train_ms"], ctr32),
                  ("float infer strict vs cuDNN fp32", fs["infer_ms"], c32["infer_ms"]),
                  ("float train tf32 vs the faster cuDNN", ft["train_ms"] if ft else None, cbest_tr),
                  ("QAT train strict vs cuDNN fp32", qs["train_ms"] if qs else None, ctr32),
                  ("QAT train tf32 vs the faster cuDNN", qt["train_ms"] if qt else None, cbest_tr),
                  ("int8 infer vs the fastest cuDNN infer", qi, min(cinf))]
        for what, a, b in checks:
            if a is not None and num(a) is None:   # a row that did not run: its reason
                misses.append("%d %d %d %d: %s: %s" % (T, N, C, H, what, a))
            elif num(a) is not None and num(b) and a > b:
                misses.append("%d %d %d %d: %s %.3f > %.3f (%.2fx)" % (T, N, C, H, what, a, b, a / b))
        if lp and qs and num(qs["train_ms"]) and lp["train_ms"] / qs["train_ms"] < 20:
            misses.append("%d %d %d %d: loop train / QAT strict %.1fx < 20x" % (T, N, C, H, lp["train_ms"] / qs["train_ms"]))
    print()
    print("Slower than the peer (%d):" % len(misses))
    for m in misses:
        print("- " + m)


if __name__ == "__main__":
    main()
