"""memsweep-temporal-order: Hochreiter & Schmidhuber's temporal order problem (Neural Computation 1997,
§5.6, Experiment 6) as a memsweep task plugin, registered by the entry point
`temporal-order = "memsweep_temporal_order:TemporalOrderTask"` in the group "memsweep.tasks"."""

from memsweep_temporal_order.task import TemporalOrderConfig, TemporalOrderTask

__all__ = ["TemporalOrderConfig", "TemporalOrderTask"]
