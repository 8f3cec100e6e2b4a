"""The GPU table the performance model (``prefixstudy.model``) reads its peaks from.

Every number is a datasheet peak, never a measurement.  Conventions:

* ``bf16_tflops``: dense BF16 tensor-core peak (the datasheets print the 2:4
  *sparse* number first, marked "*"; the dense one is half of it).  TFLOPS count
  two FLOPs per multiply-add, as NVIDIA does.
* ``hbm_gb_s``: memory bandwidth, GB/s (10^9 bytes/s).
* ``link_gb_s``: GPU-to-GPU bandwidth **per direction, per GPU**, GB/s.  NVIDIA
  quotes NVLink as the *total bidirectional* bandwidth of one GPU (A100: 600 GB/s
  = 12 links x 25 GB/s x 2 directions), so we halve it.  A ring all-reduce sends
  and receives at the same time, so the per-direction figure is its limit.
* ``memory_gb``: device memory, GB as printed on the datasheet.

A YAML file (``--gpus-file``) can add entries or override fields of built-in ones::

    H100-SXM:            # override one field of a built-in entry
      hbm_gb_s: 3000
    RTX-4090:            # a new entry needs every number
      bf16_tflops: 165.2
      hbm_gb_s: 1008
      link_gb_s: 32
      memory_gb: 24
      aliases: ["NVIDIA GeForce RTX 4090"]
      source: "my measurement"
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from prefixstudy.errors import UserError


class GPU(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    name: str
    bf16_tflops: float = Field(gt=0)  # dense
    hbm_gb_s: float = Field(gt=0)
    link_gb_s: float = Field(gt=0)  # per direction, per GPU
    memory_gb: float = Field(gt=0)
    aliases: tuple[str, ...] = ()  # torch.cuda.get_device_name() strings
    source: str = ""


BUILTIN_GPUS: dict[str, GPU] = {
    # NVIDIA A100 Tensor Core GPU datasheet (nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf):
    # BF16 312 TFLOPS (624 sparse), 40GB HBM2 1,555 GB/s, NVLink 600 GB/s (bidirectional).
    "A100-SXM4-40GB": GPU(
        name="A100-SXM4-40GB", bf16_tflops=312, hbm_gb_s=1555, link_gb_s=300, memory_gb=40,
        aliases=("NVIDIA A100-SXM4-40GB",), source="NVIDIA A100 datasheet",
    ),
    # Same datasheet: 80GB HBM2e 2,039 GB/s; compute and NVLink as the 40GB part.
    "A100-SXM4-80GB": GPU(
        name="A100-SXM4-80GB", bf16_tflops=312, hbm_gb_s=2039, link_gb_s=300, memory_gb=80,
        aliases=("NVIDIA A100-SXM4-80GB",), source="NVIDIA A100 datasheet",
    ),
    # NVIDIA H100 Tensor Core GPU datasheet, H100 SXM column: BF16 1,979 TFLOPS sparse
    # (989 dense), 80GB HBM3 3.35 TB/s, NVLink 900 GB/s (bidirectional).
    "H100-SXM": GPU(
        name="H100-SXM", bf16_tflops=989, hbm_gb_s=3350, link_gb_s=450, memory_gb=80,
        aliases=("NVIDIA H100 80GB HBM3",), source="NVIDIA H100 datasheet (SXM)",
    ),
    # NVIDIA H200 Tensor Core GPU datasheet, H200 SXM column: BF16 1,979 TFLOPS sparse
    # (989 dense), 141GB HBM3e 4.8 TB/s, NVLink 900 GB/s (bidirectional).
    "H200-SXM": GPU(
        name="H200-SXM", bf16_tflops=989, hbm_gb_s=4800, link_gb_s=450, memory_gb=141,
        aliases=("NVIDIA H200",), source="NVIDIA H200 datasheet (SXM)",
    ),
    # NVIDIA L40S datasheet: BF16 362.05 TFLOPS (733 sparse), 48GB GDDR6 864 GB/s,
    # no NVLink: PCIe Gen4 x16 64 GB/s bidirectional.
    "L40S": GPU(
        name="L40S", bf16_tflops=362.05, hbm_gb_s=864, link_gb_s=32, memory_gb=48,
        aliases=("NVIDIA L40S",), source="NVIDIA L40S datasheet (link = PCIe Gen4 x16)",
    ),
}


def _norm(name: str) -> str:
    """'NVIDIA A100-SXM4-40GB' and 'a100 sxm4 40gb' compare equal."""
    s = name.strip().lower()
    s = re.sub(r"^nvidia\s+", "", s)
    return re.sub(r"[\s_-]+", "", s)


def load_gpus(path: Path | None = None) -> dict[str, GPU]:
    """The built-in table, with a YAML file's entries merged over it."""
    table = dict(BUILTIN_GPUS)
    if path is None:
        return table
    from prefixstudy.config import read_yaml

    data = read_yaml(Path(path))
    if data is None:
        return table
    if not isinstance(data, dict):
        raise UserError(f"{path}: expected a mapping of GPU name -> fields, got {type(data).__name__}")
    for name, fields in data.items():
        if not isinstance(fields, dict):
            raise UserError(f"{path}: entry '{name}': expected a mapping of fields")
        base: dict[str, Any] = table[name].model_dump() if name in table else {}
        merged = {**base, **fields, "name": str(name)}
        try:
            table[str(name)] = GPU.model_validate(merged)
        except ValidationError as err:
            e = err.errors()[0]
            field = ".".join(str(x) for x in e["loc"])
            msg = "unknown key" if e["type"] == "extra_forbidden" else e["msg"]
            raise UserError(f"{path}: entry '{name}', field '{field}': {msg}") from None
    return table


def find_gpu(name: str, table: dict[str, GPU] | None = None) -> GPU | None:
    """The entry for a table key or a torch device name ('NVIDIA H200'), or None."""
    table = BUILTIN_GPUS if table is None else table
    want = _norm(name)
    for gpu in table.values():
        if want == _norm(gpu.name) or any(want == _norm(a) for a in gpu.aliases):
            return gpu
    return None


def get_gpu(name: str, table: dict[str, GPU] | None = None) -> GPU:
    """Like find_gpu, but an unknown name is a UserError listing the known ones."""
    gpu = find_gpu(name, table)
    if gpu is None:
        known = ", ".join(sorted((table or BUILTIN_GPUS).keys()))
        raise UserError(f"--gpu {name!r}: unknown GPU (known: {known}; add one with --gpus-file)")
    return gpu
