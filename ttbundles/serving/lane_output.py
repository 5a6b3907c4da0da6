"""What the lane coordinator and the runner share: the lane of each request a step
scheduled, riding on the scheduler's output itself.

With in-process lanes the engine runs the worker in its own process (the "uni" executor),
so the merged `SchedulerOutput` reaches the runner as the coordinator left it: the lanes
are attributes of that object. Here so that the runner reads them without importing the
coordinator (`serving.lanes`, which imports the scheduler and vLLM's engine parts).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from vllm.v1.core.sched.output import SchedulerOutput

_LANE_OUTPUTS = "_ttbundles_lane_outputs"
_LANE_OF = "_ttbundles_lane_of"


def mark_lanes(
    merged: SchedulerOutput, outputs: list[SchedulerOutput], placed: dict[str, int]
) -> None:
    """Attach each lane's own output and every scheduled request's lane to `merged`."""
    setattr(merged, _LANE_OUTPUTS, outputs)
    setattr(merged, _LANE_OF, placed)


def lane_of(scheduler_output: SchedulerOutput) -> dict[str, int] | None:
    """The lane of every request scheduled in a coordinator's step (None: no lanes).

    The one hand-off from the coordinator to the worker, riding on the output object
    itself: with lanes the engine runs the worker in its own process (the "uni"
    executor), so the object reaches it as it is.
    """
    return getattr(scheduler_output, _LANE_OF, None)


def lane_outputs(scheduler_output: SchedulerOutput) -> list[SchedulerOutput] | None:
    """Each lane's own output of a coordinator's step, in lane order."""
    return getattr(scheduler_output, _LANE_OUTPUTS, None)
