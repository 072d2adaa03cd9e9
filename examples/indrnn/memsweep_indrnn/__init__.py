"""memsweep-indrnn: the IndRNN cell (Li et al., CVPR 2018) as a memsweep plugin, registered by the entry
point `indrnn = "memsweep_indrnn:IndRNNCell"` in the group "memsweep.cells" (memsweep's
`trainers.plugins`)."""

from memsweep_indrnn.cell import IndRNNCell, IndRNNConfig

__all__ = ["IndRNNCell", "IndRNNConfig"]
