"""The Gumbel-softmax temperature tau of the discrete attention: its check
and its annealing schedule (J. Kinley, 2020, Section 3.3; tau = 1 in
Section 5.3). Nothing here imports torch or fairseq."""

import math
from typing import Sequence


def check_temperature(tau) -> None:
    """ValueError naming --gumbel-temperature unless tau is a finite number > 0."""
    ok = isinstance(tau, (int, float)) and not isinstance(tau, bool) and math.isfinite(tau) and tau > 0
    if not ok:
        raise ValueError(
            f"--gumbel-temperature must be a finite number > 0 (the thesis uses 1); got {tau!r}"
        )


class GumbelSchedule:
    """Temperature annealing, geometric: tau(n) = start * (end / start) ** (min(n, updates) / updates).

    The thesis keeps tau = 1 (Section 5.3) but names the usual practice of
    starting high and annealing low (Section 3.3); a geometric decay moves
    tau by the same factor per update (as Jang et al. anneal exponentially)
    and stays at ``end`` after ``updates`` updates.
    """

    def __init__(self, start: float, end: float, updates: int):
        for name, value in (("START", start), ("END", end)):
            try:
                check_temperature(value)
            except ValueError:
                raise ValueError(
                    f"--gumbel-anneal START,END,UPDATES: {name} must be a finite number > 0; got {value!r}"
                ) from None
        if isinstance(updates, bool) or not isinstance(updates, int) or updates < 1:
            raise ValueError(f"--gumbel-anneal START,END,UPDATES: UPDATES must be an integer >= 1; got {updates!r}")
        self.start, self.end, self.updates = float(start), float(end), updates

    @classmethod
    def parse(cls, spec: str) -> "GumbelSchedule":
        """'START,END,UPDATES', e.g. '2,0.5,10000'."""
        parts: Sequence[str] = [p.strip() for p in str(spec).split(",")]
        if len(parts) != 3:
            raise ValueError(f"--gumbel-anneal takes START,END,UPDATES (e.g. 2,0.5,10000); got {spec!r}")
        try:
            start, end = float(parts[0]), float(parts[1])
            updates = int(parts[2])
        except ValueError:
            raise ValueError(
                f"--gumbel-anneal takes START,END,UPDATES as two numbers and an integer (e.g. 2,0.5,10000); got {spec!r}"
            ) from None
        return cls(start, end, updates)

    def __call__(self, num_updates: int) -> float:
        frac = min(max(num_updates, 0), self.updates) / self.updates
        return self.start * (self.end / self.start) ** frac

    def __repr__(self):
        return f"GumbelSchedule({self.start:g}, {self.end:g}, {self.updates})"
