"""CLI: the ``prefixstudy run`` flags that users of ``vllm bench serve`` and its peers expect.

Each flag only sets config fields (dotted overrides, validated once with the rest of the config);
what a field means is the config's and the runner's business.  Bad input is a UserError naming
the flag (one line, exit 2).
"""

from __future__ import annotations

from pathlib import Path

from prefixstudy.errors import UserError


def _percentiles(text: str) -> list[float]:
    out = []
    for part in text.split(","):
        try:
            p = float(part)
        except ValueError:
            raise UserError(f"--percentiles {text}: '{part}' is not a number") from None
        if not 0 < p <= 100:
            raise UserError(f"--percentiles {text}: {part} is not in (0, 100]")
        out.append(p)
    return out


def _metadata(items: tuple[str, ...]) -> dict[str, str]:
    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise UserError(f"--metadata {item}: expected key=value, for example --metadata gpu=h200")
        out[key.strip()] = value
    return out


def _goodput(text: str) -> dict[str, float]:
    from prefixstudy.metrics.requests import parse_slo

    try:  # vLLM's form separates the objectives with spaces ("ttft:200 e2e:2000", quoted)
        return parse_slo(",".join(x for x in text.replace(",", " ").split()))
    except UserError as e:  # parse_slo names --slo; this flag is --goodput
        raise UserError(str(e).replace("--slo", "--goodput", 1)) from None


def _config_engine_kind(config: Path | None) -> str:
    if config is None:
        return "vllm"
    from prefixstudy.config import read_yaml

    data = read_yaml(config)
    engine = data.get("engine") if isinstance(data, dict) else None
    return str(engine.get("kind", "vllm")) if isinstance(engine, dict) else "vllm"


def _targets(config: Path | None, on: str | None, off: str | None) -> dict:
    """--target-on/--target-off: a config of another backend becomes an http one (its engine
    section is replaced: the vLLM engine arguments mean nothing to a running server)."""
    targets = {m: u for m, u in (("on", on), ("off", off)) if u is not None}
    if not targets:
        return {}
    if _config_engine_kind(config) == "http":
        return {f"engine.targets.{m}": u for m, u in targets.items()}
    return {"engine": {"kind": "http", "targets": targets}, "sweep.modes": list(targets)}


def capacity_overrides(config: Path | None, slo, rates) -> dict:
    """--capacity: a capacity search with its defaults, unless the config has one (its fields stay)."""
    if slo is not None:
        raise UserError("--capacity and --slo both given: a run searches one answer; use one")
    if rates is not None:
        raise UserError("--capacity searches its own rates (sweep.capacity_search.start_rate, growth, "
                        "max_rate); drop --rates / --request-rate")
    from prefixstudy.config import read_yaml

    data = read_yaml(config) if config is not None else None
    sweep = data.get("sweep") if isinstance(data, dict) else None
    return {} if isinstance(sweep, dict) and isinstance(sweep.get("capacity_search"), dict) \
        else {"sweep.capacity_search": {}}


def peer_overrides(config: Path | None, rates, *, request_rate=None, max_concurrency=None, seed=None,
                   burstiness=None, percentiles=None, goodput=None, slo=None, capacity=None, label=None,
                   metadata=(), target_on=None, target_off=None) -> dict:
    """The flags' dotted config overrides (only those given)."""
    if request_rate is not None and rates is not None:
        raise UserError("--request-rate and --rates both given; use one")
    out: dict = {}
    if capacity:
        out.update(capacity_overrides(config, slo, rates if rates is not None else request_rate))
    if request_rate is not None:
        out["sweep.rates"] = request_rate
    if max_concurrency is not None:
        out["sweep.max_concurrency"] = max_concurrency
    if seed is not None:  # as vllm bench serve's --seed: the arrivals and the sampled dataset
        out["arrivals.seed"] = out["dataset.seed"] = seed
    if burstiness is not None:
        out["arrivals.burstiness"] = burstiness  # the config refuses it beside Poisson arrivals
    if percentiles is not None:
        out["percentiles"] = _percentiles(percentiles)
    if goodput is not None:
        out["goodput"] = _goodput(goodput)
    if slo is not None:  # the search's other fields: --set sweep.slo.tolerance=0.1 and so on
        from prefixstudy.config.slo import parse_objectives

        out["sweep.slo.objectives"] = parse_objectives(slo)
    if label is not None:
        out["label"] = label
    if metadata:
        out["metadata"] = _metadata(metadata)
    out.update(_targets(config, target_on, target_off))
    return out
