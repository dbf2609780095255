"""Entry-point wiring of ``python -m ncdlr.train_inat2k`` (the runs themselves are covered by the e2e tests)."""

import pytest

from ncdlr import train_inat2k


def test_cluster_job_uses_the_inat2k_config_with_the_given_data_and_flags():
    args = train_inat2k.build_parser().parse_args(
        ["--data", "s3://bucket/inat18-2k", "--num-workers", "8", "--use-gpu", "true", "--pretrained", "s3://w/dino.pth"])
    cfg = train_inat2k.build_config(args)  # --data: configs/inat18_2k.yaml
    assert cfg.data.uri == "s3://bucket/inat18-2k"
    assert cfg.model.encoder == "vit_base_patch16_224" and cfg.model.head == "expand"
    assert cfg.model.pretrained == "s3://w/dino.pth"
    assert cfg.run.num_workers == 8 and cfg.run.use_gpu == "true"


def test_embedded_default_uses_a_gamma_sized_for_its_small_ku():
    args = train_inat2k.build_parser().parse_args([])
    cfg = train_inat2k.build_config(args)  # no --data: configs/demo.yaml
    assert cfg.labeler.gamma <= 10  # γ = 500 would pin τ ≈ 1 at Ku = 10 (method.md §4 trap a)
    assert cfg.run.num_workers == 2 and cfg.model.encoder == "efficientnet_lite0"


def test_bad_override_is_refused_before_anything_starts(capsys):
    assert train_inat2k.main(["--data", "s3://b/x", "--num-workers", "many"]) == 2
    assert "run.num_workers" in capsys.readouterr().err


def test_embedded_default_joins_an_already_initialised_ray_without_starting_another(ray_local):
    import ray

    from ncdlr.service.entry import init_ray

    assert init_ray(runtime_env={"env_vars": {"AWS_REGION": "us-east-1"}}) is False
    assert ray.is_initialized()


def test_the_verbose_flag_reaches_the_config():
    args = train_inat2k.build_parser().parse_args(["--verbose"])
    assert train_inat2k.build_config(args).run.verbose is True
    assert train_inat2k.build_config(train_inat2k.build_parser().parse_args([])).run.verbose is False
