"""Builds the stubs of qvi.serving.v1 from the repository's proto/ into qvi_client/_proto while the
wheel is built, so the package never carries a stale copy of the API. The generated gRPC module's
absolute import of its messages is made relative to the package."""
import os
import pathlib

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = pathlib.Path(__file__).resolve().parent
PROTO_ROOT = HERE.parent.parent / "proto"
PROTO = "qvi/serving/v1/inference.proto"


class BuildWithStubs(build_py):
    def run(self):
        super().run()
        from grpc_tools import protoc  # a build requirement (pyproject.toml)

        if not (PROTO_ROOT / PROTO).exists():
            raise RuntimeError(f"{PROTO_ROOT / PROTO} is missing: build qvi-serve-client from the repository "
                               "(pip install ./client/python)")
        out = pathlib.Path(self.build_lib) / "qvi_client" / "_proto"
        out.mkdir(parents=True, exist_ok=True)
        include = os.path.join(os.path.dirname(protoc.__file__), "_proto")  # google/protobuf/*.proto
        rc = protoc.main(["protoc", f"-I{PROTO_ROOT}", f"-I{include}", f"--python_out={out}",
                          f"--pyi_out={out}", f"--grpc_python_out={out}", str(PROTO_ROOT / PROTO)])
        if rc != 0:
            raise RuntimeError(f"protoc failed on {PROTO}")
        for folder in [out, out / "qvi", out / "qvi" / "serving", out / "qvi" / "serving" / "v1"]:
            (folder / "__init__.py").touch()
        grpc_module = out / "qvi" / "serving" / "v1" / "inference_pb2_grpc.py"
        text = grpc_module.read_text()
        absolute = "from qvi.serving.v1 import inference_pb2"
        if absolute not in text:
            raise RuntimeError(f"{grpc_module}: the import to rewrite was not found")
        grpc_module.write_text(text.replace(absolute, "from . import inference_pb2"))


setup(cmdclass={"build_py": BuildWithStubs})
