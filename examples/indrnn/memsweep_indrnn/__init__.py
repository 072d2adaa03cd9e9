"""memsweep-indrnn: the IndRNN cell (Li et al., CVPR 2018) as a memsweep plugin, registered by the entry
point `indrnn = "memsweep_indrnn:IndRNNCell"` in the group "memsweep.cells" (memsweep's
`trainers.plugins`)."""

from typing import Any

__all__ = ["IndRNNCell", "IndRNNConfig"]


def __getattr__(name: str) -> Any:
    """The classes while this package is still importing (below), for memsweep's registry."""
    if name in __all__:
        from memsweep_indrnn import cell

        return getattr(cell, name)
    raise AttributeError(f"module 'memsweep_indrnn' has no attribute {name!r}")


# memsweep's cell registry first: importing it loads every plugin, this one included, and it asks this
# (partly imported) package for IndRNNCell, which `__getattr__` then gives. Imported the other way
# round, the registry would find no IndRNNCell here yet and mark the plugin broken.
import trainers.cells  # noqa: E402, F401

from memsweep_indrnn.cell import IndRNNCell, IndRNNConfig  # noqa: E402
