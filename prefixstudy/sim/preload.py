"""Stage: sim, in parallel.  Imported once by the fork server that ``sim.pool``'s workers are
forked from: vLLM's import and its first config resolution (lazy imports inside it) take
seconds, and a worker forked after them starts without paying either."""

from __future__ import annotations

import atexit
import gc

from prefixstudy.configs import shipped_model_dir
from prefixstudy.sim.vllm_setup import SchedulerSpec, build_scheduler, quiet_vllm, vllm_config


def _warm() -> None:
    from prefixstudy.costmodel.arch import load_arch

    tiny = shipped_model_dir("tiny-llama")
    if tiny is None:
        return
    spec = SchedulerSpec(model_dir=str(tiny), prefix_caching=True, num_gpu_blocks=16)
    build_scheduler(spec, load_arch(tiny), vllm_config(spec))


quiet_vllm()
_warm()
gc.freeze()  # every worker forked from here starts with vLLM's objects frozen (sim.sessions.frozen_heap)
# The fork server itself exits with its parent, through the interpreter's teardown.  Objects still
# frozen then are never freed, and extension modules built with nanobind (triton's, which vLLM
# imports) print a "leaked" report of them to the user's console.  Its workers exit by os._exit.
atexit.register(gc.unfreeze)
