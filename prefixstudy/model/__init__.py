"""Stage: model.  First-principles arithmetic beside the measurement pipeline: what prefix
caching can save, and at what request rate cache OFF must saturate while ON need not.

No vLLM, torch or GPU.  One module per job; this package imports none of them:

* ``arch``: a Hugging Face ``config.json`` -> ``Arch`` (parameter counts, KV bytes per token).
* ``gpus``: the GPU datasheet table (``--gpus-file`` adds or overrides entries).
* ``roofline``: FLOPs and bytes of an engine step, its roofline time on ``tp`` GPUs,
  per-request predictions, the prefix saving and the rate ceilings.  Pure arithmetic.
* ``calibrate``: efficiencies fitted to a measured study and the per-point comparison
  the report shows (pandas; matplotlib for its figure).
* ``explain``: the text ``prefixstudy model`` prints (summary, ``--explain``).
"""
