"""A rehearsal of named config candidates on a user's own table: which setting to train with, chosen without a
novel label or a test image (``ncdlr rehearse``).

The benchmark chose every dataset config's setting this way (``benchmarks/quality.py --select-setting …
--select-problem planted``, docs/results.md sessions 26–35); this module poses the same choice on any feature
table or activation cache. Each candidate is a whole config: the base config (YAML file and command-line
overrides) with the candidate's own ``section.key=value`` edits on top, resolved and checked as ``ncdlr train``
would (:func:`ncdlr.service.config.resolve`). The base config itself is always the candidate :data:`BASE`, the
one kept without evidence against it.

Every candidate trains on the same draws (paired): draw ``d`` is the validation problem of seed ``run.seed + d``
(:func:`ncdlr.service.rehearsal.rehearse`). On the *planted* problem (the default, the rehearsal of record since
session 26) a fifth of the known classes is planted among the real unlabeled rows and the score is their F1
against the clusters of the whole pool; on the *known* problem the pseudo-novel classes are posed alone. Only the
``known`` and ``novel`` rows of the table are read, and the novel rows' labels are replaced by a placeholder before
anything uses them (:func:`ncdlr.service.validation.planted_splits`).

Each (draw, candidate) training is written to the record (``rehearsal.json``) as it finishes, so an interrupted
rehearsal resumes where it stopped and a rerun with more ``draws`` extends it. A record is tied to the resolved
configs and the table it was run on; a rerun with other candidates' configs is refused rather than mixed.

The choice (:func:`choose`) is :func:`ncdlr.service.rehearsal.choose_candidate` over the paired draws: the base
stays unless a candidate beats it by ``margin_se`` standard errors of the paired differences. The project's rule
for a config since session 27 is the higher mean, no margin (``margin_se`` 0).
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ncdlr.data.features import FeatureSplits

from .config import Config, ConfigError, Setting, resolve
from .rehearsal import choose_candidate, rehearse, single_process

#: the name of the candidate that is the base config itself (no edits): the one kept without evidence against it
BASE = "config"
#: the validation problems a rehearsal can pose, and the scores it can choose by
PROBLEMS, SCORES = ("planted", "known"), ("pool", "val")
RECORD_NAME = "rehearsal.json"
RECORD_VERSION = 1


@dataclass(frozen=True)
class RehearsalPlan:
    """What a rehearsal poses and how it chooses.

    Attributes:
        problem: ``planted`` (pseudo-novel classes planted in the real unlabeled pool, Ku' + Ku clusters) or
            ``known`` (the pseudo-novel classes alone, scale-matched batches).
        score: ``pool`` (planted: the planted classes' F1 in the whole pool; known: the pseudo-novel training
            rows' clustering accuracy) or ``val`` (the held-out pseudo-novel images' class-mean accuracy).
        draws: validation draws every candidate trains on (≥ 2, so the paired differences have an SE).
        margin_se: standard errors of the paired difference a candidate must clear to replace the base (0 = the
            higher mean, the project's rule).
        pseudo_novel_fraction: share of the known classes hidden per draw (0.2).
    """

    problem: str = "planted"
    score: str = "pool"
    draws: int = 8
    margin_se: float = 0.0
    pseudo_novel_fraction: float = 0.2

    def __post_init__(self) -> None:
        if self.problem not in PROBLEMS or self.score not in SCORES:
            raise ValueError(f"problem must be one of {PROBLEMS} and score one of {SCORES}, got {self.problem!r}, "
                             f"{self.score!r}")
        if self.draws < 2:
            raise ValueError(f"a rehearsal needs at least 2 draws (the paired differences' SE), got {self.draws}")
        if self.margin_se < 0 or not 0 < self.pseudo_novel_fraction < 1:
            raise ValueError(f"margin_se must be ≥ 0 and pseudo_novel_fraction in (0, 1), got {self.margin_se}, "
                             f"{self.pseudo_novel_fraction}")


def parse_candidate(tokens: Sequence[str]) -> tuple[str, list[Setting]]:
    """``["pair", "method.task_weight=1", "method.known_reweight=1"]`` → ``("pair", [Setting, …])``: a name, then
    one ``key=value`` edit or more (``section.key`` or a unique bare key; values as on the command line)."""
    if not tokens:
        raise ConfigError("--candidate needs a name and at least one key=value edit")
    name, edits = tokens[0], list(tokens[1:])
    if "=" in name or not name:
        raise ConfigError(f"--candidate starts with its name, then key=value edits; got {' '.join(tokens)!r}")
    if name == BASE:
        raise ConfigError(f"the candidate name {BASE!r} is the base config itself; name yours otherwise")
    if not edits:
        raise ConfigError(f"candidate {name!r} has no key=value edit: it would be the base config again")
    settings = []
    for edit in edits:
        key, sep, value = edit.partition("=")
        if not sep or not key:
            raise ConfigError(f"candidate {name!r}: expected key=value, got {edit!r}")
        settings.append(Setting(key.removeprefix("--"), value, from_text=True, source=f"candidate {name!r}"))
    return name, settings


def candidate_configs(base: Sequence[Setting], candidates: Sequence[tuple[str, Sequence[Setting]]]) -> dict[str, Config]:
    """``{BASE: the base config, name: the base with that candidate's edits}``, each resolved and checked
    (:func:`~ncdlr.service.config.resolve`: unknown keys, wrong types and contradictions name the candidate).
    Two candidates that resolve to the same config as each other or as the base are refused."""
    configs = {BASE: resolve(list(base))}
    for name, edits in candidates:
        if name in configs:
            raise ConfigError(f"candidate {name!r} is given twice")
        configs[name] = resolve(list(base) + list(edits))
        if configs[name].run.seed != configs[BASE].run.seed:
            raise ConfigError(f"candidate {name!r} changes run.seed: the draws are paired by it (every candidate "
                              f"trains on the problems of run.seed + d); set --seed for all of them instead")
    seen: dict[str, str] = {}
    for name, cfg in configs.items():
        key = json.dumps(comparable(cfg), sort_keys=True)
        if key in seen:
            raise ConfigError(f"candidate {name!r} resolves to the same config as {seen[key]!r}: nothing to choose")
        seen[key] = name
    return configs


def comparable(cfg: Config) -> dict:
    """The part of ``cfg`` a rehearsal's trainings depend on (``run.output`` and the other run-only fields left out;
    ``run.num_workers`` enters through the whole step's batch, :func:`single_process`), for telling whether a
    record was made with these configs."""
    data = single_process(cfg).to_dict()
    data.pop("run", None)
    data["seed"] = cfg.run.seed
    return data


@dataclass
class Record:
    """A rehearsal's results so far: ``scores[name][d] = {"val": …, "pool": …, "seconds": …}`` for draw ``d``
    (a string key in the JSON), with what they were measured on."""

    table: str
    plan: dict
    configs: dict[str, dict]
    scores: dict[str, dict[str, dict[str, float]]]

    @classmethod
    def fresh(cls, table: str, plan: RehearsalPlan, configs: Mapping[str, Config]) -> "Record":
        return cls(table, {"problem": plan.problem, "pseudo_novel_fraction": plan.pseudo_novel_fraction},
                   {name: comparable(cfg) for name, cfg in configs.items()}, {name: {} for name in configs})

    def to_json(self) -> dict:
        return {"version": RECORD_VERSION, "table": self.table, "plan": self.plan, "configs": self.configs,
                "scores": self.scores}


def load_record(path: Path, table: str, plan: RehearsalPlan, configs: Mapping[str, Config]) -> Record:
    """The record at ``path`` if it was made on ``table`` with ``plan``'s problem and these configs (a fresh one if
    there is none); anything else raises :class:`ConfigError` naming what differs, so results are never mixed."""
    fresh = Record.fresh(table, plan, configs)
    if not path.is_file():
        return fresh
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise ConfigError(f"{path} is not a rehearsal record ({err}); move it away or choose another --output") from None
    if data.get("version") != RECORD_VERSION:
        raise ConfigError(f"{path} has record version {data.get('version')!r}, not {RECORD_VERSION}")
    if data["table"] != table or data["plan"] != fresh.plan:
        raise ConfigError(f"{path} was rehearsed on {data['table']!r} with {data['plan']}, not on {table!r} with "
                          f"{fresh.plan}; choose another --output")
    for name, cfg in fresh.configs.items():
        if name in data["configs"] and data["configs"][name] != cfg:
            changed = sorted(f"{section}.{key}" for section, values in cfg.items() if isinstance(values, dict)
                             for key, value in values.items()
                             if data["configs"][name].get(section, {}).get(key) != value)
            raise ConfigError(f"{path}: candidate {name!r} was rehearsed with another config (differs in "
                              f"{', '.join(changed) or 'run.seed'}); choose another --output or give it another name")
    return Record(table, fresh.plan, {**data["configs"], **fresh.configs},
                  {name: data["scores"].get(name, {}) for name in configs})


def save_record(path: Path, record: Record) -> None:
    """Write ``record`` atomically (a partial write never replaces a good record)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(record.to_json(), indent=1))
    tmp.replace(path)


#: called after each training: ``(draw, name, {"val", "pool", "seconds"}, trainings done, trainings to do)``
Progress = Callable[[int, str, dict, int, int], None]


def pending(record: Record, plan: RehearsalPlan) -> list[tuple[int, str]]:
    """The ``(draw, candidate)`` trainings of ``plan.draws`` draws that ``record`` does not hold yet, draw by draw."""
    return [(d, name) for d in range(plan.draws) for name in record.scores if str(d) not in record.scores[name]]


def run_rehearsal(configs: Mapping[str, Config], splits: FeatureSplits, plan: RehearsalPlan, record: Record,
                  path: Path | None = None, progress: Progress | None = None) -> Record:
    """Train every candidate of ``configs`` on draws ``0 … plan.draws − 1`` that ``record`` lacks, draw by draw,
    and record both scores of each run; ``record`` is saved to ``path`` after every training.

    Each training is one draw of :func:`ncdlr.service.rehearsal.rehearse` (the benchmark's rehearsal: draw ``d``
    is the problem of seed ``run.seed + d``, the same for every candidate since they share ``run.seed``), with
    the candidate's whole step's batch (:func:`single_process`). Candidates that differ only in how a trained model is
    scored (``method.posthoc``) share each draw's training, and each score applies its candidate's fix."""
    todo, runs = pending(record, plan), {}  # runs: a draw's trainings, shared by candidates that train alike
    for done, (draw, name) in enumerate(todo, 1):
        start, pool = time.perf_counter(), {}
        val = rehearse(single_process(configs[name]), splits, {name: _as_it_is}, draws=1,
                       pseudo_novel_fraction=plan.pseudo_novel_fraction, first_draw=draw, pool=pool,
                       planted=plan.problem == "planted", runs=runs)
        result = {"val": float(val[name][0]), "pool": float(pool[name][0]), "seconds": time.perf_counter() - start}
        record.scores[name][str(draw)] = result
        if path is not None:
            save_record(path, record)
        if progress is not None:
            progress(draw, name, result, done, len(todo))
    return record


def _as_it_is(_trial: Config, _num_clusters: int) -> None:
    """The :data:`ncdlr.service.rehearsal.Candidate` edit of a candidate that is already a whole config."""


@dataclass(frozen=True)
class Row:
    """One candidate's line of the summary: mean score over the draws, the paired gap to the base with its SE,
    and on how many draws it beat the base (scores as fractions, 0..1)."""

    name: str
    mean: float
    gap: float
    se: float
    won: int
    draws: int


def summarise(record: Record, plan: RehearsalPlan) -> tuple[list[Row], str]:
    """The rows of the candidates over the first ``plan.draws`` draws by ``plan.score``, and the choice
    (:func:`choose`)."""
    per_draw = scores_by_draw(record, plan)
    base = np.asarray(per_draw[BASE])
    rows = []
    for name, values in per_draw.items():
        diff = np.asarray(values) - base
        rows.append(Row(name, float(np.mean(values)), float(diff.mean()),
                        float(diff.std(ddof=1) / math.sqrt(len(diff))) if len(diff) > 1 else float("nan"),
                        int((diff > 0).sum()), len(values)))
    return rows, choose(per_draw, plan.margin_se)


def scores_by_draw(record: Record, plan: RehearsalPlan) -> dict[str, list[float]]:
    """``{name: [score of draw 0, …, draw plan.draws − 1]}`` by ``plan.score``; raises if a draw is missing."""
    out = {}
    for name, by_draw in record.scores.items():
        missing = [d for d in range(plan.draws) if str(d) not in by_draw]
        if missing:
            raise ValueError(f"candidate {name!r} has no result for draws {missing}")
        out[name] = [by_draw[str(d)][plan.score] for d in range(plan.draws)]
    return out


def choose(per_draw: Mapping[str, Sequence[float]], margin_se: float = 0.0) -> str:
    """The candidate to train with: :data:`BASE` unless another beats it on the paired draws by more than
    ``margin_se`` standard errors (0: by a higher mean); of those that do, the best mean."""
    return choose_candidate(dict(per_draw), BASE, margin_se)


def render_table(rows: Sequence[Row], choice: str, plan: RehearsalPlan) -> str:
    """A Markdown table of :func:`summarise`'s rows, scores in %, with the choice marked."""
    what = {"planted": {"pool": "planted classes' F1 in the pool", "val": "planted classes' held-out accuracy"},
            "known": {"pool": "pseudo-novel training rows' accuracy", "val": "pseudo-novel held-out accuracy"}}
    lines = [f"{plan.problem} problem, {plan.draws} draws, score: {what[plan.problem][plan.score]} (%), choice by "
             + ("the higher mean" if plan.margin_se == 0 else f"a paired gap above {plan.margin_se:g} SE"),
             "", "| candidate | score | − config (paired) | SE | draws won | |", "|---|---|---|---|---|---|"]
    for row in rows:
        base = row.name == BASE
        lines.append(f"| {row.name} | {100 * row.mean:.1f} | {'' if base else f'{100 * row.gap:+.1f}'} | "
                     f"{'' if base else f'{100 * row.se:.1f}'} | {'' if base else f'{row.won} of {row.draws}'} | "
                     f"{'**chosen**' if row.name == choice else ''} |")
    return "\n".join(lines)


def plot_draws(path: Path, record: Record, plan: RehearsalPlan, choice: str) -> None:
    """PNG of every candidate's score per draw (the paired draws on the x axis), the chosen one drawn thick."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    per_draw = scores_by_draw(record, plan)
    fig, ax = plt.subplots(figsize=(7, 4), dpi=120)
    for i, (name, values) in enumerate(per_draw.items()):
        ax.plot(range(plan.draws), [100 * v for v in values], marker="o", color=f"C{i}",
                lw=2.5 if name == choice else 1, label=f"{name} (mean {100 * np.mean(values):.1f})")
    ax.set_xticks(range(plan.draws))
    ax.set_xlabel("validation draw (the same problem for every candidate)")
    ax.set_ylabel(f"{plan.score} score (%)")
    ax.set_title(f"ncdlr rehearse: {plan.problem} problem, choice {choice!r}")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
