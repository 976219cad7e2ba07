"""Which scaled_dot_product_attention kernel the maps-free forward runs on a GPU (issue 53, item 6).

The QVI Transformer's forward without maps computes eq. 3/10 and eq. 7 each as one
F.scaled_dot_product_attention call with a boolean padding mask (model_store/qvi/nn/self_attention.py).
PyTorch picks a kernel per call: flash (takes no mask), memory-efficient (takes one), cuDNN, or the
math fallback (softmax and two matrix products). This script, on the GPU machine from the repo root,

  1. profiles the BERT-base-sized model's forward without maps (qvi.bench_model.bench_config, random
     weights, eager — TorchScript dispatches the same aten op) and names the attention kernels it ran;
  2. times the attention call alone at the model's shapes under each backend forced in turn
     (torch.nn.attention.sdpa_kernel), or says why a backend refused;
  3. times the whole forward with each backend forced, to say what the choice costs the model.

    python3 bench/sdpa_probe.py [--device cuda] [--batch 128] [--tokens 128] [--dtypes float32 bfloat16]

--device cpu runs the same steps on the CPU (a dry run of the script; the kernels are the CPU's).
"""
import argparse
import os
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "model_store"))


def kind_of(kernel: str) -> str:
    k = kernel.lower()
    if "flash" in k:
        return "flash"
    if "fmha" in k or "efficient" in k or "mem_eff" in k:
        return "memory-efficient"
    if "cudnn" in k and ("attn" in k or "sdpa" in k or "fprop" in k):
        return "cudnn"
    if "softmax" in k:
        return "softmax (math fallback if no fused kernel ran)"
    return ""


def timed(fn, device: str, reps: int) -> float:
    import torch
    for _ in range(3):
        fn()
    if device == "cuda":
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(reps):
        fn()
    if device == "cuda":
        torch.cuda.synchronize()
    return (time.perf_counter() - t0) / reps * 1e3


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"])
    ap.add_argument("--layers", type=int, default=12, help="fewer for a quick dry run")
    ap.add_argument("--reps", type=int, default=20)
    a = ap.parse_args()
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.profiler import ProfilerActivity, profile
    from qvi.bench_model import bench_config
    from qvi.models import build_model

    dev = a.device
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name() if dev == 'cuda' else 'CPU'}; "
          f"flash {torch.backends.cuda.flash_sdp_enabled()}, mem-efficient {torch.backends.cuda.mem_efficient_sdp_enabled()}, "
          f"cudnn {torch.backends.cuda.cudnn_sdp_enabled()}, math {torch.backends.cuda.math_sdp_enabled()}", flush=True)
    torch.manual_seed(0)
    config = bench_config(layers=a.layers, max_tokens=a.tokens)
    backends = [("flash", SDPBackend.FLASH_ATTENTION), ("memory-efficient", SDPBackend.EFFICIENT_ATTENTION),
                ("cudnn", SDPBackend.CUDNN_ATTENTION), ("math", SDPBackend.MATH)]
    for dtype_name in a.dtypes:
        dtype = getattr(torch, dtype_name)
        model = build_model(config).eval().to(dev).to(dtype)
        ids = torch.randint(2, config.vocab_size, (a.batch, a.tokens), device=dev)
        # Lengths from 16 tokens to all of them: the mask has real padding, as served batches do.
        lengths = torch.linspace(16, a.tokens, a.batch, device=dev).long()
        mask = torch.arange(a.tokens, device=dev).unsqueeze(0) < lengths.unsqueeze(1)

        def forward():
            with torch.no_grad():
                return model.forward_without_maps(ids, mask)

        forward()
        acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if dev == "cuda" else [])
        with profile(activities=acts) as prof:
            forward()
            if dev == "cuda":
                torch.cuda.synchronize()
        print(f"\n== {dtype_name}: forward without maps, batch {a.batch} x {a.tokens} tokens, {a.layers} layers")
        events = [e for e in prof.key_averages()]
        ops = [e for e in events if "scaled_dot_product" in e.key or "_efficient_attention" in e.key
               or "_flash_attention" in e.key or "_cudnn_attention" in e.key or e.key == "aten::_softmax"]
        for e in sorted(ops, key=lambda e: e.key):
            print(f"  op     {e.count:4d} x {e.key}")
        attr = "device_time_total" if hasattr(events[0], "device_time_total") else "cuda_time_total"
        kernels = [e for e in events if getattr(e, attr, 0) > 0 and not e.key.startswith("aten::")
                   and not e.key.startswith("cuda")] if dev == "cuda" else []
        total = sum(getattr(e, attr) for e in kernels) or 1
        for e in sorted(kernels, key=lambda e: -getattr(e, attr))[:14]:
            print(f"  kernel {100 * getattr(e, attr) / total:5.1f} % {e.count:4d} x {e.key[:110]}"
                  f"{'   <- ' + kind_of(e.key) if kind_of(e.key) else ''}")
        kinds = sorted({kind_of(e.key) for e in kernels} - {""})
        print(f"  attention kernels seen: {', '.join(kinds) or 'none named (CPU run)'}")

        # The attention call alone at the model's shapes: [B, heads, T, head_dim], mask [B,1,1,T].
        heads, d = config.heads, config.hidden // config.heads
        q, k, v = (torch.randn(a.batch, heads, a.tokens, d, device=dev, dtype=dtype) for _ in range(3))
        allowed = mask.unsqueeze(1).unsqueeze(2)
        print(f"  F.scaled_dot_product_attention [{a.batch},{heads},{a.tokens},{d}] with the boolean mask:")
        for name, backend in backends:
            try:
                with sdpa_kernel([backend]):
                    ms = timed(lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=allowed, scale=d ** -0.5),
                               dev, a.reps)
                print(f"    {name:17s} {ms:8.3f} ms a call")
            except RuntimeError as e:
                print(f"    {name:17s} refused: {str(e).splitlines()[0][:150]}")
        print(f"  the whole forward (batch {a.batch}) with one backend allowed:")
        for name, backend in [("default choice", None)] + backends:
            try:
                if backend is None:
                    ms = timed(forward, dev, a.reps)
                else:
                    with sdpa_kernel([backend]):
                        ms = timed(forward, dev, a.reps)
                print(f"    {name:17s} {ms:8.3f} ms a batch = {a.batch / ms * 1e3:9.0f} texts/s")
            except RuntimeError as e:
                print(f"    {name:17s} refused: {str(e).splitlines()[0][:150]}")
        del model
    return 0


if __name__ == "__main__":
    sys.exit(main())
