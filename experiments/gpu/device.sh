#!/bin/bash
# Runs on the lent GPU machine (the `device` tool), from the repo root.  GPU time is scarce:
# each step writes everything it produces under $OUT before it ends.
#   part NN              copy one bundle part (carried as .gpu/part-NN) to /tmp/b
#   unpack               join the parts and extract vLLM 0.26.0 + Ray 2.60.0 into /tmp/site
#   sglang               extract the SGLang 0.5.17 bundle (../shared/gpu/build-sglang-bundle.sh; its lean
#                        part carried as .gpu/sgl-part-00, its model folder as .gpu/sgl-model) into
#                        /tmp/sgl-site and /tmp/sgl-model; then SITE=/tmp/sgl-site runs the steps on it
#   study CONFIG [ARGS]  prefixstudy run CONFIG (a shipped name, e.g. h200-tp1, or a path) into /tmp/results, results copied to $OUT
#   capsplit TAG CONFIG UNIT=V1,V2 [ARGS]
#                        prefixstudy capacity, ON on GPU 0 and OFF on GPU 1 (as split); locally,
#                        experiments/gpu/join_capacity.py joins the two into one capacity folder
#   resume               prefixstudy run --resume the newest run in /tmp/results
#   swap CONFIG GPU0_MODE REPEATS [ARGS]
#                        like split, for some repeats only, with GPU 0 serving GPU0_MODE (GPU 1 the
#                        other): run it twice with the modes swapped, so no mode owns a GPU
# CODE=DIR puts DIR's prefixstudy first on the path (a branch's code carried into an ignored folder);
# RESULTS=DIR writes `study` runs there (default /tmp/results); STEP_TRACE=NAME writes the engine
# core's step trace (engines.vllm_steps) to $OUT/NAME-on and $OUT/NAME-off.
set -uo pipefail
# SITE: the unpacked bundle on the path (/tmp/site: vLLM and Ray; /tmp/sgl-site: SGLang, whose pins differ).
export PYTHONPATH=${CODE:+$CODE:}${SITE:-/tmp/site}:$PWD VLLM_USE_FLASHINFER_SAMPLER=0 PYTHONUNBUFFERED=1
# SGLang offline: no hub lookups, FA3 from sgl_kernel rather than a kernel fetched from the hub.
[ "${SITE:-}" = /tmp/sgl-site ] && export HF_HUB_OFFLINE=1 SGLANG_USE_SGL_FA3_KERNEL=1 CUDA_HOME=/usr/local/cuda
# `python -m` puts the working directory (this tree's prefixstudy) before PYTHONPATH unless told not to.
[ -n "${CODE:-}" ] && export PYTHONSAFEPATH=1
[ -n "${STEP_TRACE:-}" ] && export PREFIXSTUDY_STEP_TRACE=${OUT:-/tmp/out}/$STEP_TRACE
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
OUT=${OUT:-/tmp/out}
# SIGTERM before the device call's own limit: finished points are flushed, the run can be resumed.
# A stop that lands on an engine start can outlast the limit; the console lines reach $OUT as they
# are printed (grep --line-buffered below), so a call killed there still brings them back.
ps() { timeout -s TERM "${STUDY_TIMEOUT:-560}" python3 -m prefixstudy "$@"; }
RESULTS=${RESULTS:-/tmp/results}
newest() {  # the newest run of any study under $RESULTS: run ids are timestamps, so sort by the id, not the path
  ls -d "$RESULTS"/*/*/ 2>/dev/null | awk -F/ '{print $(NF-1) "\t" $0}' | sort | tail -1 | cut -f2
}
collect() {  # the newest run, as one archive plus its summary and manifest
  local run; run=$(newest)
  [ -n "$run" ] || return 0
  local name; name=$(basename "$(dirname "$run")")
  mkdir -p "$OUT/$name"
  # requests.parquet/ and iterations.parquet/ are folders of per-point parts: the device tool
  # brings back at most 8 files, so the run travels as one archive.
  tar -czf "$OUT/$name/run.tgz" -C "$run" .
  cp "$run"/{manifest.json,summary.csv,capacity.csv} "$OUT/$name/" 2>/dev/null
  # An engine that did not start: its own log (from Ray's session files), readable without the archive.
  find "$run" -name engine-start.log | head -2 | while read -r f; do
    cp "$f" "$OUT/$name/$(basename "$(dirname "$f")")-engine-start.log"; done
  echo "$run" > "$OUT/$name/run_dir.txt"
}
case "$1" in
  part) mkdir -p /tmp/b && cp ".gpu/part-$2"/* /tmp/b/ && ls -la /tmp/b ;;
  unpack)
    cat /tmp/b/bundle.part.* > /tmp/x.tar.xz &&
      python3 -c "import tarfile; tarfile.open('/tmp/x.tar.xz').extractall('/tmp/site')" &&
      python3 -c "import vllm, ray, torch; print('vllm', vllm.__version__, 'ray', ray.__version__, 'gpus', torch.cuda.device_count(), torch.cuda.get_device_name(0))" ;;
  sglang)
    cat .gpu/sgl-part-*/bundle.part.* > /tmp/sgl.tar.xz &&
      python3 -c "import tarfile; tarfile.open('/tmp/sgl.tar.xz').extractall('/tmp/sgl-site')" &&
      cp -r .gpu/sgl-model /tmp/sgl-model &&
      PYTHONPATH=/tmp/sgl-site python3 -c "import sglang, torch; print('sglang', sglang.__version__, 'gpus', torch.cuda.device_count())" ;;
  study) shift; cfg=$1; shift
    ps run "$cfg" --out "$RESULTS" --no-report --quiet "$@" 2>&1 | grep --line-buffered -v "^INFO\|^(.*) INFO" | tee "$OUT/study.log"
    collect ;;
  split) shift; cfg=$1; shift
    # ON on GPU 0 and OFF on GPU 1, two in-process engines in two processes (own compile caches);
    # `prefixstudy merge` joins the two runs into one study afterwards.
    for i in 0 1; do m=$([ $i = 0 ] && echo on || echo off)
      CUDA_VISIBLE_DEVICES=$i VLLM_CACHE_ROOT=/tmp/vc$i ps run "$cfg" --out /tmp/results-$m --modes $m \
        --executor local --no-report --quiet "$@" > "/tmp/split-$m.log" 2>&1 &
    done
    wait
    for m in on off; do grep -v "INFO\|^(.*) WARNING" /tmp/split-$m.log | tail -25 > "$OUT/$m.log"; done
    tar -czf "$OUT/runs.tgz" -C /tmp results-on results-off ;;
  swap) shift; cfg=$1; m0=$2; reps=$3; shift 3
    m1=$([ "$m0" = on ] && echo off || echo on); tag=$m0-$(echo "$reps" | tr -d '[], ' )
    for i in 0 1; do m=$([ $i = 0 ] && echo "$m0" || echo "$m1")
      CUDA_VISIBLE_DEVICES=$i VLLM_CACHE_ROOT=/tmp/vc-$m ps run "$cfg" --out "/tmp/swap-$tag/$m" --modes "$m" \
        --executor local --no-report --quiet --set "sweep.only_repeats=$reps" "$@" > "/tmp/swap-$tag-$m.log" 2>&1 &
    done
    wait
    for m in on off; do grep -v "INFO\|^(.*) WARNING" "/tmp/swap-$tag-$m.log" | tail -40 > "$OUT/$tag-$m.log"; done
    tar -czf "$OUT/swap-$tag.tgz" -C /tmp "swap-$tag" ;;
  capsplit) shift; tag=$1; cfg=$2; caps=$3; shift 3
    for i in 0 1; do m=$([ $i = 0 ] && echo on || echo off)
      CUDA_VISIBLE_DEVICES=$i VLLM_CACHE_ROOT=/tmp/vc-$m timeout -s TERM "${STUDY_TIMEOUT:-560}" python3 -m prefixstudy \
        capacity "$cfg" --capacity "$caps" --out "/tmp/cap-$tag/$m" --set "sweep.modes=[$m]" --set executor=local \
        --quiet "$@" > "/tmp/cap-$tag-$m.log" 2>&1 &
    done
    wait
    for m in on off; do grep -v "INFO\|^(.*) WARNING" "/tmp/cap-$tag-$m.log" | tail -40 > "$OUT/cap-$tag-$m.log"; done
    tar -czf "$OUT/cap-$tag.tgz" -C /tmp "cap-$tag" ;;
  resume)
    run=$(newest)
    ps run --resume "$run" --no-report --quiet 2>&1 | grep --line-buffered -v "^INFO\|^(.*) INFO" | tee "$OUT/resume.log"
    collect ;;
  *) echo "usage: device.sh part NN | unpack | sglang | study CONFIG [ARGS] | split CONFIG [ARGS] | swap CONFIG MODE REPEATS [ARGS] | capsplit TAG CONFIG UNIT=V1,.. [ARGS] | resume" >&2; exit 2 ;;
esac
