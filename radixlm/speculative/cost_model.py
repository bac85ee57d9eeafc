"""StepCostModel: what a forward of R query rows costs, measured on this machine as it runs.

Whether a draft token pays depends on the hardware and the batch: on a GPU a few extra rows in a
small batch are nearly free; on a 2-core CPU each extra row of a 135M model costs ~25% of a
1-row decode step, and a batch of 8 decodes is already compute-bound. So the scheduler records
every decode and verify step's time (drafting + forward + sampling + acceptance) against its
number of rows, and the controller asks what R rows would cost.

Per row count the median of its last COST_WINDOW measurements (a GC pause or a noisy neighbour
moves it little); between measured counts a linear interpolation; past the largest, the
least-squares line through every count's median (never below the largest's own). The slope of the
two largest counts alone is noise where they are a row apart: one slow 36-row step would price 64
rows out, and drafts would never grow to be measured there. Before anything is measured the prior
(one unit + PRIOR_ROW_SHARE per extra row) leans towards drafting so that a verify step gets
measured; once measured, the figures decide.
"""

from __future__ import annotations

import bisect
import statistics
from collections import deque

COST_WINDOW = 9  # measurements kept per row count
PRIOR_ROW_SHARE = (
    0.25  # an extra row's cost, as a share of a 1-row step, before any verify was measured
)


class StepCostModel:
    def __init__(self):
        self._samples: dict[int, deque] = {}  # rows -> recent seconds
        self._avg: dict[int, float] = {}  # rows -> their median
        self._rows: list[int] = []  # sorted keys of _avg
        self._line: tuple[float, float, float] | None = (
            None  # (mean rows, mean seconds, slope); None: stale
        )

    def observe(self, rows: int, seconds: float) -> None:
        if rows <= 0 or seconds <= 0:
            return
        samples = self._samples.get(rows)
        if samples is None:
            bisect.insort(self._rows, rows)
            samples = self._samples[rows] = deque(maxlen=COST_WINDOW)
        samples.append(seconds)
        self._avg[rows] = statistics.median(samples)
        self._line = None

    def cost(self, rows: int) -> float:
        """Estimated seconds of a step of `rows` query rows (relative units before any
        measurement: only ratios matter to the caller)."""
        known, avg = self._rows, self._avg
        if not known:
            return 1.0 + PRIOR_ROW_SHARE * (rows - 1)
        if rows in avg:
            return avg[rows]
        i = bisect.bisect_left(known, rows)
        if 0 < i < len(known):  # between two measured counts
            lo, hi = known[i - 1], known[i]
            return avg[lo] + (avg[hi] - avg[lo]) * (rows - lo) / (hi - lo)
        if i == 0:  # below the smallest: scale down, a step never costs less than nothing
            lo = known[0]
            return (
                avg[lo] * max(rows, 1) / lo
                if len(known) == 1
                else max(
                    avg[lo] - self._slope(known[0], known[1]) * (lo - rows), avg[lo] * rows / lo
                )
            )
        top = known[-1]
        if len(known) == 1:
            return avg[top] * (1 + PRIOR_ROW_SHARE * (rows - top) / top)
        return max(self._fitted(rows), avg[top])

    def _fitted(self, rows: int) -> float:
        """The least-squares line through the measured medians, at `rows` (its slope never below 0).
        Fitted once per new measurement: the controller prices many row counts per step."""
        if self._line is None:
            xs, ys = self._rows, [self._avg[r] for r in self._rows]
            mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
            slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum(
                (x - mx) ** 2 for x in xs
            )
            self._line = (mx, my, max(slope, 0.0))
        mx, my, slope = self._line
        return my + slope * (rows - mx)

    def _slope(self, a: int, b: int) -> float:
        return (self._avg[b] - self._avg[a]) / (b - a)
