"""Stage: workloads.  What is sent: ``load_rows(cfg)`` builds the one list of ``DatasetRow`` that
every mode and rate of a study replays, from the workload that ``dataset.kind`` names, and checks
it against the model (token ids < vocab size, prompt + output <= max_model_len).

A new workload is one file here with a function ``rows(cfg, vocab_size) -> (rows, source)`` and
one entry in ``WORKLOADS`` (and its kind in ``config.DatasetConfig``)."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from prefixstudy.workloads.base import DatasetRow, describe, validate

if TYPE_CHECKING:
    from prefixstudy.config import StudyConfig

__all__ = ["DatasetRow", "WORKLOADS", "describe", "load_rows"]


# kind -> the module whose ``rows(cfg, vocab_size) -> (rows, source)`` builds it.
WORKLOADS = {"fixed": "prefixstudy.workloads.fixed", "jsonl": "prefixstudy.workloads.jsonl",
             "groups": "prefixstudy.workloads.groups", "sessions": "prefixstudy.workloads.sessions",
             "trace": "prefixstudy.workloads.trace"}


def load_rows(cfg: "StudyConfig") -> list[DatasetRow]:
    """The one dataset every mode and rate replays, checked against the model."""
    vocab = cfg.model_config_json()["vocab_size"]
    rows, source = importlib.import_module(WORKLOADS[cfg.dataset.kind]).rows(cfg, vocab)
    validate(rows, vocab, cfg.engine.max_model_len, source)
    return rows
