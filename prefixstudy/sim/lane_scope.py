"""Stage: sim.  Which of vLLM's schedulers the decode lane (``sim.lane``) takes: those without a
feature whose per-step state the lane does not replay, or that decides by something the held
requests would change.  The rest run every step through vLLM's scheduler, as ``--stepwise`` does."""

from __future__ import annotations

# The vLLM releases on which the lane's async path has passed the bit-for-bit comparisons
# (tests/unit/sim/test_fast_path.py; benchmarks/lane_check.py runs them where pytest is missing:
# vLLM 0.26 in benchmarks/results/lane_check_vllm026_20261205.txt).  The AsyncScheduler's
# per-request bookkeeping changes between releases, so on any other release the lane declines an
# AsyncScheduler and every step goes through vLLM's scheduler.
ASYNC_CHECKED_RELEASES = ("0.26.", "0.32.")


def lane_scope(scheduler) -> tuple[object, bool] | None:
    """(the KV cache's one full-attention manager, whether the scheduler is vLLM's async one), or
    None where the lane must not take this scheduler."""
    from vllm.v1.core.sched.request_queue import SchedulingPolicy

    vc = scheduler.vllm_config
    coordinator = getattr(scheduler.kv_cache_manager, "coordinator", None)
    managers = getattr(coordinator, "single_type_managers", ())
    pipelined = bool(getattr(vc.scheduler_config, "async_scheduling", False))
    if pipelined:
        import vllm

        if not str(vllm.__version__).startswith(ASYNC_CHECKED_RELEASES):
            return None
    if (vc.speculative_config is not None or getattr(vc, "lora_config", None) is not None
            # a decode more than one step after the last (pipeline stages) the lane does not replay
            or (pipelined and getattr(scheduler, "use_v2_model_runner", False)
                and getattr(scheduler, "decode_stagger", 1) != 1)
            or getattr(vc.scheduler_config, "long_prefill_token_threshold", 0)
            or getattr(scheduler, "policy", SchedulingPolicy.FCFS) != SchedulingPolicy.FCFS
            or getattr(scheduler.kv_cache_manager, "watermark_blocks", 0)
            or any(getattr(scheduler, a, None) is not None
                   for a in ("connector", "ec_connector", "aux_output_connector"))
            or getattr(scheduler, "defer_block_free", False)
            or getattr(scheduler, "num_lookahead_tokens", 0)
            or not hasattr(scheduler, "max_num_scheduled_tokens")
            or len(managers) != 1 or type(managers[0]).__name__ != "FullAttentionManager"
            or managers[0].block_size < 2):  # a block of one token opens and fills at once
        return None
    return managers[0], pipelined
