"""Stage: cost model.  What an engine step costs, and the arithmetic behind it.

``engine_fit``: the step-cost fit over a study's busy steps (non-negative least squares) and what
it gives the headline.  ``step``: a step's terms.  ``step_cost``: the simulator's priced step
(``CostModel``), fitted from a study's steps.  ``roofline``: FLOPs and bytes of a step on ``tp``
GPUs.  ``transfer``: carrying a fit to another GPU, model or TP.  ``arch`` and ``gpus``: the
model's architecture and the GPU datasheets they read.

Metrics, ``prefixstudy model``, the closure model and the simulator call it; it reads no results.
"""
