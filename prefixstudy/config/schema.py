"""The study config: one validated model, its ``engine`` section a union over the registered
backends (``prefixstudy.engines.registry``), told apart by ``engine.kind`` (default: vllm)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Annotated, Any, Literal, Union

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from prefixstudy.config.arms import BUILTIN_ARMS, ArmConfig, arm_engine
from prefixstudy.config.sections import (ArrivalConfig, CheckConfig, DatasetConfig, RayConfig, RouterConfig,
                                         SweepConfig)
from prefixstudy.engines.registry import config_classes
from prefixstudy.engines.vllm import VllmEngineConfig
from prefixstudy.errors import UserError, read_text

_STRICT = ConfigDict(extra="forbid")

ENGINE_CONFIGS = config_classes()
EngineConfig = Annotated[Union[tuple(ENGINE_CONFIGS.values())], Field(discriminator="kind")]
ENGINE_KINDS = tuple(ENGINE_CONFIGS)


class StudyConfig(BaseModel):
    model_config = _STRICT
    study: str = Field("default", pattern=r"^[A-Za-z0-9._-]+$",
                       description="The study's name: its runs go to `<out>/<study>/<run-id>/`.")
    model: str = Field("tiny-llama", description="A folder with a config.json, a shipped model's name "
                       "(`tiny-llama`, `mistral-7b-v0.3`) or a Hugging Face id.")
    device: Literal["auto", "cpu", "cuda"] = Field(
        "auto", description="Where the engines run: `auto` whatever this machine has; `cuda` refuses a machine "
        "without a CUDA GPU.")
    out: Path = Field(Path("results"), description="The folder the study's runs are written under.")
    executor: Literal["auto", "local", "ray"] = Field(
        "auto", description="Where the engines live: `local` in this process, `ray` one actor per arm; `auto` "
        "ray when it imports (local for echo and http unless a cluster is named).")
    engine: EngineConfig = Field(default_factory=VllmEngineConfig,
                                 description="The engine every arm runs; `kind` picks the backend and its fields "
                                 "(one section per kind below).")
    arms: list[ArmConfig] = Field(default_factory=list, description="Named overlays on `engine`, each run as its "
                                  "own engine on the same schedule; `on` and `off` are built in.")
    dataset: DatasetConfig = Field(default_factory=DatasetConfig, description="What is sent: the prompts and "
                                   "output lengths (its section below).")
    arrivals: ArrivalConfig = Field(default_factory=ArrivalConfig, description="When requests are sent (its "
                                    "section below).")
    sweep: SweepConfig = Field(default_factory=SweepConfig, description="The points: rates, arms, requests, "
                               "repeats and limits (its section below).")
    checks: CheckConfig = Field(default_factory=CheckConfig, description="The hit-rate check on every point (its "
                                "section below).")
    ray: RayConfig = Field(default_factory=RayConfig, description="The Ray cluster, with `executor` ray (its "
                           "section below).")
    replicas: int = Field(1, ge=1, le=1024, description="Engine replicas per arm, each with its own prefix cache, "
                          "behind one router; 1: one engine.")
    router: RouterConfig = Field(default_factory=RouterConfig, description="How a fleet of `replicas` routes "
                                 "requests (its section below).")
    grid: dict[str, list[Any]] = Field(
        default_factory=dict, description="Engine axes: a dotted config field (`engine.max_num_batched_tokens`, "
        "`dataset.shared_fraction`) or a KV-cache size (`capacity.blocks`, `capacity.offload_gib`, ... as "
        "`prefixstudy capacity`) and its values; each combination is its own run folder under one parent "
        "(`sweep.json`); empty: one run.")
    label: str | None = Field(None, description="A name for the run (`--label`), written to config.yaml and the "
                              "bench export; None: none.")
    metadata: dict[str, str] = Field(default_factory=dict, description="key: value pairs (`--metadata`) carried in "
                                     "config.yaml and the bench export.")
    percentiles: list[float] = Field(default_factory=lambda: [50.0, 90.0, 99.0], min_length=1,
                                     description="Percentiles, in (0, 100], of the bench export and the pooled ITL "
                                     "in the manifest (`--percentiles`).")
    goodput: dict[Literal["ttft", "tpot", "e2e"], float] = Field(
        default_factory=dict, description="Service-level objectives in ms (`--goodput ttft:200`): the bench "
        "export's `request_goodput` and the report's default SLO; empty: none.")

    @field_validator("percentiles")
    @classmethod
    def _percentiles(cls, v: list[float]) -> list[float]:
        for p in v:
            if not 0 < p <= 100:
                raise ValueError(f"every percentile must be in (0, 100], got {p:g}")
        return sorted(set(v))

    @field_validator("grid")
    @classmethod
    def _grid(cls, v: dict[str, list[Any]]) -> dict[str, list[Any]]:
        for k, values in v.items():
            if not values:
                raise ValueError(f"{k}: give at least one value")
            if k.split(".")[0] in ("grid", "out"):
                raise ValueError(f"{k}: not an axis (a grid's cells share its results folder)")
            if len(set(map(repr, values))) != len(values):
                raise ValueError(f"{k}: a value is given twice")
        return v

    @field_validator("goodput")
    @classmethod
    def _goodput(cls, v: dict[str, float]) -> dict[str, float]:
        for k, ms in v.items():
            if not (ms > 0 and math.isfinite(ms)):
                raise ValueError(f"{k}: the objective must be a finite number of ms > 0, got {ms}")
        return v

    @model_validator(mode="before")
    @classmethod
    def _default_engine_kind(cls, data):
        # Configs written before backends existed have no engine.kind: they meant vLLM.
        if isinstance(data, dict) and isinstance(data.get("engine"), dict) and "kind" not in data["engine"]:
            data = {**data, "engine": {**data["engine"], "kind": "vllm"}}
        return data

    @model_validator(mode="after")
    def _itl_percentiles(self) -> "StudyConfig":
        # An itl objective reads the point's pooled gaps at its percentile, kept for `percentiles` only.
        from prefixstudy.config.slo import objective_parts

        for name in (self.sweep.slo.objectives if self.sweep.slo else {}):
            metric, q = objective_parts(name)
            if metric == "itl" and q not in self.percentiles:
                self.percentiles = sorted({*self.percentiles, q})
        return self

    @model_validator(mode="after")
    def _arms_run_by_default(self) -> "StudyConfig":
        if self.arms and "modes" not in self.sweep.model_fields_set:
            self.sweep.modes = [*BUILTIN_ARMS, *(a.name for a in self.arms)]
        return self

    def arm(self, name: str) -> ArmConfig:
        """The arm called ``name``: one of ``arms``, or the built-in on / off."""
        for a in self.arms:
            if a.name == name:
                return a
        if name in BUILTIN_ARMS:
            return BUILTIN_ARMS[name]
        raise KeyError(name)

    def arm_engine(self, name: str):
        """The engine config of arm ``name``: ``engine`` with the arm's overlay, caching set."""
        return arm_engine(self.engine, self.arm(name))

    @field_validator("study")
    @classmethod
    def _not_dot(cls, v: str) -> str:
        if v in (".", ".."):  # the pattern allows them, but they would place runs outside `out`
            raise ValueError("must be a folder name, not '.' or '..'")
        return v

    @field_validator("model")
    @classmethod
    def _moved_model(cls, v: str) -> str:
        # The model folders lived in experiments/models/<name> until they shipped in the package;
        # results recorded before (their config.yaml) and older configs still name that path.
        p = Path(v)
        if p.parent.parts[-2:] == ("experiments", "models") and not p.is_dir():
            from prefixstudy.configs import shipped_model_dir

            shipped = shipped_model_dir(p.name)
            if shipped is not None:
                return str(shipped.resolve())
        return v

    def model_dir(self) -> Path | None:
        p = Path(self.model)
        return p if p.is_dir() else None

    def model_config_json(self) -> dict:
        """The model's config.json, read from its folder; a clear error when missing or bad."""
        import json

        d = self.model_dir()
        if d is None:
            raise UserError(f"field 'model': folder '{self.model}' not found (it needs a config.json)")
        f = d / "config.json"
        text = read_text(f, "model config", "the model's config.json")
        try:
            cfg = json.loads(text)
        except json.JSONDecodeError as e:
            raise UserError(f"{f}: line {e.lineno}: not valid JSON ({e.msg})") from None
        except RecursionError:
            raise UserError(f"{f}: not valid JSON (nested too deep)") from None
        vocab = cfg.get("vocab_size") if isinstance(cfg, dict) else None
        if isinstance(vocab, bool) or not isinstance(vocab, int) or vocab <= 0:
            raise UserError(f"{f}: field 'vocab_size' missing or not an integer > 0")
        return cfg
