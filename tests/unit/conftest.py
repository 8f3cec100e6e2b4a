"""Fixtures of the cost model and model tests: the Mistral-7B architecture, 8 x A100 at peak, the CLI."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from prefixstudy.costmodel import roofline as m
from prefixstudy.costmodel.arch import Arch, load_arch
from prefixstudy.costmodel.gpus import get_gpu

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def mistral_dir() -> Path:
    """The Mistral-7B-v0.3 model folder (config.json), shipped in the package or under experiments/."""
    for p in (REPO / "prefixstudy/configs/models/mistral-7b-v0.3", REPO / "experiments/models/mistral-7b-v0.3"):
        if (p / "config.json").is_file():
            return p
    raise FileNotFoundError("mistral-7b-v0.3/config.json")


@pytest.fixture(scope="module")
def mistral(mistral_dir) -> Arch:
    return load_arch(mistral_dir)


@pytest.fixture(scope="module")
def a100x8(mistral) -> m.Deployment:
    return m.Deployment(mistral, get_gpu("A100-SXM4-40GB"), tp=8)  # PEAK efficiencies


@pytest.fixture
def model_cli():
    """``prefixstudy model ARGS`` through the main group, which turns a UserError into exit 2."""
    from prefixstudy.cli import main

    return lambda args: CliRunner().invoke(main, ["model", *args])
