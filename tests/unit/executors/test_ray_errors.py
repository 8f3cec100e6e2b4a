"""A Ray error that is no task's or actor's (Ray's OutOfMemoryError on a busy machine) is one line
with what to do, not a traceback.  No cluster is started: the executor's run is handed the error."""

from __future__ import annotations

import pytest
from ray.exceptions import OutOfMemoryError, RayError

from prefixstudy.executors.run_plan import RunPlan
from prefixstudy.config import StudyConfig
from prefixstudy.errors import StudyFailed
from prefixstudy.executors import ray as ray_executor


class Sink:
    run_dir = None


@pytest.mark.parametrize("error, line", [
    (OutOfMemoryError("Task was killed due to the node running low on memory.\nMemory on the node (IP: 10.0.0.1) "
                      "where the task was running was 23.1GB / 24GB"),
     "Ray: OutOfMemoryError: Task was killed due to the node running low on memory.; run fewer engines side by "
     "side (--parallel off, or fewer replicas) or --executor local"),
    (RayError("The GCS went away.\nDetails follow"),
     "Ray: RayError: The GCS went away.; try again, or run with --executor local"),
])
def test_a_ray_error_of_its_own_is_one_line(monkeypatch, error, line):
    monkeypatch.setattr(ray_executor, "connect", lambda address, num_cpus=None: False)

    async def fails(self, rows, progress):
        raise error

    monkeypatch.setattr(ray_executor.RayExecutor, "_run", fails)
    cfg = StudyConfig.model_validate({"engine": {"kind": "echo"}})
    with pytest.raises(StudyFailed) as e:
        ray_executor.RayExecutor().run(cfg, RunPlan.whole(cfg), [], Sink(), progress=False)
    assert str(e.value) == line
