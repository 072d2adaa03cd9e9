"""`python -m trainers analyze …`: the matrix-level analyses on the command line, JSON with --json, PNG with --png.

python -m trainers analyze fisher  --init chain --scale 2.0 --hidden 50 --json
python -m trainers analyze decode  --init chain --nonlinearity elu --json
python -m trainers analyze henrici --matrix recurrent_matrix.json --json
python -m trainers analyze profile --matrix run1.json --matrix run2.json --nonlinearity elu --png profile.png
"""

from __future__ import annotations

import argparse
import json
from typing import Any, Literal

import torch

from trainers.analysis import figures  # matplotlib is imported only inside its functions
from trainers.analysis.decoding import decode_first_signal
from trainers.analysis.fisher import fisher_memory
from trainers.analysis.henrici import henrici_index, spectral_radius
from trainers.analysis.networks import Network, network
from trainers.analysis.profile import mean_profile, network_profile
from trainers.initializers import INITIALIZERS
from trainers.params import ConfigError


def add_network_args(p: argparse.ArgumentParser, hidden: int, scale_help: str) -> None:
    p.add_argument(
        "--init",
        default="chain",
        help=f"initialiser: {', '.join(INITIALIZERS.names())}; a comma-separated list for several",
    )
    p.add_argument("--scale", type=float, help=scale_help)
    p.add_argument("--hidden", type=int, default=hidden, help=f"units N (default {hidden})")
    p.add_argument(
        "--fb-forward", dest="fb_forward", type=float, default=0.99, help="fbchain's forward weight"
    )
    p.add_argument("--seed", type=int, default=1, help="W's draw (the trial seed's init stream) and v's")


def add_matrix_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--matrix",
        action="append",
        default=[],
        metavar="FILE",
        help='JSON with key "W" [N, N] (W_ij from j to i; MLflow artifact recurrent_matrix.json), '
        'optionally "V" [N, d] and "b" [N]; repeat to average (profile). Replaces --init',
    )
    p.add_argument(
        "--gate",
        choices=["i", "f", "g", "o"],
        help="take this gate's [N, N] block of an LSTM weight_hh [4N, N]",
    )


def add_output_args(p: argparse.ArgumentParser, png: bool = True) -> None:
    p.add_argument("--json", action="store_true", help="machine-readable output")
    if png:
        p.add_argument("--png", metavar="PATH", help="also draw the paper's panel to PATH")
    p.add_argument("--threads", type=int, default=1, help="intra-op CPU threads (default 1: fastest here)")


def load_matrix(path: str, gate: str | None) -> dict[str, Any]:
    """W [N, N] (and V, b when present) from a JSON file; an LSTM's [4N, N] needs --gate."""
    try:
        with open(path) as fh:
            data = json.load(fh)
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read it ({exc.strerror})") from None
    if not isinstance(data, dict) or "W" not in data:
        raise ConfigError(f'{path}: expected a JSON object with key "W" (as MLflow\'s recurrent_matrix.json)')
    w = torch.tensor(data["W"], dtype=torch.float64)
    if gate is not None:
        n = w.shape[1]
        if w.shape[0] != 4 * n:
            raise ConfigError(f"{path}: --gate needs W [4N, N] (an LSTM's weight_hh); got {tuple(w.shape)}")
        k = "ifgo".index(gate)
        w = w[k * n : (k + 1) * n]
    if w.ndim != 2 or w.shape[0] != w.shape[1]:
        hint = (
            " (an LSTM's weight_hh: pass --gate i|f|g|o)"
            if w.ndim == 2 and w.shape[0] == 4 * w.shape[1]
            else ""
        )
        raise ConfigError(f"{path}: W must be square [N, N]; got {tuple(w.shape)}{hint}")
    out: dict[str, Any] = {"W": w}
    for key in ("V", "b"):
        if data.get(key) is not None:
            out[key] = torch.tensor(data[key], dtype=torch.float64)
    return out


def with_threads(fn: Any) -> Any:
    """Run an analysis with `--threads` intra-op threads (small matrices: 1 is fastest)."""

    def run(args: argparse.Namespace) -> int:
        torch.set_num_threads(args.threads)
        return int(fn(args))

    return run


def emit(args: argparse.Namespace, rows: list[dict[str, Any]], lines: list[str]) -> None:
    """One network: its dict; several: {"networks": [...]}. Text mode prints `lines`."""
    if args.json:
        print(json.dumps(rows[0] if len(rows) == 1 else {"networks": rows}))
    else:
        print("\n".join(lines))


def networks(args: argparse.Namespace, inputs: Literal["unit", "paper"]) -> list[Network]:
    """The --init networks (a comma-separated list draws them side by side, as the paper's panels)."""
    return [
        network(
            name.strip(), args.hidden, args.scale, inputs=inputs, fb_forward=args.fb_forward, seed=args.seed
        )
        for name in args.init.split(",")
    ]


def cmd_analyze_fisher(args: argparse.Namespace) -> int:
    rows, lines, curves = [], [], {}
    for net in networks(args, "unit"):
        fm = fisher_memory(net.w, net.v, horizon=args.horizon)
        rows.append({"init": net.init, "scale": net.scale, "hidden": net.hidden, **fm.to_dict()})
        curves[f"{net.init} ({net.scale:g})"] = fm
        k_peak = max(range(len(fm.amplification)), key=fm.amplification.__getitem__)
        lines.append(
            f"{net.init} (scale {net.scale:g}, N = {net.hidden}): J_tot = {fm.j_tot:.6g} "
            f"(tail beyond k = {len(fm.j) - 1}: {fm.tail:.2g}{', exact' if fm.exact else ''}); "
            f"J(0..4) = {', '.join(f'{j:.4g}' for j in fm.j[:5])}; "
            f"peak ‖Wᵏv‖² = {fm.amplification[k_peak]:.4g} at k = {k_peak}"
        )
    if args.png:
        figures.plot_fisher(curves, args.png, k_max=2 * args.hidden)  # Fig. 1: N = 100
    emit(args, rows, lines)
    return 0


def cmd_analyze_decode(args: argparse.Namespace) -> int:
    rows, lines, results = [], [], {}
    for net in networks(args, "paper"):
        d = decode_first_signal(
            net.w, net.v, args.nonlinearity, args.sigma, args.trials, args.steps, args.seed
        )
        rows.append({"init": net.init, "scale": net.scale, "hidden": net.hidden, **d.to_dict()})
        results[net.init] = d
        lines.append(
            f"{net.init} (scale {net.scale:g}, N = {net.hidden}), {d.nonlinearity}, σ = {d.sigma}: "
            f"R² = {d.r2:.4f} (in-sample over {d.trials} trials, as Appendix A), held out {d.r2_heldout:.4f}"
            + (f", optimal {d.r2_optimal:.4f}" if d.r2_optimal is not None else "")
        )
    if args.png:
        figures.plot_decoding(results, args.png)
    emit(args, rows, lines)
    return 0


def matrices(args: argparse.Namespace) -> list[tuple[str, dict[str, Any]]]:
    """The networks named on the command line: --matrix files, else the --init networks (V: their input)."""
    if args.matrix:
        return [(path, load_matrix(path, args.gate)) for path in args.matrix]
    if args.gate is not None:
        raise ConfigError("--gate applies to --matrix files (an LSTM's weight_hh [4N, N])")
    return [(f"{n.init} scale {n.scale:g}", {"W": n.w, "V": n.v[:, None]}) for n in networks(args, "paper")]


def cmd_analyze_henrici(args: argparse.Namespace) -> int:
    rows = []
    for name, m in matrices(args):
        w = m["W"]
        rows.append(
            {
                "source": name,
                "hidden": int(w.shape[0]),
                "henrici_index": henrici_index(w),
                "frobenius": float(w.norm().item()),
                "spectral_radius": spectral_radius(w),
            }
        )
    lines = [
        f"{r['source']}: d(W) = {r['henrici_index']:.6g}  ‖W‖_F = {r['frobenius']:.6g}  ρ(W) = {r['spectral_radius']:.6g}"
        for r in rows
    ]
    emit(args, rows, lines)
    return 0


def cmd_analyze_profile(args: argparse.Namespace) -> int:
    profiles = []
    for name, m in matrices(args):
        n = m["W"].shape[0]
        pulse = args.pulse
        if pulse == "auto":
            pulse = "input" if "V" in m else "ones"
        if pulse == "input":
            if "V" not in m:
                raise ConfigError(f'{name}: --pulse input needs "V" in the file; use --pulse ones or source')
            p = m["V"].sum(dim=1)  # V·1: a unit pulse in every input dimension   [N]
        else:
            p = (
                torch.ones(n, dtype=torch.float64)
                if pulse == "ones"
                else torch.eye(n, dtype=torch.float64)[0]
            )
        profiles.append(network_profile(m["W"], p, args.steps, args.nonlinearity, m.get("b"), args.seed))
    stats = mean_profile(profiles)
    if args.png:
        figures.plot_profile(stats, args.png)
    near = [i for i, d in enumerate(stats.offsets) if abs(d) <= 3]
    print(
        json.dumps(stats.to_dict())
        if args.json
        else f"{stats.count} network(s): peak at i − j = {stats.peak}; mean W_ij at i − j = −3..3: "
        + ", ".join(f"{stats.mean[i]:.3g}" for i in near)
    )
    return 0


def add_analyze_parser(sub: Any) -> None:
    p = sub.add_parser(
        "analyze", help="matrix-level analyses: Fisher memory, decoding, Henrici index, weight profile"
    )
    kinds = p.add_subparsers(dest="analysis", required=True)
    q = kinds.add_parser(
        "fisher", help="Fisher memory J(k), J_tot and ‖Wᵏv‖² of the linear network (Fig. 1b-c)"
    )
    add_network_args(
        q,
        100,
        "α (chain), β (fbchain), λ (identity, orthogonal); default Fig. 1's: "
        "chain 1.02, fbchain 0.04, identity/orthogonal 0.99 (the series need ρ(W) < 1)",
    )
    q.add_argument("--horizon", type=int, help="length K of the J(k) curve (default: until J_tot is reached)")
    add_output_args(q)
    q.set_defaults(fn=with_threads(cmd_analyze_fisher))
    q = kinds.add_parser(
        "decode", help="R² of decoding s_1 from h_100 in an untrained network (Fig. 2, App. A)"
    )
    add_network_args(q, 100, "the initialiser's scale (default 1.01, Appendix A; fbchain β 0.04)")
    q.add_argument(
        "--nonlinearity", default="linear", help="linear | elu | tanh | relu (Fig. 2b: linear; 2c: elu)"
    )
    q.add_argument("--sigma", type=float, default=0.0, help="noise std σ per unit and step (Fig. 2b: 0.1)")
    q.add_argument("--trials", type=int, default=250, help="simulated trials (Appendix A: 250)")
    q.add_argument("--steps", type=int, default=100, help="decode s_1 from h_steps (Appendix A: 100)")
    add_output_args(q)
    q.set_defaults(fn=with_threads(cmd_analyze_decode))
    q = kinds.add_parser("henrici", help="Henrici index d(W) of a saved matrix or an initialiser (Table 2)")
    add_network_args(q, 100, "the initialiser's scale (default: Appendix A's, 1.01)")
    add_matrix_args(q)
    add_output_args(q, png=False)
    q.set_defaults(fn=with_threads(cmd_analyze_henrici))
    q = kinds.add_parser("profile", help="mean W_ij against i − j, units ordered by peak time (Figs. 5-6)")
    add_network_args(q, 100, "the initialiser's scale (default: Appendix A's, 1.01)")
    add_matrix_args(q)
    q.add_argument("--nonlinearity", default="linear", help="the network's f: linear | elu | tanh | relu")
    q.add_argument("--steps", type=int, default=100, help="steps after the pulse (§3.2: 100)")
    q.add_argument(
        "--pulse",
        choices=["auto", "input", "ones", "source"],
        default="auto",
        help="the t = 0 pulse: input = V·1 (the network's input matrix), ones = every unit, source = unit 0; "
        "auto: input when V is known, else ones",
    )
    add_output_args(q)
    q.set_defaults(fn=with_threads(cmd_analyze_profile))
