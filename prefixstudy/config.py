"""The one validated study config: parsed once, resolved, saved beside the results."""

from __future__ import annotations

import copy
import math
from pathlib import Path
from typing import Annotated, Any, Literal, Union

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from prefixstudy.arms import BUILTIN_ARMS, ArmConfig, check_arms
from prefixstudy.engines import config_classes
from prefixstudy.engines.vllm import VllmEngineConfig
from prefixstudy.errors import UserError, read_text
from prefixstudy.workloads.specs import MixConfig, SessionsConfig, TraceConfig

_STRICT = ConfigDict(extra="forbid")


# One config class per backend, told apart by ``engine.kind`` (default: vllm); the union is built
# from the backend registry (prefixstudy.engines.BACKENDS).
_CONFIGS = config_classes()
EngineConfig = Annotated[Union[tuple(_CONFIGS.values())], Field(discriminator="kind")]
ENGINE_KINDS = tuple(_CONFIGS)


class DatasetConfig(BaseModel):
    """What is sent (prefixstudy.workloads): ``kind`` ``fixed`` composes the seed's fixed-prompt
    shape; ``jsonl`` replays a file (``path``); ``groups`` mixes many prefixes (``mix``);
    ``sessions`` is multi-turn (``sessions``); ``trace`` replays a block-hash trace (``path``,
    ``trace``).  Without a kind, a path means jsonl."""

    model_config = _STRICT
    kind: Literal["fixed", "jsonl", "groups", "sessions", "trace"] = Field(
        "fixed", description="The workload: `fixed` (one shared prefix per group + a unique suffix), `jsonl` "
        "(replay `path`), `groups` (many prefixes, `mix`), `sessions` (multi-turn), `trace` (a block-hash "
        "trace at `path`); unset with a `path`: `jsonl`.")
    path: Path | None = Field(None, description="The file `jsonl` and `trace` replay; None for the generated "
                              "workloads.")
    num_requests: int | None = Field(None, gt=0, description="Rows a generated workload makes; a point "
                                     "wraps around them. None: as many as the largest point needs.")
    prefix_len: int = Field(1198, ge=0, description="Tokens of the prefix every request of a group shares "
                            "(the seed workload's 1198).")
    suffix_len: int = Field(16, ge=0, description="Unique tokens after the prefix, per request (`sessions`: "
                            "the first turn's user message).")
    output_len: int = Field(143, gt=0, description="Tokens each request generates (max_tokens = min_tokens, "
                            "EOS ignored).")
    groups: int = Field(1, gt=0, description="Distinct prefixes (groups) the requests are spread over.")
    # numpy's generators take non-negative seeds.
    seed: int = Field(0, ge=0, description="Seed of the generated token ids and lengths; `--seed` sets it "
                      "and `arrivals.seed`.")
    token_low: int = Field(100, ge=0, description="Lowest token id a generated prompt holds "
                           "(inclusive).")
    token_high: int | None = Field(None, gt=0, description="Token ids are drawn below this (exclusive); None: "
                                   "the model's vocab size.")
    mix: MixConfig | None = Field(None, description="`groups` only: how the groups are mixed (its section "
                                  "below); None: uniform, round robin.")
    sessions: SessionsConfig | None = Field(None, description="`sessions` only: turns, user messages, think "
                                            "time (its section below); None: its defaults.")
    trace: TraceConfig | None = Field(None, description="`trace` only: how `path` is read and replayed (its "
                                      "section below); None: its defaults.")

    @model_validator(mode="before")
    @classmethod
    def _kind_from_path(cls, data):
        if isinstance(data, dict) and "kind" not in data and data.get("path") is not None:
            data = {**data, "kind": "jsonl"}
        return data

    @model_validator(mode="after")
    def _nonempty_prompt(self) -> "DatasetConfig":
        if self.kind in ("jsonl", "trace") and self.path is None:
            raise ValueError(f"kind {self.kind} needs a path")
        if self.kind not in ("jsonl", "trace") and self.path is not None:
            raise ValueError(f"a path is replayed by kind jsonl or trace, not {self.kind}")
        for section, kind in (("mix", "groups"), ("sessions", "sessions"), ("trace", "trace")):
            if getattr(self, section) is not None and self.kind != kind:
                raise ValueError(f"'{section}' is read by kind {kind}, not {self.kind}")
        if self.path is None and self.prefix_len + self.suffix_len == 0:
            raise ValueError("prefix_len + suffix_len must be > 0")
        if self.token_high is not None and self.token_low >= self.token_high:
            raise ValueError(f"token_low {self.token_low} must be < token_high {self.token_high}")
        return self


class ArrivalConfig(BaseModel):
    model_config = _STRICT
    process: Literal["poisson", "gamma", "constant"] = Field(
        "poisson", description="The arrival process at each point's rate: Poisson, gamma (with `burstiness`) "
        "or evenly spaced; a `burstiness` without a process means gamma.")
    burstiness: float = Field(1.0, gt=0, description="Gamma shape, as `vllm bench serve --burstiness`: 1.0 is "
                              "Poisson, below 1 burstier, above 1 more even; gamma only.")
    seed: int = Field(0, ge=0, description="Seed of the arrival schedule; repeat k draws with seed + k, and every "
                      "arm of one repeat gets the same schedule.")

    @model_validator(mode="before")
    @classmethod
    def _burstiness_means_gamma(cls, data):
        # As `vllm bench serve --burstiness`: a burstiness without a process asks for gamma arrivals.
        if isinstance(data, dict) and "burstiness" in data and "process" not in data:
            data = {**data, "process": "gamma"}
        return data

    @model_validator(mode="after")
    def _burstiness_needs_gamma(self) -> "ArrivalConfig":
        if self.burstiness != 1.0 and self.process != "gamma":
            raise ValueError(f"burstiness {self.burstiness:g} applies to gamma arrivals only, and process is "
                             f"{self.process}; drop it or set arrivals.process: gamma")
        return self


class SweepConfig(BaseModel):
    model_config = _STRICT
    rates: list[float] = Field(default_factory=lambda: [1.0, 2.0, 4.0, 8.0], min_length=1,
                               description="Offered request rates, req/s, one point each (sorted, duplicates "
                               "dropped); `inf` sends every request at once.")
    modes: list[str] = Field(default_factory=lambda: ["on", "off"], min_length=1,
                             description="The arms to run, by name: `on` / `off` (prefix caching on / off) and "
                             "those under `arms`; unset: on, off and every arm of `arms`.")
    baseline: str | None = Field(None, description="The arm every other arm is compared with (headline, report, "
                                 "compare, export); None: off when it runs, else no comparison.")
    num_requests: int = Field(40, gt=0, description="Measured requests per point, at least (`min_duration_s` "
                              "can ask for more).")
    min_duration_s: float = Field(0.0, ge=0, allow_inf_nan=False,
                                  description="Per point, at least this many seconds of arrivals (rate x seconds "
                                  "requests); 0: `num_requests` alone.")
    warmup_requests: int = Field(2, ge=0, description="Requests sent one at a time before each point's measured "
                                 "ones, with fresh suffixes; recorded with `warmup` true and counted nowhere.")
    prime_prefixes: bool = Field(True, description="After each point's cache reset, send each group's prefix once, "
                                 "so ON's first measured request of a group can hit.")
    max_point_duration_s: float = Field(900.0, gt=0, description="Seconds a point may run; then its open "
                                        "requests are cancelled (rows marked unfinished) and it is saturated.")
    request_timeout_s: float = Field(300.0, gt=0, description="Seconds a request may take from its send time "
                                     "before it is cancelled (a row marked unfinished).")
    # Repeats run sweep after sweep (all rates, then all rates again), so drift spreads over them.
    repeats: int = Field(1, ge=1, le=1000, description="Every rate this many times, each repeat with its own "
                         "arrival draw (seed `arrivals.seed` + repeat); 2 or more give intervals over repeats.")
    only_repeats: list[int] | None = Field(None, description="Run only these repeats (0-based), e.g. to give "
                                           "repeats to different machines and `prefixstudy merge` them; None: all.")
    interleave_arms: bool = Field(True, description="In process, every arm's engine stays up and the arms take "
                                  "turns point by point: A B, then B A, along a sweep, and the first arm "
                                  "alternates across a rate's repeats, so neither the arm nor its place in a "
                                  "pair owns the early or the late part of the run; false: one arm's whole "
                                  "sweep, then the next (one engine at a time).")
    # Set by study.pending_configs when a run is resumed; never saved.
    run_points: list[tuple[float, int]] | None = Field(None, exclude=True,
                                                       description="Internal: the (rate, repeat) points still to "
                                                       "run when a run is resumed; never saved, not for configs.")
    done_points: set[tuple[str, float, int]] = Field(default_factory=set, exclude=True,
                                                     description="Internal: (arm, rate, repeat) points a resumed "
                                                     "interleaved run already has; never saved, not for configs.")
    max_concurrency: int | None = Field(None, gt=0, description="At most this many requests open at once (a "
                                        "request waits for a slot; its dispatch lag says how long); None: no limit.")

    @field_validator("rates")
    @classmethod
    def _positive_rates(cls, v: list[float]) -> list[float]:
        for r in v:
            # inf: every request at once (as `vllm bench serve --request-rate inf`).
            if not (r > 0 and (math.isfinite(r) or r == math.inf)):
                raise ValueError(f"every rate must be a number > 0 req/s or inf, got {r}")
        return sorted(set(v))

    @field_validator("modes", mode="before")
    @classmethod
    def _yaml_on_off(cls, v):
        # YAML 1.1 reads a bare `on` / `off` as true / false; the user meant the mode.
        if isinstance(v, list):
            return [{True: "on", False: "off"}.get(m, m) if isinstance(m, bool) else m for m in v]
        return v

    @field_validator("baseline", mode="before")
    @classmethod
    def _yaml_on_off_baseline(cls, v):
        # As for modes: `baseline: off` reaches us as False.
        return {True: "on", False: "off"}.get(v, v) if isinstance(v, bool) else v

    @field_validator("modes")
    @classmethod
    def _unique_modes(cls, v: list[str]) -> list[str]:
        return list(dict.fromkeys(v))

    @model_validator(mode="after")
    def _repeats_in_range(self) -> "SweepConfig":
        for k in self.only_repeats or ():
            if not 0 <= k < self.repeats:
                raise ValueError(f"only_repeats: {k} is not a repeat of 0..{self.repeats - 1}")
        return self

    def baseline_arm(self) -> str | None:
        if self.baseline is not None:
            return self.baseline
        return "off" if "off" in self.modes else None

    def requests_for(self, rate: float) -> int:
        if math.isinf(rate):  # everything at once: the duration is not the schedule's to set
            return self.num_requests
        return max(self.num_requests, math.ceil(rate * self.min_duration_s))

    def points(self) -> list[tuple[float, int]]:
        """(rate, repeat) in the order they run: the whole sweep, then again for the next repeat."""
        if self.run_points is not None:
            return list(self.run_points)
        repeats = self.only_repeats if self.only_repeats is not None else range(self.repeats)
        return [(rate, k) for k in repeats for rate in self.rates]

    def turns(self) -> list[tuple[str, float, int]]:
        """(arm, rate, repeat) in the order an interleaved run takes them: the arms in order where the
        rate's place in ``rates`` plus the repeat is even, reversed where odd.  Along a sweep that is
        A B, B A, A B, ...; and each rate's repeats alternate which arm goes first, so that the order
        within a pair can be told from the arm."""
        place = {rate: i for i, rate in enumerate(self.rates)}  # fixed by the config: a resumed run keeps it
        out = []
        for rate, k in self.points():
            arms = self.modes if (place.get(rate, 0) + k) % 2 == 0 else self.modes[::-1]
            out += [(m, rate, k) for m in arms if (m, float(rate), k) not in self.done_points]
        return out


class CheckConfig(BaseModel):
    model_config = _STRICT
    hit_rate_tolerance: float = Field(0.05, ge=0, le=1, description="How far (a share of prompt tokens) ON's "
                                      "measured hit rate may fall below what the cache should serve before the "
                                      "point is flagged.")
    fail_on_hit_rate_mismatch: bool = Field(False, description="True: a point that fails the hit-rate check "
                                            "(ON too low, or OFF above 0) fails; false: it is only flagged.")


class RayConfig(BaseModel):
    model_config = _STRICT
    address: str = Field("local", description="`local` starts a Ray cluster for the run (or joins `RAY_ADDRESS` "
                         "under `ray job submit`), `auto` joins the one `ray start` made here, `ray://host:port` a "
                         "remote one.")
    parallel: Literal["auto", "on", "off"] = Field(
        "auto", description="Run the arms' engines side by side: `auto` when the cluster has room, `on` always "
        "(refused without room), `off` one after the other.")
    num_cpus_per_engine: int = Field(1, ge=1, description="CPUs each engine actor reserves on a CPU cluster (GPU "
                                     "engines reserve one CPU per GPU).")
    num_cpus: int | None = Field(None, ge=1, description="CPUs of the cluster that address `local` starts; None: "
                                 "all cores.")

    @field_validator("parallel", mode="before")
    @classmethod
    def _yaml_on_off(cls, v):
        # As for sweep.modes: a bare `parallel: on` reaches us as True.
        return {True: "on", False: "off"}.get(v, v) if isinstance(v, bool) else v


class RouterConfig(BaseModel):
    """How a mode's fleet of ``replicas`` routes requests (prefixstudy.router).  ``policies``: one
    run folder per policy (prefixstudy.routing_sweep); each run's config holds one."""

    model_config = _STRICT
    policies: list[Literal["round_robin", "least_loaded", "prefix_affinity"]] = Field(
        default_factory=lambda: ["round_robin"], min_length=1,
        description="Routing policies, one run folder each (used when `replicas` > 1).")
    prefix_blocks: int = Field(4, ge=1, description="`prefix_affinity`: the prompt's first this many whole blocks "
                               "are hashed to pick a replica.")
    load_bound: float = Field(1.25, ge=1, description="`prefix_affinity`: a request spills to the least-loaded "
                              "replica past ceil(bound x the mean requests in flight).")
    # OFF has no cache for a policy to exploit, so one OFF baseline (round_robin) is often enough,
    # and saves a fleet start per policy.
    off_policies: list[Literal["round_robin", "least_loaded", "prefix_affinity"]] | None = Field(
        None, description="The policies that also run with caching OFF; None: all of `policies`.")

    @field_validator("policies", "off_policies")
    @classmethod
    def _unique(cls, v: list[str] | None) -> list[str] | None:
        return None if v is None else list(dict.fromkeys(v))

    @model_validator(mode="after")
    def _off_within(self) -> "RouterConfig":
        stray = [p for p in self.off_policies or [] if p not in self.policies]
        if stray:
            raise ValueError(f"off_policies names {stray[0]}, which is not one of policies {self.policies}")
        return self


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
        from prefixstudy.arms import arm_engine

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


def resolve_model_path(model: str, base: Path | None = None) -> str:
    """A relative model folder is looked up from the cwd, then the config's folder, then among the
    shipped models (``tiny-llama``, ``mistral-7b-v0.3``), and made absolute, so the saved config
    works from anywhere (vLLM would take it for a hub id)."""
    from prefixstudy.configs import shipped_model_dir

    p = Path(model)
    if p.is_absolute():
        return model
    for root in (Path.cwd(), base):
        if root is not None and (root / p).is_dir():
            return str((root / p).resolve())
    shipped = shipped_model_dir(model)
    return str(shipped.resolve()) if shipped is not None else model


def _fmt_error(err: ValidationError, source: str, overrides: dict | None = None) -> str:
    e = err.errors()[0]
    loc = list(e["loc"])
    if loc[:1] == ["engine"] and len(loc) > 1 and loc[1] in ENGINE_KINDS:
        del loc[1]  # pydantic names the union member; the user wrote engine.<field>
    field = ".".join(str(x) for x in loc) or "(top level)"
    # A bad value that came from the command line is named by its flag, not by the file.
    for k in overrides or ():
        if field == k or field.startswith(f"{k}."):
            source = f"--set {k}"
    msg = e["msg"]
    if e["type"] == "extra_forbidden":
        msg = "unknown key"
    return f"{source}: field '{field}': {msg}"


def parse_config(data: Any, source: str, overrides: dict | None = None) -> StudyConfig:
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise UserError(f"{source}: expected a mapping of config keys, got {type(data).__name__}")
    try:
        cfg = StudyConfig.model_validate(data)
    except ValidationError as err:
        raise UserError(_fmt_error(err, source, overrides)) from None
    check_arms(cfg, source, overrides)
    check_sizes(cfg, source)
    return cfg


# Token ids the generated dataset may hold (8 GiB as int64): far past any study's, short of
# what would exhaust a machine's memory before the first request.
DATASET_MAX_TOKENS = 1 << 30


def check_sizes(cfg: StudyConfig, source: str) -> None:
    """Refuse, before anything is generated, a study whose generated dataset could not fit in
    memory: rows (the largest point's requests plus warm-ups) x prompt tokens, plus each group's
    shared prefix.  A replayed file (jsonl, trace) is bounded by the file itself."""
    d, sw = cfg.dataset, cfg.sweep
    if d.path is not None:
        return
    rows = max(max(sw.requests_for(r) for r in sw.rates) + sw.warmup_requests, d.num_requests or 0)
    tokens = rows * (d.prefix_len + d.suffix_len) + (d.groups * d.prefix_len if d.kind == "groups" else 0)
    if tokens > DATASET_MAX_TOKENS:
        raise UserError(f"{source}: field 'dataset': the generated dataset would hold {tokens:.3g} prompt tokens "
                        f"({rows:,} rows of {d.prefix_len + d.suffix_len:,} tokens"
                        + (f", {d.groups:,} group prefixes" if d.kind == "groups" else "")
                        + f"), more than {DATASET_MAX_TOKENS:.3g}; lower the request count, the prompt length "
                          "or the number of groups")


# A config is a page of settings: these bound what a mistaken or hostile file can make us do.
CONFIG_MAX_BYTES = 1 << 20
CONFIG_MAX_VALUES = 100_000  # after YAML aliases are expanded


class _UniqueKeyLoader(yaml.SafeLoader):
    """SafeLoader that refuses a key given twice in one mapping (PyYAML keeps the last silently)."""

    def construct_mapping(self, node, deep=False):
        seen = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if isinstance(key, (str, int, float, bool)) and key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"key '{key}' is given twice", key_node.start_mark)
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


def _count_values(obj: Any, limit: int) -> int:
    """Values in ``obj``, walking shared (aliased) parts each time they appear, up to ``limit``."""
    n, stack = 0, [obj]
    while stack and n <= limit:
        x = stack.pop()
        n += 1
        if isinstance(x, dict):
            stack.extend(x.values())
        elif isinstance(x, list):
            stack.extend(x)
    return n


def read_yaml(path: Path) -> Any:
    text = read_text(path, "config file", "a YAML config file", max_bytes=CONFIG_MAX_BYTES)
    try:
        data = yaml.load(text, Loader=_UniqueKeyLoader)  # noqa: S506 - a SafeLoader subclass
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" line {mark.line + 1}:" if mark else ""
        problem = getattr(e, "problem", None) or str(e).strip().splitlines()[0]
        raise UserError(f"{path}:{where} invalid YAML: {problem}") from None
    except RecursionError:
        raise UserError(f"{path}: invalid YAML: nested too deep for a config") from None
    if _count_values(data, CONFIG_MAX_VALUES) > CONFIG_MAX_VALUES:
        raise UserError(f"{path}: expands to more than {CONFIG_MAX_VALUES:,} values (YAML aliases?); "
                        "a config is a few dozen")
    return data


def set_dotted(data: dict, dotted: str, value: Any) -> None:
    """Apply one ``--set a.b=c`` override onto raw config data."""
    keys = dotted.split(".")
    cur = data
    for k in keys[:-1]:
        nxt = cur.setdefault(k, {})
        if not isinstance(nxt, dict):
            raise UserError(f"--set {dotted}: '{k}' is not a section")
        cur = nxt
    cur[keys[-1]] = value


def _switch_kind(data: dict, path: Path | None, overrides: dict) -> None:
    """``--set engine.kind=K`` over a file written for another backend: the file's engine keys that
    K has no field for are dropped when the file is a shipped config (its engine section is the
    package's default, not the user's), and refused in one line naming the flag when the user wrote
    them.  Keys also given on the command line are the user's, and checked as usual."""
    kind = overrides.get("engine.kind")
    engine = data.get("engine")
    if path is None or kind not in _CONFIGS or not isinstance(engine, dict) or engine.get("kind", "vllm") == kind:
        return
    from prefixstudy.configs import shipped_config

    fields = set(_CONFIGS[kind].model_fields) - {"prefix_caching"}
    stray = [k for k in engine if k not in fields and f"engine.{k}" not in overrides]
    if not stray:
        return
    shipped = shipped_config(path.name)
    if shipped is not None and shipped.resolve() == Path(path).resolve():
        data["engine"] = {k: v for k, v in engine.items() if k not in stray}
        return
    raise UserError(f"--set engine.kind={kind}: {path} sets field 'engine.{stray[0]}', which engine.kind {kind} "
                    f"has no field for; remove it from the file, or set engine.kind: {kind} there")


def load_config(path: Path | None, overrides: dict[str, Any] | None = None) -> StudyConfig:
    """Read a YAML config (or the defaults), apply dotted overrides, validate once."""
    source = str(path) if path else "(defaults)"
    data = read_yaml(path) if path else {}
    if data is None:
        # An empty file would otherwise run the shipped default vLLM study, which it did not ask for.
        raise UserError(f"{source}: no config keys (the file is empty or only comments); "
                        "run without a config for the default study")
    if not isinstance(data, dict):
        raise UserError(f"{source}: expected a mapping of config keys, got {type(data).__name__}")
    _switch_kind(data, path, overrides or {})
    for k, v in (overrides or {}).items():
        set_dotted(data, k, copy.deepcopy(v))  # a later dotted key must not edit the caller's dict
    cfg = parse_config(data, source, overrides)
    base = path.parent if path else None
    cfg.model = resolve_model_path(cfg.model, base)
    if cfg.dataset.path is not None and not cfg.dataset.path.is_absolute() and base is not None \
            and not cfg.dataset.path.exists() and (base / cfg.dataset.path).exists():
        cfg.dataset.path = (base / cfg.dataset.path).resolve()
    return cfg


def flat_config(d: dict, prefix: str = "") -> dict:
    """A config (as data) flattened to dotted keys, to name the first field where two differ."""
    out = {}
    for k, v in d.items():
        if isinstance(v, dict) and v:
            out.update(flat_config(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def dump_config(cfg: StudyConfig) -> str:
    return yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False)
