"""Emami et al. (2019), "Input-output equivalence of unitary and contractive RNNs", NeurIPS 2019, §5
(synthetic contractive teacher: Fig. 2 at 20 dB, Fig. 3 at 15 dB).

Grid: student hidden size n ∈ {2, 4, …, 14} × 30 teacher realisations (the teacher task's
`teacher_seed` 1–30) × 3 students (RNN, URNN, LSTM) = 210 runs per student, 630 per preset. Two presets,
one per figure, because the SNR and the input law change together (20 dB with dense Gaussian input;
15 dB with sparse Gaussian input, p = 0.02): a crossed dimension would add two settings the paper never
ran. Fig. 3's text shows only RNNs and URNNs; the LSTM is kept there for symmetry with Fig. 2 — drop it
with `models=["rnn", "urnn"]`.
Teacher (paper eq. 6, docs/protocol.md §3): n_true = 4, 2 inputs, 2 outputs, relu,
W = I − ε AᵀA/‖A‖² with ε = 0.01, biases calibrated to 60 % activity, T = 1000, 700 training and 300 test
sequences; these are the task's own defaults.
Students: `rnn` is their Keras SimpleRNN(relu) — orthogonal recurrent init (our `init="orthogonal"`,
`scale=1.0`); their input kernel is Glorot-uniform, our `rnn` cell's is N(0, 0.9/√n) (no field selects
Glorot for `rnn`). `urnn` is the same RNN projected onto the orthogonal group after every batch (SVD),
Keras initialisers. `lstm` is Keras' LSTM (`init="keras"`).
Protocol (§5 and `melikaemami/URNN:urnn_synth_test.py`): MSE over every step and output, tf.keras' Adam
(`keras_adam`: ε added to √v, the bias corrections folded into the rate, as every Keras and TensorFlow
Adam computes it; torch's `adam` adds ε to the bias-corrected √v) with the
paper's lr 0.01 (the script's CLI default is 1e-3, which the paper overrides), Keras β 0.9/0.999, ε 1e-7,
batch 10, 100 epochs of 70 updates, validation on the 300 test sequences once per epoch, no clipping, no
early stop. The trial seed (1) draws the students' weights; the paper's R² = 1 − MSE/Var(Y_test) is
computed from the recorded validation loss.
"""

from __future__ import annotations

from search_spaces.space import Dimension, Model, Scalar, SearchSpace, Values

CITATION = "Emami et al., NeurIPS 2019, §5, Fig. 2 (20 dB) and Fig. 3 (15 dB); code: melikaemami/URNN"

HIDDEN_SIZES = (2, 4, 6, 8, 10, 12, 14)  # n, around the teacher's n_true = 4
TEACHER_SEEDS = tuple(range(1, 31))  # 30 realisations of the contractive teacher

DIMS: dict[str, Dimension] = {"hidden": Values(HIDDEN_SIZES), "teacher_seed": Values(TEACHER_SEEDS)}

MODELS = (
    Model("rnn", {"cell": "rnn", "init": "orthogonal", "scale": 1.0, "nonlinearity": "relu"}, DIMS),
    Model("urnn", {"cell": "urnn", "init": "orthogonal", "scale": 1.0, "nonlinearity": "relu"}, DIMS),
    Model("lstm", {"cell": "lstm", "init": "keras"}, DIMS),
)

PROTOCOL: dict[str, Scalar] = {
    "task": "teacher",
    "optimizer": "keras_adam",  # tf.keras' Adam: ε added to √v, not to torch's bias-corrected √v
    "lr": 1e-2,
    "eps": 1e-7,
    "clip_norm": None,
    "batch_size": 10,
    "epochs": 100,
    "early_stop_loss": None,
}

GAUSSIAN_20DB = SearchSpace(
    name="emami2019-gaussian20db",
    models=MODELS,
    seeds=(1,),
    base={**PROTOCOL, "snr_db": 20.0, "sparse_in": 1.0},
    citation=CITATION,
    description="Contractive relu teacher (n_true=4, T=1000), dense Gaussian input, output SNR 20 dB; "
    "students n ∈ {2, …, 14} × 30 teachers; Adam 1e-2, batch 10, 100 epochs. Paper (Fig. 2, curves only): "
    "the RNN reaches the optimal R² at the noise level only for n ≥ 8 (n_true = 4); a URNN needs about 2n units to match "
    "an RNN with n; the LSTM is close to the URNN.",
)

SPARSE_15DB = SearchSpace(
    name="emami2019-sparse15db",
    models=MODELS,
    seeds=(1,),
    base={**PROTOCOL, "snr_db": 15.0, "sparse_in": 0.02},
    citation=CITATION,
    description="As emami2019-gaussian20db with sparse Gaussian input (nonzero with p=0.02) and SNR 15 dB. "
    "Paper (Fig. 3, curves only): again a URNN with 2n units matches an RNN with n.",
)

PRESETS = (GAUSSIAN_20DB, SPARSE_15DB)
