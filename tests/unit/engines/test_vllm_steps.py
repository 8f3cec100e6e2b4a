"""The step timer (engines.vllm_steps) driven the way vLLM 0.26's engine core drives a scheduler:
``EngineCore.step`` (one step at a time) and ``step_with_batch_queue`` (async scheduling, two
batches in flight, the worker in the engine core's thread as with ``UniProcExecutor``).  The clock
and the GPU are a model: a launch takes host time and the GPU runs a step's kernels as they are
launched, after the previous step's; no engine starts."""

from types import SimpleNamespace

import pytest

from prefixstudy.engines import step_log
from prefixstudy.engines.vllm import VllmEngineConfig, engine_args, step_timing_label

DECODE = dict(prefill=0, launch_ms=1.0, gpu_ms=5.0)
PREFILL = dict(prefill=1214, launch_ms=15.0, gpu_ms=20.0)  # a mixed step outside the full CUDA graphs


class Clock:
    def __init__(self):
        self.t = 0.0

    def monotonic(self):
        return self.t


class FakeScheduler:
    """Hands out the planned steps in order; one request per step, its prompt done when scheduled."""

    def __init__(self, plan):
        self.plan = list(plan)
        self.requests, self.running, self.waiting = {}, [], []
        self.kv_cache_manager = SimpleNamespace(usage=0.5)

    def has_requests(self):
        return bool(self.plan)

    def schedule(self, *args):
        kind = self.plan.pop(0)
        rid = f"r{len(self.requests)}"
        n = kind["prefill"] or 1
        self.requests[rid] = SimpleNamespace(num_computed_tokens=n + 1214 * (not kind["prefill"]),
                                             num_prompt_tokens=1214)
        return SimpleNamespace(num_scheduled_tokens={rid: n}, total_num_scheduled_tokens=n,
                               scheduled_new_reqs=[], kind=kind)

    def get_grammar_bitmask(self, out):
        return None

    def update_from_output(self, out, model_output):
        return {}


def Timed(plan):  # noqa: N802 - stands for the class
    """The step timer over FakeScheduler.  Made here, not at import: importing vllm_steps imports
    vLLM (about 12 s of CPU), and every test worker collects this file."""
    from prefixstudy.engines import vllm_steps

    class Timed(vllm_steps._StepTiming, FakeScheduler):
        pass

    return Timed(plan)


class Worker:
    """Host time for a launch; the GPU starts a step's kernels as they come, after the previous step's."""

    def __init__(self, clock):
        self.clock, self.gpu_free = clock, 0.0

    def execute(self, out):
        k = out.kind
        start = max(self.gpu_free, self.clock.t)
        self.clock.t += k["launch_ms"] / 1e3
        self.gpu_free = out.gpu_end = max(start + k["gpu_ms"] / 1e3, self.clock.t)

    def wait(self, out):
        self.clock.t = max(self.clock.t, out.gpu_end)


def sync_loop(sched, worker):
    """EngineCore.step: schedule, execute, wait for this step's output, update."""
    while sched.has_requests():
        out = sched.schedule()
        worker.execute(out)
        sched.get_grammar_bitmask(out)
        worker.wait(out)
        sched.update_from_output(out, None)


def batch_queue_loop(sched, worker):
    """EngineCore.step_with_batch_queue with max_concurrent_batches 2: schedule and launch N+1
    before waiting for N and updating from N's output."""
    queue = []
    while sched.has_requests() or queue:
        if sched.has_requests():
            out = sched.schedule()
            worker.execute(out)
            sched.get_grammar_bitmask(out)
            queue.insert(0, out)
            if len(queue) < 2 and sched.has_requests():
                continue
        done = queue.pop()
        worker.wait(done)
        sched.update_from_output(done, None)


def run(loop, monkeypatch, tmp_path, plan):
    clock = Clock()
    monkeypatch.setattr("prefixstudy.engines.vllm_steps.time", clock)
    log, trace = tmp_path / "steps.bin", tmp_path / "trace.bin"
    monkeypatch.setenv(step_log.ENV, str(log))
    monkeypatch.setenv(step_log.TRACE_ENV, str(trace))
    loop(Timed(plan), Worker(clock))
    steps, _ = step_log.read_steps(str(log))
    return [round((s.end_mono - s.start_mono) * 1e3, 6) for s in steps], [s.prefill_tokens for s in steps], \
        step_log.read_trace(str(trace))


PLAN = [DECODE, DECODE, PREFILL, DECODE, DECODE]


def test_one_step_at_a_time_each_record_is_its_own_launch_and_gpu_work(monkeypatch, tmp_path):
    ms, prefill, _ = run(sync_loop, monkeypatch, tmp_path, PLAN)
    assert prefill == [0, 0, 1214, 0, 0]
    assert ms == [5.0, 5.0, 20.0, 5.0, 5.0]  # the GPU runs a step's kernels while they are launched


def test_with_the_batch_queue_the_step_before_a_prefill_holds_its_launch(monkeypatch, tmp_path):
    """The mechanism of the shifted GPU records: decode step 2 is updated only after prefill 3 was
    scheduled and launched (15 ms of host time), while 3's GPU work ran under 2's record."""
    ms, prefill, _ = run(batch_queue_loop, monkeypatch, tmp_path, PLAN)
    assert prefill == [0, 0, 1214, 0, 0]
    assert ms == [5.0, 15.0, 10.0, 5.0, 5.0]
    assert ms[2] < ms[1]  # the invariant it breaks: a step computing prompt tokens measures shorter


def test_the_trace_shows_which_work_lands_between_two_records(monkeypatch, tmp_path):
    _, _, trace = run(batch_queue_loop, monkeypatch, tmp_path, PLAN)
    order = [(name, seq) for name, _, seq, _, _ in trace]
    assert order[:12] == [("schedule_start", 0), ("schedule_end", 0), ("executed", 0),
                          ("schedule_start", 1), ("schedule_end", 1), ("executed", 1),
                          ("update_start", 0), ("update_end", 0),
                          ("schedule_start", 2), ("schedule_end", 2), ("executed", 2),
                          ("update_start", 1)]
    t = {(name, seq): t for name, t, seq, _, _ in trace}
    assert t[("executed", 2)] - t[("schedule_end", 2)] == pytest.approx(0.015)  # prefill 3's launch ...
    assert t[("update_end", 1)] - t[("update_end", 0)] == pytest.approx(0.015)  # ... is decode 2's record
    assert [p for name, _, seq, p, _ in trace if name == "schedule_end"] == [0, 0, 1214, 0, 0]


def test_async_scheduling_is_left_to_vllm_unless_set_and_rows_say_how_they_were_timed():
    assert "async_scheduling" not in engine_args("m", VllmEngineConfig(), "on")  # vLLM's default engine
    assert engine_args("m", VllmEngineConfig(async_scheduling=False), "on")["async_scheduling"] is False
    assert engine_args("m", VllmEngineConfig(async_scheduling=True), "off")["async_scheduling"] is True
    assert (step_timing_label(False), step_timing_label(True)) == ("engine", "engine-async")
    assert step_timing_label(True, gpu_spans=True) == step_timing_label(False, gpu_spans=True) == "gpu-span"
    assert {"engine", "engine-async", "gpu-span"} <= set(step_log.TIMING_METHODS)


def test_a_trace_read_while_a_record_is_half_written_keeps_the_whole_ones(tmp_path):
    p = tmp_path / "t.bin"
    p.write_bytes(step_log.TRACE.pack(3, 1.5, 7, 0, 40) + step_log.TRACE.pack(4, 1.6, 7, 0, 40)[:10])
    assert step_log.read_trace(str(p)) == [("update_start", 1.5, 7, 0, 40)]
    assert step_log.read_trace(str(tmp_path / "none.bin")) == []


def test_a_report_of_an_async_run_says_why_it_has_no_step_fit():
    from prefixstudy.report.data import step_fit

    fit, notes = step_fit({"step_fit": None, "step_timing": ["engine-async"]})
    assert fit.empty and len(notes) == 1 and "async scheduling" in notes[0]
    assert step_fit({"step_fit": None, "step_timing": ["engine"]})[1][0].startswith("No step-cost fit: too few")


class FakeEvent:
    def __init__(self, t):
        self.t, self.synced = t, False

    def synchronize(self):
        self.synced = True

    def elapsed_time(self, other):
        return (other.t - self.t) * 1e3


def test_the_trace_gets_each_steps_gpu_span_when_asked(monkeypatch, tmp_path):
    """With the GPU timer on (step_log.GPU_SPANS_ENV) the scheduler takes each step's CUDA-event span
    (from engines.vllm_gpu_timer) once its output is in, and writes it into the step's record and
    as the trace's "gpu_span" event."""
    from prefixstudy.engines import vllm_gpu_timer

    monkeypatch.setenv(step_log.GPU_SPANS_ENV, "1")
    spans = iter([0.004, 0.006, 0.030, 0.005, 0.005])

    class SpannedWorker(Worker):
        def execute(self, out):
            super().execute(out)
            vllm_gpu_timer.SPANS[id(out)] = [FakeEvent(0.0), FakeEvent(next(spans))]

    clock = Clock()
    monkeypatch.setattr("prefixstudy.engines.vllm_steps.time", clock)
    monkeypatch.setenv(step_log.ENV, str(tmp_path / "steps.bin"))
    monkeypatch.setenv(step_log.TRACE_ENV, str(tmp_path / "trace.bin"))
    batch_queue_loop(Timed(PLAN), SpannedWorker(clock))
    gpu = [(seq, round(t * 1e3, 6), p) for name, t, seq, p, _ in step_log.read_trace(str(tmp_path / "trace.bin"))
           if name == "gpu_span"]
    assert gpu == [(0, 4.0, 0), (1, 6.0, 0), (2, 30.0, 1214), (3, 5.0, 0), (4, 5.0, 0)]
    # Each step's record carries the same span, beside its host stamps.
    steps, _ = step_log.read_steps(str(tmp_path / "steps.bin"))
    assert [(round(s.gpu_ms, 6), s.prefill_tokens) for s in steps] == [(4.0, 0), (6.0, 0), (30.0, 1214), (5.0, 0),
                                                                       (5.0, 0)]
    assert vllm_gpu_timer.SPANS == {}


def test_a_span_is_taken_once_and_only_for_a_step_the_executor_saw():
    from prefixstudy.engines.vllm_gpu_timer import SPANS, gpu_span_ms

    start, end = FakeEvent(1.0), FakeEvent(1.0125)
    SPANS[7] = [start, end]
    assert gpu_span_ms(7) == pytest.approx(12.5) and end.synced
    assert gpu_span_ms(7) is None
    SPANS[8] = [start, None]  # executed, never sampled
    assert gpu_span_ms(8) is None
