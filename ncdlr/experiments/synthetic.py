"""Synthetic long-tailed discovery: ETF + MSE + adaptive self-labeling vs a UNO-style baseline.

The data are long-tailed Gaussian clusters in a 16-d "signal" subspace hidden under a 16-d "nuisance"
subspace of larger variance (then rotated), so a head has to learn from the known classes which
directions matter before it can cluster the novel ones. Ks = Ku = 20 classes; training counts follow
``long_tail_counts(250, 20, R)`` (R = 50 known, ``--novel-ratio`` novel); the test set is balanced.

Methods, all with the same trainable head (MLP 32 → 64 → 64, normalised output), data, epochs and
batch (B known + B novel, two noisy views each); each is the method layer's own step
(:func:`ncdlr.methods.build_method`: known loss, discovery step, swapped novel loss), so this experiment
trains exactly what the service trains:

* ``uno``          learnable normalised prototypes, cross-entropy on cosine/0.1, balanced Sinkhorn per
                   batch (ε 0.05, T 3), swapped prediction (method.md §8).
* ``ncdlr-uniform`` fixed ETF prototypes + MSE, buffer of past logits, uniform cluster-size prior.
* ``ncdlr``        the same with the adaptive prior w(τ) (method.md §4).

γ follows one rule, not a search: keep the paper's effective KL strength at iNat scale,
γ/Ku = 500/1000, so γ = 0.5·Ku = 10 here (method.md §4 trap a: γ = 500 at Ku = 20 would pin τ at 1).

Usage:  python -m ncdlr.experiments.synthetic [--seeds 3] [--epochs 40] [--out DIR]
Prints a table of class-mean accuracies (mean ± std over seeds); finishes in about a minute on 2 cores.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from ncdlr.buffer import LocalBuffer
from ncdlr.data.longtail import long_tail_counts
from ncdlr.method_settings import LabelerConfig
from ncdlr.methods import Method, MethodConfig, build_method
from ncdlr.metrics import cluster_accuracy
from ncdlr.prototypes import simplex_etf

METHODS = ("uno", "ncdlr-uniform", "ncdlr")
COLUMNS = ("all", "known", "novel", "novel_head", "novel_medium", "novel_tail")


@dataclass(frozen=True)
class Setting:
    """One synthetic problem and training budget."""

    num_known: int = 20
    num_novel: int = 20
    n_max: int = 250  #: images of the head class in each half
    known_ratio: float = 50.0
    novel_ratio: float = 50.0
    test_per_class: int = 25
    signal_dim: int = 16
    nuisance_dim: int = 16
    spread: float = 0.55  #: within-class std in the signal subspace (class centres have unit-variance coords)
    nuisance: float = 1.5  #: std of the class-independent nuisance coordinates
    view_noise: float = 0.15  #: std of the Gaussian noise that makes the two views
    epochs: int = 40
    batch_size: int = 128
    lr: float = 1e-2  #: AdamW peak LR for every method; 1e-3 underfits the known classes of all methods in 40 epochs
    buffer_size: int = 2048
    gamma: float = 10.0


@dataclass
class Split:
    x: torch.Tensor  # [N, d_in]
    y: torch.Tensor  # [N] int64, known 0..Ks-1, novel Ks..K-1


def make_data(s: Setting, seed: int) -> tuple[Split, Split, Split, list[int]]:
    """Known-train, novel-train and balanced test splits, plus per-class training counts ``[K]``."""
    g = torch.Generator().manual_seed(seed)
    k = s.num_known + s.num_novel
    centres = torch.randn(k, s.signal_dim, generator=g)
    rotation, _ = torch.linalg.qr(torch.randn(s.signal_dim + s.nuisance_dim, s.signal_dim + s.nuisance_dim, generator=g))
    counts = long_tail_counts(s.n_max, s.num_known, s.known_ratio) + long_tail_counts(s.n_max, s.num_novel, s.novel_ratio)

    def draw(labels: torch.Tensor) -> Split:
        signal = centres[labels] + s.spread * torch.randn(len(labels), s.signal_dim, generator=g)
        noise = s.nuisance * torch.randn(len(labels), s.nuisance_dim, generator=g)
        return Split(torch.cat([signal, noise], 1) @ rotation.T, labels)

    train_labels = torch.cat([torch.full((n,), c) for c, n in enumerate(counts)])
    train = draw(train_labels)
    known = train.y < s.num_known
    test = draw(torch.arange(k).repeat_interleave(s.test_per_class))
    return Split(train.x[known], train.y[known]), Split(train.x[~known], train.y[~known]), test, counts


class Head(nn.Module):
    """``z = normalize(MLP(x))``: ``[N, d_in] → [N, D]`` with ``K`` prototypes ``[D, K]`` — the fixed simplex ETF,
    or learnable ones used column-normalised (:class:`ncdlr.methods.PrototypeModel`)."""

    def __init__(self, d_in: int, dim: int, num_known: int, num_novel: int, learnable_prototypes: bool, seed: int):
        super().__init__()
        self.num_known, self.num_novel = num_known, num_novel
        self.learnable_prototypes = learnable_prototypes
        self.net = nn.Sequential(nn.Linear(d_in, 64), nn.GELU(), nn.Linear(64, dim))
        k = num_known + num_novel
        self.prototypes = nn.Parameter(torch.randn(dim, k)) if learnable_prototypes else simplex_etf(dim, k, seed=seed)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.normalize(self.net(x), dim=1)

    def class_prototypes(self) -> torch.Tensor:
        return F.normalize(self.prototypes, dim=0) if self.learnable_prototypes else self.prototypes

    def logits(self, z: torch.Tensor) -> torch.Tensor:
        return z @ self.class_prototypes()


def build(method: str, s: Setting) -> Method:
    """The method layer's :class:`~ncdlr.methods.Method` for one of :data:`METHODS` (buffer connected for ncdlr)."""
    if method == "uno":
        return build_method(MethodConfig(name="uno"), LabelerConfig(use_buffer=False), s.num_novel)
    labeler = LabelerConfig(prior="uniform" if method == "ncdlr-uniform" else "adaptive", gamma=s.gamma,
                            buffer_size=s.buffer_size)
    built = build_method(MethodConfig(name="ncdlr"), labeler, s.num_novel)
    built.connect(buffer=LocalBuffer(s.buffer_size, s.num_novel))
    return built


def batches(n_known: int, n_novel: int, batch: int, g: torch.Generator):
    """One epoch = one pass over the novel split; the known split is cycled (fresh permutations)."""
    novel = torch.randperm(n_novel, generator=g)
    known = torch.cat([torch.randperm(n_known, generator=g) for _ in range(math.ceil(n_novel / n_known) + 1)])
    for start in range(0, n_novel - batch + 1, batch):
        yield known[start : start + batch], novel[start : start + batch]


def train_and_evaluate(method: str, s: Setting, seed: int) -> dict[str, float]:
    """Train one method on one seed; return :func:`cluster_accuracy` on the test split (+ final τ)."""
    known, novel, test, counts = make_data(s, seed)
    torch.manual_seed(seed)
    ks = s.num_known
    model = Head(known.x.shape[1], 64, ks, s.num_novel, learnable_prototypes=method == "uno", seed=seed)
    learner = build(method, s)
    g = torch.Generator().manual_seed(seed + 1)
    steps = s.epochs * (len(novel.y) // s.batch_size)
    optimizer = torch.optim.AdamW(model.parameters(), lr=s.lr, weight_decay=1.5e-4)
    warmup = max(1, steps // 20)
    schedule = torch.optim.lr_scheduler.SequentialLR(
        optimizer,
        [torch.optim.lr_scheduler.LinearLR(optimizer, 0.01, 1.0, warmup), torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, steps - warmup, s.lr / 10)],
        [warmup],
    )
    valid = torch.ones(s.batch_size, dtype=torch.bool)

    def views(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return tuple(x + s.view_noise * torch.randn(x.shape, generator=g) for _ in range(2))

    step = 0
    for _ in range(s.epochs):
        for ki, ni in batches(len(known.y), len(novel.y), s.batch_size, g):
            xk1, xk2 = views(known.x[ki])
            xn1, xn2 = views(novel.x[ni])
            zk1, zk2, zn1, zn2 = model(torch.cat([xk1, xk2, xn1, xn2])).split(s.batch_size)
            targets, _ = learner.novel_targets(model, zn1, zn2, valid, step)
            loss = learner.known_loss(model, zk1, zk2, known.y[ki]) + learner.novel_loss(model, zn1, zn2, targets, valid)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            schedule.step()
            step += 1

    with torch.no_grad():
        logits = learner.predict_logits(model, model(test.x))
    result = cluster_accuracy(test.y.numpy(), logits.argmax(1).numpy(), ks, train_counts=counts)
    result["tau"] = learner.imbalance_factor
    return result


def summarise(results: dict[str, list[dict[str, float]]]) -> str:
    """Markdown table: class-mean accuracy (%) mean ± std over seeds per method."""
    header = "| method | " + " | ".join(COLUMNS) + " | final τ |"
    lines = [header, "|" + "---|" * (len(COLUMNS) + 2)]
    for method, runs in results.items():
        cells = []
        for col in COLUMNS + ("tau",):
            vals = np.array([r[col] for r in runs], dtype=float) * (1 if col == "tau" else 100)
            cells.append(f"{np.nanmean(vals):.1f} ± {np.nanstd(vals):.1f}")
        lines.append(f"| {method} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m ncdlr.experiments.synthetic", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seeds", type=int, default=3, help="seeds per method (default 3; mean ± std reported)")
    parser.add_argument("--epochs", type=int, default=Setting.epochs, help="epochs per run (one epoch = one pass over the novel split)")
    parser.add_argument("--novel-ratio", type=float, default=Setting.novel_ratio, help="imbalance ratio R^u of the novel classes (paper: 50 or 100)")
    parser.add_argument("--gamma", type=float, default=Setting.gamma, help="γ of the adaptive prior (default 0.5·Ku = 10, see above)")
    parser.add_argument("--methods", nargs="+", choices=METHODS, default=list(METHODS))
    parser.add_argument("--out", type=Path, default=None, help="directory for results.json and results.md (optional)")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)  # tiny matrices: a second thread only adds synchronisation

    setting = Setting(epochs=args.epochs, novel_ratio=args.novel_ratio, gamma=args.gamma)
    results: dict[str, list[dict[str, float]]] = {m: [] for m in args.methods}
    start = time.perf_counter()
    for seed in range(args.seeds):
        for method in args.methods:
            t0 = time.perf_counter()
            results[method].append(train_and_evaluate(method, setting, seed))
            r = results[method][-1]
            print(f"[seed {seed}] {method:<14} novel {100 * r['novel']:5.1f}  known {100 * r['known']:5.1f}  τ {r['tau']:.2f}  ({time.perf_counter() - t0:.1f} s)", flush=True)
    table = summarise(results)
    print(f"\nSynthetic long-tailed NCD, Ks = Ku = 20, R^s = {setting.known_ratio:g}, R^u = {setting.novel_ratio:g}, "
          f"{setting.epochs} epochs, {args.seeds} seeds, γ = {setting.gamma:g} — class-mean accuracy (%)\n")
    print(table)
    print(f"\ntotal {time.perf_counter() - start:.0f} s")
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "results.json").write_text(json.dumps({"setting": asdict(setting), "results": results}, indent=2))
        (args.out / "results.md").write_text(table + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
