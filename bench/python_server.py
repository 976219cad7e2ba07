"""The plain Python gRPC server a user writes first, as a benchmark peer: grpcio's thread-pool
server, the same qvi.serving.v1 proto, the same model.pt loaded with torch.jit, and one forward pass
per request (no batching across callers). It answers Classify with the labels only.

    python bench/python_server.py --model-pt model_store/store/sentiment/1/model.pt --port 0 --port-file F
"""
import argparse
import os
import sys
from concurrent import futures

import grpc
import torch

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "model_store"))
sys.path.insert(0, os.path.join(REPO, "tests", "python"))

from qvi import artifact  # noqa: E402
from qvi.tokenizer import config_from_json, encode  # noqa: E402
from qvi_testing import api_stubs  # noqa: E402  (the native API's modules, generated from proto/)


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--model-pt", required=True)
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--port-file")
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--torch-threads", type=int, default=1)
    ap.add_argument("--device", default="cpu", help="cpu or cuda")
    args = ap.parse_args()
    torch.set_num_threads(args.torch_threads)
    pb, pb_grpc = api_stubs()
    module, manifest, vocab = artifact.load(args.model_pt)
    device = torch.device(args.device)
    module = module.to(device)
    cfg = config_from_json(manifest["tokenizer"])
    labels = manifest["labels"]
    name = manifest["name"]

    class Servicer(pb_grpc.InferenceServicer):
        def Classify(self, request, context):
            if request.model.name != name:
                context.abort(grpc.StatusCode.NOT_FOUND, f"model '{request.model.name}' not found")
            encs = [encode(t, cfg, vocab) for t in request.texts]
            width = max(1, max(len(e.ids) for e in encs))
            ids = torch.zeros(len(encs), width, dtype=torch.long)
            mask = torch.zeros(len(encs), width, dtype=torch.bool)
            for i, e in enumerate(encs):
                ids[i, :len(e.ids)] = torch.tensor(e.ids, dtype=torch.long)
                mask[i, :len(e.ids)] = True
            with torch.inference_mode():
                probs = module(ids.to(device), mask.to(device))["logits"].softmax(-1).cpu()
            resp = pb.ClassifyResponse(model=pb.ModelSpec(name=name, version=1), request_id=request.request_id)
            for row in probs:
                best = int(row.argmax())
                resp.results.add().labels.add(label=labels[best], score=float(row[best]))
            return resp

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=args.workers))
    pb_grpc.add_InferenceServicer_to_server(Servicer(), server)
    port = server.add_insecure_port(f"127.0.0.1:{args.port}")
    server.start()
    if args.port_file:
        with open(args.port_file + ".tmp", "w") as f:
            f.write(f"{port}\n")
        os.replace(args.port_file + ".tmp", args.port_file)
    server.wait_for_termination()


if __name__ == "__main__":
    main()
