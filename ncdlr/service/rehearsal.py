"""Choosing γ without touching the novel labels: a discovery rehearsal on the known classes (method.md §4 trap c).

The in-process counterpart of the Ray Tune search (``tuning/gamma_search.py``), on the same validation
problem (:func:`ncdlr.service.validation.validation_splits`: pseudo-novel classes stratified over
head/medium/tail, a held-out ``val`` share of every class). Each candidate ``γ`` trains the method on it with
:func:`ncdlr.service.local.train` and is scored by the pseudo-novel class-mean accuracy on ``val``
(:func:`ncdlr.service.validation.validation_scores`). Since ``γ`` enters as ``γ · KL / Ku`` (its strength
grows as Ku shrinks, trap a), the candidates are compared at equal ``γ / Ku`` and the winner is rescaled to
the real ``Ku``. The validation problem has fewer unlabeled rows than the real one (n' pseudo-novel against n
novel training rows), so each candidate trains with the batch and the buffer scaled by n'/n: an epoch has as
many steps as a real one and the buffer holds the same share of an epoch. Cost: one training on about 80 % of
the known rows per candidate and draw.

The uniform prior (:data:`UNIFORM`) can be a candidate, so the rehearsal may also answer "learn the prior or
not"; :func:`select_setting` rehearses the values of any other config key the same way (e.g. the known-class
warm-up, ``optim.known_warmup_epochs``), and :func:`select_edits` named edits of several keys at once. Several
draws (other pseudo-novel classes, other held-out images) average the scores, and the choice
(:func:`choose_candidate`) keeps the default γ/Ku unless a candidate beats it on the draws by two standard errors.

Two ways to lower the noise of one draw without a new validation problem: a *replicate* trains every candidate
again on the same draws with other training seeds (:func:`replicate_seed`), and the *pool* score
(:data:`POOL_SPLIT`) reads each run's clustering of the pseudo-novel rows it trained on without their labels
(the transductive score of the NCD literature: about four times the pseudo-novel rows ``val`` scores, but
rows the run has seen).

A rehearsal may also *plant* its pseudo-novel classes in the real unlabeled pool (``planted=True``:
:func:`ncdlr.service.validation.planted_splits`), so every candidate trains on the real pool's sizes and number
of clusters; its pool score is then the planted classes' F1 against the clusters of the whole pool
(:func:`ncdlr.service.validation.planted_scores`), since the real rows beside them carry no label.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Hashable, Mapping, Sequence

import numpy as np

from ncdlr.data.features import FeatureSplits
from ncdlr.method_settings import GAMMA_UNIFORM

from .config import Config
from .local import TrainedRun, fixed_scores, train
from .validation import (SCORING_SPLIT, ValidationConfig, ValidationSplit, planted_scores, planted_splits,
                         validation_scores, validation_splits)


#: the γ/Ku a rehearsal keeps unless another candidate is measurably better (configs/openclipart.yaml: gamma_per_cluster 0.5)
DEFAULT_GAMMA_PER_CLUSTER = 0.5
#: the candidate "uniform prior" (labeler.prior = uniform, UNO's balanced marginal: the γ → ∞ limit), in γ/Ku units
UNIFORM = GAMMA_UNIFORM


#: the split of the validation problem behind the pool score: the pseudo-novel training rows (unlabeled to the run)
POOL_SPLIT = "novel"
#: replicate ``r`` of a rehearsal trains with ``run.seed + REPLICATE_SEED_STRIDE · r`` (draws keep their problems)
REPLICATE_SEED_STRIDE = 1000

#: a rehearsal candidate: edits a trial config in place, given the validation problem's number of pseudo-novel classes
Candidate = Callable[[Config, int], object]


def scaled_config(cfg: Config, scale: float) -> Config:
    """A copy of ``cfg`` with ``data.batch_size`` and ``labeler.buffer_size`` times ``scale`` (n'/n; at least one
    row, the buffer at least one batch): an epoch of the validation problem has as many steps as a real one."""
    trial = copy.deepcopy(cfg)
    trial.data.batch_size = max(1, round(cfg.data.batch_size * scale))
    trial.labeler.buffer_size = max(trial.data.batch_size, round(cfg.labeler.buffer_size * scale))
    return trial


def single_process(cfg: Config) -> Config:
    """``cfg`` as one process trains it: ``data.batch_size`` is per worker, so the in-process rehearsal takes the
    whole step's batch, ``data.batch_size × run.num_workers`` (configs/openclipart.yaml: 32 × 2 = 64, the batch
    of every benchmark cell), on one worker."""
    out = copy.deepcopy(cfg)
    out.data.batch_size, out.run.num_workers = cfg.data.batch_size * max(1, cfg.run.num_workers), 1
    return out


def trial_config(cfg: Config, splits: FeatureSplits, validation: FeatureSplits) -> Config:
    """``cfg`` scaled (:func:`scaled_config`) from the real problem ``splits`` to the validation problem
    ``validation``: by n'/n, its pseudo-novel rows over the real novel rows (at most 1)."""
    return scaled_config(cfg, min(1.0, len(validation.features["novel"]) / len(splits.features["novel"])))


def apply_gamma(cfg: Config, gamma: float) -> Config:
    """``cfg`` with the rehearsal's choice set in place (:meth:`~ncdlr.method_settings.LabelerConfig.set_gamma`)."""
    cfg.labeler.set_gamma(gamma)
    return cfg


def predictions(run: TrainedRun, problem: FeatureSplits, split: str, cfg: Config | None = None) -> np.ndarray:
    """``[n]`` predictions of ``run`` for the rows of ``problem``'s ``split`` (view 0, argmax over all K) after the
    post-hoc fix the run's config ``cfg`` names (``method.posthoc``; none without ``cfg``), taken on ``problem``'s
    own training rows (:func:`~ncdlr.service.local.fixed_scores`): a candidate ``method.posthoc=la`` is rehearsed as
    it would be used."""
    kind = cfg.method.posthoc if cfg is not None else "none"
    extra = {} if cfg is None else {"temperature": cfg.method.temperature, "crt_epochs": cfg.method.crt_epochs,
                                    "seed": cfg.run.seed}
    return fixed_scores(run, problem, problem.features[split], (kind,), **extra)[kind].argmax(1).numpy()


def rehearsal_score(run: TrainedRun, validation: FeatureSplits, split: str = SCORING_SPLIT,
                    cfg: Config | None = None) -> float:
    """The validation score of ``run``: pseudo-novel class-mean accuracy of its predictions (:func:`predictions`,
    with ``cfg``'s post-hoc fix) on ``split`` (``val``, the held-out rows; or :data:`POOL_SPLIT`, the pseudo-novel
    rows it trained on, view 0)."""
    return validation_scores(validation.labels[split].numpy(), predictions(run, validation, split, cfg),
                             validation.num_known, validation.train_counts())["score"]


def planted_score(run: TrainedRun, problem: FeatureSplits, info: ValidationSplit, cfg: Config | None = None) -> float:
    """The pool score of ``run`` on a planted problem (:func:`~ncdlr.service.validation.planted_splits`): the
    planted classes' mean F1 against its clusters of all the ``novel`` training rows (:func:`predictions`, with
    ``cfg``'s post-hoc fix)."""
    return planted_scores(problem.labels[POOL_SPLIT].numpy(), predictions(run, problem, POOL_SPLIT, cfg), info)["score"]


#: config fields that only change how a trained model is scored, not its training (``section.name``)
EVALUATION_ONLY = ("method.posthoc",)


def training_key(cfg: Config) -> str:
    """What decides a training of ``cfg``: its config with the :data:`EVALUATION_ONLY` fields at their defaults,
    written out (two candidates with one key train the same model, so a rehearsal trains it once)."""
    plain = copy.deepcopy(cfg)
    for key in EVALUATION_ONLY:
        section, name = key.split(".", 1)
        setattr(getattr(plain, section), name, getattr(type(getattr(plain, section))(), name))
    return repr(plain)


def replicate_seed(cfg: Config, replicate: int) -> int:
    """The training seed of replicate ``replicate`` of a rehearsal of ``cfg`` (replicate 0: ``run.seed`` itself)."""
    if replicate < 0:
        raise ValueError(f"replicate must be at least 0, got {replicate}")
    return cfg.run.seed + REPLICATE_SEED_STRIDE * replicate


def select_gamma(cfg: Config, splits: FeatureSplits, gamma_per_cluster: tuple[float, ...] = (0.05, 0.15, 0.5, 1.5),
                 draws: int = 1, pseudo_novel_fraction: float = ValidationConfig.pseudo_novel_fraction,
                 per_draw: dict[float, list[float]] | None = None, default: float | None = DEFAULT_GAMMA_PER_CLUSTER,
                 margin_se: float = 2.0) -> tuple[float, dict[float, float]]:
    """Best ``γ`` for ``cfg`` on ``splits`` by the known-class rehearsal.

    Args:
        cfg: the run's config (its ``labeler.gamma`` is ignored; ``run.seed`` seeds the first validation split).
        splits: the real feature splits: the ``known`` rows, ``num_novel`` (Ku) and the number of ``novel``
            training rows (their labels are never read).
        gamma_per_cluster: candidates for ``γ / Ku``; :data:`UNIFORM` is the uniform prior.
        draws: validation problems to average over (seeds ``run.seed``, ``run.seed + 1``, …: other pseudo-novel
            classes, other held-out images). One draw of a small Ks scores a handful of classes, so one image
            moves its score by several points.
        pseudo_novel_fraction: share of the known classes made pseudo-novel (:class:`ValidationConfig`).
        per_draw: filled with ``{γ/Ku: [score of each draw]}`` when given.
        default, margin_se: how the choice is made from the draws (:func:`choose_candidate`).

    Returns:
        ``(γ for the real Ku, {γ/Ku: mean pseudo-novel class-mean accuracy on val})``. The γ is :data:`UNIFORM`
        when the uniform prior wins (:func:`apply_gamma`).
    """
    candidates = {ratio: (lambda trial, ku, ratio=ratio: apply_gamma(trial, ratio * ku)) for ratio in gamma_per_cluster}
    by_draw = rehearse(cfg, splits, candidates, draws, pseudo_novel_fraction)
    if per_draw is not None:
        per_draw.update(by_draw)
    scores = {ratio: float(np.mean(values)) for ratio, values in by_draw.items()}
    return choose_candidate(by_draw, default, margin_se) * splits.num_novel, scores


def rehearse(cfg: Config, splits: FeatureSplits, candidates: Mapping[Hashable, Candidate], draws: int = 1,
             pseudo_novel_fraction: float = ValidationConfig.pseudo_novel_fraction,
             first_draw: int = 0, replicate: int = 0,
             pool: dict[Hashable, list[float]] | None = None, planted: bool = False,
             runs: dict | None = None) -> dict[Hashable, list[float]]:
    """Each candidate's pseudo-novel score on each validation draw: ``{key: [score of draw first_draw, the next, …]}``
    (``draws`` of them; a later ``first_draw`` extends an earlier rehearsal with new draws).

    Draw ``d`` is the validation problem of seed ``run.seed + d`` (:func:`validation_splits`); every candidate
    trains on it from ``cfg`` scaled to its size (:func:`trial_config`) and edited by ``candidates[key](trial,
    Ku')``, with the training seed of ``replicate`` (:func:`replicate_seed`), and is scored by
    :func:`rehearsal_score` on ``val``. ``pool``, when given, is filled the same way with the pool score
    (:data:`POOL_SPLIT`) of the same runs. ``planted``: draw ``d`` is instead the planted problem of that seed
    (:func:`~ncdlr.service.validation.planted_splits`, the real pool beside the pseudo-novel classes, so no scaling),
    the edit gets its ``Ku' + Ku`` clusters, and ``pool`` gets :func:`planted_score`. Each score applies the
    candidate's own post-hoc fix (``method.posthoc``). Candidates whose configs differ only in evaluation-only fields
    (:func:`training_key`) share one training of a draw; ``runs``, when given, keeps the current draw's trainings
    across calls (a caller that rehearses one candidate per call passes the same dict). Cost: at most
    ``len(candidates) · draws`` trainings.
    """
    if draws < 1 or first_draw < 0:
        raise ValueError(f"draws must be at least 1 and first_draw at least 0, got {draws}, {first_draw}")
    seed = replicate_seed(cfg, replicate)
    by_draw: dict[Hashable, list[float]] = {key: [] for key in candidates}
    trained = runs if runs is not None else {}  # (draw, replicate, planted, fraction, training_key) → TrainedRun
    problem = planted_splits if planted else validation_splits
    for draw in range(first_draw, first_draw + draws):
        validation, info = problem(
            splits, ValidationConfig(seed=cfg.run.seed + draw, pseudo_novel_fraction=pseudo_novel_fraction))
        this_draw = (draw, replicate, planted, pseudo_novel_fraction)
        for stale in [tag for tag in trained if tag[:-1] != this_draw]:  # a training is reused within its draw only
            del trained[stale]
        for key, edit in candidates.items():
            trial = trial_config(cfg, splits, validation)
            trial.run.seed = seed
            edit(trial, validation.num_novel)
            tag = (*this_draw, training_key(trial))  # before train(), which fills in the trial's model fields
            if tag not in trained:
                trained[tag] = train(trial, validation)
            run = trained[tag]
            by_draw[key].append(rehearsal_score(run, validation, cfg=trial))
            if pool is not None:
                pool.setdefault(key, []).append(planted_score(run, validation, info, trial) if planted
                                                else rehearsal_score(run, validation, POOL_SPLIT, trial))
    return by_draw


def select_setting(cfg: Config, splits: FeatureSplits, key: str, values: Sequence, default, draws: int = 3,
                   pseudo_novel_fraction: float = ValidationConfig.pseudo_novel_fraction,
                   per_draw: dict | None = None, margin_se: float = 2.0) -> tuple[object, dict]:
    """The value of config ``key`` (``"section.name"``) the known-class rehearsal supports, among ``values``.

    ``default`` (one of ``values``) stays unless another value beats it draw by draw by ``margin_se`` standard
    errors (:func:`choose_candidate`); hence at least two draws. Returns ``(value, {value: mean score})``;
    ``per_draw`` is filled with ``{value: [score of each draw]}`` when given. :func:`select_edits` with one key.
    """
    return select_edits(cfg, splits, one_key_edits(key, values), default, draws, pseudo_novel_fraction, per_draw,
                        margin_se)


def one_key_edits(key: str, values: Sequence) -> dict[object, dict[str, object]]:
    """The candidates of :func:`select_edits` that set one config ``key`` to each of ``values``, named by the value."""
    return {value: {key: value} for value in values}


def select_edits(cfg: Config, splits: FeatureSplits, candidates: Mapping[Hashable, Mapping[str, object]], default,
                 draws: int = 3, pseudo_novel_fraction: float = ValidationConfig.pseudo_novel_fraction,
                 per_draw: dict | None = None, margin_se: float = 2.0, first_draw: int = 0, replicate: int = 0,
                 pool: dict | None = None, planted: bool = False) -> tuple[object, dict]:
    """Which of several named config edits the known-class rehearsal supports (on ``draws`` validation draws from
    ``first_draw``: :func:`rehearse`).

    ``candidates``: ``{name: {"section.key": value, …}}``, each applied to the trial configs of its trainings (an
    empty edit = ``cfg`` as it is), so a candidate may change several keys at once (e.g. the uniform prior *and*
    relaxed sizes). ``default`` (a name) stays unless another candidate beats it draw by draw by ``margin_se``
    standard errors (:func:`choose_candidate`); hence at least two draws. Returns ``(name, {name: mean score})``;
    ``per_draw`` is filled with ``{name: [score of each draw]}`` when given; ``replicate`` and ``pool`` as in
    :func:`rehearse` (``pool`` filled with the pool scores of the same runs), and ``planted`` too.
    """
    fields = {}  # candidate → [(section, field, value)], each key parsed and checked once
    for candidate, edits in candidates.items():
        fields[candidate] = [(*key.split(".", 1), value) for key, value in edits.items()]
        for key, (section, name, _) in zip(edits, fields[candidate]):
            if not hasattr(getattr(cfg, section, None), name):
                raise ValueError(f"unknown config key {key!r}")
    if default not in candidates or draws < 2:
        raise ValueError(f"need the default among the candidates and at least 2 draws; got {default!r} in "
                         f"{list(candidates)}, draws={draws}")

    def edit(trial: Config, _ku: int, changes: list[tuple[str, str, object]]) -> None:
        for section, name, value in changes:
            setattr(getattr(trial, section), name, value)

    by_draw = rehearse(cfg, splits, {candidate: (lambda trial, ku, changes=changes: edit(trial, ku, changes))
                                     for candidate, changes in fields.items()}, draws, pseudo_novel_fraction,
                       first_draw, replicate, pool, planted)
    if per_draw is not None:
        per_draw.update(by_draw)
    return choose_candidate(by_draw, default, margin_se), {v: float(np.mean(s)) for v, s in by_draw.items()}


def choose_candidate(per_draw: dict[float, list[float]], default: float | None = DEFAULT_GAMMA_PER_CLUSTER,
                     margin_se: float = 2.0) -> float:
    """The rehearsal's choice among candidates ``γ/Ku`` from their scores on each validation draw.

    With one draw (or no ``default`` among the candidates): the best mean score, ties to the candidate nearest
    ``γ/Ku = 0.5``. With several: ``default`` stays unless another candidate beats it, draw by draw (paired: the
    draws are the same validation problems for every candidate), by a mean margin above ``margin_se`` standard
    errors of those differences; of the candidates that do, the best mean. A rehearsal on a small Ks scores a
    handful of classes per draw (measured on OpenClipart-LT: ±8 points between draws, 2 between candidates), and
    an argmax over such scores would choose on noise.

    Args:
        per_draw: ``{γ/Ku: [score of draw 0, draw 1, …]}``, the same number of draws for every candidate.
        default: the candidate kept without evidence against it (None: plain argmax).
        margin_se: how many standard errors of the paired difference a challenger must clear.
    """
    means = {ratio: float(np.mean(values)) for ratio, values in per_draw.items()}
    draws = len(next(iter(per_draw.values())))
    if draws < 2 or default not in per_draw:
        return max(means, key=lambda r: (means[r], -abs(np.log(r / 0.5))))
    base = np.asarray(per_draw[default])
    better = {}
    for ratio, values in per_draw.items():
        diff = np.asarray(values) - base
        if ratio != default and diff.mean() > margin_se * diff.std(ddof=1) / np.sqrt(draws):
            better[ratio] = means[ratio]
    return max(better, key=better.get) if better else default
