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


def profile_forward(forward, dev: str, title: str) -> None:
    """Runs `forward` once under the profiler and prints the attention ops and the top GPU kernels."""
    import torch
    from torch.profiler import ProfilerActivity, profile
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if dev == "cuda" else [])
    with profile(activities=acts) as prof:
        forward()
        if dev == "cuda":
            torch.cuda.synchronize()
    print(f"\n== {title}")
    events = list(prof.key_averages())
    names = ("scaled_dot_product", "_efficient_attention", "_flash_attention", "_cudnn_attention")
    ops = [e for e in events if any(n in e.key for n in names) or e.key == "aten::_softmax"]
    for e in sorted(ops, key=lambda e: e.key):
        print(f"  op     {e.count:4d} x {e.key}")
    attr = "device_time_total" if hasattr(events[0], "device_time_total") else "cuda_time_total"
    kernels = [e for e in events if getattr(e, attr, 0) > 0 and not e.key.startswith(("aten::", "cuda"))]
    kernels = kernels if dev == "cuda" else []
    total = sum(getattr(e, attr) for e in kernels) or 1
    for e in sorted(kernels, key=lambda e: -getattr(e, attr))[:14]:
        kind = kind_of(e.key)
        print(f"  kernel {100 * getattr(e, attr) / total:5.1f} % {e.count:4d} x {e.key[:110]}"
              f"{'   <- ' + kind if kind else ''}")
    kinds = sorted({kind_of(e.key) for e in kernels} - {""})
    print(f"  attention kernels seen: {', '.join(kinds) or 'none named (CPU run)'}")


def time_each_backend(what: str, call, dev: str, reps: int, per: str) -> None:
    """`call` timed with each SDPA backend allowed alone (and with PyTorch's own choice first when
    per == 'batch'), or why the backend refused."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    backends = [("flash", SDPBackend.FLASH_ATTENTION), ("memory-efficient", SDPBackend.EFFICIENT_ATTENTION),
                ("cudnn", SDPBackend.CUDNN_ATTENTION), ("math", SDPBackend.MATH)]
    print(f"  {what}:")
    for name, backend in ([("default choice", None)] if per == "batch" else []) + backends:
        try:
            if backend is None:
                ms = timed(call, dev, reps)
            else:
                with sdpa_kernel([backend]):
                    ms = timed(call, dev, reps)
            print(f"    {name:17s} {ms:8.3f} ms a {per}")
        except RuntimeError as e:
            print(f"    {name:17s} refused: {str(e).splitlines()[0][:150]}")


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
    from qvi.bench_model import bench_config
    from qvi.models import build_model

    dev = a.device
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name() if dev == 'cuda' else 'CPU'}; "
          f"flash {torch.backends.cuda.flash_sdp_enabled()}, mem-efficient {torch.backends.cuda.mem_efficient_sdp_enabled()}, "
          f"cudnn {torch.backends.cuda.cudnn_sdp_enabled()}, math {torch.backends.cuda.math_sdp_enabled()}", flush=True)
    torch.manual_seed(0)
    config = bench_config(layers=a.layers, max_tokens=a.tokens)
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
        profile_forward(forward, dev, f"{dtype_name}: forward without maps, batch {a.batch} x {a.tokens} tokens, "
                                      f"{a.layers} layers")
        # The attention call alone at the model's shapes: [B, heads, T, head_dim], mask [B,1,1,T].
        heads, d = config.heads, config.hidden // config.heads
        q, k, v = (torch.randn(a.batch, heads, a.tokens, d, device=dev, dtype=dtype) for _ in range(3))
        allowed = mask.unsqueeze(1).unsqueeze(2)
        time_each_backend(f"F.scaled_dot_product_attention [{a.batch},{heads},{a.tokens},{d}] with the boolean mask",
                          lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=allowed, scale=d ** -0.5),
                          dev, a.reps, "call")
        time_each_backend(f"the whole forward (batch {a.batch}) with one backend allowed", forward, dev, a.reps,
                          "batch")
        del model
    return 0


if __name__ == "__main__":
    sys.exit(main())
