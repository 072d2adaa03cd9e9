"""The papers' search grids as data, and the space types (standard library only).

from search_spaces import get_preset, list_presets
space = get_preset("orhan2020-copy500")        # 2,112 trials: 462 + 462 + 594 + 594
"""

from __future__ import annotations

from search_spaces import emami2019, nru2019, orhan2020, sgornn2022, srnn2020
from search_spaces.space import (
    Dimension,
    IntRange,
    Model,
    SearchSpace,
    SpaceError,
    Uniform,
    Values,
    describe,
    did_you_mean,
    dim_from_dict,
    dim_to_dict,
)

PRESETS: dict[str, SearchSpace] = {}
for _module in (orhan2020, srnn2020, emami2019, nru2019, sgornn2022):
    for _space in _module.PRESETS:
        if _space.name in PRESETS:
            raise RuntimeError(f"preset {_space.name!r} is defined twice")
        PRESETS[_space.name] = _space


class UnknownPresetError(KeyError):
    def __str__(self) -> str:
        return str(self.args[0])


def get_preset(name: str) -> SearchSpace:
    try:
        return PRESETS[name]
    except KeyError:
        near = did_you_mean(name, PRESETS)
        raise UnknownPresetError(
            f"unknown preset {name!r}; {near + ' ' if near else ''}presets: {', '.join(list_presets())}"
        ) from None


def list_presets() -> list[str]:
    return sorted(PRESETS)


__all__ = [
    "PRESETS",
    "Dimension",
    "IntRange",
    "Model",
    "SearchSpace",
    "SpaceError",
    "Uniform",
    "UnknownPresetError",
    "Values",
    "describe",
    "dim_from_dict",
    "dim_to_dict",
    "get_preset",
    "list_presets",
]
