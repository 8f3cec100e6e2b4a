"""The Ray executor's planning, pure: how many engines a cluster fits, whether the modes run side
by side, and how an actor's death reads on one line.  No Ray import here, so it is tested without
a cluster."""

from __future__ import annotations

import re
from pathlib import Path

from prefixstudy.errors import UserError

# CPU engines: besides its reserved cores, each engine's load generator and engine-core loop want
# a core each; two engines side by side on fewer cores would skew each other's timings.
CPU_OVERHEAD_PER_ENGINE = 2


def gpu_placement(tp: int, gpus_in_process: bool) -> tuple[list[dict], dict]:
    """(placement-group bundles, the engine actor's resources in it) for one GPU engine.

    vLLM in-process: ``tp`` bundles of one GPU; the actor holds none, vLLM's Ray workers take the
    bundles.  A backend whose process must see the GPUs itself (``vllm-server``: the actor launches
    `vllm serve`, whose own workers are plain processes): one bundle of ``tp`` GPUs, all held by the
    actor, so Ray's CUDA_VISIBLE_DEVICES names them and the server inherits it."""
    if gpus_in_process:
        return [{"GPU": tp, "CPU": tp + 1}], {"num_cpus": 1, "num_gpus": tp, "bundle": 0}
    return [{"GPU": 1, "CPU": 1}] * tp, {"num_cpus": 1, "num_gpus": 0}


def engine_slots(nodes: list[dict], use_gpu: bool, tp: int, cpus_per_engine: int) -> int:
    """How many engines Ray can place at once: a GPU engine needs ``tp`` GPUs (and a CPU per GPU)
    on one node; a CPU engine ``cpus_per_engine`` CPUs."""
    if use_gpu:
        return sum(min(int(n.get("GPU", 0)) // tp, int(n.get("CPU", 0)) // tp) for n in nodes)
    return sum(int(n.get("CPU", 0)) // cpus_per_engine for n in nodes)


def plan_parallel(requested: str, n_modes: int, nodes: list[dict], use_gpu: bool, tp: int,
                  cpus_per_engine: int, replicas: int = 1, interleave: bool = False) -> dict:
    """How the modes run: ``{"requested", "used", "turns", "reason"}`` for the manifest.  ``used``:
    side by side (every arm's engine at once, the points in step); ``turns``: every arm's engine
    placed at once, but one point runs at a time, the arms taking turns (``interleave``, the
    config's ``sweep.interleave_arms``); neither: one arm's engine after the other's.

    Raises UserError when not even one engine fits, or ``on`` is asked for and two do not fit.
    With ``replicas`` > 1 a mode is a fleet of that many engines (``plan_fleets``; no turns).
    """
    if replicas > 1:
        return plan_fleets(requested, n_modes, nodes, use_gpu, tp, cpus_per_engine, replicas)
    slots = engine_slots(nodes, use_gpu, tp, cpus_per_engine)
    gpus = sum(int(n.get("GPU", 0)) for n in nodes)
    cpus = sum(int(n.get("CPU", 0)) for n in nodes)
    need = f"{tp} GPUs on one node" if use_gpu else f"{cpus_per_engine} CPUs"
    if slots < 1:
        have = f"{gpus} GPUs, {cpus} CPUs over {len(nodes)} node(s)"
        raise UserError(f"the Ray cluster has no room for one engine: it needs {need}, the cluster has {have}")
    # Turns need every arm's engine placed at once; only one of them runs a point at a time, so
    # the cores a side-by-side engine wants for its loops (CPU_OVERHEAD_PER_ENGINE) are not needed.
    can_turn = interleave and slots >= n_modes

    def out(used: bool, reason: str, turns: bool = False) -> dict:
        return {"requested": requested, "used": used, "turns": turns, "reason": reason}

    def not_side_by_side(why: str, sep: str = "; ") -> dict:
        if can_turn:
            every = "both engines" if n_modes == 2 else f"all {n_modes} engines"
            return out(False, f"{why}{sep}{every} are placed at once and the arms take turns point by point", turns=True)
        return out(False, f"{why}{sep}modes run one after the other")

    if n_modes < 2:
        return out(False, "one mode only")
    if requested == "off":
        return not_side_by_side("parallel off", ": ")
    # Side by side means every arm's engine at once (they start together and run the points in step).
    if requested == "on":
        if slots < n_modes:
            room = "one engine only" if slots == 1 else f"{slots} engines, not {n_modes}"
            raise UserError(f"--parallel on: the Ray cluster has room for {room} ({need} each)")
        return out(True, "parallel on: both engines run side by side" if n_modes == 2 else
                   f"parallel on: all {n_modes} engines run side by side")
    if use_gpu:
        if slots >= n_modes:
            return out(True, f"auto: the cluster fits {n_modes} engines of {tp} GPU(s) side by side")
        return not_side_by_side(f"auto: the cluster fits only {slots} engine{'s' * (slots != 1)} of {tp} GPU(s) "
                                f"({gpus} GPUs)")
    per = cpus_per_engine + CPU_OVERHEAD_PER_ENGINE
    roomy = sum(int(n.get("CPU", 0)) // per for n in nodes)
    if roomy >= n_modes:
        return out(True, f"auto: {cpus} CPUs fit {n_modes} CPU engines of {cpus_per_engine} + {CPU_OVERHEAD_PER_ENGINE} "
                         "CPUs side by side")
    return not_side_by_side(f"auto: {cpus} CPUs; {n_modes} CPU engines side by side need {n_modes} x ({cpus_per_engine} "
                            f"+ {CPU_OVERHEAD_PER_ENGINE}) = {n_modes * per} CPUs (engine cores + load generator and "
                            "engine loop)")


def one_after_the_other(plan: dict) -> str:
    """The console note (one line, at most 120 characters) for a plan that ``auto`` made sequential:
    "" otherwise (side by side, in turns, one arm, or ``--parallel off`` asked for).  Each arm's
    points then run at other times than the other arm's, so a difference between arms also holds
    whatever changed in between; the manifest's ``parallel.reason`` says why."""
    if plan["used"] or plan["turns"] or not plan["reason"].startswith("auto:"):
        return ""
    return "ray: the arms run one after the other (neither side by side nor in turns); the manifest's parallel says why"


def plan_fleets(requested: str, n_modes: int, nodes: list[dict], use_gpu: bool, tp: int,
                cpus_per_engine: int, replicas: int) -> dict:
    """As ``plan_parallel``, for fleets of ``replicas`` engines per mode.  A fleet must fit whole;
    side by side needs room for every mode's fleet at once."""
    slots = engine_slots(nodes, use_gpu, tp, cpus_per_engine)
    need = f"{tp} GPUs on one node" if use_gpu else f"{cpus_per_engine} CPUs"
    if slots < replicas:
        raise UserError(f"field 'replicas': the Ray cluster has room for {slots} engine(s) of {need}, "
                        f"a fleet of {replicas} replicas needs {replicas}")

    def out(used: bool, reason: str) -> dict:
        return {"requested": requested, "used": used, "turns": False, "reason": reason}

    # CPU engines side by side also want a core each for their loops (as CPU_OVERHEAD_PER_ENGINE says).
    roomy = slots if use_gpu else sum(int(n.get("CPU", 0)) // (cpus_per_engine + CPU_OVERHEAD_PER_ENGINE)
                                      for n in nodes)
    both = (slots if requested == "on" else roomy) >= n_modes * replicas
    if n_modes < 2:
        return out(False, "one mode only")
    if requested == "off":
        return out(False, "parallel off: modes run one after the other")
    if requested == "on" and not both:
        raise UserError(f"--parallel on: the Ray cluster has room for {slots} engine(s), "
                        f"2 fleets of {replicas} replicas need {2 * replicas}")
    if both:
        return out(True, f"{requested}: the cluster fits 2 fleets of {replicas} replicas side by side ({slots} engine slots)")
    return out(False, f"auto: the cluster fits {slots} engine(s), not 2 fleets of {replicas}; modes run one after the other")


def assign_replicas(slots_per_node: list[int], n: int) -> list[int]:
    """Which node each of ``n`` replicas goes to, spread: each to the node with the fewest replicas so
    far that still has a free slot (ties: the most free slots, then the first node).  A fleet on
    several nodes loses one node's share, not all of it, to a node's failure."""
    free, placed, out = list(slots_per_node), [0] * len(slots_per_node), []
    for _ in range(n):
        room = [k for k in range(len(free)) if free[k] > 0]
        if not room:
            raise UserError(f"field 'replicas': no free engine slot for replica {len(out)} of {n}")
        k = min(room, key=lambda k: (placed[k], -free[k], k))
        free[k] -= 1
        placed[k] += 1
        out.append(k)
    return out


def node_slots(node: dict, use_gpu: bool, tp: int, cpus_per_engine: int) -> int:
    """Engines one node fits (as ``engine_slots`` counts them)."""
    return engine_slots([node], use_gpu, tp, cpus_per_engine)


def summarize_actor_error(e: BaseException) -> str:
    """A Ray actor death as one line: what happened, the process, and the exit detail's first sentence."""
    text = " ".join(str(e).split())
    pid = re.search(r"\bpid: (\d+)", text)
    exit_type = re.search(r"Worker exit type: (\w+)", text)
    detail = re.search(r"Worker exit detail: (.+?\.)(?:\s|$)", text)
    head = re.split(r"(?<=\.)\s", text, maxsplit=1)[0]
    parts = [f"{type(e).__name__}: {head}"]
    if pid:
        parts.append(f"pid {pid.group(1)}")
    if exit_type:
        parts.append(exit_type.group(1))
    if detail:
        parts.append(detail.group(1))
    return "; ".join(parts)[:500]


def actor_name(study: str, run_dir: Path | str, mode: str, generation: int = 0) -> str:
    """Named actors, so tools (and tests) can find a run's engines:
    ``ray.get_actor(actor_name(...), namespace="prefixstudy")``.  A replacement gets ``/restartN``."""
    return f"{study}/{Path(run_dir).name}/{mode}" + (f"/restart{generation}" if generation else "")
