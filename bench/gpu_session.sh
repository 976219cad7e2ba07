#!/usr/bin/env bash
# What a GPU machine is for (issue 34), in stages that each fit one device call (< 10 min). Run on
# the GPU machine from the repo root, after the bundle: on this machine
#   ../shared/tools/gpu-bundle core_test libqvi_cuda_graphs.so
# then through the device tool, with carry [".gpu"]:
#   source .gpu/env.sh && bash bench/gpu_session.sh graphs bert   # real captures; in-process limits, demo + BERT-base
#   source .gpu/env.sh && bash bench/gpu_session.sh server        # qvi-server under qvi-perf, four configurations
#   source .gpu/env.sh && bash bench/gpu_session.sh pt2           # AOTInductor packages compiled there and measured
#   source .gpu/env.sh && bash bench/gpu_session.sh probe         # what limits one text per request
#   source .gpu/env.sh && bash bench/gpu_session.sh agenda        # issue 53 item 6: SDPA kernel, BERT fp32,
#                                                                 # both CUDA packages served with two instances
#   source .gpu/env.sh && bash bench/gpu_session.sh pipeline tagger  # issue 53: the defaults against the instance
#       thread answering, under h2load (needs h2load and .gpu/classify.grpc in the bundle, below); the tagger on
#       the GPU from TorchScript and from its CUDA package, one instance, with and without graphs
# h2load for the bundle: cp /usr/bin/h2load .gpu/build/ and its libraries (ldd) into .gpu/lib; the framed
# request: .venv/bin/python -c 'import sys; sys.path.insert(0, "bench"); import emulated_device, shutil, tempfile;
#   shutil.copy(emulated_device.grpc_body(tempfile.mkdtemp(), "sentiment"), ".gpu/classify.grpc")'
#   source .gpu/env.sh && bash bench/gpu_session.sh cores    # issue 53 item 4: server CPU per request on 1-16
#       cores; needs the null twin: .venv/bin/python -m qvi null (in model_store/) --artifact
#       store/sentiment/1/model.pt --out ../.gpu/null_store/sentiment/1
# A dry run on a machine without a GPU (every stage but bert, short steps, nothing measured):
#   OUT=/tmp/dry QVI_GPU_SESSION_DEVICE=cpu QVI_GPU_SESSION_SECONDS=0.3 QVI_GPU_SESSION_PERF_SECONDS=1 \
#     bash bench/gpu_session.sh graphs server
# Each stage writes its log and JSON files into $OUT/<stage>/ and packs them into $OUT/<stage>.tgz
# (the device tool brings back at most 8 files), so a stage killed at its limit still returns its log.
set -uo pipefail
out=${OUT:-/tmp/qvi_gpu}
store=model_store/store
# QVI_GPU_SESSION_DEVICE=cpu: a dry run of the script itself on a machine without a GPU.
device=${QVI_GPU_SESSION_DEVICE:-cuda}
graphs=both
[[ $device == cpu ]] && graphs=off
# Seconds per measured step (the dry run shortens them).
secs=${QVI_GPU_SESSION_SECONDS:-2}
perf_secs=${QVI_GPU_SESSION_PERF_SECONDS:-5}
# Which server configurations (server stage) and BERT dtypes (bert stage) to run: a short device lease
# may afford only some.
servers=${QVI_GPU_SESSION_SERVERS:-default nographs b128 b256_i2}
bert_dtypes=${QVI_GPU_SESSION_BERT_DTYPES:-float32 bfloat16}
pt2_models=${QVI_GPU_SESSION_PT2_MODELS-sentiment ner}  # empty: none
# The probe stage's lines: the default store with the default server under more client threads and
# channels, more request threads, larger batches, the hand-off to request threads forced, and two
# load generators at once (each half the load): which of them moves the one-text-per-request limit.
probes=${QVI_GPU_SESSION_PROBES:-"base|$store||1|--threads 8 --channels 16 --concurrency 256
client16|$store||1|--threads 16 --channels 64 --concurrency 256,1024
req8|$store|--inference-threads 8|1|--threads 16 --channels 64 --concurrency 1024
b128_req8|/tmp/qvi_store_b128|--inference-threads 8 --inline-prepare-bytes 0|1|--threads 16 --channels 64 --concurrency 1024
two_clients|$store||2|--threads 8 --channels 32 --concurrency 512
two_clients_req8|/tmp/qvi_store_b128|--inference-threads 8|2|--threads 8 --channels 32 --concurrency 512"}

bench_limit() {  # model-dir label words batch-sizes [extra qvi-bench-model flags...]
  local dir=$1 label=$2 words=$3 sizes=$4
  shift 4
  timeout 240 build/qvi-bench-model --model "$dir" --device "$device" --format torchscript --cuda-graphs $graphs \
    --batch-sizes "$sizes" --seconds "$secs" --words "$words" --json "$dir_out/limit_${label}_${words}.json" "$@"
}

# Starts qvi-server on a store (extra args go to it) and waits until it is healthy: sets srv_pid,
# address and metrics.
start_server() {  # name store [qvi-server flags...]
  local name=$1 srv_store=$2
  shift 2
  local port_file metrics_file
  port_file=$(mktemp -u) metrics_file=$(mktemp -u)
  build/qvi-server --model-store "$srv_store" --device "$device" --host 127.0.0.1 --port 0 --port-file "$port_file" \
    --metrics-port 0 --metrics-port-file "$metrics_file" --http-port -1 "$@" > "$dir_out/server_$name.log" 2>&1 &
  srv_pid=$!
  for _ in $(seq 120); do [[ -s $port_file && -s $metrics_file ]] && break; sleep 0.5; done
  address=127.0.0.1:$(cat "$port_file")
  until build/qvi-client --server "$address" --timeout 2 --color never health > /dev/null 2>&1; do
    kill -0 $srv_pid 2> /dev/null || { echo "qvi-server ($name) exited"; tail -20 "$dir_out/server_$name.log"; return 1; }
    sleep 0.5
  done
  echo "== server $name: $*"
  grep -E "CUDA|instance|graphs" "$dir_out/server_$name.log" | head -8
  metrics=http://127.0.0.1:$(cat "$metrics_file")/metrics
}

stop_server() {  # name
  kill -TERM $srv_pid
  wait $srv_pid
  echo "qvi-server ($1) exit $?"
}

# One qvi-server under qvi-perf: start it on a store, sweep, stop it. Extra args go to qvi-server.
serve_and_load() {  # name store [qvi-server flags...]
  local name=$1
  start_server "$@" || return 1
  local common=(--server "$address" --metrics "$metrics" --duration "$perf_secs" --warmup 2 --threads 8 --channels 16)
  nvidia-smi dmon -s u -d 1 > "$dir_out/dmon_$name.txt" 2>&1 &
  local dmon=$!
  build/qvi-perf "${common[@]}" --concurrency 1,64,256,1024 --json "$dir_out/perf_${name}_1text.json"
  build/qvi-perf "${common[@]}" --concurrency 1,256 --attention --gates --json "$dir_out/perf_${name}_1text_explain.json"
  build/qvi-perf "${common[@]}" --concurrency 8,64 --texts-per-request 32 --json "$dir_out/perf_${name}_32texts.json"
  kill $dmon 2> /dev/null
  stop_server "$name"
}

# Where one text per request stops scaling: one short qvi-perf step per line of $probes
# ("name|store|qvi-server flags|clients|qvi-perf flags"); clients > 1 runs that many qvi-perf processes at once.
probe() {
  local name srv_store flags clients perf_flags
  while IFS='|' read -r name srv_store flags clients perf_flags; do
    [[ -z $name ]] && continue
    # shellcheck disable=SC2086  # the flags are words
    start_server "$name" "$srv_store" $flags || continue
    local pids=()
    for c in $(seq "$clients"); do
      # shellcheck disable=SC2086
      build/qvi-perf --server "$address" --metrics "$metrics" --duration 3 --warmup 1 $perf_flags \
        --json "$dir_out/probe_${name}_$c.json" > "$dir_out/probe_${name}_$c.txt" 2>&1 &
      pids+=($!)
    done
    wait "${pids[@]}"
    for c in $(seq "$clients"); do echo "-- $name client $c: $perf_flags"; cat "$dir_out/probe_${name}_$c.txt"; done
    stop_server "$name"
  done <<< "$probes"
}

# A copy of the demo store whose serving.json sets batching for a GPU.
gpu_store() {  # dir max_batch_size
  rm -rf "$1"
  mkdir -p "$1"
  cp -r "$store/sentiment" "$1/"
  printf '{"max_batch_size": %s, "max_batch_tokens": %s, "max_queued_texts": 65536, "max_queued_tokens": 4194304}\n' \
    "$2" $(($2 * 128)) > "$1/sentiment/serving.json"
}

for stage in "$@"; do
  dir_out=$out/$stage
  mkdir -p "$dir_out"
  {
    echo "== $stage $(date -u +%FT%TZ) on $(nproc) cores"
    nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv,noheader || true
    case $stage in
      graphs)
        # Real captures against the forward without graphs (skipped without a GPU), and both backends.
        QVI_SOURCE_DIR=$PWD timeout 300 build/core_test --gtest_filter='DemoGraphs*:CudaGraph*:ModelLoadTest*'
        for m in sentiment ner; do
          for words in 20 100; do
            bench_limit $store/$m/1 $m $words 1,8,32,128,256 --explain
          done
        done
        ;;
      bert)
        # The UNTRAINED BERT-base-sized bench models, exported here (about 660 MB: they do not travel).
        models=/tmp/qvi_bench_models
        for dtype in $bert_dtypes; do
          (cd model_store && python3 -m qvi bench-model --store $models --dtype "$dtype") || echo "export $dtype failed"
          name=bert_base_qvi
          [[ $dtype == bfloat16 ]] && name=bert_base_qvi_bf16
          bench_limit $models/$name/1 $name 128 1,8,32,64,128 --words-stddev 0
        done
        ;;
      pt2)
        # The AOTInductor packages for CUDA are compiled here (Triton needs the GPU), then measured
        # against TorchScript, and the real-capture test checks the package's parity too.
        # bench/cuda_pt2_probe.py: the exporter's compile, each step announced and timed, with
        # faulthandler, and its check in a fresh process (torch's Python loader crashed on CUDA
        # packages on 2026-11-26/27; the export's own check dies there, model_store/README.md).
        for m in $pt2_models; do
          timeout "${QVI_GPU_SESSION_PT2_SECONDS:-240}" python3 bench/cuda_pt2_probe.py --model "$store/$m/1/model.pt" \
            --device "$device" --write || echo "pt2 compile of $m failed (exit $?)"
        done
        QVI_SOURCE_DIR=$PWD timeout 120 build/core_test --gtest_filter='*OnAGpu*'
        for m in $pt2_models; do
          [[ -f $store/$m/1/model.cuda.pt2 ]] &&
            timeout 240 build/qvi-bench-model --model "$store/$m/1" --device "$device" --format both --cuda-graphs $graphs \
              --batch-sizes 1,8,32,128 --seconds "$secs" --words 20 --explain --json "$dir_out/limit_pt2_$m.json"
        done
        ;;
      agenda)
        # Issue 53, item 6. The two CUDA packages compile in the background (Triton needs the GPU; the
        # classifier took 112-143 s alone on 16 cores) while the GPU answers the other questions; the
        # compiles share the cores, so the in-process rows below ran beside them (GPU-bound at batch >= 32).
        pids=()
        for m in $pt2_models; do
          timeout "${QVI_GPU_SESSION_PT2_SECONDS:-300}" python3 bench/cuda_pt2_probe.py --model "$store/$m/1/model.pt" \
            --device "$device" --write --no-check > "$dir_out/pt2_$m.txt" 2>&1 &
          pids+=($!)
        done
        # Which scaled_dot_product_attention kernel the maps-free forward runs (BERT-base-sized, batch 128).
        # shellcheck disable=SC2086  # QVI_GPU_SESSION_SDPA_ARGS: smaller shapes for a dry run
        timeout 120 python3 bench/sdpa_probe.py --device "$device" --dtypes $bert_dtypes ${QVI_GPU_SESSION_SDPA_ARGS:-}
        # The BERT-base-sized float32 row (the bf16 one is in the H200 tables).
        models=/tmp/qvi_bench_models
        (cd model_store && python3 -m qvi bench-model --store $models --dtype float32) || echo "export float32 failed"
        bench_limit $models/bert_base_qvi/1 bert_base_qvi 128 1,8,32,64,128 --words-stddev 0
        for i in "${!pids[@]}"; do wait "${pids[$i]}"; echo "pt2 compile exit $?"; done
        for m in $pt2_models; do
          echo "-- pt2 compile of $m:"; grep -E '^\[' "$dir_out/pt2_$m.txt" | tail -4
          ls -la "$store/$m/1/" | grep pt2
        done
        # Served from the CUDA packages (auto picks model.cuda.pt2), two instances each.
        if start_server pkg_i2 "$store" --instances-per-model 2; then
          nvidia-smi dmon -s u -d 1 > "$dir_out/dmon_pkg_i2.txt" 2>&1 &
          dmon=$!
          common=(--server "$address" --metrics "$metrics" --duration 3 --warmup 1 --threads 8 --channels 16)
          build/qvi-perf "${common[@]}" --concurrency 256 --json "$dir_out/perf_pkg_i2_classify_1text.json"
          build/qvi-perf "${common[@]}" --concurrency 64 --texts-per-request 32 --json "$dir_out/perf_pkg_i2_classify_32texts.json"
          build/qvi-perf "${common[@]}" --model ner --method tag --concurrency 256 --json "$dir_out/perf_pkg_i2_tag_1text.json"
          build/qvi-perf "${common[@]}" --model ner --method tag --concurrency 64 --texts-per-request 32 \
            --json "$dir_out/perf_pkg_i2_tag_32texts.json"
          build/qvi-client --server "$address" --color never tag --model ner "Angela Merkel met Emmanuel Macron in Paris ." || true
          kill $dmon 2> /dev/null
          stop_server pkg_i2
        fi
        ;;
      pipeline)
        # One instance of the classifier (TorchScript, graphs, batches of up to 256) under h2load at
        # 1,024 streams: the defaults (answer threads, batches pipelined) against the pipeline off,
        # against the instance thread answering and against four instances (issue 53 items 1, 2 and 7;
        # the target: >= 150k OK texts/s).
        gpu_store /tmp/qvi_store_b256 256
        timeout 360 python3 bench/emulated_device.py --store /tmp/qvi_store_b256 --device "$device" \
          --body "${QVI_GPU_SESSION_BODY:-.gpu/classify.grpc}" --load h2load --concurrency 256,1024 --duration 5 \
          --warmup 1 --variants 'defaults=;unpipelined=--pipeline-batches=false;inline=--answer-threads 0;four=--instances-per-model 4' \
          --out "$dir_out/pipeline.json"
        ;;
      cores)
        # Issue 53 item 4: the server's CPU per request against its cores (1-16; the null model, h2load on
        # the other cores), gRPC and HTTP/JSON. Needs .gpu/null_store and .gpu/classify.grpc (header).
        timeout 400 python3 bench/core_scaling.py --cores 1,2,4,8,16 --duration 4 --warmup 1 \
          --store "${QVI_GPU_SESSION_NULL_STORE:-.gpu/null_store}" --body "${QVI_GPU_SESSION_BODY:-.gpu/classify.grpc}" \
          --out "$dir_out/cores.json"
        ;;
      tagger)
        # Does Tag answer on the GPU from TorchScript? Then the tagger's CUDA package compiled and served
        # alone with one instance, with graphs and without: which of them hangs (2026-11-28, call1).
        tagger_try() {  # name store [qvi-server flags...]
          local name=$1
          start_server "$@" --shutdown-grace-seconds 2 || return
          echo "-- $name: GPU SM busy before any call"
          nvidia-smi dmon -s u -d 1 -c 3 | grep -v '^#'
          timeout 15 build/qvi-client --server "$address" --timeout 10 --color never tag --model ner \
            "Angela Merkel met Emmanuel Macron in Paris ." || echo "-- $name: Tag did not answer (exit $?)"
          timeout 15 build/qvi-perf --server "$address" --metrics "$metrics" --model ner --method tag --threads 4 \
            --channels 8 --concurrency 64 --duration 3 --warmup 1 --json "$dir_out/perf_$name.json" || true
          echo "-- $name: GPU SM busy after"
          nvidia-smi dmon -s u -d 1 -c 2 | grep -v '^#'
          kill -TERM $srv_pid
          timeout 10 tail --pid=$srv_pid -f /dev/null || { echo "-- $name: still running; killed"; kill -9 $srv_pid; }
          wait $srv_pid 2> /dev/null
        }
        tagger_try ts_tagger "$store" --model-format torchscript
        timeout 240 python3 bench/cuda_pt2_probe.py --model "$store/ner/1/model.pt" --device "$device" --write \
          --no-check > "$dir_out/pt2_ner.txt" 2>&1 || echo "pt2 compile of ner failed (exit $?)"
        grep -E '^\[' "$dir_out/pt2_ner.txt" | tail -3
        rm -rf /tmp/qvi_store_ner && mkdir -p /tmp/qvi_store_ner && cp -r "$store/ner" /tmp/qvi_store_ner/
        if [[ -f /tmp/qvi_store_ner/ner/1/model.cuda.pt2 ]]; then
          tagger_try pkg_tagger_nographs /tmp/qvi_store_ner --instances-per-model 1 --cuda-graphs=false
          tagger_try pkg_tagger_graphs /tmp/qvi_store_ner --instances-per-model 1
        fi
        ;;
      probe)
        gpu_store /tmp/qvi_store_b128 128
        probe
        ;;
      server)
        gpu_store /tmp/qvi_store_b128 128
        gpu_store /tmp/qvi_store_b256 256
        for name in $servers; do
          case $name in
            default) serve_and_load default "$store" ;;
            nographs) serve_and_load nographs "$store" --cuda-graphs=false ;;
            b128) serve_and_load b128 /tmp/qvi_store_b128 ;;
            b256_i2) serve_and_load b256_i2 /tmp/qvi_store_b256 --instances-per-model 2 ;;
            *) echo "unknown server configuration $name" ;;
          esac
        done
        ;;
      *) echo "unknown stage $stage" ;;
    esac
    echo "== $stage done $(date -u +%FT%TZ)"
  } 2>&1 | tee "$dir_out/$stage.txt"
  tar czf "$out/$stage.tgz" -C "$out" "$stage" && rm -rf "$dir_out"
done
