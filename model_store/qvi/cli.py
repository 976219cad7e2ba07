"""python -m qvi — train, evaluate and export QVI models, and build the demo model store.

    python -m qvi train    --task classification --arch cnn_att --g qvi --train T --dev D --out ckpt.pt
    python -m qvi evaluate --checkpoint ckpt.pt --test TEST        (or --artifact model.pt)
    python -m qvi export   --checkpoint ckpt.pt --store model_store/store --name NAME --version 1 [--format both]
                           [--cpu-variants x86-64-v4 x86-64-v4-bf16 x86-64-v4-int8 --fidelity-test TEST]
    python -m qvi demo     --store model_store/store               (the demo models the server serves)
    python -m qvi results  --seeds 5                               (model_store/README.md's table)
    python -m qvi faithfulness --artifact model.pt --test TEST --out f.json   (how faithful α, β and peers are)
    python -m qvi calibrate --artifact model.pt --dev DEV --test TEST [--write]  (temperature, ECE, conformal sets)
    python -m qvi drift-reference --artifact model.pt --test TEST [--write]  (the reference of the drift gauges)
    python -m qvi bench-model --dtype bfloat16                     (UNTRAINED BERT-base size, benchmarks only)
    python -m qvi null     --artifact store/sentiment/1/model.pt --out DIR   (DIR/model.null: no math, benchmarks only)
    python -m qvi import   --from FOLDER --store model_store/store --name NAME   (a fine-tuned BERT/RoBERTa/DistilBERT)
"""
import argparse
import json
import os
import sys
from typing import Optional, Sequence

import torch

from qvi import pt2
from qvi.data import encode_examples
from qvi.models import ModelConfig
from qvi.tokenizer import Vocabulary, config_from_json
from qvi.train import evaluate
from qvi.workflow import (BOUNDARIES, FORMATS, add_freezing_arg, add_train_args, evaluate_artifact, export_checkpoint,  # noqa: F401
                          label_list, load_checkpoint, read_corpus, run_training)


def cmd_train(args: argparse.Namespace) -> None:
    ckpt = run_training(args)
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    torch.save(ckpt, args.out)
    print(json.dumps(ckpt["metrics"], indent=1))


def cmd_evaluate(args: argparse.Namespace) -> None:
    if args.artifact:
        scores = evaluate_artifact(args.artifact, args.test, args.conll_join)
    else:
        model, ckpt = load_checkpoint(args.checkpoint)
        config = ModelConfig(**ckpt["config"])
        tok = config_from_json(ckpt["tokenizer"])
        tagging = config.task == "tagging"
        data = encode_examples(read_corpus(args.test, config.task, args.conll_join), tok, Vocabulary(ckpt["vocab"]),
                               ckpt["labels"], ckpt["scheme"], tagging)
        scores = evaluate(model, config, data, ckpt["labels"])
    print(json.dumps(scores, indent=1))


def cmd_export(args: argparse.Namespace) -> None:
    card: dict = {"description": args.description} if args.description else {}
    if args.faithfulness:
        from qvi.faithfulness import card_summary
        with open(args.faithfulness) as f:
            report = json.load(f)
        if report.get("model") != args.name:
            raise SystemExit(f"{args.faithfulness} measured the model {report.get('model')!r}, not {args.name!r}")
        card["faithfulness"] = card_summary(report)
    for path in export_checkpoint(args.checkpoint, args.store, args.name, args.version, card, args.format,
                                  args.device, args.cpu_target, args.pt2_cache, args.cpu_variants or (),
                                  args.fidelity_test, args.conll_join, args.cpu_freezing,
                                  speed_gate=args.cpu_speed_gate == "on"):
        print(path)


def cmd_null(args: argparse.Namespace) -> None:
    from qvi import artifact
    print(artifact.write_null(args.artifact, args.out))


def main(argv: Optional[Sequence[str]] = None) -> None:
    from qvi import demo  # the demo and results commands build on the functions above
    ap = argparse.ArgumentParser(prog="python -m qvi", description=__doc__.splitlines()[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    sub = ap.add_subparsers(dest="command", required=True)
    p = sub.add_parser("train", help="train one model and save a checkpoint")
    add_train_args(p)
    p.add_argument("--out", required=True, help="checkpoint file to write")
    p.set_defaults(func=cmd_train)
    p = sub.add_parser("evaluate", help="score a checkpoint or an exported model.pt on a corpus")
    g = p.add_mutually_exclusive_group(required=True)
    g.add_argument("--checkpoint")
    g.add_argument("--artifact")
    p.add_argument("--test", required=True)
    p.add_argument("--conll-join", default=" ")
    p.set_defaults(func=cmd_evaluate)
    p = sub.add_parser("export", help="export a checkpoint as <store>/<name>/<version>/model.pt and model.cpu.pt2")
    p.add_argument("--checkpoint", required=True)
    p.add_argument("--store", required=True)
    p.add_argument("--name", required=True)
    p.add_argument("--version", type=int, required=True)
    p.add_argument("--description", default="")
    p.add_argument("--faithfulness", help="a `python -m qvi faithfulness` report of this model to put in its card")
    p.add_argument("--format", choices=FORMATS, default="both",
                   help="model.pt (TorchScript), model.<device>.pt2 (AOTInductor), or both")
    p.add_argument("--device", choices=tuple(pt2.FILES), default="cpu", help="the device a .pt2 is compiled for")
    p.add_argument("--cpu-target", choices=tuple(pt2.CPU_TARGETS), default=pt2.DEFAULT_CPU_TARGET,
                   help="instruction set of a CPU .pt2: x86-64-v3 (AVX2; runs on any x86 server since ~2015) "
                        "or native (this machine's, e.g. AVX-512; for compiling on the node that serves it)")
    p.add_argument("--pt2-cache", help="reuse packages compiled before from the same weights, code and target")
    add_freezing_arg(p)
    p.add_argument("--cpu-variants", nargs="+", choices=tuple(pt2.CPU_VARIANTS),
                   help="also compile these CPU packages (model.cpu.<variant>.pt2), which a server whose CPU runs "
                        "them prefers to model.cpu.pt2; a bf16 or int8 one is kept only if it passes the fidelity "
                        "gate and is faster than every package the server would load after it (int8 before bf16 "
                        "before x86-64-v4 before model.cpu.pt2)")
    p.add_argument("--cpu-speed-gate", choices=("on", "off"), default="on",
                   help="off: keep a bf16 or int8 package that passes its fidelity gate even where it is slower "
                        "on this CPU at the gate's short texts (for a deployment of long texts in large batches, "
                        "where bf16 can win; the card records that it was not timed)")
    p.add_argument("--fidelity-test", help="the test split a bf16 or int8 package's fidelity gate runs on (labels, "
                                           "entity F1, alpha and beta against float32)")
    p.add_argument("--conll-join", default=" ", help="how --fidelity-test's CoNLL tokens join into text")
    p.set_defaults(func=cmd_export)
    p = sub.add_parser("null", help="write DIR/model.null: an artifact's manifest and vocabulary for the server's "
                                    "null backend, which answers with no math (benchmarks of the serving path)")
    p.add_argument("--artifact", required=True, help="an exported model.pt")
    p.add_argument("--out", required=True, help="the version folder to write model.null into")
    p.set_defaults(func=cmd_null)
    demo.add_commands(sub)
    from qvi import (bench_model, calibration, drift, faithfulness, finetune, finetune_packages, finetune_study,
                     hf_import)
    faithfulness.add_commands(sub)
    calibration.add_commands(sub)
    drift.add_commands(sub)
    hf_import.add_commands(sub)
    finetune.add_commands(sub)
    finetune_packages.add_commands(sub)
    finetune_study.add_commands(sub)
    bench_model.add_commands(sub)
    args = ap.parse_args(argv)
    args.func(args)


if __name__ == "__main__":
    main(sys.argv[1:])
