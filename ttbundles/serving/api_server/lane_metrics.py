"""Per-lane statistics on `/metrics`: requests running and waiting, KV cache usage.

vLLM's metrics are per engine; lanes live inside one engine, so their numbers need a way
from the engine-core process (where the lane coordinator counts them) to the API server
(where `/metrics` is served). They travel in the engine's own `SchedulerStats`, in its
one open-ended integer map (`num_kv_fetch_reqs_by_stage`, which vLLM reads only for the
KV-connector stages it knows), under `ttbundles:lane:<i>:<what>` keys. In the API server
`TTLaneStatLogger`, a vLLM stat-logger plugin (entry point `vllm.stat_logger_plugins`,
name `tt`), runs before vLLM's own loggers (plugins come first in vLLM's list), moves
those keys into Prometheus gauges labelled by lane, and removes them, so vLLM's loggers
see the stats exactly as they would without lanes.

Gauges (labels `model_name`, `engine`, `lane`):
`ttbundles:lane_num_requests_running`, `ttbundles:lane_num_requests_waiting`,
`ttbundles:lane_kv_cache_usage_perc` (0..1, like vLLM's `vllm:kv_cache_usage_perc`),
`ttbundles:lane_requests_assigned` (requests bound to the lane since the start: the
balance of the least-loaded assignment).

This module is imported by the API server (the plugin) and the engine core (the
encoding); the Prometheus and vLLM imports happen only when the logger is built.
"""

from __future__ import annotations

from typing import Any

PREFIX = "ttbundles:lane:"
_PPM = 1_000_000  # KV usage travels as an integer: parts per million


def encode_lane_stats(lanes: list[tuple[int, int, float, int]]) -> dict[str, int]:
    """`(running, waiting, kv_usage, assigned)` per lane as the integer map's entries."""
    encoded: dict[str, int] = {}
    for lane, (running, waiting, usage, assigned) in enumerate(lanes):
        encoded[f"{PREFIX}{lane}:running"] = int(running)
        encoded[f"{PREFIX}{lane}:waiting"] = int(waiting)
        encoded[f"{PREFIX}{lane}:kv_usage_ppm"] = round(usage * _PPM)
        encoded[f"{PREFIX}{lane}:assigned"] = int(assigned)
    return encoded


def take_lane_stats(values: dict[str, int]) -> dict[int, dict[str, float]]:
    """Remove the lane entries from `values`; `{lane: {running, waiting, kv_usage}}`."""
    lanes: dict[int, dict[str, float]] = {}
    for key in [k for k in values if k.startswith(PREFIX)]:
        lane_text, _, what = key[len(PREFIX) :].partition(":")
        value = values.pop(key)
        if not lane_text.isdigit():
            continue
        entry = lanes.setdefault(int(lane_text), {})
        if what == "kv_usage_ppm":
            entry["kv_usage"] = value / _PPM
        elif what in ("running", "waiting", "assigned"):
            entry[what] = float(value)
    return lanes


def _logger_class() -> type:
    """Build the stat-logger class on first use (vLLM and prometheus_client are loaded
    by then: only vLLM's AsyncLLM asks for stat-logger plugins)."""
    import prometheus_client
    from vllm.v1.metrics.loggers import StatLoggerBase

    gauges: dict[str, Any] = {}

    def gauge(name: str, documentation: str) -> Any:
        if name not in gauges:
            # "mostrecent": with several API server processes (prometheus multiprocess
            # mode) the newest value wins, as for vLLM's own gauges.
            gauges[name] = prometheus_client.Gauge(
                name,
                documentation,
                labelnames=["model_name", "engine", "lane"],
                multiprocess_mode="mostrecent",
            )
        return gauges[name]

    class TTLaneStatLogger(StatLoggerBase):
        """Moves the lane coordinator's per-lane numbers into Prometheus gauges."""

        def __init__(self, vllm_config: Any, engine_index: int = 0):
            self.engine_index = engine_index
            self.model_name = str(getattr(vllm_config.model_config, "served_model_name", ""))
            self.running = gauge(
                "ttbundles:lane_num_requests_running",
                "Requests running in each in-process data-parallel lane.",
            )
            self.waiting = gauge(
                "ttbundles:lane_num_requests_waiting",
                "Requests waiting in each in-process data-parallel lane.",
            )
            self.usage = gauge(
                "ttbundles:lane_kv_cache_usage_perc",
                "KV cache usage of each in-process data-parallel lane (1 = full).",
            )
            self.assigned = gauge(
                "ttbundles:lane_requests_assigned",
                "Requests bound to each in-process data-parallel lane since the start.",
            )

        def record(
            self,
            scheduler_stats: Any,
            iteration_stats: Any,
            mm_cache_stats: Any = None,
            engine_idx: int = 0,
        ) -> None:
            if scheduler_stats is None:
                return
            lanes = take_lane_stats(scheduler_stats.num_kv_fetch_reqs_by_stage)
            for lane, values in lanes.items():
                labels = (self.model_name, str(engine_idx), str(lane))
                self.running.labels(*labels).set(values.get("running", 0))
                self.waiting.labels(*labels).set(values.get("waiting", 0))
                self.usage.labels(*labels).set(values.get("kv_usage", 0.0))
                self.assigned.labels(*labels).set(values.get("assigned", 0))

        def log_engine_initialized(self) -> None:
            return

    return TTLaneStatLogger


_CLASS: type | None = None


def __getattr__(name: str) -> Any:
    """`TTLaneStatLogger`, built lazily so importing this module stays cheap (the
    engine core imports it for `encode_lane_stats`)."""
    global _CLASS
    if name == "TTLaneStatLogger":
        if _CLASS is None:
            _CLASS = _logger_class()
        return _CLASS
    raise AttributeError(name)
