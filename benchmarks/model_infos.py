"""What a vLLM cache root without ``modelinfos`` costs an engine's configuration: the reason the
test suite's xdist workers share one (tests/conftest.py, ``_share_model_infos``).

Each line configures the tiny Llama (``AsyncEngineArgs.create_engine_config``) in a fresh
interpreter with ``VLLM_CACHE_ROOT`` set: a new root (vLLM inspects the model class in a
subprocess that imports vLLM), the same root again (it reads the entry the first wrote), and a
second new root.  Printed: wall seconds of the configuration and CPU seconds of its children.

    python benchmarks/model_infos.py
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

CHILD = r"""
import os, resource, sys, time
os.environ["VLLM_CACHE_ROOT"] = sys.argv[1]
from vllm import AsyncEngineArgs
import prefixstudy
model = os.path.join(os.path.dirname(prefixstudy.__file__), "configs/models/tiny-llama")
t = time.monotonic()
AsyncEngineArgs(model=model, load_format="dummy", skip_tokenizer_init=True).create_engine_config()
c = resource.getrusage(resource.RUSAGE_CHILDREN)
print(f"RESULT {time.monotonic() - t:.2f} {c.ru_utime + c.ru_stime:.2f}")
"""


def configure(root: Path) -> str:
    r = subprocess.run([sys.executable, "-c", CHILD, str(root)], capture_output=True, text=True, check=True)
    (line,) = [ln for ln in r.stdout.splitlines() if ln.startswith("RESULT ")]  # vLLM prints too
    wall, cpu = line.split()[1:]
    return f"configure {wall} s wall, its subprocesses {cpu} CPU-s"


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        first, second = Path(tmp, "a"), Path(tmp, "b")
        print("new root:        ", configure(first))
        print("same root again: ", configure(first))
        print("another new root:", configure(second))


if __name__ == "__main__":
    main()
