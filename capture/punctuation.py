"""Timer-driven punctuation of one link, as Gigascope generates it (thesis 8.1).

Every timer period (one second by default) a link's punctuation advances to the largest
capture time seen on it (the input of a link is taken as ordered; packets older than that
arriving later are late and counted by the low level) and, during a lull, to `clock - slack`,
so windows close on a silent link too. The clock is the run's:

- a replay at full speed (`--speed max`): the data clock, i.e. the capture time up to which
  every link has been read (the smallest next-packet time over the links still reading);
- a paced replay (`--speed N`): capture time advancing N times as fast as the wall clock;
- live capture: the wall clock (kernel timestamps are wall-clock times).

A link that punctuates itself (`source`: a NETFLOW link, `capture.flowreader`) gives its own
value at each tick instead.

Values are aligned down to the smallest window slide of the link's queries (a punctuation
between two window ends closes nothing more than the end below it) and never repeated.
"""

from __future__ import annotations

from common.units import NS_PER_S as NS


def align_down(t: int, step: int) -> int:
    return t - t % step if step > 0 else t


def next_tick(now_ns: int, period_ns: int, margin_ns: int = 0) -> int:
    """The wall-clock time of a link's next timer tick: `margin_ns` after the next multiple
    of the period. A window whose end is a whole number of periods is then closed by the
    first tick after its end, once a packet past the end has been taken (the margin: how
    long the link may take to hand it over); ticks a period after the last one, whatever
    their phase, closed it up to a period later (half a period on average)."""
    if period_ns <= 0:
        return now_ns
    return ((now_ns - margin_ns) // period_ns + 1) * period_ns + margin_ns


def tick_due(now_ns: int, planned_ns: int, period_ns: int) -> bool:
    """Whether the tick planned at `planned_ns` is due: its time has come, or the wall clock
    was set back by more than a period (ticks would otherwise stop until it caught up)."""
    return now_ns >= planned_ns or planned_ns - now_ns > period_ns


class LinkTimer:
    """The punctuation state of one link: largest capture time seen, last value emitted."""

    def __init__(self, step_ns: int = 0, slack_ns: int = NS):
        if slack_ns < 0:
            raise ValueError("the lull slack must not be negative")
        self.step = int(step_ns)
        self.slack = int(slack_ns)
        self.max_seen: int | None = None
        self.last: int | None = None
        self.count = 0
        #: a link that punctuates itself (a NETFLOW link's meld of exporters): its
        #: punctuation, asked at each tick, replaces the largest time seen and the lull's
        #: clock (its records come disordered; its lull is its own)
        self.source = None

    def observe(self, batch_max: int) -> None:
        """Record the largest capture time of a batch just handed to the low level."""
        if self.max_seen is None or batch_max > self.max_seen:
            self.max_seen = int(batch_max)

    def candidate(self, clock_ns: int | None) -> int | None:
        """The punctuation the link could give now (None before it has any time at all)."""
        if self.source is not None:
            p = self.source()
            return None if p is None else align_down(p, self.step)
        values = [v for v in (self.max_seen,
                              None if clock_ns is None else clock_ns - self.slack)
                  if v is not None]
        if not values:
            return None
        return align_down(max(values), self.step)

    def fire(self, clock_ns: int | None) -> int | None:
        """The punctuation to emit at a timer tick, or None when it would not advance."""
        p = self.candidate(clock_ns)
        if p is None or (self.last is not None and p <= self.last):
            return None
        self.last = p
        self.count += 1
        return p
