"""Helpers that several stages use and that belong to none: statistics over repeats and blocks
(``bootstrap``), atomic file writes (``files``), naming this machine's packages and GPU
(``machine``).  They import nothing else of the package but ``errors`` and ``schema``."""
