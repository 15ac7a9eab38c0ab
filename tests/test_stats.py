"""fairseq_dnas.stats: the one mean ± standard error helper of every results table."""

import math

import pytest

from fairseq_dnas.stats import mean_se, mean_se_cell


def test_standard_error_is_the_sample_deviation_over_root_n():
    values = [1.0, 2.0, 4.0]
    mean, se = mean_se(values)
    sd = math.sqrt(sum((v - 7 / 3) ** 2 for v in values) / 2)  # ddof 1
    assert mean == pytest.approx(7 / 3) and se == pytest.approx(sd / math.sqrt(3))


def test_one_value_has_no_standard_error():
    assert math.isnan(mean_se([3.0])[1])
    assert mean_se([3.0], single=0.0) == (3.0, 0.0)
    with pytest.raises(ValueError):
        mean_se([])


def test_cells():
    assert mean_se_cell([1.0, 3.0]) == "2.00 ± 1.00"
    assert mean_se_cell([1.0, 3.0], digits=1, plus_minus="+-") == "2.0 +- 1.0"
    assert mean_se_cell([2.5], interval=(2.0, 3.0)) == "2.50 [2.00, 3.00]"
    assert mean_se_cell([2.5]) == "2.50"
