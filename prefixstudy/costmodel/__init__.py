"""Stage: cost model.  What an engine step costs, the arithmetic behind it, and the fits that price it.

``roofline``: the one roofline: FLOPs, weight and KV bytes and all-reduces of a step, priced on ``tp``
GPUs by their datasheet.  ``transfer``: carrying a fit to another GPU, model or TP by that roofline.
``engine_fit``: the step-cost fit over a study's busy steps (non-negative least squares) and what it
gives the headline.  ``step``: a step's terms.  ``step_cost``: the simulator's priced step
(``CostModel``), fitted from a study's steps.  ``timestamp_fit``: the same price fitted to request
timestamps, a simulator inside.  ``roofline_fit``: the roofline's efficiencies fitted to a study.
``arch`` and ``gpus``: the model's architecture and the GPU datasheets they read.

Metrics, ``prefixstudy model``, the closure model and the simulator call it, handing it frames; it
reads no results folder.
"""
