"""The AOTInductor artifact: <store>/<name>/<version>/model.<device>.pt2, beside model.pt.

One package per device kind it was compiled for (model.cpu.pt2, model.cuda.pt2), each a PT2 archive
(torch.export.pt2_archive) holding:

    AOTInductor model "model"         forward(token_ids, mask): every output, the maps included
    AOTInductor model "without_maps"  the Transformer models' forward_without_maps (absent for others)
    extra/manifest.json, extra/vocab.txt   the same files model.pt carries (an imported sub-word model:
                                      extra/tokenizer.json for vocab.txt)
    extra/pt2.json                    what the server must know about this package (PT2_INFO below)

Both models take token_ids Long[B,T] and mask Bool[B,T] with B dynamic in 1..MAX_BATCH and T in
MIN_TOKENS..max_tokens, and return the outputs of the eager model as a flat list in the order of the
package's call spec (a dict's keys). A server pads a batch of one-token texts to MIN_TOKENS (padding
does not change an answer) and splits batches over MAX_BATCH.

Taggers leave out `tags`: torch.export cannot trace the CRF's Viterbi loop over a dynamic number of
tokens, so pt2.json carries the CRF's start, end and transition scores and the server decodes the
emissions itself (server/core/model/viterbi.cc, the same recursion as qvi.nn.CRF.decode).

CPU packages are compiled for a named instruction set, recorded in pt2.json ("cpu_target") and by
AOTInductor (AOTI_CPU_ISA): by default x86-64-v3 (AVX2 and FMA, every x86 server since about 2015),
so that a package built on one machine serves on another; `--cpu-target native` compiles for the
machine it runs on (AVX-512 here), for a package compiled on the node that serves it. A server
refuses a package its CPU cannot run, or one compiled by another torch version (the package calls
into LibTorch's C shim, which is not stable across versions), and serves model.pt instead.

Architectures with LSTM/GRU layers (lstm_att, han) are not exported: torch.export unrolls
nn.LSTM/nn.GRU over the time steps of the example and so cannot keep T dynamic, and HAN's sentence
grid has a size that depends on the data. Their manifests say so ("pt2"), and they ship TorchScript.
"""
import contextlib
import copy
import hashlib
import json
import logging
import math
import os
import shutil
import statistics
import tempfile
import time
from typing import Dict, Iterator, List, Optional, Sequence, Tuple

import torch
from torch import nn

from qvi.hf_encoders import Encoder
from qvi.models import TransformerClassifier, TransformerCRF

FILES = {"cpu": "model.cpu.pt2", "cuda": "model.cuda.pt2"}
# The CPU packages a version may hold beside model.cpu.pt2, by name: (cpu target, dtype), each in
# model.cpu.<name>.pt2. The server loads the first of these its CPU can run, in this order, before
# model.cpu.pt2 (server/core/model/model_load.cc); serving.json's "cpu_package" pins one.
# "int8": the Linear layers' weights in int8 (per channel) and their inputs quantized to int8 at run
# time (per tensor, dynamic: no calibration), everything else in float32 (quantize_int8 below).
CPU_VARIANTS = {"x86-64-v4-int8": ("x86-64-v4", "int8"), "x86-64-v4-bf16": ("x86-64-v4", "bfloat16"),
                "x86-64-v4": ("x86-64-v4", "float32")}


def variant_file(variant: str) -> str:
    if variant not in CPU_VARIANTS:
        raise ValueError(f"CPU package variant must be one of {sorted(CPU_VARIANTS)}, got {variant!r}")
    return f"model.cpu.{variant}.pt2"


# How far a compiled package may differ from the float32 eager model on the check's random batches, each
# difference taken relative to the value's size (|got - want| / (1 + |want|): absolute below 1): float32 code
# only by rounding, which grows with depth (kernels that sum in another order: a fine-tuned MiniLM, 6 layers, came
# out 1.0e-5 from its eager model in absolute terms, the 12-layer multilingual-e5-small tagger 1.75e-5); bfloat16
# by its 8-bit mantissa. A bf16 package's real test is the fidelity gate on a test split (qvi/fidelity.py); this one
# catches a miscompiled package.
CHECK_TOLERANCE = {"float32": 5e-5, "bfloat16": 0.05, "int8": 0.05}
PT2_INFO = "pt2.json"
INFO_VERSION = 2  # 2: CPU kernels take their OpenMP team size at run time (dynamic threads)
MIN_TOKENS = 2
MAX_BATCH = 1024
CPU_TARGETS = {"x86-64-v3": 256, "x86-64-v4": 512, "native": None}  # -march -> SIMD width Inductor vectorises for
DEFAULT_CPU_TARGET = "x86-64-v3"
# /proc/cpuinfo flags a package needs. x86-64-v3 is AVX2, FMA, F16C, BMI1/2, LZCNT (abm) and MOVBE;
# for "native", every flag of this list that the compiling machine has, since -march=native may use
# any of them.
X86_64_V3_FLAGS = ["avx", "avx2", "fma", "f16c", "bmi1", "bmi2", "abm", "movbe"]
# x86-64-v4 adds AVX-512 F, BW, CD, DQ and VL.
X86_64_V4_FLAGS = X86_64_V3_FLAGS + ["avx512f", "avx512bw", "avx512cd", "avx512dq", "avx512vl"]
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
# A package's arithmetic: a dtype the whole model is cast to, or "int8" (its Linear layers quantized).
PRECISIONS = tuple(DTYPES) + ("int8",)
# What a reduced-precision package needs besides its target's flags: for bfloat16 the CPU's bf16 dot
# products, for int8 its int8 ones (VNNI). Without them the compiled code still runs (bf16 converts by
# shifts, oneDNN's int8 kernels widen to int16) but slower than float32, so it is not a package to pick.
PRECISION_FLAGS = {"bfloat16": ["avx512_bf16"], "int8": ["avx512_vnni"]}
NATIVE_FLAGS = X86_64_V3_FLAGS + [
    "avx512f", "avx512dq", "avx512cd", "avx512bw", "avx512vl", "avx512_vnni", "avx512_bf16", "avx512ifma",
    "avx512vbmi", "avx512_vbmi2", "avx512_bitalg", "avx512_vpopcntdq", "avx512_fp16", "avx_vnni",
    "amx_tile", "amx_bf16", "amx_int8", "gfni", "vaes", "vpclmulqdq", "sha_ni"]


def required_cpu_flags(target: str) -> List[str]:
    if target == "x86-64-v3":
        return list(X86_64_V3_FLAGS)
    if target == "x86-64-v4":
        return list(X86_64_V4_FLAGS)
    have = set()
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("flags"):
                have = set(line.split(":", 1)[1].split())
                break
    return [flag for flag in NATIVE_FLAGS if flag in have]

def cpu_flags(target: str, dtype: str) -> List[str]:
    """The flags a package compiled for `target` in `dtype` needs."""
    flags = required_cpu_flags(target)
    return flags + [f for f in PRECISION_FLAGS.get(dtype, []) if f not in flags]


UNEXPORTABLE = {
    "lstm": "torch.export unrolls nn.LSTM over the example's time steps, so T cannot stay dynamic",
    "lstm_att": "torch.export unrolls nn.LSTM over the example's time steps, so T cannot stay dynamic",
    "han": "torch.export unrolls nn.GRU over the example's time steps, and the sentence grid's size "
           "depends on the data",
}


def export_status(arch: str) -> Dict[str, object]:
    """The manifest's "pt2" entry: whether this architecture can be exported to a .pt2, and why not."""
    reason = UNEXPORTABLE.get(arch)
    return {"exportable": reason is None, **({"reason": reason} if reason else {})}


class _Entry(nn.Module):
    """One exported method of a model, with the signature torch.export sees."""

    def __init__(self, model: nn.Module, lean: bool):
        super().__init__()
        self.model = model
        self.lean = lean

    def forward(self, token_ids: torch.Tensor, mask: torch.Tensor) -> Dict[str, torch.Tensor]:
        out = self._outputs(token_ids, mask)
        # A model computing in another precision still answers in float32, as the server expects
        # (the cast is fused into each output's last kernel).
        return {k: v.float() if v.is_floating_point() else v for k, v in out.items()}

    def _outputs(self, token_ids: torch.Tensor, mask: torch.Tensor) -> Dict[str, torch.Tensor]:
        m = self.model
        if isinstance(m, TransformerCRF):
            return m._run(token_ids, mask, "received" if self.lean else "maps", decode=False)
        if isinstance(m, TransformerClassifier):
            return m._run(token_ids, mask, "none" if self.lean else "maps")
        if isinstance(m, Encoder):  # an imported or fine-tuned encoder (qvi.hf_import, qvi.finetune)
            return m._run(token_ids, mask, not self.lean, decode=False)
        return m(token_ids, mask)


def methods(model: nn.Module) -> List[Tuple[str, nn.Module]]:
    """(package model name, module) for each method the package holds."""
    entries = [("model", _Entry(model, lean=False))]
    if isinstance(model, (TransformerClassifier, TransformerCRF, Encoder)):
        entries.append(("without_maps", _Entry(model, lean=True)))
    return entries


@contextlib.contextmanager
def _cpu_target(target: str) -> Iterator[Dict[str, object]]:
    """Inductor config for compiling CPU code for `target`. Inductor itself always passes
    -march=native to the C++ compiler, which would let the compiler use every instruction of this
    machine in any loop; for a portable target that flag is replaced for the compile's duration."""
    if target not in CPU_TARGETS:
        raise ValueError(f"cpu target must be one of {sorted(CPU_TARGETS)}, got {target!r}")
    if target == "native":
        yield {}
        return
    from torch._inductor import cpp_builder
    original = getattr(cpp_builder, "_get_optimization_cflags", None)
    if original is None:
        raise RuntimeError("this torch's Inductor has no _get_optimization_cflags; cannot pin the CPU target")

    def flags(*args, **kwargs):  # type: ignore[no-untyped-def]
        cflags, ldflags = original(*args, **kwargs)
        return [f"march={target}" if f == "march=native" else f for f in cflags], ldflags

    cpp_builder._get_optimization_cflags = flags
    try:
        yield {"cpp.simdlen": CPU_TARGETS[target]}
    finally:
        cpp_builder._get_optimization_cflags = original


# aot_inductor.package: write the files for a PT2 archive. cpp.dynamic_threads: CPU kernels open
# OpenMP teams of the calling thread's size (omp_get_max_threads, which the server sets to its torch
# intra-op count) instead of the exporting machine's core count, which Inductor otherwise writes
# into the code: a package compiled on a 64-core machine would run 64 threads per forward on a
# 4-CPU pod.
COMPILE_OPTIONS = {"aot_inductor.package": True, "cpp.dynamic_threads": True}
# Inductor's weight freezing (CPU packages only; the CUDA packages were measured without it): the
# weights become constants of the graph, so Inductor folds what depends on them alone and hands the
# Linear layers to oneDNN with their weights packed once, at compile time. Whether that is faster
# depends on the CPU (docs/performance.md, "Frozen weights"): on a 2-core AMD EPYC it made the demo
# classifier 1.3-1.5x faster at batches of 4 and more; on a 2-core Intel Xeon (AVX-512, AMX) the
# package without it was 1.57x faster at batch 1 and 1.0-1.16x up to 16. So by default ("auto") the
# exporter compiles both, times them on this machine (FREEZING_SHAPES) and keeps the faster: a
# package is meant to be compiled on the kind of node that serves it. "on" and "off" force one.
FREEZING = ("auto", "on", "off")
DEFAULT_FREEZING = "auto"
# (batch size, tokens) that "auto" times: a lone short text, as at concurrency 1, and a batch of
# eight of them, as under load. The faster package by the geometric mean of the two times is kept
# (ties keep freezing). One torch thread, as each of the server's CPU instances runs.
FREEZING_SHAPES = [(1, 24), (8, 24)]
FREEZING_SECONDS = 3.0  # the timing's budget, both packages and shapes together


def _example(vocab_size: int, device: str) -> Tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(2, max(vocab_size, 3), (4, 16), generator=g)
    mask = torch.ones(4, 16, dtype=torch.bool)
    mask[1, 11:] = False
    mask[3, 5:] = False
    return ids.to(device), mask.to(device)


def compile_package(model: nn.Module, manifest: Dict[str, object], vocab_text: str, path: str,
                    device: str = "cpu", cpu_target: str = DEFAULT_CPU_TARGET, dtype: str = "float32",
                    freeze: bool = False) -> str:
    """Exports and compiles every method of `model` (eval mode), its weights and arithmetic in
    `dtype`, into the package `path`; `freeze` freezes the weights of a CPU package (FREEZING)."""
    from torch.export.pt2_archive._package import package_pt2
    arch = str(manifest["architecture"]["name"])  # type: ignore[index]
    if arch in UNEXPORTABLE:
        raise ValueError(f"{arch} cannot be exported to a .pt2: {UNEXPORTABLE[arch]}")
    if dtype not in PRECISIONS:
        raise ValueError(f"dtype must be one of {list(PRECISIONS)}, got {dtype!r}")
    if dtype == "int8" and device != "cpu":
        raise ValueError("int8 packages are CPU packages")
    config = manifest["architecture"]["config"]  # type: ignore[index]
    freeze = (freeze or dtype == "int8") and device == "cpu"
    model = model.eval().to(device)
    compiled_model = copy.deepcopy(model).to(DTYPES[dtype]) if dtype == "bfloat16" else model
    max_tokens = int(config["max_tokens"])
    b = torch.export.Dim("batch", min=1, max=MAX_BATCH)
    t = torch.export.Dim("tokens", min=MIN_TOKENS, max=max_tokens)
    example = _example(int(config["vocab_size"]), device)
    aoti_files: Dict[str, List[str]] = {}
    outputs: Dict[str, List[str]] = {}
    with _cpu_target(cpu_target if device == "cpu" else "native") as isa_config, torch.no_grad():
        for name, module in methods(compiled_model):
            dynamic = ({0: b, 1: t}, {0: b, 1: t})
            outputs[name] = list(module(*example).keys())
            if dtype == "int8":
                module = quantize_int8(module, example, dynamic)
            ep = torch.export.export(module, example, dynamic_shapes=dynamic)
            files = torch._inductor.aot_compile(ep.module(), example,
                                                options=dict(isa_config, **COMPILE_OPTIONS, freezing=freeze))
            aoti_files[name] = [f for f in files if isinstance(f, str)]  # type: ignore[union-attr]
    info: Dict[str, object] = {
        "info_version": INFO_VERSION,
        "device": device,
        "cpu_target": cpu_target if device == "cpu" else "",
        "cpu_flags": cpu_flags(cpu_target, dtype) if device == "cpu" else [],
        "dtype": dtype,
        "freezing": freeze,
        "torch_version": torch.__version__.split("+")[0],
        "min_tokens": MIN_TOKENS,
        "max_tokens": max_tokens,
        "max_batch": MAX_BATCH,
        "outputs": outputs,
    }
    if isinstance(model, TransformerCRF) or (isinstance(model, Encoder) and model.crf is not None):
        info["server_decodes"] = "tags"
        info["crf"] = {"start": model.crf.start.detach().cpu().tolist(),
                       "end": model.crf.end.detach().cpu().tolist(),
                       "transitions": model.crf.trans.detach().cpu().tolist()}
    package_pt2(path, aoti_files=aoti_files, extra_files=_extra_files(manifest, vocab_text, info))  # type: ignore[arg-type]
    return path


def quantize_int8(module: nn.Module, example: Tuple[torch.Tensor, torch.Tensor],
                  dynamic: Tuple[Dict[int, object], ...]) -> nn.Module:
    """`module` with its Linear layers in dynamic int8, for an "int8" package: torchao's PT2E flow
    with its X86InductorQuantizer in dynamic mode -- each weight int8 per output channel, each input
    quantized per tensor at run time from its own range, so no calibration data is needed. Compiled
    with frozen weights, Inductor's x86 passes (registered by importing torchao's) turn each into
    one oneDNN int8 matrix product with the quantization fused into the kernels around it.

    The export is strict (TorchDynamo): the quantizer finds Linear layers by the `source_fn_stack`
    that Dynamo records on each node, and torch 2.11's default non-strict export records none, so
    it would quantize nothing (the first try at int8 ran exactly as fast as float32 for that reason)."""
    import torchao.quantization.pt2e.inductor_passes.x86  # noqa: F401  (the int8 lowerings)
    import torchao.quantization.pt2e.quantizer.x86_inductor_quantizer as x86q
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e
    graph = torch.export.export(module, example, dynamic_shapes=dynamic, strict=True).module()
    quantizer = x86q.X86InductorQuantizer()
    quantizer.set_global(x86q.get_default_x86_inductor_quantization_config(is_dynamic=True))
    prepared = prepare_pt2e(graph, quantizer)  # type: ignore[arg-type]
    prepared(*example)  # observes each weight's range; the inputs' ranges are taken per call
    quantized = convert_pt2e(prepared)
    linears = sum(1 for n in quantized.graph.nodes if n.target == torch.ops.aten.linear.default)
    dequantized = sum(1 for n in quantized.graph.nodes
                      if n.target == torch.ops.quantized_decomposed.dequantize_per_channel.default)
    if linears == 0 or dequantized < linears:
        raise RuntimeError(f"int8: the quantizer annotated {dequantized} of {linears} Linear layers")
    return quantized


def _readable(path: str) -> None:
    """Temporary files are private (0600); give the package the mode of any new file, so that a
    server running as another user (the image's uid 10001) can read it."""
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(path, 0o666 & ~umask)


@contextlib.contextmanager
def _publishing(folder: str, file: str) -> Iterator[str]:
    """Yields a temporary path in `folder` to write a package to; when the block ends without an
    error, renames it into place as model.<device>.pt2, so a server watching the store never sees
    half a package. The archive's folder inside takes the temporary file's stem, "model"."""
    os.makedirs(folder, exist_ok=True)
    staging = tempfile.mkdtemp(prefix=".pt2.", dir=folder)
    try:
        tmp = os.path.join(staging, "model.pt2")
        yield tmp
        _readable(tmp)
        os.replace(tmp, os.path.join(folder, file))
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _vocab_file(manifest: Dict[str, object]) -> str:
    """vocab.txt, or an imported sub-word model's tokenizer.json (manifest format 2), which it carries instead."""
    tokenizer = manifest.get("tokenizer", {})
    return "tokenizer.json" if isinstance(tokenizer, dict) and tokenizer.get("level") == "subword" else "vocab.txt"


def _extra_files(manifest: Dict[str, object], vocab_text: str, info: Dict[str, object]) -> Dict[str, str]:
    """`vocab_text`: the text of _vocab_file(manifest)."""
    return {"manifest.json": json.dumps(manifest, ensure_ascii=False, indent=1, sort_keys=True),
            _vocab_file(manifest): vocab_text, PT2_INFO: json.dumps(info, indent=1)}


def _freezing_mode(freezing: str, device: str, dtype: str = "float32") -> str:
    """The freezing a package is compiled with: none on a GPU, always for int8 (its lowering to
    oneDNN's int8 kernels is one of Inductor's freezing passes)."""
    if freezing not in FREEZING:
        raise ValueError(f"freezing must be one of {list(FREEZING)}, got {freezing!r}")
    if device != "cpu":
        return "off"
    return "on" if dtype == "int8" else freezing


def geometric_mean(times: Dict[str, float]) -> float:
    """One package's score from its times at each shape ({shape: ms}): smaller is faster."""
    return math.exp(sum(math.log(t) for t in times.values()) / len(times))


def choose_freezing(ms: Dict[str, Dict[str, float]]) -> bool:
    """Whether to keep the frozen package, from each package's times ({"frozen": {shape: ms},
    "unfrozen": {...}}): the one with the smaller geometric mean over the shapes, freezing on a tie."""
    return geometric_mean(ms["frozen"]) <= geometric_mean(ms["unfrozen"])


def time_packages(paths: Dict[str, str], vocab_size: int, seconds: float = FREEZING_SECONDS,
                  rounds: int = 5) -> Dict[str, Dict[str, float]]:
    """Milliseconds per forward of each package at FREEZING_SHAPES ({name: {"BxT": ms}}), one torch
    thread: the method a plain request runs (the forward without maps where the package has one),
    the packages taking turns for `rounds` rounds, the median round of each kept."""
    runs = {}
    for name, path in paths.items():
        compiled = load_methods(path)
        runs[name] = compiled.get("without_maps", compiled["model"])
    g = torch.Generator().manual_seed(2)
    inputs = {f"{b}x{t}": (torch.randint(2, max(vocab_size, 3), (b, t), generator=g), torch.ones(b, t, dtype=torch.bool))
              for b, t in FREEZING_SHAPES}
    per_step = seconds / (rounds * len(runs) * len(inputs))
    samples: Dict[str, Dict[str, List[float]]] = {name: {shape: [] for shape in inputs} for name in runs}
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with torch.no_grad():
            for name, run in runs.items():  # first calls allocate and page in the code
                for ids, mask in inputs.values():
                    for _ in range(3):
                        run(ids, mask)  # type: ignore[operator]
            for _ in range(rounds):
                for name, run in runs.items():
                    for shape, (ids, mask) in inputs.items():
                        calls, start = 0, time.perf_counter()
                        while True:
                            run(ids, mask)  # type: ignore[operator]
                            calls += 1
                            elapsed = time.perf_counter() - start
                            if elapsed >= per_step:
                                break
                        samples[name][shape].append(1e3 * elapsed / calls)
    finally:
        torch.set_num_threads(threads)
    return {name: {shape: round(statistics.median(v), 4) for shape, v in by.items()} for name, by in samples.items()}


def _compile_choosing_freezing(model: nn.Module, manifest: Dict[str, object], vocab_text: str, path: str,
                               cpu_target: str, dtype: str) -> None:
    """compile_package for the CPU with freezing "auto": compiles the package with and without
    frozen weights, times both on this machine and writes the faster to `path`, its pt2.json saying
    what was measured ("freezing_choice")."""
    config = manifest["architecture"]["config"]  # type: ignore[index]
    with tempfile.TemporaryDirectory(prefix=".freezing.", dir=os.path.dirname(os.path.abspath(path))) as work:
        candidates = {}
        for name, freeze in (("frozen", True), ("unfrozen", False)):
            os.makedirs(os.path.join(work, name))
            # Named model.pt2, as every package: the archive's folder inside takes the file's stem.
            candidates[name] = os.path.join(work, name, "model.pt2")
            compile_package(model, manifest, vocab_text, candidates[name], "cpu", cpu_target, dtype, freeze)
        ms = time_packages(candidates, int(config["vocab_size"]))
        keep = "frozen" if choose_freezing(ms) else "unfrozen"
        extra = read_extra(candidates[keep])
        info = json.loads(extra[PT2_INFO])
        info["freezing_choice"] = {"ms": ms, "kept": keep, "cpu": cpu_model(), "torch_threads": 1}
        extra[PT2_INFO] = json.dumps(info, indent=1)
        repackage(candidates[keep], path, extra)


def cpu_model() -> str:
    """This machine's CPU, as /proc/cpuinfo names it ("" where it does not)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return ""


def write_package(model: nn.Module, manifest: Dict[str, object], vocab_text: str, folder: str,
                  device: str = "cpu", cpu_target: str = DEFAULT_CPU_TARGET, check: bool = True,
                  dtype: str = "float32", file: Optional[str] = None, freezing: str = DEFAULT_FREEZING) -> str:
    """Compiles into a temporary file in `folder`, checks it against the eager model, and renames it
    into place as `file` (model.<device>.pt2 by default), so a server watching the store never sees
    half a package. `freezing` (FREEZING) decides the CPU package's weight freezing."""
    file = file or FILES[device]
    mode = _freezing_mode(freezing, device, dtype)
    with _publishing(folder, file) as tmp:
        if mode == "auto":
            _compile_choosing_freezing(model, manifest, vocab_text, tmp, cpu_target, dtype)
        else:
            compile_package(model, manifest, vocab_text, tmp, device, cpu_target, dtype, mode == "on")
        if check:
            worst = check_package(tmp, model, device)
            if worst > CHECK_TOLERANCE[dtype]:
                raise RuntimeError(f"the compiled package differs from the eager model by {worst:.3g} "
                                   f"(> {CHECK_TOLERANCE[dtype]} for {dtype})")
    return os.path.join(folder, file)


_HERE = os.path.dirname(os.path.abspath(__file__))
# A change to a model's forward changes what is compiled, with the same weights and manifest.
_CODE = [__file__, os.path.join(_HERE, "models.py"), os.path.join(_HERE, "hf_encoders.py")] + sorted(
    os.path.join(_HERE, "nn", f) for f in os.listdir(os.path.join(_HERE, "nn")) if f.endswith(".py"))


def cache_key(model: nn.Module, manifest: Dict[str, object], device: str, cpu_target: str,
              dtype: str = "float32", freezing: str = DEFAULT_FREEZING) -> str:
    """What a compiled package depends on: the weights, the architecture and outputs, the code that
    defines the models (qvi/models.py, qvi/nn/) and this exporter's, torch's version, the target and
    the freezing; with freezing "auto", this machine's CPU too (the choice was timed on it). Not the
    model card (dates), which only the extra files carry."""
    mode = _freezing_mode(freezing, device, dtype)
    h = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        h.update(name.encode())
        h.update(tensor.detach().cpu().contiguous().numpy().tobytes())
    h.update(json.dumps([manifest["architecture"], manifest["outputs"]], sort_keys=True).encode())
    for path in _CODE:
        with open(path, "rb") as f:
            h.update(f.read())
    h.update(f"{torch.__version__}|{device}|{cpu_target}|{dtype}|{mode}".encode())
    if mode == "auto":
        h.update(f"|{cpu_model()}|{os.cpu_count()}|{' '.join(required_cpu_flags('native'))}".encode())
    return h.hexdigest()[:32]


def repackage(source: str, path: str, extra: Dict[str, str]) -> None:
    """Copies the package `source` to `path` with its extra files replaced by `extra`."""
    from torch.export.pt2_archive._package import PT2ArchiveReader, PT2ArchiveWriter
    with PT2ArchiveReader(source) as reader, PT2ArchiveWriter(path) as writer:
        for name in reader.get_file_names():
            if name.startswith("extra/") or name in (".data/version", ".data/serialization_id",
                                                        "archive_format", "archive_version", "byteorder"):
                continue
            writer.write_bytes(name, reader.read_bytes(name))
        for name, text in extra.items():
            writer.write_string(f"extra/{name}", text)


CACHE_DAYS = 30


def _prune(cache: str) -> None:
    """Drops cached packages unused for CACHE_DAYS: every change to the exporter or torch makes new
    keys, and the old packages would otherwise stay forever."""
    import time
    for name in os.listdir(cache):
        path = os.path.join(cache, name)
        if name.endswith(".pt2") and time.time() - os.path.getmtime(path) > CACHE_DAYS * 86400:
            os.unlink(path)


def write_cached(model: nn.Module, manifest: Dict[str, object], vocab_text: str, folder: str,
                 device: str = "cpu", cpu_target: str = DEFAULT_CPU_TARGET, cache: Optional[str] = None,
                 dtype: str = "float32", file: Optional[str] = None, freezing: str = DEFAULT_FREEZING) -> str:
    """write_package, but with `cache` (a folder) a package compiled before from the same weights,
    code, target, dtype and freezing is reused, its extra files rewritten: compiling takes a minute
    on two cores."""
    file = file or FILES[device]
    if cache is None:
        return write_package(model, manifest, vocab_text, folder, device, cpu_target, dtype=dtype, file=file,
                             freezing=freezing)
    os.makedirs(cache, exist_ok=True)
    _prune(cache)
    cached = os.path.join(cache, cache_key(model, manifest, device, cpu_target, dtype, freezing) + ".pt2")
    if os.path.exists(cached):
        os.utime(cached)  # used: kept by _prune
    else:
        staging = tempfile.mkdtemp(prefix=".compile.", dir=cache)
        try:
            os.replace(write_package(model, manifest, vocab_text, staging, device, cpu_target, dtype=dtype,
                                     freezing=freezing), cached)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    info = json.loads(read_extra(cached)[PT2_INFO])
    with _publishing(folder, file) as tmp:
        repackage(cached, tmp, _extra_files(manifest, vocab_text, info))
    return os.path.join(folder, file)


def load_methods(path: str, device: str = "cpu") -> Dict[str, object]:
    """The package's compiled methods, callable from Python (torch's own loader)."""
    from torch._inductor.package import load_package
    # torch's reader warns when the package's CPU target is not this machine's best; that is the
    # portable target working as meant, not a problem.
    logging.getLogger("torch.export.pt2_archive._package").setLevel(logging.ERROR)
    info = read_extra(path)[PT2_INFO]
    names = json.loads(info)["outputs"]
    return {name: load_package(path, name, device_index=-1) for name in names}


def read_extra(path: str) -> Dict[str, str]:
    from torch.export.pt2_archive._package import PT2ArchiveReader
    out = {}
    with PT2ArchiveReader(path) as reader:
        have = set(reader.get_file_names())
        for name in ("manifest.json", "vocab.txt", "tokenizer.json", PT2_INFO):
            if name in ("manifest.json", PT2_INFO) or f"extra/{name}" in have:  # one of the other two
                out[name] = reader.read_string(f"extra/{name}")
    return out


def shapes(max_tokens: int) -> Sequence[Tuple[int, int]]:
    """Batch sizes and lengths a package is checked at: the smallest, odd ones and the largest."""
    return [(1, MIN_TOKENS), (3, min(17, max_tokens)), (8, max_tokens), (2, min(64, max_tokens))]


def check_package(path: str, model: nn.Module, device: str = "cpu") -> float:
    """Largest difference between the package's outputs and the eager model's over shapes(), each
    batch with some rows padded, relative to each value's size (CHECK_TOLERANCE); raises if an output is
    missing or extra."""
    compiled = load_methods(path, device)
    entries = dict(methods(model))
    vocab_size = (model.emb_word.num_embeddings if isinstance(model, Encoder) else
                  model.body.emb.num_embeddings if hasattr(model, "body") else model.emb.num_embeddings)
    info = json.loads(read_extra(path)[PT2_INFO])
    max_tokens = int(info["max_tokens"])
    g = torch.Generator().manual_seed(1)
    worst = 0.0
    with torch.no_grad():
        for b, t in shapes(max_tokens):
            ids = torch.randint(2, vocab_size, (b, t), generator=g)
            lengths = torch.randint(1, t + 1, (b,), generator=g)
            lengths[0] = t
            mask = torch.arange(t).unsqueeze(0) < lengths.unsqueeze(1)
            ids = (ids * mask).to(device)
            mask = mask.to(device)
            for name, run in compiled.items():
                want = entries[name](ids, mask)
                got = run(ids, mask)  # type: ignore[operator]
                if set(got) != set(want):
                    raise RuntimeError(f"{name}: the package returns {sorted(got)}, the model {sorted(want)}")
                for key, value in want.items():
                    diff = (got[key].float() - value.float()).abs() / (1 + value.float().abs())
                    worst = max(worst, diff.max().item())
    return worst
