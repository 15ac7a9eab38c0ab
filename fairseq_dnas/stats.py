"""Mean and standard error over seeds: the one helper behind every results
table (``fairseq_dnas.commands.seed_table`` and ``bleu_table``, the discrete
recipe's ``faithfulness_table.py``, ``arithmetic_table.py`` and
``translation_table.py``, and ``examples/masked_lm/experiment.py``).

Standard error = sample standard deviation (ddof 1) / sqrt(n), as the paper
reports over 5 runs. It needs two values: with one, ``mean_se`` returns
``single`` (nan unless the caller asks for something else) as the error, and
``mean_se_cell`` writes the mean alone or, when the caller has one, the run's
bootstrap interval instead (it says nothing about seed-to-seed variation).
Standard library only, so the table commands start fast.
"""

import math
from typing import Optional, Sequence, Tuple


def mean_se(values: Sequence[float], single: float = float("nan")) -> Tuple[float, float]:
    """(mean, standard error of the mean) of ``values``; the error is
    ``single`` when there is one value."""
    n = len(values)
    if n == 0:
        raise ValueError("mean_se of no values")
    mean = sum(values) / n
    if n < 2:
        return mean, single
    var = sum((v - mean) ** 2 for v in values) / (n - 1)  # ddof 1
    return mean, math.sqrt(var / n)


def mean_se_cell(values: Sequence[float], digits: int = 2, plus_minus: str = "±",
                 interval: Optional[Tuple[float, float]] = None) -> str:
    """A table cell: ``"mean ± se"`` for two or more values; for one value its
    ``interval`` as ``"mean [low, high]"`` if given, else the mean alone."""
    mean, se = mean_se(values)
    if len(values) == 1:
        if interval is not None:
            return f"{mean:.{digits}f} [{interval[0]:.{digits}f}, {interval[1]:.{digits}f}]"
        return f"{mean:.{digits}f}"
    return f"{mean:.{digits}f} {plus_minus} {se:.{digits}f}"
