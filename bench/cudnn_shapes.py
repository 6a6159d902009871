"""bench/cudnn_shapes.py: the GPU baseline of ../shared/tools/bench_cudnn.py on shapes of your own.

bench_cudnn.py times cuDNN's GRU (fp32 with TF32 off, TF32, fp16) and a PyTorch fake-quant loop on
five fixed shapes. This runs the same measurements (its own `bench` function and `FakeQuantGRU`
class, imported from the file, so the method is the same) on TxNxCxH tokens, the form
`recipes/bench.lua --shapes` takes, so that both can be run on one device in one command:

  python3 bench/cudnn_shapes.py --tool PATH/bench_cudnn.py --shapes 100x128x40x128,50x32x64x128 [--reps 20] [--loop]

--loop adds the fake-quant loop (slow: a Python loop of small kernels per step); --bidir times
cuDNN's bidirectional GRU instead (the loop is one direction: not with --bidir). Output: one JSON
line per (shape, precision) as bench_cudnn.py prints them, shape named by its token.
"""
import argparse, importlib.util, os, sys


def load_tool(path, reps):
    if not os.path.isfile(path):
        raise SystemExit("bench/cudnn_shapes.py: --tool %s: no such file (expected the path of bench_cudnn.py)" % path)
    argv = sys.argv
    sys.argv = [path, str(reps)]   # bench_cudnn.py reads its repeat count from argv at import
    try:
        spec = importlib.util.spec_from_file_location("bench_cudnn", path)
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
    finally:
        sys.argv = argv
    return mod


def parse_shape(tok):
    parts = tok.split("x")
    if len(parts) != 4 or not all(p.isdigit() and int(p) >= 1 for p in parts):
        raise SystemExit("bench/cudnn_shapes.py: --shapes: '%s' is not TxNxCxH with four positive integers" % tok)
    return tuple(int(p) for p in parts)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tool", required=True, help="path of bench_cudnn.py")
    ap.add_argument("--shapes", required=True, help="comma-separated TxNxCxH")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--loop", action="store_true", help="also the PyTorch fake-quant loop")
    ap.add_argument("--bidir", action="store_true", help="cuDNN's bidirectional GRU (output 2H)")
    a = ap.parse_args()
    if a.bidir and a.loop:
        raise SystemExit("bench/cudnn_shapes.py: --loop runs bench_cudnn.py's one-direction fake-quant GRU; not with --bidir")
    shapes = [(t, parse_shape(t)) for t in a.shapes.split(",") if t]
    m = load_tool(a.tool, a.reps)
    torch, nn = m.torch, m.nn
    p = torch.cuda.get_device_properties(0)
    print("device", p.name, "SMs", p.multi_processor_count, "torch", torch.__version__, "cudnn", torch.backends.cudnn.version(),
          flush=True)
    for name, (T, N, C, H) in shapes:
        x = torch.randn(T, N, C, device=m.dev)
        for prec in ["fp32-strict", "tf32", "fp16"]:   # as bench_cudnn.main
            torch.backends.cudnn.allow_tf32 = prec != "fp32-strict"
            torch.backends.cuda.matmul.allow_tf32 = prec != "fp32-strict"
            dt = torch.float16 if prec == "fp16" else torch.float32
            gru = nn.GRU(C, H, bidirectional=a.bidir).to(m.dev, dt)
            xx = x.to(dt)
            with torch.no_grad():
                fwd = m.bench(lambda: gru(xx))
            xg = xx.clone().requires_grad_(True)

            def step():
                out, hn = gru(xg)
                out.float().square().mean().backward()
            tr = m.bench(step)
            m.emit(anchor="cudnn-bidir" if a.bidir else "cudnn", shape=name, T=T, N=N, C=C, H=H, prec=prec, infer_ms=fwd,
                   train_ms=tr)
        if a.loop:
            torch.backends.cudnn.allow_tf32 = False
            torch.backends.cuda.matmul.allow_tf32 = False
            q = m.FakeQuantGRU(C, H).to(m.dev)
            with torch.no_grad():
                fwd = m.bench(lambda: q(x), reps=max(5, m.REPS // 3), warm=2)
            xg = x.clone().requires_grad_(True)

            def qstep():
                out, hn = q(xg)
                out.square().mean().backward()
            tr = m.bench(qstep, reps=max(5, m.REPS // 3), warm=2)
            m.emit(anchor="torch-fakequant-loop", shape=name, T=T, N=N, C=C, H=H, prec="int8-fq", infer_ms=fwd, train_ms=tr)


if __name__ == "__main__":
    main()
