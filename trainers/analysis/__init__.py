"""Matrix-level analyses of recurrent networks (Orhan & Pitkow 2020), one module per analysis.

| module       | analysis                                                        | paper                    |
|--------------|-----------------------------------------------------------------|--------------------------|
| `henrici`    | departure from normality d(W), spectral radius                  | §3.2, Table 2            |
| `networks`   | the four initialisers' W with a scalar input v                  | §2.1, Fig. 1a, App. A    |
| `fisher`     | Fisher memory J(k), J_tot, transient amplification ‖Wᵏv‖²       | §2.1 eq. 1–4, Fig. 1b–c  |
| `decoding`   | linear decoding of s_1 from h_100 (R²)                          | §2.2, Fig. 2, App. A     |
| `profile`    | weight profile of units ordered by peak time                    | §3.2, Figs. 5–6          |
| `figures`    | the panels as PNG (matplotlib imported inside each function)    |                          |
| `cli`        | `python -m trainers analyze fisher|decode|henrici|profile`      |                          |

Everything here is torch only.
"""

from trainers.analysis.decoding import Decoding, decode_first_signal
from trainers.analysis.fisher import DivergentSeriesError, FisherMemory, fisher_memory, power_series
from trainers.analysis.henrici import henrici_index, spectral_radius
from trainers.analysis.networks import APPENDIX_A_SCALE, FIG1_SCALE, Network, activation, network
from trainers.analysis.profile import (
    ProfileStats,
    WeightProfile,
    mean_profile,
    network_profile,
    peak_order,
    pulse_response,
    weight_profile,
)

__all__ = [
    "APPENDIX_A_SCALE",
    "FIG1_SCALE",
    "Decoding",
    "DivergentSeriesError",
    "FisherMemory",
    "Network",
    "ProfileStats",
    "WeightProfile",
    "activation",
    "decode_first_signal",
    "fisher_memory",
    "henrici_index",
    "mean_profile",
    "network",
    "network_profile",
    "peak_order",
    "power_series",
    "pulse_response",
    "spectral_radius",
    "weight_profile",
]
