"""An engine that fails to start on a Ray actor leaves its reason with the run.

On 2 x H200 a fleet's engines failed to start and the run said only "Engine core initialization
failed. See root cause above.": the cause was in Ray's session logs on a machine that was gone.
Here a real tiny vLLM engine fails for real inside a Ray actor: ``load_format: safetensors`` on
a model folder without weights.  The run's one line names the root cause and a log file beside the
manifest holds the engine's own output, for one engine and for a fleet's replica.  About 3 minutes
on 2 cores (two engine starts that fail once the engine core loads the model).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from prefixstudy.cli import main

REPO = Path(__file__).resolve().parents[2]
TINY = REPO / "prefixstudy/configs/models/tiny-llama"
ARGS = ["--modes", "on", "--rates", "1", "--num-requests", "2", "--executor", "ray",
        "--set", "engine.load_format=safetensors", "--set", "sweep.warmup_requests=0", "--no-report", "--quiet"]
CAUSE = f"RuntimeError: Cannot find any model weights with `{TINY}`"


@pytest.fixture(scope="module")
def ray_cluster(ray_head):
    """Both runs join the session's shared Ray head (the CLI joins a Ray it finds initialised, and
    leaves it up): it has room for the fleet's generator and its two replicas' placement groups."""
    import ray

    if ray.is_initialized():  # an earlier test's, on another cluster
        ray.shutdown()
    ray.init(address=ray_head.address, log_to_driver=False, namespace="prefixstudy")
    yield
    ray.shutdown()


def _failed_run(out: Path, *extra: str) -> tuple[Path, dict]:
    with pytest.raises(SystemExit) as done:
        main(["run", str(REPO / "prefixstudy/configs/default.yaml"), "--out", str(out), *ARGS, *extra])
    assert done.value.code == 1
    (run,) = (p.parent for p in out.rglob("manifest.json"))
    return run, json.loads((run / "manifest.json").read_text())


def _check_log(run: Path) -> None:
    log = (run / "engine-start.log").read_text()
    # The actor's own files from Ray's session logs, with vLLM's traceback from the engine core.
    assert re.fullmatch(r"==> /.+/session_[^/]+/logs/worker-[0-9a-f-]+\.(out|err) <==", log.splitlines()[0])
    assert CAUSE in log and "EngineCore" in log


@pytest.mark.engine
@pytest.mark.timeout(600)
def test_one_engine_that_did_not_start_names_its_root_cause(ray_cluster, tmp_path):
    run, man = _failed_run(tmp_path)
    assert man["status"] == "failed" and man["points"] == [] and man["error_log"] == "engine-start.log"
    assert man["error"] == (f"cache ON: the engine did not start (RuntimeError: Engine core initialization failed; "
                            f"root cause: {CAUSE}); its log: {run / 'engine-start.log'}")
    _check_log(run)


@pytest.mark.engine
@pytest.mark.timeout(600)
def test_a_replica_that_did_not_start_names_its_root_cause(ray_cluster, tmp_path):
    # A fleet: the replica's actor reads its own log, the generator's actor passes it on.
    parent, man = _failed_run(tmp_path, "--set", "replicas=2", "--set", "router.policies=[round_robin]")
    assert parent.name == "policy-round_robin" and man["status"] == "failed" and man["points"] == []
    assert man["error"] == (f"cache ON: the engine did not start (replica 0: RuntimeError: Engine core "
                            f"initialization failed; root cause: {CAUSE}); its log: {parent / 'engine-start.log'}")
    _check_log(parent)
