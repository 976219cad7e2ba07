"""Where compiling a demo model's AOTInductor package for CUDA fails (issue 34): the exporter's own
compile (`qvi.pt2.compile_package`, without the export's check), each Inductor compile timed and
announced before it starts, with faulthandler on (a SIGSEGV prints every thread's Python stack, and a step
that runs past --stall-seconds prints them without stopping). Run on a GPU machine from the repo
root (bench/gpu_session.sh pt2 runs it):

    python3 bench/cuda_pt2_probe.py --model model_store/store/sentiment/1/model.pt [--write]

--write keeps the package as model.cuda.pt2 beside model.pt (else it goes to a temporary folder) and
checks each method against the eager model in a fresh process (--check PT2 does only that).
"""
import argparse
import faulthandler
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
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
    ap.add_argument("--no-check", action="store_true", help="with --write: skip the check in a fresh process")
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
    example = pt2._example(int(manifest["architecture"]["config"]["vocab_size"]), a.device)
    if a.check:
        return check(a, model, example)
    # The exporter's own compile (pt2.compile_package: every method exported, compiled and packaged
    # with pt2.json), each Inductor compile announced and timed; without the exporter's check.
    folder = os.path.dirname(os.path.abspath(a.model)) if a.write else tempfile.mkdtemp(prefix="qvi_pt2_probe_")
    path = os.path.join(folder, pt2.FILES[a.device])
    compile_one = torch._inductor.aot_compile

    def announced(gm, example_inputs, options=None):
        say(f"aot_compile ({len(gm.graph.nodes)} graph nodes)")
        files = compile_one(gm, example_inputs, options=options)
        say(f"compiled into {sum(isinstance(f, str) for f in files)} files")
        return files

    torch._inductor.aot_compile = announced
    say(f"compile_package -> {path}")
    pt2.compile_package(model, manifest, vocab.to_text(), path, a.device)
    say("packaged")
    if a.write and not a.no_check:
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
