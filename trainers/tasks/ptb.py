"""Penn Treebank language modelling, word or character level (Mikolov et al. 2010 data; Orhan & Pitkow
2020 Table 1 via `salesforce/awd-lstm-lm`; SGORNN Table 3 via `sgornn/experiments/ptb.py`).

Files (the user provides them; Mikolov's `simple-examples.tgz`, folder `simple-examples/data/`), in
`<root>/ptb/`:  word level `ptb.train.txt`, `ptb.valid.txt`, `ptb.test.txt`;
                char level `ptb.char.train.txt`, `ptb.char.valid.txt`, `ptb.char.test.txt`.
(awd-lstm-lm's `getdata.sh` renames the same files to `data/penn/{train,valid,test}.txt` and
`data/pennchar/…`; here they keep Mikolov's names.)
Tokens, as awd-lstm-lm's `data.py` reads them at both levels: each line's whitespace-separated tokens,
then `<eos>` (char files hold space-separated characters with `_` between words, so a token is a
character and `<eos>` the line end). The vocabulary is the training file's tokens in order of first
appearance (PTB is closed-vocabulary: the word files already map rare words to `<unk>`); a validation
token outside it is an error.
Batches: contiguous windows of `bptt` tokens, x = ids[s : s+bptt], y = ids[s+1 : s+bptt+1], at
s = 0, bptt, 2·bptt, … (non-overlapping, as SGORNN's `ptb_supervised`); each split is a fixed set of
windows, shuffled each epoch like any fixed set. **No hidden state is carried across windows** (each
starts from the zero state), unlike awd-lstm-lm's truncated BPTT over one stream, so its numbers are
not directly comparable with Table 1.
Inputs are token ids [T, B] (`input_vocab` = vocabulary size); the model embeds them into
`embed_dim` (SGORNN: embedding size = hidden size, 256). Output: every step over the vocabulary;
loss: mean cross-entropy over all tokens of the batch.
Metric: bits per token = mean cross-entropy / ln 2 over all validation tokens (every window has
`bptt` tokens, so the loop's mean over windows is the mean over tokens). That is bits per character at
char level; at word level the perplexity is 2^metric (= exp(val_loss)) — the loop averages the metric
linearly over examples, so it cannot report exp(mean) itself.
Random baseline: the memoryless predictor is the training set's unigram distribution; its loss on the
training stream is the unigram entropy H = −Σ_w p_w ln p_w (nats).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import torch

from trainers import numerics
from trainers.tasks.base import Split, Task, Tensors, cross_entropy
from trainers.tasks.mnist_files import default_root

EOS = "<eos>"
FOLDER = "ptb"
FILES = {
    "word": {"train": "ptb.train.txt", "valid": "ptb.valid.txt", "test": "ptb.test.txt"},
    "char": {"train": "ptb.char.train.txt", "valid": "ptb.char.valid.txt", "test": "ptb.char.test.txt"},
}
DEFAULT_BPTT = {"word": 35, "char": 150}
SOURCE = "Mikolov's simple-examples.tgz (http://www.fit.vutbr.cz/~imikolov/rnnlm/simple-examples.tgz), folder simple-examples/data/"


@dataclass(frozen=True)
class PTBConfig:
    level: Literal["word", "char"] = "word"
    bptt: int | None = None  # tokens per window; None: 35 (word, SGORNN / Zaremba) or 150 (char, awd-lstm-lm)
    embed_dim: int = 256  # the embedding feeding the cell (SGORNN: Embedding(10000, units = 256))
    val_file: Literal["valid", "test"] = "valid"  # which file the validation windows come from
    n_train: int | None = None  # use only the first n training windows (None: all)
    n_val: int | None = None
    root: str | None = None  # folder holding ptb/ (default $MEMSWEEP_DATA_DIR or ~/.cache/memsweep)
    prob_clip: float | None = None  # None: log-softmax (awd-lstm-lm, PyTorch); ε: Keras 2's clipped loss


@dataclass(frozen=True)
class Corpus:
    vocab: tuple[str, ...]  # id → token
    ids: dict[str, torch.Tensor]  # file role ("train", "valid", "test") → token ids [N] int64


def tokens(path: Path) -> list[str]:
    """awd-lstm-lm `Corpus.tokenize`: every line's tokens, then <eos>."""
    with path.open(encoding="utf-8") as fh:
        return [tok for line in fh for tok in [*line.split(), EOS]]


@functools.lru_cache(maxsize=2)
def load_ptb(root: str, level: str) -> Corpus:
    folder = Path(root) / FOLDER
    paths = {role: folder / name for role, name in FILES[level].items()}
    missing = [p.name for p in paths.values() if not p.exists()]
    if missing:
        raise FileNotFoundError(
            f"PTB ({level} level) not found: {folder} lacks {', '.join(missing)}. Put "
            f"{', '.join(FILES[level].values())} in {folder} (they come from {SOURCE}); or set "
            f"MEMSWEEP_DATA_DIR or the task field `root` to the folder that holds '{FOLDER}/'."
        )
    train = tokens(paths["train"])
    index = {tok: i for i, tok in enumerate(dict.fromkeys(train))}  # order of first appearance
    ids = {}
    for role, path in paths.items():
        toks = train if role == "train" else tokens(path)
        unknown = next((t for t in toks if t not in index), None)
        if unknown is not None:
            raise ValueError(f"PTB: token {unknown!r} of {path} is not in the training vocabulary")
        ids[role] = torch.tensor([index[t] for t in toks], dtype=torch.int64)
    return Corpus(tuple(index), ids)


def windows(ids: torch.Tensor, bptt: int) -> torch.Tensor:
    """Non-overlapping windows [n, bptt + 1] at s = 0, bptt, …  (SGORNN's `ptb_supervised` range)."""
    n = len(range(0, len(ids) - 1 - bptt, bptt))
    return ids.unfold(0, bptt + 1, bptt)[:n]


class PTBTask(Task):
    name = "ptb"
    seeded_data = False
    Config = PTBConfig
    output = "sequence"
    metric_name = "bits_per_token"
    supports_fresh = False
    config: PTBConfig

    def __init__(self, config: PTBConfig, seed: int) -> None:
        super().__init__(config, seed)
        if config.bptt is not None and config.bptt < 1:
            raise ValueError("ptb: bptt must be at least 1")
        if config.embed_dim < 1:
            raise ValueError("ptb: embed_dim must be at least 1")
        self._root = str(Path(config.root) if config.root else default_root())

    @property
    def corpus(self) -> Corpus:
        return load_ptb(self._root, self.config.level)

    # Token inputs (the model embeds ids into input_dim). A property, so the files are read only when
    # the vocabulary is needed; base.Task declares a plain attribute, hence the ignore.
    @property
    def input_vocab(self) -> int:  # type: ignore[override]
        return len(self.corpus.vocab)

    @property
    def seq_len(self) -> int:
        return self.config.bptt or DEFAULT_BPTT[self.config.level]

    @property
    def input_dim(self) -> int:
        return self.config.embed_dim

    @property
    def output_dim(self) -> int:
        return len(self.corpus.vocab)

    @property
    def data_regime(self) -> Literal["fixed", "fresh"]:
        return "fixed"

    @property
    def train_size(self) -> int:
        return len(self.train_split())

    def _split(self, role: str, limit: int | None) -> Split:
        w = windows(self.corpus.ids[role], self.seq_len)
        return Split((w[: limit or len(w)],))

    def train_split(self) -> Split:
        return self._split("train", self.config.n_train)

    def val_split(self) -> Split:
        return self._split(self.config.val_file, self.config.n_val)

    @property
    def baseline_loss(self) -> float:
        p = torch.bincount(self.corpus.ids["train"]).double()  # every vocabulary id occurs in train
        p /= p.sum()
        return float(-(p * numerics.log(p)).sum())

    def encode(self, batch: Tensors, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        (w,) = batch  # [B, bptt + 1]
        w = w.to(device)
        return w[:, :-1].T.contiguous(), w[:, 1:].T.contiguous()  # x, y: ids [bptt, B]

    def loss(self, out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return cross_entropy(out, y, self.config.prob_clip)  # out [T, B, V]

    def metric_sum(self, out: torch.Tensor, y: torch.Tensor) -> float:
        ce = cross_entropy(out, y, self.config.prob_clip, reduction="none")  # [T, B]
        return float(ce.mean(0).sum() / math.log(2))  # Σ over windows of bits per token

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "level": self.config.level, "vocab_size": len(self.corpus.vocab)}
