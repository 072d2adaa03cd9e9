"""Chandar et al. (2019), "Towards non-saturating recurrent units for modelling long-term dependencies"
(NRU), AAAI 2019: the appendix's sensitivity study of k, m, h (psMNIST, Fig. 8), and the synthetic-task
comparisons (copy T = 100/200, Fig. 1; variable copy T = 100/200, Fig. 2; denoise T = 100, Fig. 4).

Sensitivity (appendix "Hyper-parameter Sensitivity Analysis"): one factor at a time around the baseline
m = 256, k = 4, h = 200: k ∈ {1, 4, 9, 16}, m ∈ {100, 256, 400}, h ∈ {50, 100, 200, 300}, 40 epochs each.
The baseline appears once, as its own model, so no trial is run twice: 1 + 3 + 2 + 3 = 9 trials. The
authors' configs (`apsarath/myTorch:memnets/config/baselines/pmnist/fm_oblation/`) use h = 212 for the k runs
and max_steps 25,000 (50 epochs); we follow the paper (h = 200, 40 epochs = 20,000 steps at batch 100).
Protocol (docs/protocol.md §4): Adam lr 1e-3 (β 0.9/0.999, ε 1e-8) as torch 0.4 computed it, ε added to
√v (`keras_adam`: torch's since 1.3 adds it to the bias-corrected √v), gradient-norm clip 1, batch 100,
linear heads, a Xavier-normal readout with a zero bias (`readout_init`), no early stop. Their data
(`nru_project/task/mnist_task.py`): numpy's RandomState(50) shuffles the 60,000 training images, then
draws the pixels' permutation, fixed across runs
(`permutation_rng="nru"`, `permutation_seed=50`: the same shuffle and permutation); the shuffled set's
first 50,000 train and its last 10,000 validate, once per epoch; a zero input follows the 784 pixels and
the label is read there (`trailing_zero_step`: their 785 steps); each epoch's order of the training
images is drawn by the same RandomState, as their data iterator draws it (`batch_order="nru"`).

Synthetic comparisons: the paper gives no hyperparameter grid, only one run per (task, T, cell) with
~23.5k parameters each. Sizes from the authors' configs (`memnets/config/baselines/{100,200}_lag/`):
NRU h=80, m=64, k=4; LSTM and LSTM-chrono h=70; GRU h=82; JANET h=101 (chrono); RNN-orth / RNN-id h=143,
relu. Chrono t_max = T_max + 20 for copy and variable copy, T + 11 for denoise (`memnets/train.py`;
docs/protocol.md §4), so each (task, T) is its own preset. Protocol: the paper's Adam 1e-3 (ε 1e-8) and
clip 1 for every model, as their configs have it, but for their NRU on copy (`copy_v1/fm.yaml`: AMSGrad,
clip 0.5) and on variable copy at T = 200 (`200_lag/copy_v2/fm.yaml`: AMSGrad, clip 1), each as torch 0.4
computed it (`keras_adam`, `keras_amsgrad`: ε added to √v); batch 10,
fresh batches, the configs' max_steps 200,000, validation every 1,000 steps (their `save_every_n`) on a
fixed set of 1,000 sequences (theirs is the online training loss), myTorch's Xavier-normal readout with
a zero bias (`readout_init`), no early stop. EURNN, GORU and SRU have no cell here. Their GRU is myTorch's GRUCell (2018): the reset gate applied to h before the
candidate's product, one bias per gate, Xavier-normal input and orthogonal recurrent weights, zero biases
(`reset="before"`, `init="mytorch"`); their LSTM is myTorch's LSTMCell, with peepholes drawn from U(0, 1)
(`init="mytorch"`, `peepholes`): h = 70 gives the paper's ~23.5k parameters (23,529 on copy). Their
RNN-orth / RNN-id are myTorch's RNNCell: LayerNorm on the pre-activation (`layer_norm`, in every RNN
config of theirs) and Xavier-normal input weights with the relu gain (`input_init="xavier_normal"`), W
orthogonal or the identity, one zero bias: 23,604 parameters on copy; they train alone, not in bundles.
Seeds: the paper shows one run per setting (the configs fix rseed 5); every preset runs seed 1 only.
"""

from __future__ import annotations

from search_spaces.space import Model, Scalar, SearchSpace, Values

CITATION_SENSITIVITY = (
    "Chandar et al., AAAI 2019, appendix (hyper-parameter sensitivity, Fig. 8); code: apsarath/myTorch"
)
CITATION_SYNTHETIC = (
    "Chandar et al., AAAI 2019, Experiments: Copying Memory Task (Fig. 1; variable copy Fig. 2), Denoising Task "
    "(Fig. 4); code: apsarath/myTorch"
)

# ----- appendix: sensitivity of k, m, h on psMNIST ---------------------------------------------------
BASELINE_K, BASELINE_M, BASELINE_H = 4, 256, 200
HEADS = (1, 9, 16)  # k, besides the baseline's 4 (√(m·k) must be an integer: 16, 48, 64)
MEMORY_SIZES = (100, 400)  # m, besides 256
HIDDEN_SIZES = (50, 100, 300)  # h, besides 200

SENSITIVITY_BASE: dict[str, Scalar] = {
    "task": "psmnist",
    "prob_clip": None,  # PyTorch's log-softmax cross-entropy (psMNIST's default is Keras', Orhan's)
    "permutation_seed": 50,
    "permutation_rng": "nru",  # their RandomState(50): the training images' shuffle, then the pixels'
    "trailing_zero_step": True,  # their 785th step, a zero input where the label is read
    "batch_order": "nru",  # each epoch's order of the images from the same RandomState, as their iterator
    "normalization": "unit",
    "split": "train_val",
    "cell": "nru",
    "hidden": BASELINE_H,
    "memory_size": BASELINE_M,
    "heads": BASELINE_K,
    "use_relu": False,
    "optimizer": "keras_adam",  # torch 0.4's Adam (their code's): ε added to √v, as Keras' (docs/protocol.md §4)
    "lr": 1e-3,
    "eps": 1e-8,
    "clip_norm": 1.0,
    "readout_init": "xavier_normal",  # their `_W_h2o`: Xavier-normal, zero bias
    "batch_size": 100,
    "epochs": 40,
    "early_stop_loss": None,
}

SENSITIVITY = SearchSpace(
    name="nru2019-sensitivity",
    models=(
        Model("baseline"),
        Model("heads", dims={"heads": Values(HEADS)}),
        Model("memory", dims={"memory_size": Values(MEMORY_SIZES)}),
        Model("hidden", dims={"hidden": Values(HIDDEN_SIZES)}),
    ),
    seeds=(1,),
    base=SENSITIVITY_BASE,
    citation=CITATION_SENSITIVITY,
    description="psMNIST, NRU around m=256, k=4, h=200: k ∈ {1, 9, 16}, m ∈ {100, 400}, h ∈ {50, 100, 300} "
    "(one at a time), Adam 1e-3, clip 1, batch 100, 40 epochs. Paper (Fig. 8, curves only): more heads help "
    "with diminishing returns above 4 or 9; m=400 learns slower at first but all m converge alike; small h "
    "hurts. Reference: NRU (h=212, 50k steps) reaches 95.46 % valid / 95.38 % test (Table 3).",
)

# ----- Experiments: copy, variable copy and denoise, one run per cell ---------------------------------------
SYNTHETIC_PROTOCOL: dict[str, Scalar] = {
    "n_val": 1_000,
    "readout_init": "xavier_normal",  # myTorch's Recurrent `_W_h2o`: Xavier-normal, zero bias
    "optimizer": "keras_adam",  # torch 0.4's Adam (their code's): ε added to √v, as Keras'
    "lr": 1e-3,
    "eps": 1e-8,
    "clip_norm": 1.0,
    "batch_size": 10,
    "steps": 200_000,
    "eval_every": 1_000,
    "early_stop_loss": None,
}

# The models whose settings do not depend on T (~23.5k parameters each on copy).
NRU_CELL: dict[str, Scalar] = {"cell": "nru", "hidden": 80, "memory_size": 64, "heads": 4, "use_relu": False}
NRU = Model("nru", NRU_CELL)
# their NRU configs for copy (`copy_v1/fm.yaml`: T = 100 and 200) train with AMSGrad and clip 0.5, and for
# variable copy at T = 200 (`200_lag/copy_v2/fm.yaml`) with AMSGrad and clip 1; every other config of
# theirs, Adam and clip 1
NRU_COPY = Model("nru", {**NRU_CELL, "optimizer": "keras_amsgrad", "clip_norm": 0.5})
NRU_VARCOPY_200 = Model("nru", {**NRU_CELL, "optimizer": "keras_amsgrad"})
MYTORCH_LSTM: dict[str, Scalar] = {"cell": "lstm", "hidden": 70, "init": "mytorch", "peepholes": True}
LSTM = Model("lstm", MYTORCH_LSTM)
GRU = Model("gru", {"cell": "gru", "hidden": 82, "init": "mytorch", "reset": "before"})  # myTorch's GRUCell
# myTorch's RNNCell: LayerNorm on the pre-activation (every RNN config of theirs), Xavier-normal V
MYTORCH_RNN: dict[str, Scalar] = {
    "cell": "rnn",
    "hidden": 143,
    "scale": 1.0,
    "nonlinearity": "relu",
    "input_init": "xavier_normal",
    "layer_norm": True,
}
RNN_ORTH = Model("rnn-orth", {**MYTORCH_RNN, "init": "orthogonal"})
RNN_ID = Model("rnn-id", {**MYTORCH_RNN, "init": "identity"})

# Chrono initialisation, t_max = T_max + 20 (copy, variable copy) or T + 11 (denoise).
LSTM_CHRONO_120 = Model("lstm-chrono", {**MYTORCH_LSTM, "chrono_tmax": 120})
LSTM_CHRONO_220 = Model("lstm-chrono", {**MYTORCH_LSTM, "chrono_tmax": 220})
LSTM_CHRONO_111 = Model("lstm-chrono", {**MYTORCH_LSTM, "chrono_tmax": 111})
JANET_120 = Model("janet", {"cell": "janet", "hidden": 101, "chrono_tmax": 120})
JANET_220 = Model("janet", {"cell": "janet", "hidden": 101, "chrono_tmax": 220})
JANET_111 = Model("janet", {"cell": "janet", "hidden": 101, "chrono_tmax": 111})

BASELINES_T100 = (LSTM, LSTM_CHRONO_120, GRU, JANET_120, RNN_ORTH, RNN_ID)
BASELINES_T200 = (LSTM, LSTM_CHRONO_220, GRU, JANET_220, RNN_ORTH, RNN_ID)
MODELS_DENOISE = (NRU, LSTM, LSTM_CHRONO_111, GRU, JANET_111, RNN_ORTH, RNN_ID)

COPY_100 = SearchSpace(
    name="nru2019-copy100",
    models=(NRU_COPY, *BASELINES_T100),
    base={
        **SYNTHETIC_PROTOCOL,
        "task": "copy",
        "layout": "delay",
        "data": "fresh",
        "seq_len": 100,
        "prob_clip": None,
    },
    citation=CITATION_SYNTHETIC,
    description="Copy, T=100 blanks (120 steps), 7 cells at ~23.5k parameters, Adam 1e-3 (torch 0.4's form), "
    "clip 1 (their NRU: AMSGrad, clip 0.5, as its config), batch 10, 200k steps. Paper (Fig. 1, curves only): baseline CE 0.17; NRU converges first, then JANET (2-3× more "
    "updates); RNN-orth and RNN-id stay at the baseline.",
)

COPY_200 = SearchSpace(
    name="nru2019-copy200",
    models=(NRU_COPY, *BASELINES_T200),
    base={
        **SYNTHETIC_PROTOCOL,
        "task": "copy",
        "layout": "delay",
        "data": "fresh",
        "seq_len": 200,
        "prob_clip": None,
    },
    citation=CITATION_SYNTHETIC,
    description="Copy, T=200 blanks (220 steps), as nru2019-copy100. Paper (Fig. 1): baseline CE 0.09; NRU "
    "converges first, then JANET; RNN-orth and RNN-id stay at the baseline.",
)

VARCOPY_100 = SearchSpace(
    name="nru2019-varcopy100",
    models=(NRU, *BASELINES_T100),
    base={**SYNTHETIC_PROTOCOL, "task": "varcopy", "lag_min": 1, "lag_max": 100},
    citation=CITATION_SYNTHETIC,
    description="Variable copy, lag drawn per batch from 1..100, as nru2019-copy100 (every model Adam, clip "
    "1). Paper (Fig. 2, curves only): NRU solves it fastest, then JANET.",
)

VARCOPY_200 = SearchSpace(
    name="nru2019-varcopy200",
    models=(NRU_VARCOPY_200, *BASELINES_T200),
    base={**SYNTHETIC_PROTOCOL, "task": "varcopy", "lag_min": 1, "lag_max": 200},
    citation=CITATION_SYNTHETIC,
    description="Variable copy, lag drawn per batch from 1..200, as nru2019-copy100 (their NRU: AMSGrad, clip "
    "1, as its config). Paper (Fig. 2): NRU fastest, then JANET.",
)

DENOISE_100 = SearchSpace(
    name="nru2019-denoise100",
    models=MODELS_DENOISE,
    base={**SYNTHETIC_PROTOCOL, "task": "denoise", "data": "fresh", "seq_len": 100},
    citation=CITATION_SYNTHETIC,
    description="Denoise, 10 symbols at random places in T=100 noise steps, loss on the 10 recall steps "
    "(baseline ln 8 ≈ 2.079), as nru2019-copy100 (every model Adam, clip 1). Paper (Fig. 4, curves only): "
    "every model converges (EURNN, "
    "not run here, does not); NRU learns faster at first, all converge after about as many updates.",
)

PRESETS = (SENSITIVITY, COPY_100, COPY_200, VARCOPY_100, VARCOPY_200, DENOISE_100)
