"""What a finished trial measured, as the attributes the trial record stores: a trainer run's
epochs (its step phases, memory, throughput, GPU use), or a Ray Tune trial's last result."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from hpo import record


def tune_result_attrs(
    result: Mapping[str, Any] | None, epochs_done: int, error: bool, ranks: int = 1
) -> dict[str, Any]:
    """The attributes of a finished Ray Tune trial, from its last result (both Ray recorders);
    its measurements are its last epoch's. ``ranks``: the trial's processes (DDP workers)."""
    attrs: dict[str, Any] = {
        record.ATTR_FINISHED_AT: record.now_iso(),
        record.ATTR_EPOCHS_COMPLETED: epochs_done,
    }
    if result:
        attrs[record.ATTR_NODES] = result.get("node", "")
        attrs[record.ATTR_ELAPSED_S] = round(float(result.get("time_total_s", 0.0)), 3)
        attrs[record.ATTR_IMAGES_PER_S] = result.get("images_per_s")
        if result.get("test_accuracy") is not None:
            attrs[record.ATTR_TEST_ACCURACY] = result["test_accuracy"]
        if "epoch" in result and "step" in result and "images_per_s" in result:
            attrs.update(measurement_attrs([result], ranks))
    if error:
        attrs[record.ATTR_FAIL_REASON] = "the Tune trial raised an error (see its log under ray_results)"
    return attrs


def measurement_attrs(epochs: Sequence[Mapping[str, Any]], world_size: int) -> dict[str, Any]:
    """The measurement attributes of a trainer trial, from its epochs' metrics (``EpochMetrics``
    as dicts; epochs without the step phases, written by an older trainer, are left out)."""
    measured = [m for m in epochs if m.get("data_time_s") is not None]
    attrs: dict[str, Any] = {}
    if not measured:
        return attrs
    phases = ("data", "forward", "backward", "optimizer")
    seconds = {p: sum(float(m.get(f"{p}_time_s") or 0.0) for m in measured) for p in phases}
    total = sum(seconds.values())
    if total > 0:
        attrs[record.ATTR_DATA_WAIT_SHARE] = round(seconds["data"] / total, 4)
    # Every epoch of a run has the same number of steps.
    steps = sum(int(m["step"]) // max(1, int(m["epoch"])) for m in measured)
    if steps > 0:
        attrs[record.ATTR_STEP_MS] = {p: round(1000 * seconds[p] / steps, 3) for p in phases}
    peaks = [int(m["peak_memory_bytes"]) for m in measured if m.get("peak_memory_bytes") is not None]
    if peaks:
        attrs[record.ATTR_PEAK_MEMORY_MIB] = round(max(peaks) / 2**20, 1)
    attrs[record.ATTR_IMAGES_PER_S_PER_GPU] = round(
        sum(float(m["images_per_s"]) for m in measured) / len(measured) / max(1, world_size), 1
    )
    utilization = [float(m["gpu_utilization"]) for m in measured if m.get("gpu_utilization") is not None]
    if utilization:
        attrs[record.ATTR_GPU_UTILIZATION] = round(sum(utilization) / len(utilization), 1)
    return attrs
