"""Orhan & Pitkow (2020), "Improved memory in recurrent neural networks with sequential non-normal
dynamics", ICLR 2020, §3.1.1 (copy, addition, psMNIST).

Grid: 11 learning rates × the initialiser's scale (α: 7, β: 7, λ: 9) × seeds 1–6 = 462 runs for
each non-normal model (chain, fbchain) and 594 for each normal model (identity, orthogonal), 2,112 per
task. Settings: N = 100 (copy, addition) or 25 (psMNIST); elu (copy, psMNIST) or relu (addition);
batch 16; RMSprop with the authors' code's clip 10 and early stop at validation loss 0.0025
(`eminorhan/nonnormal-init` train.py; docs/protocol.md §1.5). Budget: the code's default 100 epochs
(the paper does not state it); a study may shorten it with overrides, which the trials record.
"""

from __future__ import annotations

from search_spaces.space import Model, Scalar, SearchSpace, Values

CITATION = (
    "Orhan & Pitkow, ICLR 2020, §3.1.1 (grids), Fig. 3d-f (success counts); code: eminorhan/nonnormal-init"
)

LEARNING_RATES = (8e-4, 5e-4, 3e-4, 1e-4, 8e-5, 5e-5, 3e-5, 1e-5, 8e-6, 5e-6, 3e-6)
ALPHAS = (0.99, 1.00, 1.01, 1.02, 1.03, 1.04, 1.05)  # chain: feedforward weight
BETAS = (0.01, 0.02, 0.03, 0.04, 0.05, 0.06, 0.07)  # chain with feedback: feedback weight
LAMBDAS = (0.01, 0.96, 0.99, 1.0, 1.01, 1.02, 1.03, 1.04, 1.05)  # identity / orthogonal: scale
SEEDS = (1, 2, 3, 4, 5, 6)

MODELS = (
    Model("chain", {"init": "chain"}, {"lr": Values(LEARNING_RATES), "scale": Values(ALPHAS)}),
    Model("fbchain", {"init": "fbchain"}, {"lr": Values(LEARNING_RATES), "scale": Values(BETAS)}),
    Model("identity", {"init": "identity"}, {"lr": Values(LEARNING_RATES), "scale": Values(LAMBDAS)}),
    Model("orthogonal", {"init": "orthogonal"}, {"lr": Values(LEARNING_RATES), "scale": Values(LAMBDAS)}),
)

PROTOCOL: dict[str, Scalar] = {
    "cell": "rnn",
    "batch_size": 16,
    "optimizer": "rmsprop",
    "clip_norm": 10.0,
    "epochs": 100,
    "early_stop_loss": 0.0025,
}

COPY_500 = SearchSpace(
    name="orhan2020-copy500",
    models=MODELS,
    seeds=SEEDS,
    base={
        **PROTOCOL,
        "task": "copy",
        "seq_len": 500,
        "layout": "total",
        "hidden": 100,
        "nonlinearity": "elu",
    },
    citation=CITATION,
    description="Copy task, 500 steps in all (Orhan's layout), N=100, elu. Paper: chain 46/462, fbchain 11/462, "
    "identity 0/594, orthogonal 0/594 successes.",
)

ADDITION_750 = SearchSpace(
    name="orhan2020-addition750",
    models=MODELS,
    seeds=SEEDS,
    base={
        **PROTOCOL,
        "task": "addition",
        "seq_len": 750,
        "channels": "mask_first",
        "hidden": 100,
        "nonlinearity": "relu",
    },
    citation=CITATION,
    description="Addition task, T=750, [mask, value] channels, fixed 60k/10k sets, N=100, relu.",
)

PSMNIST = SearchSpace(
    name="orhan2020-psmnist",
    models=MODELS,
    seeds=SEEDS,
    base={
        **PROTOCOL,
        "task": "psmnist",
        "hidden": 25,
        "nonlinearity": "elu",
        "normalization": "unit",
        "split": "train_test",
    },
    citation=CITATION,
    description="Permuted sequential MNIST (a permutation per seed, pixels/255, validated on the test set), N=25, elu.",
)

# §3.3 and Table 3: the LSTM initialisers (plain = PyTorch's default, orthogonal, chain, mixed) on
# character-level PTB. The paper trains awd-lstm-lm's 3-layer, regularised LSTM (3 runs each, mean ±
# s.e.m.); memsweep's `lstm` is one layer without awd-lstm-lm's dropouts, so this preset compares the four
# initialisers under one protocol rather than reproducing Table 3's bpc. Protocol fields that the paper
# does not give (hidden size, optimiser, learning rates, budget) are memsweep's choices, named here.
LSTM_INITS = (
    Model("lstm-plain", {"init": "plain"}, {"lr": Values((2e-3, 1e-3))}),
    Model("lstm-orthogonal", {"init": "orthogonal"}, {"lr": Values((2e-3, 1e-3))}),
    Model("lstm-chain", {"init": "chain"}, {"lr": Values((2e-3, 1e-3))}),
    Model("lstm-mixed", {"init": "mixed"}, {"lr": Values((2e-3, 1e-3))}),
)

LSTM_PTB_CHAR = SearchSpace(
    name="orhan2020-lstm-ptbchar",
    models=LSTM_INITS,
    seeds=(1, 2, 3),
    base={
        "task": "ptb",
        "level": "char",
        "cell": "lstm",
        "bias_hh": True,  # awd-lstm-lm's layers are nn.LSTM: two biases, drawn as torch draws them
        "hidden": 1000,  # awd-lstm-lm's char-level layer width (ours: a single layer)
        "batch_size": 128,
        "optimizer": "adam",
        "clip_norm": 0.25,  # awd-lstm-lm's default clip
        "epochs": 5,
        "early_stop_loss": None,
    },
    citation="Orhan & Pitkow, ICLR 2020, §3.3 and Table 3 (LSTM initialisers; paper: awd-lstm-lm, 3 layers)",
    description="LSTM with Table 3's initialisers plain / orthogonal / chain / mixed on char-level PTB "
    "(bits per character), one layer of 1,000 units; PTB files are yours to provide (see the ptb task). "
    "Paper (3-layer awd-lstm-lm, test bpc): ortho 1.230, chain 1.230, plain 1.245, mixed 1.227.",
)

PRESETS = (COPY_500, ADDITION_750, PSMNIST, LSTM_PTB_CHAR)
