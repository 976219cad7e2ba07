"""Does torch.jit.freeze or optimize_for_inference make the demo classifier faster on this CPU?
The median of 8 x 300 forward passes of one batch of 8 texts x 24 tokens, one torch thread, for the
model as exported and the two variants. Run from the repository root: .venv/bin/python bench/freeze_check.py
(docs/performance.md quotes its output)."""
import statistics, time, torch
torch.set_num_threads(1)
m = torch.jit.load("model_store/store/sentiment/1/model.pt").eval()
ids = torch.randint(2, 1000, (8, 24)); mask = torch.ones(8, 24, dtype=torch.bool)
variants = {"as exported": m, "freeze": torch.jit.freeze(m), "optimize_for_inference": torch.jit.optimize_for_inference(torch.jit.freeze(m))}
def median_ms(f):
    runs = []
    for _ in range(8):
        t = time.perf_counter()
        for _ in range(300): f(ids, mask)
        runs.append((time.perf_counter() - t) / 300 * 1e3)
    return statistics.median(runs)
with torch.inference_mode():
    for f in variants.values():
        for _ in range(20): f(ids, mask)
    for name, f in variants.items(): print(f"{name}: {median_ms(f):.3f} ms per batch of 8")
