"""How many novel clusters the model gets (``model.num_novel``), the oracle counts of ``labeler.prior=fixed``, and the
measures of the known classes that ``labeler.max_imbalance = 0`` and ``labeler.size_floor = known`` stand for
(:func:`fill_from_known`).

``model.num_novel`` is ``"0"`` (the data's number of novel classes — the default), a positive integer ``N``
(``N`` novel prototypes / clusters, whatever the data holds), or ``"auto"``: before training, the driver
estimates ``Ku`` with :func:`ncdlr.estimate_k.estimate_num_novel` (method.md §6: Ward on the frozen
features of the known + novel training rows, mixed metric β = 0.5) and trains with ``Ks + Ku_est``
prototypes. In feature-table mode the table's known + novel rows are used as they are; in image mode the
known and novel splits are first embedded with the run's frozen encoder (``model.encoder`` /
``model.pretrained``, :func:`ncdlr.service.embed.embed_dataset`) into ``RUN/estimate_k_features.parquet``.
The resolved number replaces ``"auto"`` in the run's ``config.yaml`` and the estimate is kept in
``RUN/num_novel.json`` (evaluation copies it into ``metrics.json`` as ``num_novel_estimated``).
Evaluation needs nothing else: the Hungarian matching accepts any number of predicted clusters.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np
import torch

from .config import ConfigError

log = logging.getLogger(__name__)

ESTIMATE_FILE = "num_novel.json"


def model_num_novel(cfg, summary) -> int:
    """``Ku`` of the model: ``model.num_novel`` when positive, else the data's ``summary.num_novel``.

    Raises:
        ValueError: ``model.num_novel`` is still ``"auto"`` (only :func:`resolve_num_novel` resolves it).
    """
    value = cfg.model.num_novel
    if value == "auto":
        raise ValueError("model.num_novel='auto' is resolved by the trainer before training "
                         "(ncdlr.service.num_novel.resolve_num_novel); the config here still says 'auto'")
    count = int(value)
    return count if count > 0 else summary.num_novel


def fixed_prior_counts(cfg, summary) -> torch.Tensor | None:
    """``[Ku]`` true training counts of the novel classes for ``labeler.prior=fixed``, else None.

    ``prior=fixed`` is the paper's ORACLE ablation: it reads the novel classes' training counts (labels an
    NCD method never has), from the feature table or the dataset manifest. It needs the model's ``Ku`` to
    be the data's (a ranked prior over a different number of clusters is undefined).
    """
    if cfg.labeler.prior != "fixed":
        return None
    ku = model_num_novel(cfg, summary)
    if ku != summary.num_novel:
        raise ConfigError(f"labeler.prior=fixed (oracle true novel counts) needs model.num_novel = the data's "
                         f"{summary.num_novel} novel classes, got {ku}; use another prior or model.num_novel=0")
    counts = summary.train_counts[summary.num_known:summary.num_known + summary.num_novel]
    if len(counts) != summary.num_novel or sum(counts) <= 0:
        raise ConfigError(f"labeler.prior=fixed: the data's training counts of its {summary.num_novel} novel classes "
                         f"are missing or all zero ({counts})")
    return torch.tensor(counts, dtype=torch.float32)


def needs_max_imbalance(labeler) -> bool:
    """Whether a ``labeler`` config section reads ``max_imbalance`` (priors ``bounded`` and ``anchored``)."""
    return labeler.prior in ("bounded", "anchored")


def known_imbalance(train_counts, num_known: int, what: str = "labeler.max_imbalance=0") -> float:
    """``n_max / n_min`` over the known classes' training counts ``train_counts[:num_known]`` (observable without a
    novel label; classes with no row are left out). ``what``: the setting that asked, named in the error when no known
    class has a row."""
    counts = _known_counts(train_counts, num_known, what)
    return float(counts.max() / counts.min())


def rarest_known_share(train_counts, num_known: int, novel_rows: int) -> float:
    """The training count of the rarest known class over ``novel_rows`` (the novel pool's size, observable): the
    share ``labeler.size_floor = "known"`` stands for."""
    if novel_rows < 1:
        raise ConfigError("labeler.size_floor=known: the data has no novel training rows")
    return float(_known_counts(train_counts, num_known, "labeler.size_floor=known").min() / novel_rows)


def _known_counts(train_counts, num_known: int, what: str) -> np.ndarray:
    counts = np.asarray(list(train_counts)[:num_known], dtype=float)
    counts = counts[counts > 0]
    if counts.size == 0:
        raise ConfigError(f"{what} stands for a measure of the known classes, but no known class has a training row; "
                          f"set it to a number")
    return counts


def fill_from_known(cfg, train_counts, num_known: int, novel_rows: int) -> dict[str, object]:
    """Resolve in ``cfg`` what stands for a measure of the known classes: ``labeler.max_imbalance = 0`` where the prior
    reads it (their ``n_max / n_min``), ``labeler.relax_bound = "known"`` (the same ratio) and
    ``labeler.size_floor = "known"`` (the rarest one's share of the
    ``novel_rows``). Returns ``{key: value filled in}``."""
    filled: dict[str, object] = {}
    if needs_max_imbalance(cfg.labeler) and not cfg.labeler.max_imbalance:
        cfg.labeler.max_imbalance = filled["labeler.max_imbalance"] = known_imbalance(train_counts, num_known)
    if cfg.labeler.relax_bound == "known" and cfg.labeler.reg_m > 0:
        bound = known_imbalance(train_counts, num_known, "labeler.relax_bound=known")
        if not bound > 1:
            raise ConfigError(f"labeler.relax_bound=known: the known classes' training counts are all equal (n_max/n_min "
                              f"= {bound:g}), so they bound no imbalance; set labeler.relax_bound to a number > 1")
        cfg.labeler.relax_bound = filled["labeler.relax_bound"] = f"{bound:.6g}"
    if cfg.labeler.size_floor == "known":
        share = rarest_known_share(train_counts, num_known, novel_rows)
        cfg.labeler.size_floor = filled["labeler.size_floor"] = f"{share:.6g}"
    for key, value in filled.items():
        log.info("%s from the known classes: %s", key, value)
    return filled


def _training_features(cfg, data, output: Path) -> tuple[np.ndarray, np.ndarray, np.ndarray, str]:
    """``features [N, D]``, ``labels [N]``, ``labeled [N]`` of the known + novel training rows, and their source."""
    from ncdlr.data.features import read_feature_table

    if data.features is not None:  # feature-table mode: the table the driver has read already
        return (*data.features.labeled_rows(), cfg.data.features)
    from .embed import embed_dataset

    table = str(output / "estimate_k_features.parquet")
    log.info("model.num_novel=auto: embedding the known and novel splits of %s with the frozen %s first",
             cfg.data.uri, cfg.model.encoder)
    embed_dataset(cfg.data.uri, table, encoder=cfg.model.encoder, pretrained=cfg.model.pretrained,
                  image_size=cfg.data.image_size, splits=("known", "novel"), endpoint_url=cfg.data.endpoint_url or None)
    return (*read_feature_table(table, splits=("known", "novel")).labeled_rows(), table)


def resolve_num_novel(cfg, data, output: str | Path) -> dict | None:
    """Replace ``model.num_novel="auto"`` in ``cfg`` by the estimate; write ``RUN/num_novel.json``.

    Returns the estimate record (``num_novel``, ``num_novel_true``, ``seconds``, ``beta``, ``k_max``,
    ``score``, ``features``) or None when ``model.num_novel`` is not ``"auto"``.
    """
    if cfg.model.num_novel != "auto":
        return None
    from ncdlr.estimate_k import EstimateKConfig, estimate_num_novel

    output = Path(output)
    features, labels, labeled, source = _training_features(cfg, data, output)
    summary = data.summary
    result, _ = estimate_num_novel(features, labels, labeled, EstimateKConfig(seed=cfg.run.seed))
    if result.num_novel < 1:
        raise ValueError(f"model.num_novel=auto: ncdlr.estimate_k found Ku = 0 novel classes in {source} "
                         f"(score {result.score:.4f}); set model.num_novel to a number")
    record = {"num_novel": result.num_novel, "num_novel_true": summary.num_novel, "seconds": result.seconds,
              "beta": result.beta, "k_max": result.k_max, "score": result.score, "approximate": result.approximate,
              "features": source}
    cfg.model.num_novel = str(result.num_novel)
    output.mkdir(parents=True, exist_ok=True)
    (output / ESTIMATE_FILE).write_text(json.dumps(record, indent=2) + "\n")
    log.info("model.num_novel=auto: estimated Ku = %d (data: %d) in %.1f s from %s", result.num_novel,
             summary.num_novel, result.seconds, source)
    return record


def read_estimate(run_dir: str | Path) -> dict | None:
    """The run's ``num_novel.json`` (written when ``model.num_novel`` was ``"auto"``), else None."""
    path = Path(run_dir) / ESTIMATE_FILE
    return json.loads(path.read_text()) if path.is_file() else None
