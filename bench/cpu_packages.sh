#!/usr/bin/env bash
# The native CPU packages measured side by side (docs/performance.md, "Native CPU packages"):
# exports the demo models from their checkpoints (model_store/work/, written by the demo's set-up)
# with the x86-64-v4, x86-64-v4-bf16 and x86-64-v4-int8 packages beside model.cpu.pt2, the bf16 and
# int8 ones through their fidelity gate on each test split (and int8 through its speed gate), and the
# UNTRAINED BERT-base-sized bench model with the same packages (no gates: no test split); then
# qvi-bench-model measures TorchScript and every package each model holds, alternating at each batch
# size, one torch thread, and the gates' figures are printed.
#
#   bash bench/cpu_packages.sh                  (about 40 minutes cold on two cores, 10 warm)
#   bash bench/cpu_packages.sh bert_base_qvi    (only some of sentiment, topics, ner, bert_base_qvi)
#
# Needs a CPU with AVX-512, AVX512-BF16 and AVX512-VNNI. Packages are cached in QVI_PT2_CACHE.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
store=${QVI_BENCH_STORE:-/tmp/qvi-cpu-packages}
cache=${QVI_PT2_CACHE:-$HOME/.cache/qvi/pt2}
py=$root/.venv/bin/python
models=("$@")
((${#models[@]})) || models=(sentiment topics ner bert_base_qvi)
variants=(x86-64-v4 x86-64-v4-bf16 x86-64-v4-int8)
declare -A tests=([sentiment]=data/sentiment/test.tsv [topics]=data/bbc/test.tsv [ner]=data/conll2003/test.conll)
cd model_store
for model in "${models[@]}"; do
  [[ -f $store/$model/1/model.cpu.pt2 ]] && continue
  if [[ $model == bert_base_qvi ]]; then
    "$py" -m qvi bench-model --store "$store" --packages "${variants[@]}" --pt2-cache "$cache" > /dev/null
  else
    "$py" -m qvi export --checkpoint "work/$model.ckpt" --store "$store" --name "$model" --version 1 \
      --cpu-variants "${variants[@]}" --fidelity-test "${tests[$model]}" --pt2-cache "$cache" > /dev/null
  fi
done
# What each variant's gates measured (the model card), for the models with a test split.
"$py" - "$store" "${models[@]}" <<'PY'
import json, sys
from qvi import pt2
for name in sys.argv[2:]:
    card = json.loads(pt2.read_extra(f"{sys.argv[1]}/{name}/1/model.cpu.pt2")["manifest.json"])["model_card"]
    for variant, report in card.get("cpu_packages", {}).items():
        if report["dtype"] == "float32" or name == "bert_base_qvi":
            continue
        fidelity = report.get("fidelity", {})
        figures = {k: v for k, v in fidelity.items() if k != "limits"} if isinstance(fidelity, dict) else fidelity
        print(f"{name} {variant}: kept {report['kept']}", report.get("not_kept", ""), json.dumps(figures),
              json.dumps(report.get("speed", {}).get("ms", {})))
PY
cd "$root"
for model in "${models[@]}"; do
  # The packages this version holds (a gate may have left one out).
  packages=base
  for v in "${variants[@]}"; do [[ -f $store/$model/1/model.cpu.$v.pt2 ]] && packages+=",$v"; done
  if [[ $model == bert_base_qvi ]]; then
    echo "== bert_base_qvi (UNTRAINED), 128 tokens"
    build/qvi-bench-model --model "$store/bert_base_qvi/1" --format both --cpu-packages "$packages" --batch-sizes 1,8 \
      --seconds 10 --words 128 --words-stddev 0 2> /dev/null
    continue
  fi
  for words in 20 100; do
    echo "== $model, ~$words words"
    build/qvi-bench-model --model "$store/$model/1" --format both --cpu-packages "$packages" --batch-sizes 1,8,32 \
      --seconds 3 --words "$words" 2> /dev/null
  done
done
