"""The vLLM backend's checks before any engine starts: the internals prefixstudy reads, and its
engine arguments.  Imports vLLM (seconds), starts nothing."""

import pytest

from prefixstudy.config import load_config
from prefixstudy.study.preflight import check_engine_config
from prefixstudy.engines.vllm import engine_args, missing_internals
from prefixstudy.errors import UserError


@pytest.mark.slow
def test_the_installed_vllm_has_every_internal_we_read():
    assert missing_internals() == []


@pytest.mark.slow
def test_an_unsupported_vllm_is_one_line_naming_what_is_missing(monkeypatch):
    import vllm.outputs
    from vllm.v1.metrics import stats

    class OldOutput:  # a RequestOutput from before num_cached_tokens
        def __init__(self, request_id, prompt, outputs):
            pass

    # Every module the check imports is loaded first, as in a process that ran an engine: patched
    # afterwards, each of them still imports (async_llm imports RequestStateStats by name).
    assert missing_internals() == []
    monkeypatch.setattr(vllm.outputs, "RequestOutput", OldOutput)
    monkeypatch.delattr(stats, "RequestStateStats")
    assert missing_internals() == ["vllm.v1.metrics.stats.RequestStateStats", "RequestOutput.num_cached_tokens"]
    with pytest.raises(UserError, match=r"^vllm 0\.32\.0 is not supported \(supported: >=0\.26\.0,<0\.33\): missing "
                                        r"vllm\.v1\.metrics\.stats\.RequestStateStats, RequestOutput\.num_cached_tokens$"):
        check_engine_config(load_config(None))


def test_the_modes_differ_only_in_prefix_caching():
    cfg = load_config(None, {"engine.kv_cache_memory_bytes": 2**29, "engine.block_size": 128})
    on, off = engine_args(cfg.model, cfg.engine, "on"), engine_args(cfg.model, cfg.engine, "off")
    assert {k for k in on if on[k] != off[k]} == {"enable_prefix_caching"}
    assert (on["enable_prefix_caching"], off["enable_prefix_caching"]) == (True, False)
    assert (on["kv_cache_memory_bytes"], on["block_size"], on["disable_log_stats"]) == (2**29, 128, False)

