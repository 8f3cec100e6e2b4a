"""Stage: model.  First-principles arithmetic beside the measurement pipeline: what prefix
caching can save, and at what request rate cache OFF must saturate while ON need not.

No vLLM, torch or GPU.  One module per job; this package imports none of them.  The
arithmetic of a step (``arch``, ``gpus``, ``roofline``) lives in ``costmodel``:

* ``calibrate``: efficiencies fitted to a measured study and the per-point comparison
  the report shows (pandas; matplotlib for its figure).
* ``explain``: the text ``prefixstudy model`` prints (summary, ``--explain``).
"""
