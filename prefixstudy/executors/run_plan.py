"""What one run of a cell still has to do, resolved from its config and what the run has
recorded: never part of the config, which stays what the user asked (``config.yaml``).

A fresh run's plan is every (rate, repeat) of ``sweep``; a resumed one's, the points still
missing or failed, and, where arms take turns, the (arm, rate, repeat) that some arm already has.
Executors run a plan; the manifest records it (``plan``) beside the points it produced.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from prefixstudy.config import StudyConfig


@dataclass(frozen=True)
class RunPlan:
    points: tuple[tuple[float, int], ...]  # (rate req/s, repeat), in the order they run
    done: frozenset[tuple[str, float, int]] = field(default_factory=frozenset)  # (arm, rate, repeat) kept

    @classmethod
    def whole(cls, cfg: StudyConfig) -> "RunPlan":
        return cls(tuple(cfg.sweep.points()))

    def turns(self, cfg: StudyConfig) -> list[tuple[str, float, int]]:
        """(arm, rate, repeat) in the order an interleaved run takes them: the arms in order where
        the rate's place in ``sweep.rates`` plus the repeat is even, reversed where odd.  Along a
        sweep that is A B, B A, A B, ...; and each rate's repeats alternate which arm goes first,
        so that the order within a pair can be told from the arm."""
        place = {rate: i for i, rate in enumerate(cfg.sweep.rates)}  # fixed by the config: a resumed run keeps it
        arms = cfg.sweep.modes
        out = []
        for rate, k in self.points:
            order = arms if (place.get(rate, 0) + k) % 2 == 0 else arms[::-1]
            out += [(m, rate, k) for m in order if (m, float(rate), k) not in self.done]
        return out

    def of(self, arm: str) -> list[tuple[float, int]]:
        """The (rate, repeat) ``arm`` runs, in order: the plan's points less those it has."""
        return [(r, k) for r, k in self.points if (arm, float(r), k) not in self.done]

    def requests(self, cfg: StudyConfig) -> int:
        """Requests the plan sends over every arm of ``cfg`` (the progress bar's total)."""
        return sum(cfg.sweep.requests_for(r, k) for m in cfg.sweep.modes for r, k in self.of(m))

    def record(self) -> dict:
        """The plan as the manifest keeps it."""
        return {"points": [[float(r), k] for r, k in self.points],
                "kept": sorted([m, float(r), k] for m, r, k in self.done)}
