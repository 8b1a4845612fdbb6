"""The profile's arithmetic on kernel intervals (no GPU needed)."""
import pytest

from pp4_worker.harness.profiling import covered_us


@pytest.mark.parametrize("intervals, covered", [
    ([], 0.0),
    ([(0, 2), (3, 5)], 4.0),                # plain stream order: gaps are not busy
    ([(0, 4), (3, 6)], 6.0),                # PDL: the second starts before the first ends
    ([(0, 10), (2, 3), (4, 12)], 12.0),     # one inside another, then one past both
    ([(5, 6), (0, 1)], 2.0),                # order of the input does not matter
])
def test_busy_time_counts_overlapping_kernels_once(intervals, covered):
    assert covered_us(intervals) == covered
