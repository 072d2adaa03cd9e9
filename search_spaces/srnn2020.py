"""Rotman & Wolf (2020), "Shuffling recurrent neural networks" (SRNN), §4: copying memory (Fig. 2) and
adding problem (Fig. 3).

Grid: the paper's sequence lengths × the cells it compares, one run each: copy T ∈ {100, 200, 300, 500,
1000, 2000} and addition T ∈ {100, 200, 400, 750, 1000, 1500}, × SRNN, RNN (tanh), LSTM, GRU, uRNN, NRU =
36 trials per task. nnRNN has no cell here. T is a dimension of one preset per task: no other setting
depends on it.
Settings (paper §4; `rotmanmi/SRNN:main.py`, docs/protocol.md §2): hidden 128 for every cell; SRNN's f_r
has one hidden layer of 8 units (`hyper_size=8`, `n_layers=1`), gated. Batch 20 (copy) or 50 (addition).
RMSprop lr 1e-3, decay (ρ) 0.9, torch's ε 1e-8, no clipping, for every cell except NRU: Adam lr 1e-3 with
gradient-norm clip 1 and the authors' port's m = 256, k = 4. (Their `train()` for copy and addition
clips NRU only; the LSTM / GRU / RNN clip in §2.2 is in their pMNIST and TIMIT loops.)
Data as their code generates it: copy with T blanks between data and recall (T + 20 steps), fresh
samples, 1,000 per epoch (50 updates), read out over 10 classes (`main.py`'s `Linear(hidden, 10)`: the
marker's class is in the softmax, never a target); addition with [value, mask] channels, fresh, 100 batches per epoch.
Budget: the code's default `epochs = 1000`, run as `range(1, epochs)` = 999 epochs: 49,950 updates (copy)
and 99,900 (addition). Their curves are the training loss on the fresh data; ours are validated once per
epoch on a fixed set of 1,000 sequences. No early stop.
Copy's inputs are embedded, as their code embeds them for every cell (`embedding_dict['copy'] = True`:
the symbols' ids through `nn.Embedding(10, d)`, N(0, 1), trained): d = `hyper_size` (8) for SRNN, the
hidden size (128) for the others (`embed_dim`; it does not follow `hyper_size` or `hidden`: a study
that changes them sets `embed_dim` too, as their code ties them). Their uRNN embeds into 2 × 128 for its
complex state and feeds the embedding in as it is (`input_map="identity"`); on addition its `itoh` maps the
two channels into 2 × 128 (Xavier-uniform, no bias).
Their RNN, LSTM and GRU are torch's nn.RNN (tanh), nn.LSTM and nn.GRU with their default init, U(±1/√N)
for every weight and bias, and two biases each: the rnn's and lstm's `init="plain"` with `bias_hh`, the
gru's `init="plain"` (which keeps both of nn.GRU's biases); the addition RNN has their 17,025 parameters.
The readout is each model's `end_fc`, an nn.Linear with torch's init (`readout_init="plain"`), but for
their NRU, which keeps the NRU code's Xavier-normal `_W_h2o` (`readout_init="xavier_normal"`).
Their uRNN is Arjovsky's (`models/urnncell.py`): the `arjovsky_urnn` cell, 128 complex units kept as
256 reals (`hidden` 256, the states their `end_fc` reads), its initial state drawn U(±√(1.5/128)) per
example at every forward, training and validation alike, as their `URNN.forward` draws it. Since the
uRNN fixes its own `hidden`, a study of all six models cannot set `hidden` in `base` (refused, naming
the uRNN): choose the other models (`models`) for another hidden size, or give the uRNN its own model.
Seeds: the paper shows one run per setting (the code's seed 1234); the preset runs seed 1.
"""

from __future__ import annotations

from search_spaces.space import Dimension, Model, Scalar, SearchSpace, Values

CITATION = (
    "Rotman & Wolf, 2020 (SRNN), §4: copying memory (Fig. 2), adding problem (Fig. 3); code: rotmanmi/SRNN"
)

COPY_LENGTHS = (100, 200, 300, 500, 1000, 2000)  # T, the delay: T + 20 steps in all
ADDITION_LENGTHS = (100, 200, 400, 750, 1000, 1500)
EPOCHS = 999  # the code's `range(1, epochs)` with epochs = 1000

# One Model per compared cell. RMSprop, no clipping (the base) unless the model says otherwise.
SRNN: dict[str, Scalar] = {"cell": "srnn", "hyper_size": 8, "n_layers": 1, "no_gate": False}
# their RNN and LSTM are nn.RNN(tanh) and nn.LSTM: torch's default init, two biases each
RNN: dict[str, Scalar] = {"cell": "rnn", "init": "plain", "bias_hh": True, "nonlinearity": "tanh"}
LSTM: dict[str, Scalar] = {"cell": "lstm", "init": "plain", "bias_hh": True}
GRU: dict[str, Scalar] = {"cell": "gru", "init": "plain"}
# Arjovsky's uRNN as their `models/urnncell.py`: 128 complex units, 2 × 128 reals (the states end_fc reads);
# a random initial state at every forward, theirs (`initial_state="uniform"`, the cell's default)
URNN: dict[str, Scalar] = {"cell": "arjovsky_urnn", "hidden": 256}
NRU: dict[str, Scalar] = {
    "cell": "nru",
    "memory_size": 256,
    "heads": 4,
    "optimizer": "adam",
    "clip_norm": 1.0,
    "readout_init": "xavier_normal",  # their port of the NRU code keeps its `_W_h2o` (`models/nrucell.py`)
}

PROTOCOL: dict[str, Scalar] = {
    "hidden": 128,
    "readout_init": "plain",  # every model's `end_fc` is an nn.Linear (but the NRU's, above)
    "optimizer": "rmsprop",
    "lr": 1e-3,
    "rho": 0.9,
    "eps": 1e-8,
    "clip_norm": None,
    "data": "fresh",
    "n_val": 1_000,
    "epochs": EPOCHS,
    "early_stop_loss": None,
}

COPY_DIMS: dict[str, Dimension] = {"seq_len": Values(COPY_LENGTHS)}
ADDITION_DIMS: dict[str, Dimension] = {"seq_len": Values(ADDITION_LENGTHS)}

#: copy's embedding of the symbols' ids before the cell (`main.py`: `embedding=True` for copy): SRNN's into
#: its `hyper_size`, every other cell's into the hidden size
EMBED_SRNN: dict[str, Scalar] = {"embed_dim": 8}
EMBED: dict[str, Scalar] = {"embed_dim": 128}
#: their uRNN's: the symbols into its 2 × 128 reals, fed in as they are (no `itoh` after an embedding)
EMBED_URNN: dict[str, Scalar] = {"embed_dim": 256, "input_map": "identity"}

COPY = SearchSpace(
    name="srnn2020-copy",
    models=(
        Model("srnn", {**SRNN, **EMBED_SRNN}, COPY_DIMS),
        Model("rnn", {**RNN, **EMBED}, COPY_DIMS),
        Model("lstm", {**LSTM, **EMBED}, COPY_DIMS),
        Model("gru", {**GRU, **EMBED}, COPY_DIMS),
        Model("urnn", {**URNN, **EMBED_URNN}, COPY_DIMS),
        Model("nru", {**NRU, **EMBED}, COPY_DIMS),
    ),
    seeds=(1,),
    base={
        **PROTOCOL,
        "task": "copy",
        "layout": "delay",
        "prob_clip": None,
        "classes": 10,  # their readout: Linear(hidden, 10), the marker's class never a target
        "n_train": 1_000,
        "batch_size": 20,
    },
    citation=CITATION,
    description="Copy, T ∈ {100, …, 2000} blanks (T+20 steps), h=128 (uRNN: Arjovsky's, 2 × 128 reals, a "
    "random initial state at every forward: the cell's initial_state uniform), inputs embedded (SRNN: 8, "
    "uRNN: 256, the others: 128), batch 20, 999 epochs of 1,000 fresh samples. Paper (Fig. 2, curves only): most methods solve T=100; only SRNN handles longer lags "
    "efficiently (up to T=2000, f_r 1×8); GRU and LSTM partially solve it, slowly, and beat uRNN beyond "
    "T=1000; nnRNN (not run here) succeeds for T ≤ 300.",
)

ADDITION = SearchSpace(
    name="srnn2020-addition",
    models=(
        Model("srnn", SRNN, ADDITION_DIMS),
        Model("rnn", RNN, ADDITION_DIMS),
        Model("lstm", LSTM, ADDITION_DIMS),
        Model("gru", GRU, ADDITION_DIMS),
        Model("urnn", URNN, ADDITION_DIMS),
        Model("nru", NRU, ADDITION_DIMS),
    ),
    seeds=(1,),
    base={
        **PROTOCOL,
        "task": "addition",
        "channels": "value_first",
        "n_train": 5_000,  # 100 batches of 50 per epoch
        "batch_size": 50,
    },
    citation=CITATION,
    description="Addition, T ∈ {100, …, 1500}, [value, mask] channels, h=128 (uRNN: Arjovsky's, 2 × 128 "
    "reals, a random initial state at every forward: the cell's initial_state uniform), batch 50, 999 epochs of 100 "
    "fresh batches. Paper (Fig. 3, curves only): NRU, GRU and SRNN solve it quickly, NRU fastest; LSTM "
    "solves it more slowly; nnRNN (not run here) only below T=200.",
)

PRESETS = (COPY, ADDITION)
