"""prefixstudy: how much vLLM's automatic prefix caching buys at each load, and why."""

__version__ = "0.1.0"


def load(results_dir):
    """Load a study's results for a notebook (see prefixstudy.results.load)."""
    from prefixstudy.results import load as _load

    return _load(results_dir)


def __getattr__(name):
    # EnginePool for notebooks and scripts that run several studies (see prefixstudy.engines.pool);
    # imported on use, so `import prefixstudy` stays light.
    if name == "EnginePool":
        from prefixstudy.engines.pool import EnginePool

        return EnginePool
    raise AttributeError(f"module 'prefixstudy' has no attribute {name!r}")
