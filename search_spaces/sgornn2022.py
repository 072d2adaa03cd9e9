"""Taylor-Melanson et al. (2022), "Scalar gated orthogonal recurrent neural networks" (SGORNN),
ICLR 2022 submission, §3.1 (addition, Table 1) and §3.2 (HAR-2, Table 2).

Addition: T ∈ {500, 1000, 5000} × initial lr ∈ {1e-2, 1e-3, 1e-4} × 4 cells (SGORNN, VPRNN, FastRNN,
LSTM), one run each = 9 trials per cell, 36 in all. The paper searches the learning rates in turn (start
at 1e-2, divide by 10 on failure, at most twice); the preset runs all three, so the paper's choice can be
read off afterwards. T is a dimension of one preset, not three presets, because Table 1's result — the
longest T each cell solves — is a statement across T; restrict it with `dims={"seq_len": [500]}`.
Settings: h = 128 for every cell, k = 14 rotation sublayers (the code's `rots=7`, docs/protocol.md §5), relu (the LSTM is Keras' default tanh LSTM, as in the code's `LSTMModel`), batch 64, RMSprop
(Keras ρ 0.9, ε 1e-7), no gradient clipping, [value, mask] channels and fresh batches (SGORNN's generator,
docs/protocol.md §1.2), validation MSE every 100 steps on 640 sequences (the paper's 10 batches of 64;
ours are drawn once per run, theirs fresh each time).
Budget: the paper's cap of 20,000 steps, which defines "converged" in Table 1; the code's default is
75 epochs × 100 = 7,500 steps (`scripts/addition.py`, docs/protocol.md §5) — set `steps=7500` and
`lr_decay_steps=7500` for it.
Learning rate: the paper "decays linearly to zero"; the code passes Keras 2's RMSprop
`decay=(initial_lr − 0)/(epochs·steps_per_epoch)`, which is inverse-time decay, lr / (1 + lr·t/S) after t
updates of S in all: `lr_decay_steps` = S = the budget, and the rate falls to lr / (1 + lr) after S
updates (lr/1.01 at 1e-2), as in the code. No early stop (Keras `fit` runs the budget).

HAR-2: the four cells (LSTM with h = 64, the only size that gives Table 2's 19,009 parameters) × seeds
1–10 (paper footnote 3; the code's default is 42), the code's protocol (`scripts/har2.py`,
docs/protocol.md §5): RMSprop lr 1e-3, divided by 10 after 200 epochs (its LearningRateScheduler,
`lr_drop_epochs`), batch 100, 300 epochs, binary cross-entropy, validation on the test set once per
epoch, no clipping, no early stop.
"""

from __future__ import annotations

from search_spaces.space import Dimension, Model, Scalar, SearchSpace, Values

CITATION = (
    "Taylor-Melanson et al., ICLR 2022 submission (SGORNN), §3.1 + Table 1 (addition), §3.2 + Table 2 "
    "(HAR-2); code: wtaylor17/sgornn-nn-supplementary"
)

SEQ_LENS = (500, 1000, 5000)
LEARNING_RATES = (1e-2, 1e-3, 1e-4)  # the paper's search: 1e-2, then ÷10 on failure, at most twice
HAR_SEEDS = (1, 2, 3, 4, 5, 6, 7, 8, 9, 10)  # footnote 3: run i uses seed i

# One Model per compared cell; the LSTM is Keras' `LSTM` (Glorot input, orthogonal recurrent, b_f = 1).
SGORNN: dict[str, Scalar] = {"cell": "sgornn", "rotations": 14}
VPRNN: dict[str, Scalar] = {"cell": "vprnn", "rotations": 14}
FASTRNN: dict[str, Scalar] = {"cell": "fastrnn"}
LSTM: dict[str, Scalar] = {"cell": "lstm", "init": "keras"}

ADDITION_DIMS: dict[str, Dimension] = {"seq_len": Values(SEQ_LENS), "lr": Values(LEARNING_RATES)}

ADDITION = SearchSpace(
    name="sgornn2022-addition",
    models=(
        Model("sgornn", SGORNN, ADDITION_DIMS),
        Model("vprnn", VPRNN, ADDITION_DIMS),
        Model("fastrnn", FASTRNN, ADDITION_DIMS),
        Model("lstm", LSTM, ADDITION_DIMS),
    ),
    seeds=(1,),  # the paper reports one run per (cell, T, lr)
    base={
        "task": "addition",
        "channels": "value_first",
        "data": "fresh",
        "n_train": 6_400,  # one Keras epoch: 100 steps × 64
        "n_val": 640,  # 10 batches of 64
        "hidden": 128,
        "batch_size": 64,
        "optimizer": "rmsprop",
        "clip_norm": None,
        "steps": 20_000,
        "lr_decay_steps": 20_000,  # Keras's decay = lr / the budget: the code's "linear decay to zero"
        "eval_every": 100,
        "early_stop_loss": None,
    },
    citation=CITATION,
    description="Addition, T ∈ {500, 1000, 5000} × lr ∈ {1e-2, 1e-3, 1e-4}, h=128, batch 64, RMSprop with "
    "Keras's decay lr/20,000 (the code's), 20,000 steps. Paper (Table 1): SGORNN converges up to T=5000 with lr 1e-2 and never explodes; VPRNN "
    "converges at 500 and partially at 1000 (lr 1e-3), fails at 5000 without exploding; FastRNN converges "
    "at 500, partially at 1000, explodes for T ≥ 1000 at every lr; LSTM fails above T=500. Parameters: "
    "SGORNN 1,411, VPRNN 1,409, FastRNN 16,899, LSTM 67,201.",
)

HAR2 = SearchSpace(
    name="sgornn2022-har2",
    models=(
        Model("sgornn", SGORNN),
        Model("vprnn", VPRNN),
        Model("fastrnn", FASTRNN),
        Model("lstm", {**LSTM, "hidden": 64}),  # sized to FastRNN's parameter count (Table 2)
    ),
    seeds=HAR_SEEDS,
    base={
        "task": "har2",
        "hidden": 128,
        "batch_size": 100,
        "optimizer": "rmsprop",
        "lr": 1e-3,
        "lr_drop_epochs": [200],  # ÷10 (lr_drop_factor 0.1) from the 201st epoch, as the code's scheduler
        "clip_norm": None,
        "epochs": 300,
        "early_stop_loss": None,
    },
    citation=CITATION,
    description="HAR-2 (binary UCI-HAR, 9 channels × 128 steps), seeds 1–10, h=128 (LSTM 64), RMSprop 1e-3 "
    "÷10 after epoch 200, batch 100, 300 epochs. Paper (Table 2), test accuracy over "
    "10 seeds: SGORNN 94.07 ± 0.2 %, FastRNN 93.77 ± 0.49 %, LSTM 93.45 ± 1.22 %, VPRNN 92.29 ± 0.96 %; "
    "parameters 2,307 / 17,795 / 19,009 / 2,305.",
)

PRESETS = (ADDITION, HAR2)
