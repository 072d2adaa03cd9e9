"""Results a study's run could not write because its ledger did not answer (`TrialBook.kept`), kept on
this machine's disk until the study's next run writes them: a process that ends meanwhile (a restart, a
crash during the outage) loses none, and its next run here writes them instead of training them again.

    kept = KeptResults(home / "unwritten" / study_id)   # one file per config hash
    kept[config_hash] = result                          # written to disk at once, atomically
    for key in sorted(kept): result = kept.get(key)     # what an earlier process kept, too
    del kept[key]                                       # once the ledger took it

A file holds a result's recorded fields (`TrialResult.to_dict`) and its trained W and V, saved with
`torch.save` and read back with `weights_only`: a result of a memsweep whose record has gained a field
since reads with that field's default. A file that cannot be read as one is set aside (`.unreadable`,
said in the log) and its trial trains again. A disk that refuses the file (full, read-only) keeps the
result in this process's memory instead, as before there was a disk.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
from collections.abc import Iterator, MutableMapping
from pathlib import Path
from typing import Any

import torch

import trainers
from trainers.result import Evaluation

log = logging.getLogger(__name__)

SUFFIX = ".result.pt"
FIELDS = {f.name for f in dataclasses.fields(trainers.TrialResult)}


def packed(result: trainers.TrialResult) -> dict[str, Any]:
    """What a file holds: the recorded fields as JSON (floats exact, a torch version a plain string) and
    the tensors W and V."""
    fields = json.dumps(result.to_dict(), default=str)
    return {"fields": fields, "W": result.recurrent_matrix, "V": result.input_matrix}


def unpacked(data: Any) -> trainers.TrialResult:
    """The result a file held; ValueError when it holds none."""
    record = (
        json.loads(data["fields"]) if isinstance(data, dict) and isinstance(data.get("fields"), str) else None
    )
    if not isinstance(record, dict):
        raise ValueError("no trial result in it")
    fields = {k: v for k, v in record.items() if k in FIELDS and k != "history"}
    history = [Evaluation.from_dict(e) for e in record.get("history") or []]
    return trainers.TrialResult(
        **fields, history=history, recurrent_matrix=data.get("W"), input_matrix=data.get("V")
    )


class KeptResults(MutableMapping[str, trainers.TrialResult]):
    """config hash → a result the ledger did not take, one file each under `folder` (made on the first
    result; removed once empty), or in memory where the disk refused it."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.memory: dict[str, trainers.TrialResult] = {}  # what the disk refused

    def _path(self, key: str) -> Path:
        if not key or not all(c.isalnum() or c in "-_" for c in key):
            raise KeyError(f"not a config hash: {key!r}")
        return self.folder / f"{key}{SUFFIX}"

    def __setitem__(self, key: str, result: trainers.TrialResult) -> None:
        path = self._path(key)
        part = path.with_name(path.name + ".part")
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            torch.save(packed(result), part)
            os.replace(part, path)  # whole or absent: a crash while saving leaves no half result
        except OSError as exc:
            log.warning("a kept result could not be saved in %s (%s): kept in memory only", self.folder, exc)
            self.memory[key] = result
            return
        self.memory.pop(key, None)

    def __getitem__(self, key: str) -> trainers.TrialResult:
        if key in self.memory:
            return self.memory[key]
        path = self._path(key)
        try:
            return unpacked(torch.load(path, weights_only=True))
        except (FileNotFoundError, NotADirectoryError):
            raise KeyError(key) from None
        except Exception as exc:  # not a result this memsweep can read: set aside, said; it trains again
            self.set_aside(key, f"{type(exc).__name__}: {exc}")
            raise KeyError(key) from None

    def set_aside(self, key: str, why: str) -> None:
        """The key's file renamed `.unreadable` and no longer kept (its trial trains again), and why logged."""
        self.memory.pop(key, None)
        path = self._path(key)
        aside = path.with_name(path.name + ".unreadable")
        with contextlib.suppress(OSError):
            os.replace(path, aside)
            log.warning("a kept result was set aside (%s): %s; its trial trains again", why, aside)

    def __delitem__(self, key: str) -> None:
        found = self.memory.pop(key, None) is not None
        try:
            self._path(key).unlink()
        except OSError:  # none on disk (or no folder to hold one: it was in memory)
            if not found:
                raise KeyError(key) from None
        for crashed in self.folder.glob(f"*{SUFFIX}.part"):  # a save a crash cut short: nothing to read
            crashed.unlink(missing_ok=True)
        with contextlib.suppress(OSError):  # the study's folder goes with its last result
            self.folder.rmdir()

    def __contains__(self, key: object) -> bool:
        return isinstance(key, str) and (key in self.memory or self._path(key).is_file())

    def __iter__(self) -> Iterator[str]:
        on_disk = (
            {p.name[: -len(SUFFIX)] for p in self.folder.glob(f"*{SUFFIX}")}
            if self.folder.is_dir()
            else set()
        )
        return iter(sorted(on_disk | set(self.memory)))

    def __len__(self) -> int:
        return sum(1 for _ in self)
