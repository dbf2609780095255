"""Typed config: YAML + command-line overrides; every bad key or value is rejected with the key named."""

from pathlib import Path

import pytest

from ncdlr.service.config import Config, ConfigError, load_config, load_yaml, save_config

CONFIGS = sorted((Path(__file__).parents[2] / "configs").glob("*.yaml"))


def test_yaml_sets_fields_and_overrides_win(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("labeler:\n  gamma: 7\nrun:\n  num_workers: 3\n")
    cfg = load_config(path, ["--gamma", "9.5", "--run.num-workers=2", "--use_buffer", "false"])
    assert cfg.labeler.gamma == 9.5 and isinstance(cfg.labeler.gamma, float)
    assert cfg.run.num_workers == 2
    assert cfg.labeler.use_buffer is False
    assert cfg.optim.lr == Config().optim.lr


def test_int_in_yaml_is_accepted_for_a_float_field(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("optim:\n  lr: 1\n")
    assert load_yaml(path).optim.lr == 1.0


def test_yaml_numbers_that_pyyaml_reads_as_strings_are_accepted(tmp_path):
    """YAML 1.1 reads ``1e-3`` (no dot) as a string; ``--optim.lr 1e-3`` is accepted, so the file's is too."""
    path = tmp_path / "c.yaml"
    path.write_text("optim:\n  lr: 1e-3\n  min_lr: 5E-5\nlabeler:\n  gamma: 1e2\nrun:\n  num_workers: '3'\n")
    cfg = load_yaml(path)
    assert cfg.optim.lr == 1e-3 and isinstance(cfg.optim.lr, float)
    assert cfg.optim.min_lr == 5e-5 and cfg.labeler.gamma == 100.0
    assert cfg.run.num_workers == 3


@pytest.mark.parametrize("text, key", [
    ("labeler:\n  gama: 5\n", "labeler.gama"),
    ("optim:\n  lr: true\n", "optim.lr"),  # a bool is not a number
    ("optim:\n  lr: fast\n", "optim.lr"),
    ("run:\n  num_workers: '2.5'\n", "run.num_workers"),
    ("labelr:\n  gamma: 5\n", "labelr"),
    ("run:\n  num_workers: two\n", "run.num_workers"),
    ("run:\n  num_workers: 2.5\n", "run.num_workers"),
    ("labeler:\n  use_buffer: 3\n", "labeler.use_buffer"),
    ("model:\n  head: wide\n", "model.head"),
    ("data: 5\n", "data"),
    ("data:\n  decode_on: gpu\n", "data.decode_on"),
    ("data:\n  epochs_per_execution: 0\n", "data.epochs_per_execution"),
])
def test_bad_yaml_key_or_type_is_rejected_naming_the_key(tmp_path, text, key):
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        load_yaml(path)


@pytest.mark.parametrize("args, key", [
    (["--gama", "5"], "gama"),
    (["--labeler.gamma", "high"], "labeler.gamma"),
    (["--epochs"], "epochs"),
    (["--lr", "0.1"], "lr"),  # in optim and labeler: ambiguous
    (["gamma", "5"], "gamma"),
])
def test_bad_override_is_rejected_naming_the_key(args, key):
    with pytest.raises(ConfigError, match=key):
        load_config(None, args)


def test_missing_config_file_is_named(tmp_path):
    with pytest.raises(ConfigError, match="nope.yaml"):
        load_yaml(tmp_path / "nope.yaml")


def test_saved_config_round_trips(tmp_path):
    cfg = load_config(None, ["--gamma", "3", "--encoder", "tiny_cnn", "--use-gpu", "false"])
    save_config(cfg, tmp_path / "config.yaml")
    assert load_yaml(tmp_path / "config.yaml") == cfg


@pytest.mark.parametrize("path", CONFIGS, ids=[p.stem for p in CONFIGS])
def test_shipped_configs_load(path):
    cfg = load_yaml(path)
    assert cfg.labeler.gamma > 0 and cfg.optim.epochs > 0


def test_every_dataset_has_a_config():
    assert {p.stem for p in CONFIGS} >= {"cifar100_lt", "imagenet100_lt", "herbarium19", "inat18_1k", "inat18_2k",
                                          "openclipart", "demo"}


def test_gamma_per_cluster_scales_with_ku_and_a_later_gamma_wins(tmp_path):
    from ncdlr.labeler import AdaptiveSelfLabeler

    path = tmp_path / "c.yaml"
    path.write_text("labeler:\n  gamma_per_cluster: 0.5\n")
    cfg = load_config(path)
    assert AdaptiveSelfLabeler.from_config(cfg.labeler, 21).gamma == pytest.approx(10.5)
    assert AdaptiveSelfLabeler.from_config(cfg.labeler, 40).gamma == pytest.approx(20.0)  # same γ/Ku on another set
    given = load_config(path, ["--gamma", "7"])  # the command line's γ over the file's γ/Ku, not silently under it
    assert given.labeler.gamma_per_cluster == 0.0 and AdaptiveSelfLabeler.from_config(given.labeler, 21).gamma == 7.0
    again = load_config(path, ["--gamma", "7", "--gamma-per-cluster", "1.5"])
    assert again.labeler.gamma_for(10) == 15.0
    assert load_yaml(save_config(cfg, tmp_path / "saved.yaml") or tmp_path / "saved.yaml").labeler.gamma_for(21) == \
        pytest.approx(10.5)  # a saved run config reads back to the same γ
    with pytest.raises(ConfigError, match="labeler.gamma_per_cluster"):
        load_config(None, ["--gamma-per-cluster", "-1"])


def test_reg_m_is_read_from_the_command_line_and_refuses_a_negative_weight():
    assert load_config(None, ["--reg-m", "0.45"]).labeler.reg_m == 0.45
    assert load_config(None, []).labeler.reg_m == 0.0  # held sizes: the paper's transport
    with pytest.raises(ConfigError, match="labeler.reg_m"):
        load_config(None, ["--reg-m", "-0.1"])


def test_size_floor_needs_relaxed_sizes_under_a_prior_that_does_not_learn():
    cfg = load_config(None, ["--labeler.prior", "uniform", "--reg-m", "0.45", "--labeler.size_floor", "known"])
    assert cfg.labeler.size_floor == "known"  # the trainer fills in the share from the data
    assert load_config(None, ["--labeler.prior", "uniform", "--reg-m", "0.45", "--labeler.size_floor", "0.005"])
    with pytest.raises(ConfigError, match="size_floor .* needs labeler.reg_m > 0"):
        load_config(None, ["--labeler.prior", "uniform", "--labeler.size_floor", "known"])
    with pytest.raises(ConfigError, match="prior uniform .*prior='adaptive'"):
        load_config(None, ["--reg-m", "0.45", "--labeler.size_floor", "known"])
    for bad in ("rarest", "0", "1.5"):
        with pytest.raises(ConfigError, match="'labeler.size_floor': expected 'none', 'known' or a share"):
            load_config(None, ["--labeler.prior", "uniform", "--reg-m", "0.45", "--labeler.size_floor", bad])
    with pytest.raises(ConfigError, match="labeler.max_imbalance=0.5: an imbalance"):
        load_config(None, ["--labeler.max_imbalance", "0.5"])


def test_relax_bound_takes_known_or_an_imbalance_above_one_and_is_inert_under_held_sizes():
    """``labeler.relax_bound``: "known" (the trainer fills in the known classes' n_max/n_min) or a number > 1. With
    ``reg_m`` 0 it is accepted and inert, so a config's bound does not break ``--labeler.reg_m 0`` (held sizes)."""
    relaxed = ["--labeler.prior", "uniform", "--reg-m", "0.45"]
    assert load_config(None, relaxed + ["--labeler.relax_bound", "known"]).labeler.relax_bound == "known"
    assert load_config(None, relaxed + ["--labeler.relax_bound", "34.5"]).labeler.relax_bound == "34.5"
    assert load_config(None, ["--labeler.relax_bound", "known"]).labeler.reg_m == 0.0
    for bad in ("rarest", "1", "0.5", "-3"):
        with pytest.raises(ConfigError, match="'labeler.relax_bound': expected 'none', 'known' or an imbalance > 1"):
            load_config(None, relaxed + ["--labeler.relax_bound", bad])


def test_relax_tighten_takes_zero_or_a_factor_above_one_and_needs_a_bound_under_relaxed_sizes():
    """``labeler.relax_tighten``: 0 (the guard holds the sizes) or a factor > 1 on ``reg_m``; it acts only on epochs
    past ``labeler.relax_bound``, so relaxed sizes without a bound refuse it by name; held sizes leave it inert."""
    bounded = ["--labeler.prior", "uniform", "--reg-m", "0.45", "--labeler.relax_bound", "known"]
    assert load_config(None, bounded + ["--labeler.relax_tighten", "3"]).labeler.relax_tighten == 3.0
    assert load_config(None, bounded).labeler.relax_tighten == 0.0
    assert load_config(None, ["--labeler.relax_tighten", "3"]).labeler.reg_m == 0.0
    for bad in ("1", "0.5", "-3"):
        with pytest.raises(ConfigError, match="'labeler.relax_tighten': expected 0"):
            load_config(None, bounded + ["--labeler.relax_tighten", bad])
    with pytest.raises(ConfigError, match="labeler.relax_tighten=3 acts on the epochs .* labeler.relax_bound, which is none"):
        load_config(None, ["--labeler.prior", "uniform", "--reg-m", "0.45", "--labeler.relax_tighten", "3"])


def test_known_warmup_epochs_is_read_from_the_command_line_and_refuses_a_negative_count():
    assert load_config(None, ["--known-warmup-epochs", "1.5"]).optim.known_warmup_epochs == 1.5
    with pytest.raises(ConfigError, match="optim.known_warmup_epochs"):
        load_config(None, ["--known-warmup-epochs", "-1"])
    with pytest.raises(ConfigError, match="leaves none of the 2 epochs"):
        load_config(None, ["--epochs", "2", "--known-warmup-epochs", "2"])


def test_the_relaxations_warm_up_must_leave_relaxed_epochs_and_be_non_negative():
    """``labeler.relax_after_epochs``: held sizes for that many epochs of self-labeling (after the known-class
    warm-up), then ``reg_m``; holding them for every such epoch would make reg_m a dead setting, so it is refused."""
    relaxed = ["--labeler.prior", "uniform", "--labeler.reg_m", "0.45"]
    assert load_config(None, relaxed + ["--labeler.relax_after_epochs", "1"]).labeler.relax_after_epochs == 1.0
    with pytest.raises(ConfigError, match="labeler.relax_after_epochs.*must be >= 0"):
        load_config(None, relaxed + ["--labeler.relax_after_epochs", "-1"])
    with pytest.raises(ConfigError, match="holds the cluster sizes for all 1 epochs of self-labeling"):
        load_config(None, relaxed + ["--epochs", "2", "--known-warmup-epochs", "1", "--labeler.relax_after_epochs", "1"])


@pytest.mark.parametrize("flag, value, message", [
    ("--epochs", "0", "'optim.epochs': must be >= 1, got 0"),
    ("--epochs", "-1", "'optim.epochs': must be >= 1, got -1"),
    ("--batch-size", "0", "'data.batch_size': must be >= 1"),
    ("--num-workers", "0", "'run.num_workers': must be >= 1"),
    ("--buffer-size", "-5", "'labeler.buffer_size': must be >= 1"),
    ("--labeler.n_iters", "0", "'labeler.n_iters': must be >= 1"),
    ("--model.trainable_blocks", "-2", "'model.trainable_blocks': must be >= -1"),
    ("--run.checkpoints_to_keep", "0", "'run.checkpoints_to_keep': must be >= 1"),
    ("--seed", "-1", "'run.seed': must be >= 0"),
    ("--labeler.eps", "0", "'labeler.eps': must be > 0"),
    ("--optim.lr", "-0.001", "'optim.lr': must be > 0"),
    ("--method.temperature", "0", "'method.temperature': must be > 0"),
    ("--data.crop_scale_min", "1.5", r"'data.crop_scale_min': must be in \(0, 1\]"),
    ("--labeler.momentum", "1", r"'labeler.momentum': must be in \[0, 1\)"),
])
def test_a_count_size_or_step_out_of_range_is_refused_naming_the_key(flag, value, message):
    """Before: ``--epochs 0`` or ``-1`` started Ray, trained nothing and failed on a missing checkpoint after
    writing a run directory; ``--batch-size 0`` failed deep in the loader. Now each is one ConfigError at resolve."""
    with pytest.raises(ConfigError, match=message):
        load_config(None, [flag, value])


@pytest.mark.parametrize("flag, value", [("--model.trainable_blocks", "-1"), ("--run.max_failures", "-1"),
                                         ("--labeler.init_t", "-2"), ("--data.crop_scale_min", "1"),
                                         ("--labeler.momentum", "0"), ("--run.log_every", "0")])
def test_the_documented_special_values_at_the_bounds_stay_accepted(flag, value):
    """-1 = all blocks (trainable_blocks) and Ray's retry-forever (max_failures); t is any real; a crop may cover the
    whole image; 0 momentum and no progress lines are plain settings."""
    load_config(None, [flag, value])
