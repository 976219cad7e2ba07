"""Where compiling a demo model's AOTInductor package for CUDA fails (issue 34): the same steps as
`qvi.artifact.package_artifact(..., "cuda")`, one method at a time, each step timed and announced
before it starts, with faulthandler on (a SIGSEGV prints every thread's Python stack, and a step
that runs past --stall-seconds prints them without stopping). Run on a GPU machine from the repo
root (bench/gpu_session.sh pt2 runs it):

    python3 bench/cuda_pt2_probe.py --model model_store/store/sentiment/1/model.pt [--write]

--write packages the compiled methods into model.cuda.pt2 beside model.pt, as the exporter would, and
checks each against the eager model in a fresh process (--check PT2 does only that).
"""
import argparse
import faulthandler
import json
import os
import shutil
import signal
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "model_store"))

T0 = time.monotonic()


def say(msg: str) -> None:
    print(f"[{time.monotonic() - T0:7.1f} s] {msg}", flush=True)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True, help="a demo model's model.pt")
    ap.add_argument("--write", action="store_true", help="package the methods into model.cuda.pt2 beside it")
    ap.add_argument("--device", default="cuda", help="cpu: a dry run of this script without a GPU")
    ap.add_argument("--check", metavar="PT2", help="only load this package and compare each method with eager")
    ap.add_argument("--stall-seconds", type=float, default=90, help="dump every thread's stack after this long")
    a = ap.parse_args()
    faulthandler.enable(all_threads=True)
    faulthandler.dump_traceback_later(a.stall_seconds, repeat=True)
    faulthandler.register(signal.SIGTERM, all_threads=True, chain=True)  # timeout(1) stops it: where was it?
    import torch
    import torch.utils.cpp_extension
    from qvi import artifact, pt2
    from qvi.models import ModelConfig, build_model
    gpu = torch.cuda.get_device_name() if a.device == "cuda" else "no GPU"
    say(f"torch {torch.__version__}, cuda {torch.version.cuda}, {gpu}, "
        f"CUDA_HOME={os.environ.get('CUDA_HOME')} (torch finds "
        f"{torch.utils.cpp_extension.CUDA_HOME}), nvcc {shutil.which('nvcc')}, c++ {shutil.which('c++')}, compile threads "
        f"{torch._inductor.config.compile_threads}")
    module, manifest, vocab = artifact.load(a.model)
    model = build_model(ModelConfig(**manifest["architecture"]["config"])).eval()
    model.load_state_dict(module.state_dict())
    model = model.to(a.device)
    config = manifest["architecture"]["config"]
    b = torch.export.Dim("batch", min=1, max=pt2.MAX_BATCH)
    t = torch.export.Dim("tokens", min=pt2.MIN_TOKENS, max=int(config["max_tokens"]))
    example = pt2._example(int(config["vocab_size"]), a.device)
    if a.check:
        return check(a, model, example)
    aoti_files = {}
    outputs = {}
    with torch.no_grad():
        for name, method in pt2.methods(model):
            say(f"{name}: torch.export")
            ep = torch.export.export(method, example, dynamic_shapes=({0: b, 1: t}, {0: b, 1: t}))
            outputs[name] = list(method(*example).keys())
            say(f"{name}: aot_compile ({len(ep.graph.nodes)} graph nodes)")
            files = torch._inductor.aot_compile(ep.module(), example,
                                                options=dict(**pt2.COMPILE_OPTIONS, freezing=False))
            aoti_files[name] = [f for f in files if isinstance(f, str)]
            say(f"{name}: compiled into {len(aoti_files[name])} files")
    if a.write:
        from torch.export.pt2_archive._package import package_pt2
        path = os.path.join(os.path.dirname(os.path.abspath(a.model)), pt2.FILES[a.device])
        info = {"info_version": pt2.INFO_VERSION, "device": a.device, "cpu_target": "", "cpu_flags": [],
                "dtype": "float32", "freezing": False, "torch_version": torch.__version__.split("+")[0],
                "min_tokens": pt2.MIN_TOKENS, "max_tokens": int(config["max_tokens"]), "max_batch": pt2.MAX_BATCH,
                "outputs": outputs}
        if hasattr(model, "crf"):
            info["server_decodes"] = "tags"
            info["crf"] = {"start": model.crf.start.detach().cpu().tolist(),
                           "end": model.crf.end.detach().cpu().tolist(),
                           "transitions": model.crf.trans.detach().cpu().tolist()}
        say(f"package_pt2 -> {path}")
        package_pt2(path, aoti_files=aoti_files, extra_files=pt2._extra_files(manifest, vocab.to_text(), info))
        # Loaded back in a fresh process: in the compiling one, torch's Python loader crashed (SIGSEGV
        # in AOTIModelPackageLoader) on the H100, while the server's C++ loader loads the same file.
        say("loading the package back in a fresh process, each method against eager")
        checked = subprocess.run([sys.executable, os.path.abspath(__file__), "--model", a.model, "--device", a.device,
                                "--check", path])
        say(f"the check exited {checked.returncode}")
    faulthandler.cancel_dump_traceback_later()
    say("done")
    return 0


def check(a: argparse.Namespace, model, example) -> int:
    """--check: each method of the package at a.check against the eager model."""
    import torch
    from qvi import pt2
    # pt2.load_methods passes device_index -1 (torch's default); the server's C++ loader, which loads
    # CUDA packages fine, passes the device's index: a CUDA check does the same, to tell the two apart
    # if torch's Python loader still crashes.
    say(f"loading {a.check}")
    if a.device == "cuda":
        from torch._inductor.package import load_package
        outputs = json.loads(pt2.read_extra(a.check)[pt2.PT2_INFO])["outputs"]
        methods = {name: load_package(a.check, name, device_index=0) for name in outputs}
    else:
        methods = pt2.load_methods(a.check, a.device)
    with torch.no_grad():
        for name, method in pt2.methods(model):
            got = methods[name](*example)
            want = method(*example)
            worst = max(float((got[k] - want[k]).abs().max()) for k in want if k in got)
            say(f"{name}: largest difference from eager over {sorted(got)}: {worst:.3g}")
    faulthandler.cancel_dump_traceback_later()
    say("done")
    return 0


if __name__ == "__main__":
    sys.exit(main())
