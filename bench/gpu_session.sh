#!/usr/bin/env bash
# What a GPU machine is for (issue 14), in stages that each fit one device call (< 10 min). Run on
# the GPU machine from the repo root, after the bundle: on this machine
#   ../shared/tools/gpu-bundle core_test libqvi_cuda_graphs.so
# then through the device tool, with carry [".gpu"]:
#   source .gpu/env.sh && bash bench/gpu_session.sh graphs     # correctness and the in-process limits
#   source .gpu/env.sh && bash bench/gpu_session.sh server     # qvi-server under qvi-perf, graphs on and off
# Everything it prints and writes goes to $OUT (default /tmp/qvi_gpu), logs included.
set -uo pipefail
stage=${1:?usage: bench/gpu_session.sh graphs|server}
out=${OUT:-/tmp/qvi_gpu}
mkdir -p "$out"
exec > >(tee -a "$out/$stage.txt") 2>&1
echo "== $stage $(date -u +%FT%TZ) on $(nproc) cores"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
store=model_store/store
# QVI_GPU_SESSION_DEVICE=cpu: a dry run of the script itself on a machine without a GPU.
device=${QVI_GPU_SESSION_DEVICE:-cuda}

case $stage in
  graphs)
    # Real captures against the forward without graphs (skipped without a GPU), and both backends.
    QVI_SOURCE_DIR=$PWD timeout 300 build/core_test --gtest_filter='DemoGraphs*:CudaGraph*:ModelLoadTest*'
    for m in sentiment ner; do
      for words in 20 100; do
        timeout 200 build/qvi-bench-model --model $store/$m/1 --device $device --format torchscript --cuda-graphs both \
          --batch-sizes 1,8,32,128,256 --seconds 2 --words $words --explain --json "$out/limit_${m}_${words}.json"
      done
    done
    ;;
  server)
    port_file=$(mktemp) metrics_file=$(mktemp)
    for graphs in true false; do
      rm -f "$port_file" "$metrics_file"
      build/qvi-server --model-store $store --device $device --host 127.0.0.1 --port 0 --port-file "$port_file" \
        --metrics-port 0 --metrics-port-file "$metrics_file" --cuda-graphs=$graphs > "$out/server_graphs_$graphs.log" 2>&1 &
      pid=$!
      for _ in $(seq 120); do [[ -s $port_file && -s $metrics_file ]] && break; sleep 1; done
      address=127.0.0.1:$(cat "$port_file")
      until build/qvi-client --server "$address" --timeout 2 --color never health > /dev/null 2>&1; do sleep 1; done
      build/qvi-client --server "$address" --color never models || true
      metrics=http://127.0.0.1:$(cat "$metrics_file")/metrics
      common=(--server "$address" --metrics "$metrics" --duration 5 --warmup 2 --threads 8 --channels 16)
      build/qvi-perf "${common[@]}" --concurrency 1 16 64 256 --json "$out/perf_1text_graphs_$graphs.json"
      build/qvi-perf "${common[@]}" --concurrency 1 16 64 256 --attention --gates \
        --json "$out/perf_1text_explain_graphs_$graphs.json"
      build/qvi-perf "${common[@]}" --concurrency 8 32 --texts-per-request 32 \
        --json "$out/perf_32texts_graphs_$graphs.json"
      kill -TERM $pid; wait $pid
    done
    ;;
  *) echo "unknown stage $stage" >&2; exit 2 ;;
esac
