"""memsweep-temporal-order: Hochreiter & Schmidhuber's temporal order problem (Neural Computation 1997,
§5.6, Experiment 6) as a memsweep task plugin, registered by the entry point
`temporal-order = "memsweep_temporal_order:TemporalOrderTask"` in the group "memsweep.tasks"."""

from typing import Any

__all__ = ["TemporalOrderConfig", "TemporalOrderTask"]


def __getattr__(name: str) -> Any:
    """The classes while this package is still importing (below), for memsweep's registry."""
    if name in __all__:
        from memsweep_temporal_order import task

        return getattr(task, name)
    raise AttributeError(f"module 'memsweep_temporal_order' has no attribute {name!r}")


# memsweep's task registry first: importing it loads every plugin, this one included, and it asks this
# (partly imported) package for TemporalOrderTask, which `__getattr__` then gives. Imported the other
# way round, the registry would find no TemporalOrderTask here yet and mark the plugin broken.
import trainers.tasks  # noqa: E402, F401

from memsweep_temporal_order.task import TemporalOrderConfig, TemporalOrderTask  # noqa: E402
