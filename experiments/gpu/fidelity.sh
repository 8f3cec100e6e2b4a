#!/bin/bash
# Fidelity against the peer: `vllm bench serve` against `vllm serve`, caching ON (GPU 0) and OFF
# (GPU 1) side by side, on the seed workload (prefix_repetition 1198 + 16, output 143, ignore EOS).
# Needs two GPUs and the unpacked bundle (device.sh unpack).  Writes $OUT/bench.json.
set -uo pipefail
export PYTHONPATH=/tmp/site VLLM_USE_FLASHINFER_SAMPLER=0 PYTHONUNBUFFERED=1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
OUT=${OUT:-/tmp/out}
RATES=${RATES:-"1 4 16 32"}
M=/tmp/mistral
mkdir -p $M /tmp/bench && cp experiments/models/mistral-7b-v0.3/config.json $M/
cp /tmp/site/mistral_common/data/mistral_instruct_tokenizer_240323.model.v3 $M/tokenizer.model.v3
vllm() { python3 -m vllm.entrypoints.cli.main "$@"; }
serve() {  # mode gpu port
  local flag=--enable-prefix-caching; [ "$1" = off ] && flag=--no-enable-prefix-caching
  CUDA_VISIBLE_DEVICES=$2 vllm serve $M --tokenizer-mode mistral --load-format dummy --dtype bfloat16 \
    --max-num-batched-tokens 8192 --max-num-seqs 256 --max-model-len 4096 --gpu-memory-utilization 0.9 \
    $flag --port $3 > /tmp/serve-$1.log 2>&1 &
}
bench() {  # mode port
  for r in $RATES; do
    n=$(python3 -c "print(max(40, int($r * 30)))")
    vllm bench serve --backend vllm --base-url http://127.0.0.1:$2 --model $M --tokenizer $M \
      --tokenizer-mode mistral --dataset-name prefix_repetition --prefix-repetition-prefix-len 1198 \
      --prefix-repetition-suffix-len 16 --prefix-repetition-num-prefixes 1 --prefix-repetition-output-len 143 \
      --ignore-eos --request-rate $r --num-prompts $n --seed 0 --percentile-metrics ttft,tpot,itl,e2el \
      --metric-percentiles 50,90,99 --save-result --result-dir /tmp/bench --result-filename $1-$r.json \
      > /tmp/bench-$1-$r.log 2>&1 || tail -5 /tmp/bench-$1-$r.log
  done
}
t0=$(date +%s)
serve on 0 8100; serve off 1 8101
for p in 8100 8101; do
  until python3 -c "import urllib.request as u; u.urlopen('http://127.0.0.1:$p/health', timeout=2)" 2>/dev/null; do
    sleep 2; [ $(( $(date +%s) - t0 )) -gt 300 ] && { echo "server $p did not start"; tail -20 /tmp/serve-*.log; break; }
  done
done
echo "servers up after $(( $(date +%s) - t0 )) s"
bench on 8100 & bench off 8101 & wait
python3 - "$OUT/bench.json" <<'PY'
import json, pathlib, sys
runs = {p.stem: json.loads(p.read_text()) for p in sorted(pathlib.Path("/tmp/bench").glob("*.json"))}
pathlib.Path(sys.argv[1]).write_text(json.dumps(runs, indent=1))
for k, v in runs.items():
    print(k, "req/s %.2f ttft %.1f tpot %.2f e2e %.1f" % (v["request_throughput"], v["mean_ttft_ms"], v["mean_tpot_ms"], v["mean_e2el_ms"]))
PY
tail -3 /tmp/serve-on.log > "$OUT/serve.log"; tail -3 /tmp/serve-off.log >> "$OUT/serve.log"
pkill -f "vllm.entrypoints" ; true
