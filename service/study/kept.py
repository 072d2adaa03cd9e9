"""Results a study's run could not write because its ledger did not answer (`TrialBook.kept`), kept on
this machine's disk until the study's next run writes them: a process that ends meanwhile (a restart, a
crash during the outage) loses none, and its next run here writes them instead of training them again.

    kept = KeptResults(home / "unwritten" / study_id)   # one file per config hash
    kept[config_hash] = result                          # written to disk at once, atomically
    for key, result in sorted(kept.items()): ...        # what an earlier process kept, too
    del kept[key]                                       # once the ledger took it

A result is pickled whole with `torch.save` (its trained W and V are tensors): these files are this
memsweep's own, read back by the same code, never a user's.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterator, MutableMapping
from pathlib import Path

import torch

import trainers

log = logging.getLogger(__name__)

SUFFIX = ".result.pt"


class KeptResults(MutableMapping[str, trainers.TrialResult]):
    """config hash → a result the ledger did not take, one file each under `folder` (made on the first
    result; removed once empty)."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder

    def _path(self, key: str) -> Path:
        if not key or not all(c.isalnum() or c in "-_" for c in key):
            raise KeyError(f"not a config hash: {key!r}")
        return self.folder / f"{key}{SUFFIX}"

    def __setitem__(self, key: str, result: trainers.TrialResult) -> None:
        path = self._path(key)
        self.folder.mkdir(parents=True, exist_ok=True)
        part = path.with_name(path.name + ".part")
        torch.save(result, part)
        os.replace(part, path)  # whole or absent: a crash while saving leaves no half result

    def __getitem__(self, key: str) -> trainers.TrialResult:
        path = self._path(key)
        try:
            result = torch.load(path, weights_only=False)
        except FileNotFoundError:
            raise KeyError(key) from None
        except Exception as exc:  # a file no result can be read from: set aside, said, and trained again
            aside = path.with_name(path.name + ".unreadable")
            os.replace(path, aside)
            log.warning(
                "a kept result could not be read (%s: %s); moved to %s", type(exc).__name__, exc, aside
            )
            raise KeyError(key) from None
        if not isinstance(result, trainers.TrialResult):
            raise KeyError(f"{path} holds no trial result")
        return result

    def __delitem__(self, key: str) -> None:
        try:
            self._path(key).unlink()
        except FileNotFoundError:
            raise KeyError(key) from None
        with contextlib.suppress(OSError):  # the study's folder goes with its last result
            self.folder.rmdir()

    def __iter__(self) -> Iterator[str]:
        if not self.folder.is_dir():
            return iter(())
        return iter(sorted(p.name[: -len(SUFFIX)] for p in self.folder.glob(f"*{SUFFIX}")))

    def __len__(self) -> int:
        return sum(1 for _ in self)
