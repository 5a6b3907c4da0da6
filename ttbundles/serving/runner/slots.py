"""Which request holds which device row (its *slot*), for its whole life.

A request takes a slot at its first prefill and keeps it until it finishes or is
preempted, so the generator's per-slot state (resident decode inputs, sampler seeds,
penalty history, RoPE deltas) stays attached to it. With in-process data-parallel lanes
the rows are `lane x per_lane + slot`: a request takes a row of its own lane only (the
lane coordinator places it), and a preempted request keeps its lane when it resumes.
"""

from __future__ import annotations

from collections.abc import Mapping


class SlotStates:
    """The slots of `capacity` device rows split evenly over `lanes`.

    `epoch` is bumped whenever a slot changes hands: what is cached per batch layout
    (`runner.step.Layout`) stays valid while it holds."""

    def __init__(self, capacity: int, lanes: int = 1):
        self.capacity = capacity
        self.lanes = lanes
        self.per_lane = capacity // lanes
        self.slot_of: dict[str, int] = {}
        self.lane_of: dict[str, int] = {}
        self._free = [
            list(range(lane * self.per_lane, (lane + 1) * self.per_lane)) for lane in range(lanes)
        ]
        self.epoch = 0

    def free_slots(self, lane: int = 0) -> list[int]:
        """The free rows of a lane, lowest first (a copy)."""
        return sorted(self._free[lane])

    def place(self, lanes: Mapping[str, int]) -> None:
        """Record the lane the coordinator placed each request in."""
        self.lane_of.update(lanes)

    def take(self, req_id: str) -> int | None:
        """Give `req_id` the lowest free row of its lane; None when it holds one already.

        Raises RuntimeError when its lane has no free row (the scheduler admitted more
        than `per_lane` requests to one lane: a bug upstream, not bad input)."""
        if req_id in self.slot_of:
            return None
        lane = self.lane_of.get(req_id, 0)
        free = self._free[lane]
        if not free:
            raise RuntimeError(
                f"no free decode slot for {req_id} in lane {lane} "
                f"({self.per_lane} per lane: max_num_seqs reached)"
            )
        free.sort()
        slot = free.pop(0)
        self.slot_of[req_id] = slot
        self.epoch += 1
        return slot

    def release(self, req_id: str) -> int | None:
        """Give `req_id`'s row back to its lane; the row released, or None if it held none.
        Its lane stays recorded (a preempted request resumes in it): see `forget`."""
        slot = self.slot_of.pop(req_id, None)
        if slot is not None:
            self._free[slot // self.per_lane].append(slot)
            self.epoch += 1
        return slot

    def forget(self, req_id: str) -> None:
        """A finished request: its lane is no longer recorded (its slot is released first)."""
        self.lane_of.pop(req_id, None)
