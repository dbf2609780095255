"""Discovery-quality benchmark (issue 6): methods × datasets × seeds, paper-style tables in docs/results.md.

Every cell trains with the service's own per-worker loop (``ncdlr.service.train_loop``: ``build_worker_state``,
``feature_batches``, ``run_epoch`` → ``train_step`` dispatching through ``ncdlr.methods``) in ONE process with
W = 1 — no Ray: with one worker the loop is exactly the single-process algorithm (method.md §4.7), and the
grid does not pay Ray's start-up per cell. Feature-table mode: a frozen encoder's features, a trainable head.

Datasets
  synthetic    ``ncdlr.experiments.synthetic.make_data`` (the lead's problem: Ks = Ku = 20, R^s = R^u = 50,
               32-d features, balanced test; the data are re-drawn per seed). Head: MLP 32→64→64.
  openclipart  OpenClipart-LT (Debian openclipart-png, ``ncdlr prepare openclipart --max-side 256``), frozen
               efficientnet_lite0 features at 160 px (``ncdlr embed``), 1280-d, Ks = 22, Ku = 21, natural
               long tail; test = the prepared hold-out. Head: linear 1280→128 (trainable), features scaled to
               unit mean norm. Same seed → same data; the seed changes init, batches and view noise.

  openclipart-cached  the paper's regime on CPU: the same OpenClipart-LT images through the activation cache
               (``ncdlr embed --encoder efficientnet_lite0 --image-size 160 --trainable-blocks 1 --views 8``):
               efficientnet_lite0's last block + a linear head trained on two different cached random crops
               of each image per step; configs/openclipart.yaml's settings (batch 64, lr 1e-3, γ 10, buffer 512).
  openclipart-cached-p1  the same, on a second class partition of the same images (``ncdlr prepare openclipart
               --seed 1``: other classes are novel, other test images): a check that a choice made on the first
               partition is not a choice made for it.
  openclipart-cached-p2  a third partition (``--seed 2``), drawn after every default was fixed: nothing was ever
               chosen on it.
  fashion-cached  Fashion-MNIST-LT (``ncdlr prepare fashion-mnist``: 10 real classes, 5 + 5, n_max 1000, R 50, the
               official 10k test set) through the activation cache at 96 px (``ncdlr embed --encoder
               efficientnet_lite0 --image-size 96 --trainable-blocks 1 --views 8``): a second real set with about 3×
               OpenClipart-LT's images per class and a test split 10× larger; the same budget, γ = 0.5·Ku = 2.5. No
               default was ever chosen on it.
  fashion-cached-p1, fashion-cached-p2  the same on the class partitions of ``prepare fashion-mnist --seed 1`` / ``2``.
  fashion-cached-p3, fashion-cached-p4  two more (``--seed 3`` / ``4``), made in session 27 to check a selection rule
               on partitions it had never seen.
  emoji-cached  Emoji-LT (``ncdlr prepare emoji``: the emoji-datasource drawings of two styles, classes = Unicode
               subcategories, 35 + 35 with 414 → 12 and 132 → 12 training images) through the activation cache at
               128 px (``ncdlr embed --encoder efficientnet_lite0 --image-size 128 --trainable-blocks 1 --views 8``):
               a third real set, made in session 48 after every setting was fixed, so nothing was ever chosen on it;
               the same budget, γ = 0.5·Ku = 17.5. emoji-cached-p1: the partition of ``prepare emoji --seed 1``.
  tabler-cached  Tabler-LT (``ncdlr prepare tabler``: the @tabler/icons line icons, classes = their categories, 21 +
               20 with 666 → 6 and 310 → 10 training images) through the activation cache at 128 px, as emoji-cached:
               a fourth real set, made in session 49 after the relax bound was fixed; γ = 0.5·Ku = 10.
               tabler-cached-p1: the partition of ``prepare tabler --seed 1`` (known 302 → 6, novel 665 → 10).
  phosphor-cached  Phosphor-LT (``ncdlr prepare phosphor``: the @phosphor-icons/core icons, classes = their Figma
               sections, 9 + 9 with 141 → 15 and 125 → 23 training images) through the activation cache at 128 px,
               as emoji-cached: a fifth real set, made in session 67 after every setting was fixed; γ = 0.5·Ku = 4.5.
  mdi-cached   MDI-LT (``ncdlr prepare mdi``: Material Design Icons from @iconify-json/mdi, classes = their one
               category, 28 + 27 with 312 → 9 and 167 → 7 training images) through the activation cache at 128 px,
               as emoji-cached: a sixth real set, made in session 68 after every setting was fixed; γ = 0.5·Ku = 13.5.

Variants (each trains once; +LA / +cRT are post-hoc on the same trained model)
  uno, autonovel, ncdlr (faithful: ETF + MSE + buffer + adaptive w(τ)), ncdlr-bounded (ours: τ ≤ the known
  classes' imbalance n_max/n_min), and the ablations ncdlr-uniform (= ladder "+EP"), ladder-buffer (learnable
  prototypes + CE + buffer + uniform prior = ladder "+buffer"), the +EP rung's halves ladder-etf-ce (the fixed
  ETF with CE) and ladder-ep-task (+EP with the known-vs-novel term), ncdlr-nobuffer, ncdlr-learnable, ncdlr-ce,
  ncdlr-kce (cross-entropy on the labelled known rows only, MSE on the pseudo-labels: method.known_loss = ce),
  ncdlr-true (fixed true novel counts), ncdlr-free; ncdlr-anchored (ours: KL towards w(τ̂), τ̂ = the known
  classes' imbalance, instead of towards uniform); ncdlr-kw and uno-kw (the first epoch on the known classes
  alone, optim.known_warmup_epochs = 1); ncdlr-j2048 (the paper's buffer of 2048 rows instead of 512); ncdlr-m09
  and ncdlr-j2048-m09 (τ's SGD momentum 0.9 instead of 0.99); ncdlr-eps01 (Sinkhorn ε 0.1: softer self-labels);
  ncdlr-mix and uno-mix (optim.mixup = 1: mixup across the images of a batch, λ ~ Beta(1, 1)); ncdlr-avg and
  uno-avg (optim.average_epochs = 2: evaluate a moving average of the weights, horizon 2 epochs); ncdlr-relax,
  ncdlr-uniform-relax and uno-relax (labeler.reg_m = 0.45: cluster sizes relaxed, semi-relaxed OT);
  ncdlr-uniform-relax015 and ncdlr-uniform-relax135 (the uniform prior with reg_m 0.15 and 1.35);
  ncdlr-uniform-relax-floor and ncdlr-uniform-relax015-floor (the same at 0.45 and 0.15 with
  labeler.size_floor = known: no cluster below the rarest known class's share of the novel rows);
  ncdlr-uniform-relax-hold1 (ncdlr-uniform-relax with the sizes held for the first epoch of self-labeling,
  labeler.relax_after_epochs = 1); ncdlr-uniform-relax-nce (ncdlr-uniform-relax with cross-entropy over all K for
  the pseudo-labels and MSE for the labelled rows: method.loss = ce, method.known_loss = mse);
  ncdlr-uniform-relax-task (ncdlr-uniform-relax plus the known-vs-novel cross-entropy, method.task_weight = 1);
  ncdlr-uniform-relax-cb (ncdlr-uniform-relax with the class-balanced known loss, method.known_reweight = 1);
  ncdlr-uniform-relax-task-cb (ncdlr-uniform-relax with both: task_weight = 1 and known_reweight = 1);
  ncdlr-uniform-relax-task-cb-nb (that with the pseudo-cluster-balanced novel loss, method.novel_reweight = 1);
  ncdlr-uniform-relax-bound and ncdlr-uniform-relax-task-cb-bound (ncdlr-uniform-relax and -task-cb with
  labeler.relax_bound = known: the sizes held for the rest of the run once an epoch's pseudo-labels are more
  imbalanced than the known classes' n_max/n_min or leave a cluster empty); ncdlr-uniform-relax-bound-eps001 and
  ncdlr-uniform-relax-task-cb-bound-eps001 (those two, the configs' settings, with Sinkhorn ε 0.01, method.md's
  value for fine-grained sets: sharper self-labels); ncdlr-uniform-relax-task-cb-bound-j2048 (the OpenClipart-LT
  config's setting with the paper's buffer of 2048 rows instead of 512: more rows per cluster in each solve; -j256:
  256 rows, fewer older rows in each solve) and
  ncdlr-uniform-relax-task-cb-bound-e20 and ncdlr-uniform-relax-bound-e20 (each config's setting trained 20 epochs,
  the schedule stretched with them); ncdlr-uniform-relax-task-cb-bound-m0 / -m3 (the OpenClipart-LT config's setting
  with the model seed pinned at 0 or 3, the run seed following the cell) and ncdlr-uniform-relax-task-cb-bound-t05
  (that setting with a mean teacher labelling the novel rows, optim.teacher_epochs 0.5; -t2: horizon 2 epochs);
  uno-b2 and ncdlr-uniform-relax-b2 (the same two with the last two encoder blocks trained, model.trainable_blocks
  = 2: a cache made with ``ncdlr embed --trainable-blocks 2``, given with --table).
  Ladder: baseline (uno) < +buffer < +EP < +ASL (ncdlr).

Usage
  .venv/bin/python benchmarks/quality.py --datasets synthetic openclipart openclipart-cached --seeds 5 \\
      [--features /work/cache/openclipart-lt-lite0-160.parquet] [--table openclipart-cached=/work/cache/oc-lite0-160-b1-v8] \\
      [--variants ...] [--epochs N] [--only-seeds 0 2 4] [--results /work/cache/quality] [--out docs/results.md] \\
      [--workers 2] [--select] [--select-setting warmup momentum] [--holdout-view]
      [--select-draws 8] [--select-replicates 3] [--select-only-replicates 1 2] [--select-score val|pool]
      [--select-problem known|planted]
``--workers N`` runs the cells in N processes of one thread each (on 2 cores: 2); ``--select`` first runs each
dataset's known-class rehearsal (the ``ncdlr-val`` variant trains with its choice); ``--select-setting warmup
momentum`` rehearses the known-class warm-up (``optim.known_warmup_epochs``: off or one epoch) and τ's momentum
(``labeler.momentum``: 0.99 or 0.9) the same way (``--select-warmup`` = ``--select-setting warmup``).
``--select-replicates R`` trains each candidate R times per draw (other training seeds, same draws; each replicate
its own cache file, ``--select-only-replicates`` runs a share of them in one process) and chooses on the mean;
``--select-score pool`` chooses on the runs' clustering of the pseudo-novel rows they trained on instead of the
held-out images (benchmarks/rehearsal_noise.py compares the two). ``--select-problem planted`` plants a fifth of the
known classes in the real unlabeled pool instead of posing half of them alone (``ncdlr.service.validation.
planted_splits``); its pool score is their F1 against the clusters of the whole pool (cached as
select-<what>-planted-<dataset>.json).
``--holdout-view`` (cached datasets) trains without each training row's last cached view and records the model's
novel clusters on it, for ``benchmarks/carry.py`` (cells cached as ``*-hv.json``).
Each (dataset, variant, seed) result is cached as JSON under --results, so runs can be split across
processes and resumed; the tables are rendered from every cached result of the requested grid.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch

from ncdlr.data.features import FeatureSplits
from ncdlr.service.config import Config
from ncdlr.service.local import evaluate, train
from ncdlr.service.num_novel import fill_from_known
from ncdlr.service.rehearsal import (UNIFORM, apply_gamma, choose_candidate, one_key_edits, select_edits,
                                     select_gamma)

#: ``labeler.reg_m`` of the relaxed variants: 9ε at ε = 0.05 (column updates raised to κ = 0.9); tried first at 1ε
#: (κ = 0.5), where every novel row fell into one cluster (Fashion-MNIST-LT p0, 5 seeds: docs/results.md session 21)
RELAX_REG_M = 0.45


def oc_config_with(**sections: dict) -> dict[str, dict]:
    """The OpenClipart-LT config's setting as a variant (``configs/openclipart.yaml``: the uniform prior with relaxed
    sizes and their bound, the known-vs-novel term and the class-balanced known loss), with ``sections``' keys set on
    top (``labeler={"eps": 0.01}`` merges into its labeler section; a new section is added). A fresh dict each call."""
    variant = {"labeler": {"prior": "uniform", "reg_m": RELAX_REG_M, "relax_bound": "known"},
               "method": {"task_weight": 1.0, "known_reweight": 1.0}}
    for section, values in sections.items():
        variant[section] = {**variant.get(section, {}), **values}
    return variant


VARIANTS: dict[str, dict[str, dict]] = {
    "uno": {"method": {"name": "uno"}, "model": {"prototypes": "learnable"}, "labeler": {"prior": "uniform", "use_buffer": False}},
    "autonovel": {"method": {"name": "autonovel", "consistency": 1.0}, "model": {"prototypes": "learnable"},
                  "labeler": {"prior": "uniform", "use_buffer": False}},
    "ncdlr": {},
    "ncdlr-bounded": {"labeler": {"prior": "bounded"}},
    "ncdlr-anchored": {"labeler": {"prior": "anchored"}},
    "ncdlr-valgamma": {"labeler": {"prior": "bounded"}, "select": {"gamma": True}},
    # the dataset's γ or the uniform prior, chosen once per dataset by the known-class rehearsal (``--select``)
    "ncdlr-val": {"select": {"dataset": True}},
    "ncdlr-uniform": {"labeler": {"prior": "uniform"}},
    "ladder-buffer": {"model": {"prototypes": "learnable"}, "method": {"loss": "ce"}, "labeler": {"prior": "uniform"}},
    # session 51: the +EP rung (ladder-buffer → ncdlr-uniform) split in two. On Emoji-LT and Tabler-LT the rung sends
    # 5-8 % more novel test images into known columns (seed_spread.py --routing). MSE with the novel targets padded
    # by zeros never pushes a novel row off the known prototypes, where cross-entropy over all K does (its block term).
    # ladder-etf-ce: the fixed ETF with UNO's cross-entropy (only the prototypes change from ladder-buffer);
    # ladder-ep-task: the +EP rung plus the block term alone, at weight 1, its weight inside that cross-entropy.
    # Measured (results.md, session 51): the leak comes with MSE, not the ETF; the block term takes back part of it
    # and costs more of the novel clustering (−1.61 novel points, SE 1.09), so it is no remedy there
    "ladder-etf-ce": {"method": {"loss": "ce"}, "labeler": {"prior": "uniform"}},
    "ladder-ep-task": {"method": {"task_weight": 1.0}, "labeler": {"prior": "uniform"}},
    "ncdlr-nobuffer": {"labeler": {"use_buffer": False}},
    "ncdlr-learnable": {"model": {"prototypes": "learnable"}},
    "ncdlr-ce": {"method": {"loss": "ce"}},
    "ncdlr-kce": {"method": {"known_loss": "ce"}},  # cross-entropy for the labelled rows, MSE for the pseudo-labels
    "ncdlr-true": {"labeler": {"prior": "fixed"}},
    "ncdlr-free": {"labeler": {"prior": "free"}},
    # τ held fixed (the labeler's lr 0): w(τ) with τ = 1 + e^init_t, no feedback between the prior and the model
    "ncdlr-tau2": {"labeler": {"lr": 0.0, "init_t": 0.0}},
    "ncdlr-tau4": {"labeler": {"lr": 0.0, "init_t": math.log(3.0)}},
    # the paper's buffer J = 2048 rows (method.md §4.1) instead of the cached datasets' 512: the OT and τ's update
    # see about half an epoch's novel logits instead of an eighth (a seed-spread candidate; it made τ run away)
    "ncdlr-j2048": {"labeler": {"buffer_size": 2048}},
    # τ's optimiser with momentum 0.9 instead of the authors' 0.99: with L = 10 alternations per step, 0.99 carries a
    # velocity of up to lr·g/(1 − m) = 10·g per alternation for ~100 alternations (10 steps), so τ overshoots (J = 2048:
    # 1.4 → 26 within a fifth of an epoch); 0.9 damps that within one step (a seed-spread and runaway candidate)
    "ncdlr-m09": {"labeler": {"momentum": 0.9}},
    "ncdlr-j2048-m09": {"labeler": {"buffer_size": 2048, "momentum": 0.9}},
    # the first epoch on the known classes alone, then discovery (optim.known_warmup_epochs; a seed-spread candidate)
    "ncdlr-kw": {"optim": {"known_warmup_epochs": 1.0}},
    "uno-kw": {"method": {"name": "uno"}, "model": {"prototypes": "learnable"},
               "labeler": {"prior": "uniform", "use_buffer": False}, "optim": {"known_warmup_epochs": 1.0}},
    # softer self-labels: the Sinkhorn ε doubled (0.05 → 0.1), so the MSE pull is towards a blend of prototypes rather
    # than one (a candidate against the clusters' fit to the training images, benchmarks/carry.py)
    "ncdlr-eps01": {"labeler": {"eps": 0.1}},
    # mixup across the images of a batch (optim.mixup: λ ~ Beta(1, 1), chosen before any run as the middle of the
    # values the mixup papers use; on the cache: the activations before the trained block): a candidate against
    # the clusters' fit to the training images (they carry to unseen crops and centre views, not to new images)
    "ncdlr-mix": {"optim": {"mixup": 1.0}},
    "uno-mix": {"method": {"name": "uno"}, "model": {"prototypes": "learnable"},
                "labeler": {"prior": "uniform", "use_buffer": False}, "optim": {"mixup": 1.0}},
    # a moving average of the weights evaluated instead of the last iterate (optim.average_epochs): the horizon, 2 of
    # the 10 epochs, fixed before any run by the weight-averaging rule of thumb (average over the last ~20 % of the
    # run); a candidate against the fit to the training images and the seed spread of the last iterate
    "ncdlr-avg": {"optim": {"average_epochs": 2.0}},
    # UNO's multi-head: 4 heads on the shared encoder, the lowest novel loss of the last epoch predicts (model.heads)
    "ncdlr-h4": {"model": {"heads": 4}},
    "uno-h4": {"method": {"name": "uno"}, "model": {"prototypes": "learnable", "heads": 4},
               "labeler": {"prior": "uniform", "use_buffer": False}},
    "ncdlr-uniform-h4": {"model": {"heads": 4}, "labeler": {"prior": "uniform"}},
    "uno-avg": {"method": {"name": "uno"}, "model": {"prototypes": "learnable"},
                "labeler": {"prior": "uniform", "use_buffer": False}, "optim": {"average_epochs": 2.0}},
    # relaxed cluster sizes (labeler.reg_m = 0.45 = 9ε: each Sinkhorn column update raised to 0.9): the transport
    # holds the sizes w only up to 0.45·KL(Yᵀ1 ‖ w), so a class the scores show as large is not split to fill w's
    # clusters, nor small classes merged to fill one (a candidate against the merges behind the seed spread);
    # uno-relax gives UNO's balanced Sinkhorn the same relaxation
    "ncdlr-relax": {"labeler": {"reg_m": RELAX_REG_M}},
    "ncdlr-uniform-relax": {"labeler": {"prior": "uniform", "reg_m": RELAX_REG_M}},
    "uno-relax": {"method": {"name": "uno"}, "model": {"prototypes": "learnable"},
                  "labeler": {"prior": "uniform", "use_buffer": False, "reg_m": RELAX_REG_M}},
    # the uniform prior with relaxed sizes solves the paper's relaxed OT exactly, ρ in the role of γ/Ku: how much the
    # result depends on ρ, a third and three times 0.45 (κ = 0.75 and 0.96)
    "ncdlr-uniform-relax015": {"labeler": {"prior": "uniform", "reg_m": 0.15}},
    "ncdlr-uniform-relax135": {"labeler": {"prior": "uniform", "reg_m": 1.35}},
    # the same with no cluster below the rarest known class's share of the novel rows (labeler.size_floor = known)
    "ncdlr-uniform-relax-floor": {"labeler": {"prior": "uniform", "reg_m": RELAX_REG_M, "size_floor": "known"}},
    "ncdlr-uniform-relax015-floor": {"labeler": {"prior": "uniform", "reg_m": 0.15, "size_floor": "known"}},
    # the configs' relaxed sizes after one epoch of self-labeling with the sizes held (labeler.relax_after_epochs):
    # the balanced first pseudo-labels keep every cluster in use while the block is still untrained (session 28)
    "ncdlr-uniform-relax-hold1": {"labeler": {"prior": "uniform", "reg_m": RELAX_REG_M, "relax_after_epochs": 1.0}},
    # the configs' setting with the pseudo-labels' loss cross-entropy over all K cosines/T (UNO's form), the labelled
    # rows' MSE kept (method.loss ce, known_loss mse): MSE towards a novel prototype only pulls, while the softmax
    # over all K also pushes a novel row's known cosines down — against the novel test images ncdlr sends into
    # known columns, most in the novel tail (session 29)
    "ncdlr-uniform-relax-nce": {"labeler": {"prior": "uniform", "reg_m": RELAX_REG_M},
                                "method": {"loss": "ce", "known_loss": "mse"}},
    # the configs' setting plus only the part of that cross-entropy that sorts a row into its block: CE over all K
    # is −log p(block) − log p(class | block), and the block of every training row is exact (labelled = known,
    # unlabelled = novel), so this term carries no pseudo-label noise, while the MSE clusters within the novel block
    # as before. Weight 1, the weight the block term has inside that CE (and inside UNO's loss), fixed before any run
    "ncdlr-uniform-relax-task": {"labeler": {"prior": "uniform", "reg_m": RELAX_REG_M}, "method": {"task_weight": 1.0}},
    # two trained encoder blocks instead of one (model.trainable_blocks 2; needs a cache of the input of the last two
    # blocks, `ncdlr embed --trainable-blocks 2`, through --table): the configs' setting and UNO. method.md §10 traced
    # the gain to training the encoder, and sessions 28-30 traced what is left on OpenClipart-LT p2 to representation
    # (novel test images in the known classes' basins); on such a cache `uno` and `ncdlr-uniform-relax` train one
    # block on the same crops (the block before it frozen), so the pairs are on identical inputs (session 31)
    "uno-b2": {"method": {"name": "uno"}, "model": {"prototypes": "learnable", "trainable_blocks": 2},
               "labeler": {"prior": "uniform", "use_buffer": False}},
    "ncdlr-uniform-relax-b2": {"labeler": {"prior": "uniform", "reg_m": RELAX_REG_M}, "model": {"trainable_blocks": 2}},
    # session 32: the head imprinted before training (model.head_init imprint: the known rows onto their prototypes,
    # the novel rows' k-means clusters of the initial features onto the novel ones), against the seed spread
    "uno-imprint": {"method": {"name": "uno"}, "model": {"prototypes": "learnable", "head_init": "imprint"},
                    "labeler": {"prior": "uniform", "use_buffer": False}},
    "ncdlr-uniform-relax-imprint": {"labeler": {"prior": "uniform", "reg_m": RELAX_REG_M},
                                    "model": {"head_init": "imprint"}},
    # session 33: the configs' setting with a class-balanced known loss (method.known_reweight 1: each labelled row
    # weighted by 1 / its class's training count, normalised over the batch). One known class holds 60 % of the
    # known rows on OpenClipart-LT, so the plain mean trains the block mostly on that one class
    "ncdlr-uniform-relax-cb": {"labeler": {"prior": "uniform", "reg_m": RELAX_REG_M}, "method": {"known_reweight": 1.0}},
    # session 34: both at once. The block term (session 30) sent the novel tail back to novel columns but cost 2-3
    # known points, through more known test images in novel columns; the class-balanced known loss (session 33)
    # gained 3-6 known points, most in the rare known classes. Each at its own fixed weight, not tuned together
    "ncdlr-uniform-relax-task-cb": {"labeler": {"prior": "uniform", "reg_m": RELAX_REG_M},
                                    "method": {"task_weight": 1.0, "known_reweight": 1.0}},
    # session 43: the config's pair plus the novel side of the class-balanced loss (method.novel_reweight 1: each
    # unlabelled row weighted by 1 / its target cluster's size in the solve, normalised over the batch). With relaxed
    # sizes the head's few large clusters hold most unlabelled rows, so the plain mean trains the block mostly on them;
    # the power is known_reweight's, fixed before any run
    "ncdlr-uniform-relax-task-cb-nb": {"labeler": {"prior": "uniform", "reg_m": RELAX_REG_M},
                                       "method": {"task_weight": 1.0, "known_reweight": 1.0, "novel_reweight": 1.0}},
    # session 49: relaxed sizes held at w for the rest of the run once an epoch's hard pseudo-labels are more
    # imbalanced than the known classes' training n_max/n_min, or leave a cluster without one (labeler.relax_bound
    # known): the relaxation may follow the long tail the labelled classes show, not run past it. Alone and on the
    # OpenClipart-LT config; the bound is the one the bounded prior reads (labeler.max_imbalance 0), fixed before any run
    "ncdlr-uniform-relax-bound": {"labeler": {"prior": "uniform", "reg_m": RELAX_REG_M, "relax_bound": "known"}},
    "ncdlr-uniform-relax-task-cb-bound": oc_config_with(),
    # session 52: each config's setting with Sinkhorn ε 0.01, method.md §4's value for fine-grained sets, in place of
    # 0.05 (ρ kept: the cost-against-sizes weight of the relaxation). Sharper self-labels against MSE's small clustering
    # gain on the sets with many close novel classes (session 51): a soft target over many ETF prototypes is a short
    # mixture of them, so the pull towards any one cluster is weak. Fixed before any run
    "ncdlr-uniform-relax-bound-eps001": {"labeler": {"prior": "uniform", "reg_m": RELAX_REG_M, "relax_bound": "known",
                                                     "eps": 0.01}},
    "ncdlr-uniform-relax-task-cb-bound-eps001": oc_config_with(labeler={"eps": 0.01}),
    # session 52, second run: the OpenClipart-LT config's setting with the paper's buffer of 2048 rows instead of 512.
    # With 35 or 20 novel clusters a solve over 512 + 128 rows gives each cluster about 18 or 32 rows (the rarest
    # far fewer); 2048 + 128 gives 62 or 109. Session 11's J = 2048 lost with the learned prior (τ followed the older
    # rows' skew); the configs' uniform prior has no τ. Fixed before any run
    "ncdlr-uniform-relax-task-cb-bound-j2048": oc_config_with(labeler={"buffer_size": 2048}),
    # session 56, second question: the other side of the buffer's length, 256 rows (half the config's). Session 52
    # read the 2048-row loss as the older rows of a long buffer weakening the size constraint on the batch's rows; if
    # so, fewer older rows should cluster the small icon pools better. Fixed before any run
    "ncdlr-uniform-relax-task-cb-bound-j256": oc_config_with(labeler={"buffer_size": 256}),
    # session 52, third run: the same setting trained 20 epochs instead of 10 (the schedule stretched with it). On
    # Emoji-LT the self-labels' largest share is still rising at epoch 10 (0.82; one-hot from epoch 2 on Fashion-MNIST-LT):
    # the 35 clusters are still forming when the learning rate has decayed. Fixed before any run
    "ncdlr-uniform-relax-task-cb-bound-e20": oc_config_with(optim={"epochs": 20}),
    # session 53: the Fashion-MNIST-LT config's setting trained 20 epochs, the same single change on the set whose
    # self-labels are one-hot from epoch 2 (where "still forming" predicts no gain). Fixed before any run
    "ncdlr-uniform-relax-bound-e20": {"labeler": {"prior": "uniform", "reg_m": RELAX_REG_M, "relax_bound": "known"},
                                      "optim": {"epochs": 20}},
    # session 55: what decides a seed? A cell's seed is two seeds: the model seed (model.prototype_seed: the ETF
    # prototypes and the head's initial weights) and the run seed (run.seed: the row order, the cached views drawn,
    # every other draw). These pin the model seed at 0 or 3 while the run seed goes through the seeds, so a seed's
    # outcome can be laid at one of the two (OpenClipart-LT p2's seed 3 ends ~7 novel points below the others in
    # every arm so far). Fixed before any run
    "ncdlr-uniform-relax-task-cb-bound-m0": oc_config_with(model={"prototype_seed": 0}),
    "ncdlr-uniform-relax-task-cb-bound-m3": oc_config_with(model={"prototype_seed": 3}),
    # session 56: the config's setting with a mean teacher labelling the novel rows (optim.teacher_epochs 0.5: an
    # exponential moving average of the weights, horizon half an epoch, solved by the discovery step in place of the
    # model's own logits). A run's fate is set in its early epochs by targets that follow every step of the model
    # (session 55); a teacher whose labels move slower is the field's standard remedy. Fixed before any run
    "ncdlr-uniform-relax-task-cb-bound-t05": oc_config_with(optim={"teacher_epochs": 0.5}),
    # session 56's dose: the same teacher with a horizon of 2 epochs (targets that move four times slower). Fixed
    # before any run of either
    "ncdlr-uniform-relax-task-cb-bound-t2": oc_config_with(optim={"teacher_epochs": 2.0}),
}
POSTHOC_OF = {"uno": ("none", "la", "crt"), "ncdlr": ("none", "la", "crt"), "ncdlr-bounded": ("none", "la", "crt"),
              "ncdlr-anchored": ("none", "la", "crt"), "ncdlr-valgamma": ("none", "la", "crt"),
              "ncdlr-val": ("none", "la", "crt"), "ncdlr-uniform-relax-task-cb": ("none", "la", "crt")}
LADDER = (("baseline (UNO)", "uno"), ("+buffer", "ladder-buffer"), ("+EP", "ncdlr-uniform"), ("+ASL (ncdlr)", "ncdlr"),
          ("+ASL bounded (ours)", "ncdlr-bounded"), ("+ASL anchored (ours)", "ncdlr-anchored"),
          ("+ASL bounded, γ by known-class rehearsal (ours)", "ncdlr-valgamma"),
          ("+ASL, γ or uniform by the dataset's known-class rehearsal", "ncdlr-val"))
#: the label-free epoch metrics of the pseudo-labels a cell keeps (its last epoch's, and every epoch's)
PSEUDO_LABEL_METRICS = ("clusters_empty", "cluster_imbalance", "pseudo_label_confidence")
#: activation-cache datasets and their default cache folders
CACHED = {"openclipart-cached": "/work/cache/oc-lite0-160-b1-v8", "openclipart-cached-p1": "/work/cache/oc-p1-lite0-160-b1-v8",
          "openclipart-cached-p2": "/work/cache/oc-p2-lite0-160-b1-v8", "fashion-cached": "/work/cache/fm-lite0-96-b1-v8",
          "fashion-cached-p1": "/work/cache/fm-p1-lite0-96-b1-v8", "fashion-cached-p2": "/work/cache/fm-p2-lite0-96-b1-v8",
          "fashion-cached-p3": "/work/cache/fm-p3-lite0-96-b1-v8", "fashion-cached-p4": "/work/cache/fm-p4-lite0-96-b1-v8",
          "emoji-cached": "/work/cache/emoji-lite0-128-b1-v8", "emoji-cached-p1": "/work/cache/emoji-p1-lite0-128-b1-v8",
          "tabler-cached": "/work/cache/tabler-lite0-128-b1-v8", "tabler-cached-p1": "/work/cache/tabler-p1-lite0-128-b1-v8",
          "phosphor-cached": "/work/cache/phosphor-lite0-128-b1-v8", "mdi-cached": "/work/cache/mdi-lite0-128-b1-v8"}


def dataset_items(items: list[str], flag: str, what: str) -> dict[str, str]:
    """``{dataset: value}`` of a repeatable ``flag DATASET=WHAT`` option (``--table``, seed_spread's ``--results-of``);
    ValueError naming the flag for an item without ``=``."""
    bad = [item for item in items if "=" not in item]
    if bad:
        raise ValueError(f"{flag} takes DATASET={what}, got {bad[0]!r}")
    return dict(item.split("=", 1) for item in items)


def activation_tables(overrides: list[str]) -> dict[str, str]:
    """Each cached dataset's activation table: :data:`CACHED`, with ``DATASET=URI`` overrides (``--table``)."""
    given = dataset_items(overrides, "--table", "URI")
    unknown = sorted(set(given) - set(CACHED))
    if unknown:
        raise ValueError(f"--table names no cached dataset: {', '.join(unknown)} (known: {', '.join(CACHED)})")
    return {**CACHED, **given}


def add_table_argument(parser: argparse.ArgumentParser) -> None:
    """``--table DATASET=URI`` (repeatable), the one flag that moves a cached dataset's table; this script and
    seed_spread.py read it back with :func:`parsed_tables`."""
    parser.add_argument("--table", action="append", default=[], metavar="DATASET=URI",
                        help="a cached dataset's activation table (`ncdlr embed ... --trainable-blocks 1 --views 8`), if "
                             f"not the default folder: {', '.join(f'{k}={v}' for k, v in CACHED.items())}")


def add_cell_arguments(parser: argparse.ArgumentParser, holdout_view: bool = True, results_of: bool = False) -> None:
    """The flags of the scripts that read this script's cells (seed_spread.py, carry.py, consensus.py, scoreboard.py):
    ``--results``, ``--holdout-view`` (unless ``holdout_view`` is False), ``--table`` (:func:`add_table_argument`) and,
    with ``results_of``, ``--results-of DATASET=DIR`` (read back with :func:`parsed_results_of`)."""
    parser.add_argument("--results", type=Path, default=Path("/work/cache/quality"), help="quality.py's cell cache")
    if holdout_view:
        parser.add_argument("--holdout-view", action="store_true",
                            help="read the cells of `quality.py --holdout-view` (*-hv.json) instead of the plain ones")
    if results_of:
        parser.add_argument("--results-of", action="append", default=[], metavar="DATASET=DIR",
                            help="read this dataset's cells from DIR instead of --results (repeatable), so one command "
                                 "can pool datasets whose cells live apart")
    add_table_argument(parser)


def parsed_results_of(parser: argparse.ArgumentParser, args: argparse.Namespace) -> dict[str, Path]:
    """``{dataset: DIR}`` of ``args.results_of``; a bad item ends the script with the parser's usage error."""
    try:
        return {d: Path(p) for d, p in dataset_items(args.results_of, "--results-of", "DIR").items()}
    except ValueError as err:
        parser.error(str(err))


def parsed_tables(parser: argparse.ArgumentParser, args: argparse.Namespace) -> dict[str, str]:
    """:func:`activation_tables` of ``args.table``; a bad item ends the script with the parser's usage error."""
    try:
        return activation_tables(args.table)
    except ValueError as err:
        parser.error(str(err))


COLUMNS = ("all", "known", "novel", "novel_head", "novel_medium", "novel_tail")


# -- datasets ------------------------------------------------------------------------------------------------

def synthetic_splits(seed: int) -> FeatureSplits:
    from ncdlr.experiments.synthetic import Setting, make_data

    s = Setting()
    known, novel, test, _ = make_data(s, seed)
    k = s.num_known + s.num_novel
    return FeatureSplits({"known": known.x, "novel": novel.x, "test": test.x},
                         {"known": known.y, "novel": novel.y, "test": test.y}, s.num_known, s.num_novel,
                         [str(i) for i in range(k)])


def openclipart_splits(path: str) -> FeatureSplits:
    """Feature table with every split scaled by one constant so the mean known-row norm is 1."""
    from ncdlr.data.features import read_feature_table

    splits = read_feature_table(path)
    scale = float(splits.features["known"].norm(dim=1).mean())
    splits.features = {k: v / scale for k, v in splits.features.items()}
    return splits


def dataset_config(name: str, epochs: int | None) -> Config:
    """The shared budget of a dataset (every variant starts from it)."""
    cfg = Config()
    if name in CACHED:  # configs/openclipart.yaml's budget, on the activation cache. Its labeler stays the paper's
        # (learned w(τ), sizes held) for every variant to start from, so `ncdlr` is the paper's algorithm; the
        # configs' cluster sizes since session 27 (uniform prior, reg_m 0.45) are the variant `ncdlr-uniform-relax`;
        # configs/openclipart.yaml's whole setting since session 35 (those sizes, the block term and the
        # class-balanced known loss) is `ncdlr-uniform-relax-task-cb`
        # γ = 0.5·Ku, the config's gamma_per_cluster: 10 (10.5 rounded, as every OpenClipart cell since session 7)
        # at Ku = 21; 2.5 at Fashion-MNIST-LT's Ku = 5; 17.5 at Emoji-LT's Ku = 35; 10 at Tabler-LT's Ku = 20; 4.5 at
        # Phosphor-LT's Ku = 9; 13.5 at MDI-LT's Ku = 27
        cfg.data.batch_size, cfg.labeler.gamma, cfg.labeler.buffer_size = 64, 10.0, 512
        if name.startswith("fashion-cached"):
            cfg.labeler.gamma = 2.5
        if name.startswith("emoji-cached"):
            cfg.labeler.gamma = 17.5
        if name.startswith("phosphor-cached"):
            cfg.labeler.gamma = 4.5
        if name.startswith("mdi-cached"):
            cfg.labeler.gamma = 13.5
        cfg.model.head, cfg.model.trainable_blocks = "linear", 1
        cfg.optim.epochs, cfg.optim.lr, cfg.optim.min_lr, cfg.optim.warmup_epochs = 10, 1e-3, 1e-4, 1
        cfg.optim.epochs = epochs or cfg.optim.epochs
        return cfg
    cfg.data.batch_size = 128
    cfg.labeler.gamma = 10.0  # = 0.5·Ku (Ku ≈ 20): the paper's γ/Ku at iNat scale (method.md §4 trap a)
    cfg.optim.weight_decay = 1.5e-4
    cfg.optim.warmup_epochs = 2
    if name == "synthetic":
        cfg.model.head, cfg.model.head_dim = "mlp", 64
        cfg.data.feature_noise = 0.15
        cfg.optim.epochs, cfg.optim.lr, cfg.optim.min_lr = 40, 1e-2, 1e-3
    else:
        cfg.model.head, cfg.model.head_dim = "linear", 128
        cfg.data.feature_noise = 0.01  # per-coordinate std on unit-mean-norm 1280-d features (coordinate std ≈ 0.02; noise norm ≈ 0.36)
        cfg.optim.epochs, cfg.optim.lr, cfg.optim.min_lr = 40, 1e-3, 1e-4
    if epochs:
        cfg.optim.epochs = epochs
    return cfg


def variant_config(dataset: str, variant: str, seed: int, splits: FeatureSplits, epochs: int | None) -> Config:
    cfg = dataset_config(dataset, epochs)
    for section, values in VARIANTS[variant].items():
        if section == "select":
            continue
        for key, value in values.items():
            setattr(getattr(cfg, section), key, value)
    # the cell's seed is the run seed and, unless the variant pins it (the -m0/-m3 variants), the model seed too
    cfg.run.seed = seed
    cfg.model.prototype_seed = VARIANTS[variant].get("model", {}).get("prototype_seed", seed)
    # the run's own known classes, before any --select rehearsal copies the config (train() would fill it too)
    fill_from_known(cfg, splits.train_counts(), splits.num_known, splits.features["novel"].shape[0])
    return cfg


# -- grid ----------------------------------------------------------------------------------------------------

def novel_clustering(run, splits: FeatureSplits) -> tuple[dict[str, float], np.ndarray]:
    """How ``run``'s model clusters the novel TRAINING rows (view 0 of cached activations): the argmax over the novel
    columns ``[N_novel]`` and its class-mean accuracy against the true novel labels after a Hungarian matching among
    the novel clusters (task-aware, transductive: the clustering accuracy NCD papers report on the unlabelled set),
    with head/medium/tail by training count. A diagnosis (of the seed spread); never used to select anything."""
    from ncdlr.metrics import cluster_accuracy

    ks = splits.num_known
    y = splits.labels["novel"].numpy() - ks
    pred = np.asarray(novel_predictions(run, splits.features["novel"], ks))
    return cluster_accuracy(y, pred, 0, train_counts=splits.train_counts()[ks:]), pred


def test_predictions(run, splits: FeatureSplits) -> tuple[list[int], list[int]]:
    """The plain model's test predictions, kept per cell so that seeds can be compared image by image
    (``benchmarks/seed_spread.py``, ``benchmarks/carry.py``): over all K classes ``[N_test]`` (the argmax
    :func:`evaluate` scores as "none"), and over the novel columns alone ``[N_test]`` in ``0..Ku-1`` (task-aware)."""
    from ncdlr.service.local import embed

    logits = run.method.predict_logits(run.model, embed(run.model, splits.features["test"]))
    return logits.argmax(1).tolist(), logits[:, splits.num_known:].argmax(1).tolist()


def hold_out_last_view(splits: FeatureSplits) -> tuple[FeatureSplits, torch.Tensor]:
    """``--holdout-view``: the activation table's training splits without their last cached view, and that view
    of the novel training rows ``[N_novel, 1, *shape]`` — the same images in a crop training never showed, to
    tell how much of the training rows' score is a fit to the crops trained on (``benchmarks/carry.py``)."""
    if not splits.is_activations or min(splits.views("known"), splits.views("novel")) < 3:
        raise SystemExit("--holdout-view needs an activation table with at least 3 views per training row")
    kept = {k: (v[:, :-1] if k in ("known", "novel") else v) for k, v in splits.features.items()}
    return dataclasses.replace(splits, features=kept), splits.features["novel"][:, -1:]


def novel_predictions(run, x: torch.Tensor, num_known: int) -> list[int]:
    """``[N]`` task-aware predictions (argmax over the novel columns, ``0..Ku-1``) of the model, in eval mode, for
    feature-table rows ``x`` (embeddings ``[N, D]``, or cached activations ``[N, V, *shape]``: view 0)."""
    from ncdlr.service.local import embed

    was_training = run.model.training
    run.model.eval()
    logits = run.method.predict_logits(run.model, embed(run.model, x))[:, num_known:]
    run.model.train(was_training)
    return logits.argmax(1).tolist()


def clustering_trace(splits: FeatureSplits, trace: list[dict]):
    """An ``on_epoch`` hook recording how the novel TRAINING rows are clustered after each epoch (a diagnosis of
    the seed spread and of when the fit to the training images sets in; never used to select anything):
    :func:`novel_clustering`'s class-mean accuracy, the clusters that received rows, the largest cluster's share,
    τ, and the plain model's test scores so far (``test_novel``: the test split's own matching, ``test_known``;
    fractions as :func:`evaluate` gives them). The model is read in eval mode and put back in train mode."""

    def on_epoch(epoch: int, run) -> None:
        accuracy, pred = novel_clustering(run, splits)
        sizes = np.bincount(pred, minlength=splits.num_novel)
        run.model.eval()
        test = evaluate(run, splits, posthoc=("none",))["none"]
        run.model.train()
        trace.append({"epoch": epoch, "novel_train_acc": accuracy["all"],
                      "clusters_used": int((sizes > 0).sum()), "largest_share": float(sizes.max() / len(pred)),
                      "tau": run.tau_history[-1] if run.tau_history else None,
                      "test_novel": test["novel"], "test_known": test["known"]})

    return on_epoch


def run_cell(dataset: str, variant: str, seed: int, splits: FeatureSplits, epochs: int | None,
             trace: bool = False, chosen: dict | None = None, holdout_view: bool = False) -> dict:
    probe = None
    if holdout_view:
        splits, probe = hold_out_last_view(splits)
    cfg = variant_config(dataset, variant, seed, splits, epochs)
    cpu = time.process_time()
    selection = {}
    if VARIANTS[variant].get("select", {}).get("gamma"):
        cfg.labeler.gamma, selection = select_gamma(cfg, splits)
    if VARIANTS[variant].get("select", {}).get("dataset"):
        if chosen is None:
            raise SystemExit(f"{variant} needs the dataset's rehearsal: run with --select first")
        apply_gamma(cfg, chosen["gamma"])
        selection = chosen["scores"]
    epochs_trace: list[dict] = []
    trained = train(cfg, splits, on_epoch=clustering_trace(splits, epochs_trace) if trace else None)
    start = time.perf_counter()
    results = evaluate(trained, splits, posthoc=POSTHOC_OF.get(variant, ("none",)), temperature=cfg.method.temperature,
                       seed=seed)
    novel_train, novel_train_pred = novel_clustering(trained, splits)
    test_pred, test_novel_pred = test_predictions(trained, splits)
    tau = trained.tau_history
    heads = head_diagnosis(trained, splits)
    learned_prior = cfg.labeler.prior in ("adaptive", "bounded", "anchored", "free") and cfg.method.name == "ncdlr"
    return {"dataset": dataset, "variant": variant, "seed": seed, "results": results,
            "tau_final": tau[-1] if tau and learned_prior else None, "tau_max": max(tau) if tau and learned_prior else None,
            "tau_history": tau[:: max(1, len(tau) // 50)] if learned_prior else [],
            "train_s": trained.seconds, "cpu_s": time.process_time() - cpu, "eval_s": time.perf_counter() - start, "epochs": cfg.optim.epochs,
            "gamma": cfg.labeler.gamma, "gamma_selection": selection, "max_imbalance": cfg.labeler.max_imbalance,
            "trace": epochs_trace, "novel_train": novel_train, "novel_train_pred": novel_train_pred.tolist(),
            "test_pred": test_pred, "test_novel_pred": test_novel_pred, "holdout_view": holdout_view,
            "novel_heldout_pred": None if probe is None else novel_predictions(trained, probe, splits.num_known),
            "heads": heads,
            "last_epoch_pseudo_labels": {k: trained.metrics.get(k) for k in PSEUDO_LABEL_METRICS},
            "pseudo_labels_per_epoch": [{k: m.get(k) for k in PSEUDO_LABEL_METRICS} for m in trained.history],
            "relax_bound": cfg.labeler.relax_bound,
            "sizes_held_from_epoch": next((m["sizes_held_from_epoch"] for m in trained.history
                                           if "sizes_held_from_epoch" in m), None)}


def head_diagnosis(run, splits: FeatureSplits) -> dict | None:
    """``model.heads`` > 1: the head that predicts, each head's mean novel loss over the last epoch (what chose it)
    and each head's plain test scores (``{novel, known, all}``) — how good the label-free choice was against the
    heads it passed over. A diagnosis read with the test labels; never used to select anything. None with one head."""
    model = run.model
    if getattr(model, "num_heads", 1) == 1:
        return None
    chosen, scores = model.selected, []
    for h in range(model.num_heads):
        model.select_head(h)
        test = evaluate(run, splits, posthoc=("none",))["none"]
        scores.append({key: test[key] for key in ("all", "known", "novel")})
    model.select_head(chosen)
    return {"selected": chosen, "loss_u": [run.metrics.get(f"loss_u_head{h}") for h in range(model.num_heads)],
            "test": scores}


#: the dataset-level rehearsal of ``--select``: candidates (γ/Ku; UNIFORM = the uniform prior), validation draws and
#: the share of known classes made pseudo-novel (half: Ks = 22 gives 11 pseudo-novel classes, not 4)
SELECT_CANDIDATES, SELECT_DRAWS, SELECT_FRACTION = (UNIFORM, 0.15, 0.5, 1.5), 3, 0.5


#: ``--select-problem``: the validation problem of a ``--select-setting`` rehearsal — ``known`` (the pseudo-novel
#: classes alone, :data:`SELECT_FRACTION` of the known classes) or ``planted`` (:data:`PLANTED_FRACTION` of them planted
#: in the real unlabeled pool, :func:`ncdlr.service.validation.planted_splits`; its pool score is their F1)
SELECT_PROBLEMS, PLANTED_FRACTION = ("known", "planted"), 0.2


#: ``--select-score``: which score of a ``--select-setting`` rehearsal makes its choice — ``val`` (the held-out
#: images of the pseudo-novel classes) or ``pool`` (the pseudo-novel rows each run clustered; POOL_SPLIT)
SELECT_SCORES = ("val", "pool")


def selection_path(root: Path, dataset: str, epochs: int | None, what: str = "", replicate: int = 0) -> Path:
    """Where a dataset's rehearsal is cached: select-<dataset>.json (γ), select-<what>-<dataset>.json (another key),
    select-<what>-r<replicate>-<dataset>.json (its replicate ``replicate`` > 0: other training seeds, same draws)."""
    return root / (f"select-{f'{what}-' if what else ''}{f'r{replicate}-' if replicate else ''}{dataset}"
                   f"{f'-e{epochs}' if epochs else ''}.json")


def run_selection(dataset: str, splits: FeatureSplits, epochs: int | None) -> dict:
    """The known-class rehearsal of ``dataset`` (adaptive prior, the dataset's config, seed 0): which of
    :data:`SELECT_CANDIDATES` scores best on the pseudo-novel classes, averaged over :data:`SELECT_DRAWS` draws."""
    cfg = dataset_config(dataset, epochs)
    start, per_draw = time.perf_counter(), {}
    gamma, scores = select_gamma(cfg, splits, SELECT_CANDIDATES, draws=SELECT_DRAWS,
                                 pseudo_novel_fraction=SELECT_FRACTION, per_draw=per_draw)
    return {"dataset": dataset, "gamma": gamma, "uniform": math.isinf(gamma), "num_novel": splits.num_novel,
            "scores": {str(k): v for k, v in scores.items()}, "per_draw": {str(k): v for k, v in per_draw.items()},
            "draws": SELECT_DRAWS, "pseudo_novel_fraction": SELECT_FRACTION, "seconds": time.perf_counter() - start}


def read_selection(path: Path) -> dict:
    """A cached rehearsal, its choice derived again from the measured per-draw scores (so a change of the decision
    rule, :func:`ncdlr.service.rehearsal.choose_candidate`, needs no retraining)."""
    chosen = json.loads(path.read_text())
    per_draw = {float(k): v for k, v in chosen["per_draw"].items()}
    ratio = choose_candidate(per_draw)
    chosen.update(gamma=ratio * chosen["num_novel"], uniform=math.isinf(ratio))
    return chosen


#: ``--select-setting NAME``: a config key rehearsed on the known classes, its candidates and its default (kept unless
#: beaten draw by draw by two standard errors). ``warmup``: the known-class warm-up, off against one epoch;
#: ``momentum``: τ's SGD momentum, the authors' 0.99 against 0.9; ``epochs``: the training length, 10 against 20;
#: ``mixup``: off against a = 1; ``average``: the last iterate against a moving average of the weights (2 epochs);
#: ``relax``: the cluster sizes held at w against relaxed (``labeler.reg_m`` 0 against :data:`RELAX_REG_M`).
SETTING_REHEARSALS: dict[str, tuple[str, tuple[float, ...], float]] = {
    "warmup": ("optim.known_warmup_epochs", (0.0, 1.0), 0.0),
    "momentum": ("labeler.momentum", (0.99, 0.9), 0.99),
    "epochs": ("optim.epochs", (10, 20), 10),
    "mixup": ("optim.mixup", (0.0, 1.0), 0.0),
    "average": ("optim.average_epochs", (0.0, 2.0), 0.0),
    "relax": ("labeler.reg_m", (0.0, RELAX_REG_M), 0.0),
}
#: ``--select-setting NAME`` for a choice among named edits of several keys (:func:`ncdlr.service.rehearsal.
#: select_edits`), the first one the default. ``sizes``: the dataset config's transport (learned τ, sizes held at w)
#: against relaxed sizes with the learned τ and relaxed sizes with the uniform prior (the variants ``ncdlr-relax``,
#: ``ncdlr-uniform-relax``); ``uniform-sizes``: the same without the middle candidate (two thirds of the cost, for
#: replicated rehearsals); ``relax-hold``: the dataset configs' relaxed sizes (uniform prior, ρ 0.45) against the same
#: after one epoch of held sizes (``labeler.relax_after_epochs`` 1, the variant ``ncdlr-uniform-relax-hold1``);
#: ``task``: the configs' relaxed sizes without and with the known-vs-novel term (``method.task_weight`` 1, the
#: variant ``ncdlr-uniform-relax-task``; on a planted problem the planted classes' rows are unlabelled, so novel);
#: ``known-balance``: the same without and with the class-balanced known loss (``method.known_reweight`` 1, the variant
#: ``ncdlr-uniform-relax-cb``; the weights come from the rehearsal's own known classes' counts); ``task-balance``: the
#: same without and with both (the variant ``ncdlr-uniform-relax-task-cb``, session 34); ``posthoc``: the dataset
#: config's predictions as they are against after the logit adjustment by the pseudo-label prior (``method.posthoc``
#: la, the +LA rows), both from one training per draw (evaluation-only: :func:`ncdlr.service.rehearsal.training_key`).
#: ``config-epochs``: configs/openclipart.yaml's whole setting (the variant ``ncdlr-uniform-relax-task-cb-bound``) at
#: the dataset's 10 epochs against the same at 20 (``-e20``); ``epochs`` above rehearses the paper's algorithm, which
#: every variant starts from, not the config (session 57). ``fashion-config-epochs``: the same for
#: configs/fashion_mnist.yaml's setting (``ncdlr-uniform-relax-bound`` against its ``-e20``; session 58).
UNIFORM_RELAXED: dict[str, object] = {"labeler.prior": "uniform", "labeler.reg_m": RELAX_REG_M}  #: the configs' sizes


def variant_edits(variant: str) -> dict[str, object]:
    """The config edits of :data:`VARIANTS` ``variant`` as dotted keys (``{"method.task_weight": 1.0, ...}``), so a
    rehearsal's challenger is the variant the test splits measured, written once."""
    return {f"{section}.{name}": value
            for section, values in VARIANTS[variant].items() for name, value in values.items()}


def run_length_edits(variant: str) -> dict[str, dict[str, object]]:
    """A config's run-length rehearsal: the variant ``variant`` (a config's whole setting) against its ``-e20`` twin."""
    return {"config": variant_edits(variant), "config-e20": variant_edits(f"{variant}-e20")}


EDIT_REHEARSALS: dict[str, dict[str, dict[str, object]]] = {
    "sizes": {"held": {}, "relaxed": {"labeler.reg_m": RELAX_REG_M}, "uniform-relaxed": UNIFORM_RELAXED},
    "uniform-sizes": {"held": {}, "uniform-relaxed": UNIFORM_RELAXED},
    "relax-hold": {"uniform-relaxed": UNIFORM_RELAXED,
                   "uniform-relaxed-hold1": {**UNIFORM_RELAXED, "labeler.relax_after_epochs": 1.0}},
    "task": {"uniform-relaxed": UNIFORM_RELAXED, "uniform-relaxed-task": variant_edits("ncdlr-uniform-relax-task")},
    "known-balance": {"uniform-relaxed": UNIFORM_RELAXED,
                      "uniform-relaxed-cb": variant_edits("ncdlr-uniform-relax-cb")},
    "task-balance": {"uniform-relaxed": UNIFORM_RELAXED,
                     "uniform-relaxed-task-cb": variant_edits("ncdlr-uniform-relax-task-cb")},
    "posthoc": {"plain": {}, "la": {"method.posthoc": "la"}},
    "config-epochs": run_length_edits("ncdlr-uniform-relax-task-cb-bound"),
    "fashion-config-epochs": run_length_edits("ncdlr-uniform-relax-bound"),
}


def rehearsal_candidates(what: str) -> tuple[str, dict[object, dict[str, object]], object]:
    """``(what the choice is named, {candidate: its config edits}, the default candidate)`` of ``--select-setting
    what`` (:data:`SETTING_REHEARSALS` or :data:`EDIT_REHEARSALS`)."""
    if what in EDIT_REHEARSALS:
        edits = EDIT_REHEARSALS[what]
        return what, edits, next(iter(edits))
    key, values, default = SETTING_REHEARSALS[what]
    return key, one_key_edits(key, values), default


def setting_selection(root: Path, dataset: str, splits: FeatureSplits | None, epochs: int | None, what: str,
                      draws: int = SELECT_DRAWS, replicates: Sequence[int] = (0,), score: str = "val",
                      problem: str = "known") -> dict:
    """The dataset's known-class rehearsal of ``--select-setting what`` (:func:`rehearsal_candidates`; the dataset's
    config, seed 0, ``draws`` draws of :data:`SELECT_FRACTION` pseudo-novel classes), each of ``replicates`` (other
    training seeds on the same draws) cached as its own file (:func:`selection_path`), so replicates can run in
    separate processes. A cache of fewer draws is extended by the missing ones (draw ``d`` is the same validation
    problem whenever it runs), one of more is read for its first ``draws``. Each file keeps both scores of every run:
    ``per_draw`` (``val``) and ``per_draw_pool`` (``pool``; absent in caches from before it was recorded).

    The choice (under :func:`choice_field`, e.g. ``known_warmup_epochs``) is derived again on every read
    (:func:`choose_candidate`) from the ``score`` of each draw averaged over the replicates; the answer also holds
    ``per_replicate`` = ``{replicate: {score: {candidate: [per draw]}}}`` for benchmarks/rehearsal_noise.py.

    ``problem="planted"`` rehearses on planted problems instead (:data:`SELECT_PROBLEMS`), cached as
    select-<what>-planted-<dataset>.json; its ``pool`` score is the planted classes' F1 in the real pool."""
    if score not in SELECT_SCORES or problem not in SELECT_PROBLEMS:
        raise ValueError(f"score must be one of {SELECT_SCORES} and problem one of {SELECT_PROBLEMS}, got {score!r}, "
                         f"{problem!r}")
    planted = problem == "planted"
    fraction = PLANTED_FRACTION if planted else SELECT_FRACTION
    key, candidates, default = rehearsal_candidates(what)
    by_name = {str(candidate): candidate for candidate in candidates}
    per_replicate, seconds = {}, 0.0
    for replicate in replicates:
        path = selection_path(root, dataset, epochs, f"{what}-planted" if planted else what, replicate)
        cached = json.loads(path.read_text()) if path.is_file() else {"per_draw": {}, "draws": 0, "seconds": 0.0,
                                                                       "per_draw_pool": {}}
        if cached["draws"] < draws:
            if splits is None:
                raise SystemExit(f"{path.name} holds {cached['draws']} of {draws} draws and no data was loaded")
            start, per_draw, pool = time.perf_counter(), {}, {}
            select_edits(dataset_config(dataset, epochs), splits, candidates, default,
                         draws=draws - cached["draws"], pseudo_novel_fraction=fraction, per_draw=per_draw,
                         first_draw=cached["draws"], replicate=replicate, pool=pool, planted=planted)
            record = {"dataset": dataset, "key": key, "replicate": replicate, "draws": draws, "problem": problem,
                      "per_draw": {str(k): cached["per_draw"].get(str(k), []) + v for k, v in per_draw.items()},
                      "pseudo_novel_fraction": fraction,
                      "seconds": cached.get("seconds", 0.0) + time.perf_counter() - start}
            if "per_draw_pool" in cached:  # pool scores are kept only while they cover every draw
                record["per_draw_pool"] = {str(k): cached["per_draw_pool"].get(str(k), []) + v
                                           for k, v in pool.items()}
            path.write_text(json.dumps(record))
            cached = record
        per_replicate[replicate] = {
            name: {by_name[k]: v[:draws] for k, v in cached[field].items()}
            for name, field in (("val", "per_draw"), ("pool", "per_draw_pool")) if field in cached}
        seconds += cached.get("seconds", 0.0)
        if score not in per_replicate[replicate]:
            raise SystemExit(f"{path.name} has no {score} scores (cached before they were recorded): delete it to "
                             f"rehearse again, or choose with --select-score val")
    per_draw = {candidate: np.mean([per_replicate[r][score][candidate] for r in replicates], axis=0).tolist()
                for candidate in candidates}
    return {"dataset": dataset, "key": key, choice_field(what): choose_candidate(per_draw, default), "draws": draws,
            "replicates": list(replicates), "score": score, "problem": problem, "per_draw": per_draw, "seconds": seconds,
            "scores": {k: float(np.mean(v)) for k, v in per_draw.items()}, "per_replicate": per_replicate}


def choice_field(what: str) -> str:
    """The field of :func:`setting_selection`'s answer that holds the choice: the key's name (``reg_m`` for
    ``labeler.reg_m``), or ``what`` itself for :data:`EDIT_REHEARSALS`."""
    return rehearsal_candidates(what)[0].partition(".")[2] or what


def cell_path(root: Path, dataset: str, variant: str, seed: int, epochs: int | None, trace: bool = False,
              holdout_view: bool = False) -> Path:
    return root / (f"{dataset}-{variant}-s{seed}{f'-e{epochs}' if epochs else ''}{'-trace' if trace else ''}"
                   f"{'-hv' if holdout_view else ''}.json")


def variant_epochs(spec: str) -> tuple[str, int | None]:
    """A readers' variant name with its run length: ``"ncdlr@20"`` → ``("ncdlr", 20)``, the cells of ``quality.py
    --epochs 20``; ``"ncdlr"`` → ``("ncdlr", None)``, the dataset's default epochs (seed_spread.py, carry.py)."""
    name, _, epochs = spec.partition("@")
    if epochs and not epochs.isdigit():
        raise SystemExit(f"variant {spec!r}: the part after '@' must be an epoch count, e.g. ncdlr@5")
    return name, int(epochs) if epochs else None


def read_cells(root: Path, dataset: str, variant: str, seeds: int, holdout_view: bool = False,
               epochs: int | None = None) -> dict[int, dict]:
    """``{seed: cell}`` of the cached cells (no trace) found for seeds ``0..seeds-1``: the dataset's default epochs,
    or those of ``--epochs epochs``; the ``--holdout-view`` ones with ``holdout_view`` (for seed_spread.py and
    carry.py)."""
    paths = {s: cell_path(root, dataset, variant, s, epochs, holdout_view=holdout_view) for s in range(seeds)}
    return {s: json.loads(p.read_text()) for s, p in paths.items() if p.is_file()}


def fmt(values: list[float]) -> str:
    vals = np.array([v for v in values if v is not None and not math.isnan(v)], dtype=float)
    if not len(vals):
        return "–"
    return f"{100 * vals.mean():.1f} ± {100 * vals.std():.1f}"


def render(cells: list[dict], datasets: list[str], variants: list[str], header: str) -> str:
    """Markdown: per dataset the method table (All/Known/Novel, novel H/M/T), the ladder and τ."""
    lines = [header]
    for dataset in datasets:
        mine = [c for c in cells if c["dataset"] == dataset]
        if not mine:
            continue
        seeds = sorted({c["seed"] for c in mine})
        lines += [f"\n### {dataset} — class-mean accuracy (%), mean ± std over seeds {seeds}, epochs "
                  f"{mine[0]['epochs']}, γ = {mine[0]['gamma']:g}\n",
                  "| method | " + " | ".join(COLUMNS) + " | final τ (max) | train s |",
                  "|" + "---|" * (len(COLUMNS) + 3)]
        for variant in variants:
            runs = [c for c in mine if c["variant"] == variant]
            if not runs:
                continue
            for posthoc in runs[0]["results"]:
                name = variant + ("" if posthoc == "none" else f" +{posthoc.upper() if posthoc == 'la' else 'cRT'}")
                if len(runs) < len(seeds):
                    name += f" (seeds {sorted(r['seed'] for r in runs)})"
                cols = [fmt([r["results"][posthoc][c] for r in runs]) for c in COLUMNS]
                taus = [r["tau_final"] for r in runs if r["tau_final"] is not None]
                tau = (f"{np.mean(taus):.3g} ({max(r['tau_max'] for r in runs if r['tau_max'] is not None):.3g})"
                       if taus and posthoc == "none" else "")
                secs = f"{np.mean([r['train_s'] for r in runs]):.0f}" if posthoc == "none" else ""
                lines.append(f"| {name} | " + " | ".join(cols) + f" | {tau} | {secs} |")
        ladder = [(rung, [c for c in mine if c["variant"] == v]) for rung, v in LADDER]
        if all(runs for _, runs in ladder[:4]):
            lines += ["\nAblation ladder (novel, class-mean %): " + " → ".join(
                f"{rung} {fmt([r['results']['none']['novel'] for r in runs])}" for rung, runs in ladder if runs)]
    return "\n".join(lines) + "\n"


def markers(block: str = "") -> tuple[str, str]:
    """The comment lines around a generated block of tables (``block`` names one of several in a file)."""
    name = f"quality.py tables{f' ({block})' if block else ''}"
    return f"<!-- {name}: begin -->", f"<!-- {name}: end -->"


def write_between_markers(path: Path, table: str, block: str = "") -> None:
    """Replace the generated block ``block`` of ``path`` (between its markers), keeping the hand-written analysis."""
    BEGIN, END = markers(block)
    text = path.read_text() if path.is_file() else f"# Discovery quality\n\n{BEGIN}\n{END}\n"
    if BEGIN not in text or END not in text:
        text += f"\n{BEGIN}\n{END}\n"
    head, rest = text.split(BEGIN, 1)
    path.write_text(f"{head}{BEGIN}\n{table}{END}{rest.split(END, 1)[1]}")


def run_workers(args: argparse.Namespace) -> int:
    """``--workers N``: each dataset's rehearsal first (here, once), then N children of this script, each running
    every N-th pending cell of the grid with one thread. Returns the first failing child's exit status, else 0."""
    import subprocess
    import sys

    if args.select and not all(selection_path(args.results, d, args.epochs).is_file() for d in args.datasets):
        main([*child_arguments(args), "--select", "--seeds", "0"])  # the rehearsals only, cached for the children
    children = [subprocess.Popen([sys.executable, __file__, *child_arguments(args), "--shard", f"{i}/{args.workers}"])
                for i in range(args.workers)]
    codes = [child.wait() for child in children]
    return next((code for code in codes if code), 0)


def child_arguments(args: argparse.Namespace) -> list[str]:
    """The grid of ``args`` as command-line arguments (no --workers, --out or --select)."""
    out = ["--datasets", *args.datasets, "--variants", *args.variants, "--seeds", str(args.seeds),
           "--features", args.features, "--results", str(args.results)]
    for item in args.table:
        out += ["--table", item]
    if args.epochs:
        out += ["--epochs", str(args.epochs)]
    if args.only_seeds is not None:
        out += ["--only-seeds", *map(str, args.only_seeds)]
    if args.trace:
        out.append("--trace")
    if args.holdout_view:
        out.append("--holdout-view")
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--datasets", nargs="+", default=["synthetic", "openclipart"],
                        choices=["synthetic", "openclipart", *CACHED])
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    parser.add_argument("--seeds", type=int, default=5, help="seeds 0..N-1 (≥ 3 for mean ± std; docs/results.md uses 5)")
    parser.add_argument("--epochs", type=int, default=None, help="override every dataset's epochs (smoke runs)")
    parser.add_argument("--features", default="/work/cache/openclipart-lt-lite0-160.parquet",
                        help="OpenClipart-LT feature table from `ncdlr embed --encoder efficientnet_lite0 --image-size 160`")
    add_table_argument(parser)
    parser.add_argument("--only-seeds", type=int, nargs="+", default=None,
                        help="run only these of the seeds (split a grid over processes; tables use every cached seed)")
    parser.add_argument("--results", type=Path, default=Path("/work/cache/quality"), help="per-cell JSON cache")
    parser.add_argument("--out", type=Path, default=None, help="Markdown file for the tables (e.g. docs/results.md)")
    parser.add_argument("--render-only", action="store_true", help="only render the cached cells")
    parser.add_argument("--block", default="", help="which generated block of --out to replace (e.g. 'cached'; "
                                                    "default: the first, synthetic + openclipart)")
    parser.add_argument("--select", action="store_true",
                        help="run (or read) each dataset's known-class rehearsal, cached as select-<dataset>.json")
    parser.add_argument("--select-setting", nargs="+", default=[],
                        choices=sorted({*SETTING_REHEARSALS, *EDIT_REHEARSALS}),
                        help="run (or read) each dataset's known-class rehearsal of these settings, cached as "
                             "select-<name>-<dataset>.json: warmup (optim.known_warmup_epochs 0 or 1), momentum "
                             "(labeler.momentum 0.99 or 0.9), epochs (the paper's algorithm at optim.epochs 10 or 20), "
                             "mixup (optim.mixup 0 or 1), average (optim.average_epochs 0 or 2), relax (labeler.reg_m 0"
                             " or 0.45), sizes (held sizes, relaxed, or relaxed with the uniform prior), uniform-sizes "
                             "(held, or relaxed with the uniform prior), relax-hold (the configs' relaxed sizes, or the"
                             " same after one epoch of held sizes), task (the configs' relaxed sizes without or with "
                             "method.task_weight 1), known-balance (the same without or with method.known_reweight 1), "
                             "task-balance (the same without or with both), posthoc (the dataset config's predictions "
                             "plain or after method.posthoc la; one training per draw), config-epochs "
                             "(configs/openclipart.yaml's setting at 10 or 20 epochs), fashion-config-epochs "
                             "(configs/fashion_mnist.yaml's setting at 10 or 20 epochs)")
    parser.add_argument("--select-warmup", action="store_true", help="the same as --select-setting warmup")
    parser.add_argument("--select-draws", type=int, default=SELECT_DRAWS,
                        help=f"validation draws of each --select-setting rehearsal (default {SELECT_DRAWS}); a cached "
                             "rehearsal of fewer draws is extended by the missing ones, not run again")
    parser.add_argument("--select-replicates", type=int, default=1,
                        help="train every --select-setting candidate on each draw this many times, with other "
                             "seeds (replicate r: seed 1000 r), and choose on the mean over them (default 1)")
    parser.add_argument("--select-only-replicates", type=int, nargs="+", default=None,
                        help="run only these replicates (split a rehearsal over processes; each is its own cache file)")
    parser.add_argument("--select-score", choices=SELECT_SCORES, default="val",
                        help="the score a --select-setting rehearsal chooses on: val (held-out images of the "
                             "pseudo-novel classes, default) or pool (the pseudo-novel rows each run clustered)")
    parser.add_argument("--select-problem", choices=SELECT_PROBLEMS, default="known",
                        help="the validation problem of a --select-setting rehearsal: known (half the known classes "
                             "made pseudo-novel, alone; default) or planted "
                             f"({PLANTED_FRACTION * 100:.0f}%% of them planted in the real unlabeled pool, whose labels "
                             "are never read; choose on its pool score, the planted classes' F1, with --select-score "
                             "pool)")
    parser.add_argument("--trace", action="store_true",
                        help="record per epoch how the novel training rows are clustered (cells cached as *-trace.json)")
    parser.add_argument("--holdout-view", action="store_true",
                        help="cached datasets: train without each training row's last cached view and record the "
                             "model's novel clusters on it (cells cached as *-hv.json; benchmarks/carry.py reads them)")
    parser.add_argument("--workers", type=int, default=1,
                        help="processes that run the grid's cells side by side, one CPU thread each (the 2-core grid: 2)")
    parser.add_argument("--shard", default=None, help=argparse.SUPPRESS)  # "I/N": a --workers child's share of the cells
    args = parser.parse_args(argv)
    if args.workers < 1:
        parser.error(f"--workers must be at least 1, got {args.workers}")
    if args.select_replicates < 1 or any(r < 0 for r in args.select_only_replicates or ()):
        parser.error(f"--select-replicates must be at least 1 and replicates at least 0, got "
                     f"{args.select_replicates}, {args.select_only_replicates}")
    tables = parsed_tables(parser, args)
    torch.set_num_threads(1)
    args.results.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    if args.workers > 1 and not args.render_only:
        code = run_workers(args)
        if code:
            return code
        args.render_only = True  # the children wrote every cell: render them
    shard, shards = map(int, args.shard.split("/")) if args.shard else (0, 1)
    pending = 0  # cells to run, counted in grid order: a child runs those with pending % shards == shard
    cached = {p.name for p in args.results.glob("*.json")}  # at the start: the children all count the same cells
    cells = []
    for dataset in args.datasets:
        fixed = None
        if not args.render_only and dataset == "openclipart":
            fixed = openclipart_splits(args.features)
        elif not args.render_only and dataset in CACHED:
            from ncdlr.data.features import read_feature_table

            fixed = read_feature_table(tables[dataset])
        chosen = None
        if selection_path(args.results, dataset, args.epochs).is_file():
            chosen = read_selection(selection_path(args.results, dataset, args.epochs))
        elif args.select and not args.render_only and args.shard is None:
            chosen = run_selection(dataset, fixed if fixed is not None else synthetic_splits(0), args.epochs)
            selection_path(args.results, dataset, args.epochs).write_text(json.dumps(chosen))
        if chosen is not None:
            choice = "uniform prior" if chosen["uniform"] else f"γ = {chosen['gamma']:.3g}"
            print(f"[{dataset}] rehearsal: {choice} (γ/Ku → score: {chosen['scores']}; {chosen['seconds']:.0f} s)",
                  flush=True)
        settings = list(dict.fromkeys(args.select_setting + (["warmup"] if args.select_warmup else [])))
        for what in settings if not args.render_only and args.shard is None else ():
            key = rehearsal_candidates(what)[0]
            replicates = args.select_only_replicates or range(args.select_replicates)
            done = setting_selection(args.results, dataset, fixed if fixed is not None else synthetic_splits(0),
                                     args.epochs, what, args.select_draws, replicates, args.select_score,
                                     args.select_problem)
            print(f"[{dataset}] {what} rehearsal ({args.select_problem} problem, {args.select_score} score, "
                  f"replicates {done['replicates']}): "
                  f"{key} = {done[choice_field(what)]} (per draw: {done['per_draw']}; {done['seconds']:.0f} s)",
                  flush=True)
        for seed in range(args.seeds):
            skip = args.render_only or (args.only_seeds is not None and seed not in args.only_seeds)
            splits = fixed if dataset != "synthetic" else (None if skip else synthetic_splits(seed))
            for variant in args.variants:
                path = cell_path(args.results, dataset, variant, seed, args.epochs, args.trace, args.holdout_view)
                if path.name in cached or (args.render_only and path.is_file()):
                    cells.append(json.loads(path.read_text()))
                    continue
                if args.render_only or (args.only_seeds is not None and seed not in args.only_seeds):
                    continue
                pending += 1
                if (pending - 1) % shards != shard:
                    continue
                cell = run_cell(dataset, variant, seed, splits, args.epochs, trace=args.trace, chosen=chosen,
                                holdout_view=args.holdout_view)
                path.write_text(json.dumps(cell))
                cells.append(cell)
                r = cell["results"]["none"]
                print(f"[{dataset} s{seed}] {variant:<16} novel {100 * r['novel']:5.1f} known {100 * r['known']:5.1f} "
                      f"τ {cell['tau_final'] if cell['tau_final'] is None else round(cell['tau_final'], 3)} "
                      f"({cell['train_s']:.0f}+{cell['eval_s']:.0f} s wall, {cell['cpu_s']:.0f} s CPU)", flush=True)
    header = (f"Grid: {', '.join(args.datasets)} × {len(args.variants)} variants × {args.seeds} seeds; "
              f"{len(cells)} cells; wall {time.perf_counter() - start:.0f} s this invocation (cached cells not re-run).")
    table = render(cells, args.datasets, args.variants, header)
    print(table)
    if args.out:
        write_between_markers(args.out, table, args.block)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
