"""The study config's sections besides the engine and the arms: what is sent, when, the sweep of
points, the checks, the Ray cluster and the router (one pydantic model each)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from prefixstudy.config.workload_specs import MixConfig, SessionsConfig, TraceConfig
from prefixstudy.config.slo import SloSearchConfig
from prefixstudy.config.capacity_search import CapacitySearchConfig

_STRICT = ConfigDict(extra="forbid")


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
    shared_fraction: float | None = Field(
        None, description="`fixed` only: the share of each prompt that is its group's common prefix, at a fixed "
        "prompt length: a prompt stays `prefix_len + suffix_len` tokens long and splits into floor(fraction x "
        "that) shared tokens and the rest unique per request (0.5: the first half is common). Swept as an axis: "
        "`grid: {dataset.shared_fraction: [0, 0.5, 0.95]}`. None: `prefix_len` and `suffix_len` as given.")
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
        if self.shared_fraction is not None:
            if self.kind != "fixed":
                raise ValueError(f"'shared_fraction' is read by kind fixed, not {self.kind}")
            if not 0 <= self.shared_fraction <= 1:
                raise ValueError(f"shared_fraction {self.shared_fraction}: must be in [0, 1]")
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


class EngineWarmupConfig(BaseModel):
    """Each engine's warm-up after it starts, before its first point: batches of requests until the
    engine's step time settles (prefixstudy.runner.warmup)."""

    model_config = _STRICT
    batch_requests: int = Field(4, ge=1, description="Requests sent at once in each warm-up batch, with fresh "
                                "suffixes; counted nowhere.")
    tolerance: float = Field(0.1, gt=0, lt=1, description="Warm once the median token gaps of the last three "
                             "batches lie within this share of their median.")
    max_batches: int = Field(10, ge=0, description="At most this many batches (then the warm-up is recorded as not "
                             "settled); 0: no warm-up.")


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
    engine_warmup: EngineWarmupConfig = Field(default_factory=EngineWarmupConfig, description="Each engine's "
                                              "warm-up after it starts, until its step time settles (manifest: "
                                              "`engines`).")
    cache_isolation: Literal["reset", "salt"] = Field(
        "reset", description="How each point starts cold: `reset` empties the prefix cache before it; `salt` "
        "gives each point and repeat its own vLLM `cache_salt` (no reset: for servers without a reset "
        "endpoint). Either way a probe checks the cache was cold (docs/cache-isolation.md).")
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
    interleave_arms: bool = Field(True, description="Every arm's engine stays up and the arms take turns point "
                                  "by point (in process; on Ray where the cluster places every arm's engine but "
                                  "cannot run them side by side): A B, then B A, along a sweep, and the first arm "
                                  "alternates across a rate's repeats, so neither the arm nor its place in a "
                                  "pair owns the early or the late part of the run; false: one arm's whole "
                                  "sweep, then the next (one engine at a time).")
    max_concurrency: int | None = Field(None, gt=0, description="At most this many requests open at once (a "
                                        "request waits for a slot; its dispatch lag says how long); None: no limit.")
    slo: SloSearchConfig | None = Field(None, description="Search each arm's highest rate meeting these "
                                        "objectives (`--slo e2e_p90:2000`) instead of running `rates`; None: "
                                        "run `rates`.")
    capacity_search: CapacitySearchConfig | None = Field(
        None, description="Search each arm's highest sustained arrival rate (`--capacity`) instead of running "
        "`rates`; its points' lengths are its windows, not `min_duration_s`; None: run `rates`.")

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
        if self.slo is not None and self.only_repeats is not None:
            raise ValueError("only_repeats: an SLO search runs its repeats where it ends; it cannot be split")
        if self.capacity_search is not None:
            if self.slo is not None:
                raise ValueError("capacity_search: give either slo or capacity_search, not both")
            if self.only_repeats is not None:
                raise ValueError("only_repeats: a capacity search runs its repeats where it ends; it cannot be split")
            if self.max_concurrency is not None:
                raise ValueError("max_concurrency: a capacity search offers open-loop arrivals; a concurrency "
                                 "limit would hold them back in the client, not in the engine")
            # Its points need room for their whole schedule (and the backlog after it).
            c = self.capacity_search
            self.max_point_duration_s = max(self.max_point_duration_s, c.point_cap_s(),
                                            *(1.25 * self.requests_for(r) / r for r in c.extent()))
        return self

    def baseline_arm(self) -> str | None:
        if self.baseline is not None:
            return self.baseline
        return "off" if "off" in self.modes else None

    def requests_for(self, rate: float, repeat: int | None = None) -> int:
        """Requests of the point (rate, repeat); ``repeat`` None: the most any repeat may send."""
        if math.isinf(rate):  # everything at once: the duration is not the schedule's to set
            return self.num_requests
        c = self.capacity_search
        seconds = self.min_duration_s if c is None else c.window_s(rate, repeat)
        return max(self.num_requests, math.ceil(rate * seconds))

    def rate_extent(self) -> list[float]:
        """The rates datasets and point limits are sized for: ``rates``, and a search's range."""
        c = self.capacity_search
        return sorted({*self.rates, *(self.slo.extent(self.rates) if self.slo is not None else ()),
                       *(c.extent() if c is not None else ())})

    def points(self) -> list[tuple[float, int]]:
        """(rate, repeat) in the order they run: the whole sweep, then again for the next repeat
        (what a run still has to do is its plan, ``executors.run_plan.RunPlan``)."""
        repeats = self.only_repeats if self.only_repeats is not None else range(self.repeats)
        return [(rate, k) for k in repeats for rate in self.rates]


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
        "(refused without room), `off` never.  Not side by side, they take turns point by point "
        "(`sweep.interleave_arms`) where the cluster places every arm's engine at once, else run one after the other.")
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
    """How a mode's fleet of ``replicas`` routes requests (prefixstudy.engines.router).  ``policies``: one
    run folder per policy (prefixstudy.sweep.routing_axis); each run's config holds one."""

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
