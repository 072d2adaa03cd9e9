"""A name → constructor registry: `register`, `get`, `names`; unknown names list the valid ones."""

from __future__ import annotations

import sys
from collections.abc import Callable, Collection, Iterator
from pathlib import Path
from typing import Any, Generic, TypeVar

from search_spaces.space import did_you_mean

T = TypeVar("T")


class UnknownNameError(KeyError):
    """Raised for a name that is not registered; the message lists the valid names."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0])


class PluginError(UnknownNameError):
    """A name that belongs to a plugin that could not join its registry (`trainers.plugins`); the message
    says why."""


def where_plugins_are(what: str = "a plugin") -> str:
    """Where plugins are looked for, and how to install one there (for the message of a name not found)."""
    python = Path(sys.executable).name
    return (
        f"{what} is found in the Python environment that runs memsweep, {sys.prefix}: install it there, "
        f"`{python} -m pip install -e PATH`, or into a folder of its own put on the path, `{python} -m pip "
        "install --no-deps --upgrade --target DIR PATH` then `PYTHONPATH=DIR memsweep …` (docs/plugins.md); "
        "a process that was running when it was installed (`memsweep serve`) sees it once restarted"
    )


#: the registries that load plugins at their first look-up (`load_all_plugins` loads them all)
_PLUGGABLE: list[Registry[Any]] = []
#: what loads a pluggable registry's plugins (registry, kind, the class they must subclass): the one of
#: `trainers.plugins`, which imports the registries' modules and so is not imported by them; the package
#: (`trainers/__init__.py`) hands it in before any registry can be imported
PluginLoader = Callable[["Registry[Any]", str, type], None]
_loader: PluginLoader | None = None


def load_plugins_with(loader: PluginLoader) -> None:
    """Have every pluggable registry load its plugins with `loader`, once, at its first look-up."""
    global _loader
    _loader = loader


def load_all_plugins() -> None:
    """Every pluggable registry's plugins loaded (each once)."""
    for registry in _PLUGGABLE:
        registry._load_plugins()


class Registry(Generic[T]):
    """Maps names to components of one kind (tasks, cells, initialisers)."""

    def __init__(self, kind: str, plugins: type | None = None) -> None:
        """`plugins`: the class an installed plugin of this kind subclasses; given, the registry adds the
        installed plugins (`trainers.plugins`), once, when a name is first looked up — not at import, so
        that a plugin's own module may import memsweep before it is complete."""
        self.kind = kind
        self._items: dict[str, T] = {}
        self._refused: dict[str, str] = {}  # name → why (a plugin that could not join: trainers.plugins)
        self._plugins = plugins
        self.pluggable = plugins is not None
        if plugins is not None:
            _PLUGGABLE.append(self)

    def _load_plugins(self) -> None:
        if self._plugins is not None:
            if _loader is None:
                raise RuntimeError(
                    f"the {self.kind} registry has no plugin loader: import it through the trainers package, "
                    "whose __init__ hands in trainers.plugins.load"
                )
            base, self._plugins = self._plugins, None
            _loader(self, self.kind, base)

    def register(self, name: str) -> Callable[[T], T]:
        def add(item: T) -> T:
            if name in self._items:
                raise ValueError(f"{self.kind} {name!r} is registered twice")
            self._items[name] = item
            return item

        return add

    def refuse(self, name: str, why: str) -> None:
        """Remember that `name` is a plugin that could not join: `get` raises with `why`."""
        self._refused[name] = why

    def get(self, name: str) -> T:
        self._load_plugins()
        try:
            return self._items[name]
        except KeyError:
            if name in self._refused:
                raise PluginError(self._refused[name]) from None
            raise self.unknown(name) from None

    def unknown(self, name: str, also: Collection[str] = ()) -> UnknownNameError:
        """The error for `name`, which is none of this registry's: the nearest name of these and of `also`
        (what else the name could have meant where it was given, e.g. a preset's models), the valid names,
        and the plugins that could not join under theirs (left out of the valid names)."""
        refused = sorted(set(self._refused) - set(self._items))
        near = did_you_mean(name, [*self.names(), *refused, *also])
        hint = f" ({where_plugins_are(f'a plugin {self.kind}')})" if self.pluggable else ""
        return UnknownNameError(
            f"unknown {self.kind} {name!r}; {near + ' ' if near else ''}valid {self.kind}s: {', '.join(self.names())}"
            + (f" (refused: {', '.join(refused)} — see `memsweep plugins`)" if refused else "")
            + hint
        )

    def names(self) -> list[str]:
        self._load_plugins()
        return sorted(self._items)

    def __contains__(self, name: object) -> bool:
        self._load_plugins()
        return name in self._items

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())
