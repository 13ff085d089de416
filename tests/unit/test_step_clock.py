"""The step log line's ETA and data wait (`runtime.step_clock`), on a fake clock
(`tests/distributed/test_cli.py`: the same in a real 2-process run)."""

from __future__ import annotations

import logging

import pytest

from boost_titan.runtime import step_clock
from boost_titan.runtime.step_clock import StepClock, appended, duration


class FakeTime:
    def __init__(self):
        self.now = 100.0

    def perf_counter(self) -> float:
        return self.now


@pytest.fixture
def clock_time(monkeypatch) -> FakeTime:
    fake = FakeTime()
    monkeypatch.setattr(step_clock.time, "perf_counter", fake.perf_counter)
    return fake


def test_duration():
    assert [duration(s) for s in (0.4, 59, 60, 725, 3600, 11220, 86400 + 4 * 3600 + 59)] == [
        "0 s",
        "59 s",
        "1m00s",
        "12m05s",
        "1h00m",
        "3h07m",
        "1d04h",
    ]


def test_eta_is_the_median_recent_step_times_the_steps_left(clock_time):
    """Steps of 2, 2 and 30 s (a checkpoint save): the median, 2 s, times the 7 steps left
    after step 3; before any step ended, the current step so far."""
    clock = StepClock(total_steps=10)
    clock.start()
    clock_time.now += 2
    assert clock.tail(1).startswith("eta 18 s (2 s/step x 9 steps)")
    clock.start()  # step 2: the first one took 2 s
    for seconds in (2, 30):
        clock_time.now += seconds
        clock.start()
    clock_time.now += 1
    assert clock.tail(3).startswith("eta 14 s (2 s/step x 7 steps)")


def test_data_wait_is_the_time_in_next(clock_time):
    """`waiting` adds the time each `next()` takes to the step's wait (not the time the
    consumer spends between items); the step line shows it and its share of the step, the
    summary line the run's."""

    def batches():
        for i in range(4):
            clock_time.now += 0.01  # the loader's work
            yield i

    clock = StepClock(total_steps=2)
    source = batches()
    for _ in range(2):
        clock.start()
        items = clock.waiting(source)
        for _ in range(2):
            next(items)
            clock_time.now += 0.99  # training on the batch
        assert clock.wait == pytest.approx(0.02)
        assert clock.tail(1).endswith("data wait 20.0 ms (1.0%)")
    assert clock.waits == pytest.approx([0.02])  # the second step is still open
    clock.close()
    assert clock.waits == pytest.approx([0.02, 0.02])
    assert clock.wait_line() == "waited for data 0.04 s over 2 steps (1.0% of step time)"


def test_appended_reaches_the_one_line_logged_inside():
    logger = logging.getLogger("test_step_clock")
    seen: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: seen.append(record.getMessage())
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        with appended(logger, "eta 5 s"):
            logger.info("step: %d  loss: %.1f", 3, 2.5)
        logger.info("after")
    finally:
        logger.removeHandler(handler)
    assert seen == ["step: 3  loss: 2.5  eta 5 s", "after"]


def test_eta_leaves_out_the_first_step_once_another_is_timed(clock_time):
    """A first step of 9 s (compilation) then steps of 3.5 s: from the second step's line on,
    the ETA is 3.5 s per step (it was 9, 9 and 6.25 s/step up to step 3)."""
    clock = StepClock(total_steps=100)
    clock.start()
    clock_time.now += 9
    assert clock.tail(1).startswith("eta 14m51s (9 s/step x 99 steps)")  # all it knows
    for step in (2, 3, 4):
        clock.start()
        clock_time.now += 3.5
        assert f"(3.5 s/step x {100 - step} steps)" in clock.tail(step), step
