"""prefixstudy.costmodel.gpus: the datasheet table, device names, --gpus-file."""

from __future__ import annotations

import pytest
import yaml

from prefixstudy.errors import UserError
from prefixstudy.costmodel.gpus import find_gpu, get_gpu, load_gpus


def test_gpu_table_and_device_names():
    a100 = find_gpu("NVIDIA A100-SXM4-40GB")
    assert (a100.bf16_tflops, a100.hbm_gb_s, a100.link_gb_s, a100.memory_gb) == (312, 1555, 300, 40)
    assert find_gpu("NVIDIA H200").name == "H200-SXM"
    assert find_gpu("NVIDIA H100 80GB HBM3").name == "H100-SXM"
    assert find_gpu("h100-sxm").name == "H100-SXM"
    assert find_gpu("NVIDIA L40S").hbm_gb_s == 864
    assert find_gpu("NVIDIA H100 PCIe") is None
    assert find_gpu("cpu") is None
    with pytest.raises(UserError, match="unknown GPU"):
        get_gpu("B200")


def test_gpus_file_override_and_add(tmp_path):
    p = tmp_path / "gpus.yaml"
    p.write_text(yaml.safe_dump({
        "H100-SXM": {"hbm_gb_s": 3000},
        "RTX-4090": {"bf16_tflops": 165.2, "hbm_gb_s": 1008, "link_gb_s": 32, "memory_gb": 24,
                     "aliases": ["NVIDIA GeForce RTX 4090"]},
    }))
    table = load_gpus(p)
    assert table["H100-SXM"].hbm_gb_s == 3000 and table["H100-SXM"].bf16_tflops == 989
    assert find_gpu("NVIDIA GeForce RTX 4090", table).bf16_tflops == 165.2
    p.write_text(yaml.safe_dump({"X": {"bf16_tflops": 1}}))
    with pytest.raises(UserError, match="entry 'X', field 'hbm_gb_s'"):
        load_gpus(p)
