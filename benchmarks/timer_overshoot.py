"""How late a long timer sleep wakes: plain ``asyncio.sleep`` vs the runner's ``_sleep_until``, in
this process's asyncio loop and in a Ray async actor (which runs uvloop).

At 1 req/s, Poisson gaps of 2-5 s occur; a sleep that overshoots in proportion to its length
sends those requests late.  Not a test: shared machines are noisy.  Reports the median and the
maximum overshoot in ms per sleep length, over ``--repeats`` sleeps.

    python benchmarks/timer_overshoot.py              # local loop and a Ray actor
    python benchmarks/timer_overshoot.py --no-ray
"""

from __future__ import annotations

import argparse
import asyncio
import platform
import statistics
import time

from prefixstudy.runner.pacing import _sleep_until

LENGTHS_S = (0.05, 0.5, 2.0, 4.5)


async def overshoot(lengths, repeats: int) -> dict:
    out = {}
    for kind in ("asyncio.sleep", "_sleep_until"):
        for length in lengths:
            late = []
            for _ in range(repeats):
                t0 = time.monotonic()
                if kind == "asyncio.sleep":
                    await asyncio.sleep(length)
                else:
                    await _sleep_until(t0 + length)
                late.append((time.monotonic() - t0 - length) * 1e3)
            out[(kind, length)] = (statistics.median(late), max(late))
    return out


def show(where: str, res: dict) -> None:
    for (kind, length), (med, worst) in res.items():
        print(f"{where:>10}  {kind:<14} {length:5.2f} s   median {med:7.3f} ms   max {worst:7.3f} ms")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--no-ray", action="store_true")
    a = ap.parse_args()
    print(f"# {platform.node()} {platform.python_version()} {platform.machine()}")
    show("local", asyncio.run(overshoot(LENGTHS_S, a.repeats)))
    if not a.no_ray:
        import ray

        @ray.remote
        class Sleeper:
            async def run(self, lengths, repeats):
                return type(asyncio.get_running_loop()).__module__, await overshoot(lengths, repeats)

        ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False)
        loop_kind, res = ray.get(Sleeper.remote().run.remote(LENGTHS_S, a.repeats))
        show(f"ray actor ({loop_kind})", res)
        ray.shutdown()


if __name__ == "__main__":
    main()
