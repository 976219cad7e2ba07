#!/usr/bin/env bash
# The native CPU packages measured side by side (docs/performance.md, "Native CPU packages"):
# exports the demo models from their checkpoints (model_store/work/, written by the demo's set-up)
# with the x86-64-v4 and x86-64-v4-bf16 packages beside model.cpu.pt2, the bf16 one through its
# fidelity gate on each test split, and the UNTRAINED BERT-base-sized bench model with the same
# packages (no gate: no test split); then qvi-bench-model measures TorchScript and every package of
# each, alternating at each batch size, one torch thread, and the gates' figures are printed.
#
#   bash bench/cpu_packages.sh            (about 25 minutes cold on two cores, 10 warm)
#
# Needs a CPU with AVX-512 and AVX512-BF16. Packages are cached in QVI_PT2_CACHE.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
store=${QVI_BENCH_STORE:-/tmp/qvi-cpu-packages}
cache=${QVI_PT2_CACHE:-$HOME/.cache/qvi/pt2}
py=$root/.venv/bin/python
packages=base,x86-64-v4,x86-64-v4-bf16
cd model_store
for spec in "sentiment data/sentiment/test.tsv" "topics data/bbc/test.tsv" "ner data/conll2003/test.conll"; do
  set -- $spec
  [[ -f $store/$1/1/model.cpu.x86-64-v4-bf16.pt2 ]] ||
    "$py" -m qvi export --checkpoint "work/$1.ckpt" --store "$store" --name "$1" --version 1 \
      --cpu-variants x86-64-v4 x86-64-v4-bf16 --fidelity-test "$2" --pt2-cache "$cache" > /dev/null
done
[[ -f $store/bert_base_qvi/1/model.cpu.x86-64-v4-bf16.pt2 ]] ||
  "$py" -m qvi bench-model --store "$store" --packages x86-64-v4 x86-64-v4-bf16 --pt2-cache "$cache" > /dev/null
"$py" - "$store" <<'PY'
import json, sys
from qvi import pt2
for name in ("sentiment", "topics", "ner"):
    card = json.loads(pt2.read_extra(f"{sys.argv[1]}/{name}/1/model.cpu.pt2")["manifest.json"])["model_card"]
    gate = card["cpu_packages"]["x86-64-v4-bf16"]
    print(f"{name} bf16 gate: kept {gate['kept']}", json.dumps({k: v for k, v in gate["fidelity"].items() if k != "limits"}))
PY
cd "$root"
for model in sentiment topics ner; do
  for words in 20 100; do
    echo "== $model, ~$words words"
    build/qvi-bench-model --model "$store/$model/1" --format both --cpu-packages "$packages" --batch-sizes 1,8,32 \
      --seconds 3 --words "$words" 2> /dev/null
  done
done
echo "== bert_base_qvi (UNTRAINED), 128 tokens"
build/qvi-bench-model --model "$store/bert_base_qvi/1" --format both --cpu-packages "$packages" --batch-sizes 1,8 \
  --seconds 10 --words 128 --words-stddev 0 2> /dev/null
