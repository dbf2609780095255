"""What a person reads during a run: the driver's relay of rank 0's lines (no Ray needed for these)."""

from __future__ import annotations

from ncdlr.service.console import ConsoleRelay, progress_bar


def test_epoch_lines_are_printed_and_logged_progress_lines_only_now_and_then_in_a_log(tmp_path, capsys):
    relay = ConsoleRelay("unused", log_file=tmp_path / "train.log")
    relay.log_progress_s = 3600.0  # stdout is not a terminal here: a progress line at most once an hour
    relay.show("progress", "[ncdlr] epoch 1/2 [#...] step 1/10")
    relay.show("line", "[ncdlr] epoch 1/2 done in 1.0s")
    relay.log_progress_s = 0.0
    relay.show("progress", "[ncdlr] epoch 2/2 [##..] step 5/10")
    out = capsys.readouterr().out.splitlines()
    assert out == ["[ncdlr] epoch 1/2 done in 1.0s", "[ncdlr] epoch 2/2 [##..] step 5/10"]
    assert (tmp_path / "train.log").read_text().splitlines() == [
        "[ncdlr] epoch 1/2 [#...] step 1/10", "[ncdlr] epoch 1/2 done in 1.0s", "[ncdlr] epoch 2/2 [##..] step 5/10"]


def test_progress_bar_fills_with_the_steps_done():
    assert progress_bar(0, 10, width=10) == "[..........]"
    assert progress_bar(5, 10, width=10) == "[#####.....]"
    assert progress_bar(12, 10, width=10) == "[##########]"


def test_an_epoch_whose_pseudo_labels_left_clusters_empty_says_so_in_a_warning_line(tmp_path, capfd):
    """Rank 0 without a board prints to the process's stdout (``sys.__stdout__``): captured at the descriptor."""
    from types import SimpleNamespace

    from ncdlr.service.config import Config
    from ncdlr.service.console import EpochLog

    cfg = Config()
    cfg.run.output = str(tmp_path)
    log = EpochLog(cfg, rank=0)
    state = SimpleNamespace(epoch=3, model=SimpleNamespace(num_novel=21))
    metrics = {"epoch_s": 1.0, "loss": 0.5, "tau": 2.2, "bad_images": 0.0, "steps_per_s": 9.0}
    log.epoch(state, {**metrics, "clusters_empty": 0.0, "cluster_imbalance": 12.0})
    log.epoch(state, {**metrics, "clusters_empty": 4.0, "cluster_imbalance": 390.0})
    log.close()
    lines = capfd.readouterr().out.splitlines()
    warnings = [line for line in lines if "warning" in line]
    assert len(lines) == 3 and len(warnings) == 1  # no warning while every cluster has rows
    assert "4 of 21 novel clusters got no pseudo-label in epoch 3" in warnings[0] and "390-fold" in warnings[0]


def test_the_empty_cluster_warning_names_the_lever_of_its_cause():
    """Relaxed sizes → ``labeler.relax_bound``; held sizes over a buffer that holds much of an epoch and no cap →
    ``labeler.buffer_epochs`` with the fraction the buffer holds (the bare command on Emoji-LT: 2048 rows of 11 steps
    of 256, 0.73) and session 64's two readings; with the cap set, neither lever is offered again."""
    from ncdlr.method_settings import LabelerConfig
    from ncdlr.service.console import empty_clusters_warning

    relaxed = empty_clusters_warning(4, 21, 3, 390.0, LabelerConfig(prior="uniform", reg_m=0.45), 0.1)
    assert relaxed.startswith("[ncdlr] warning: 4 of 21 novel clusters got no pseudo-label in epoch 3")
    assert "--labeler.relax_bound known" in relaxed and "buffer_epochs" not in relaxed
    held = empty_clusters_warning(2, 35, 5, 695.0, LabelerConfig(), 2048 / (11 * 256))
    assert "holds 0.73 of an epoch" in held and "--labeler.buffer_epochs 0.2" in held and "relax_bound" not in held
    assert "6.1" in held and "4.1" in held and "Tabler-LT by +0.4" in held and "ncdlr rehearse" in held
    capped = empty_clusters_warning(2, 35, 5, 695.0, LabelerConfig(buffer_epochs=0.2), 0.18)
    assert "--labeler.buffer_epochs" not in capped and "relax_bound" not in capped
    no_buffer = empty_clusters_warning(2, 35, 5, 695.0, LabelerConfig(use_buffer=False), None)
    assert "--labeler.buffer_epochs" not in no_buffer and "of an epoch of the pool" not in no_buffer


def test_an_epoch_line_of_held_sizes_reads_the_buffers_share_of_the_epoch(tmp_path, capfd):
    """The epoch line computes the buffer's share from the run's steps, batch and workers (2 × W × B rows a step)."""
    from types import SimpleNamespace

    from ncdlr.service.config import Config
    from ncdlr.service.console import EpochLog

    cfg = Config()
    cfg.run.output, cfg.data.batch_size, cfg.run.num_workers = str(tmp_path), 128, 1
    log = EpochLog(cfg, rank=0, steps_per_epoch=11)
    log.epoch(SimpleNamespace(epoch=2, model=SimpleNamespace(num_novel=35)),
              {"epoch_s": 1.0, "loss": 0.5, "tau": 1.0, "bad_images": 0.0, "steps_per_s": 9.0, "clusters_empty": 1.0,
               "cluster_imbalance": 1063.0})
    log.close()
    warning = [line for line in capfd.readouterr().out.splitlines() if "warning" in line][0]
    assert "1 of 35 novel clusters" in warning and "holds 0.73 of an epoch" in warning


def test_the_first_line_says_how_the_clusters_sizes_are_treated():
    """Held at the prior's marginal (the paper's algorithm), relaxed towards it (the dataset configs' uniform prior
    with reg_m 0.45; after a warm-up of held sizes with labeler.relax_after_epochs), or nothing for a method without
    a self-labeler."""
    from ncdlr.labeler import AdaptiveSelfLabeler
    from ncdlr.service.console import cluster_sizes_phrase

    assert cluster_sizes_phrase(AdaptiveSelfLabeler(5)) == "sizes held at the adaptive prior"
    relaxed = AdaptiveSelfLabeler(5, prior="uniform", reg_m=0.45)
    assert cluster_sizes_phrase(relaxed) == "sizes relaxed towards the uniform prior (reg_m 0.45)"
    assert (cluster_sizes_phrase(relaxed, relax_after_epochs=1.0)
            == "sizes relaxed towards the uniform prior (reg_m 0.45) after 1 epoch(s) held")
    bounded = AdaptiveSelfLabeler(5, prior="uniform", reg_m=0.45, relax_bound=34.5)
    assert (cluster_sizes_phrase(bounded) == "sizes relaxed towards the uniform prior (reg_m 0.45), held once the "
                                             "pseudo-labels pass 34.5-fold")
    bounded.relax_stopped = True  # a run resumed after its relaxation stopped
    assert cluster_sizes_phrase(bounded).endswith("34.5-fold (held since the bound was passed)")
    tightening = AdaptiveSelfLabeler(5, prior="uniform", reg_m=0.45, relax_bound=34.5, relax_tighten=3.0)
    assert cluster_sizes_phrase(tightening).endswith("(reg_m 0.45), reg_m ×3 at each epoch the pseudo-labels pass "
                                                     "34.5-fold")
    tightening.relax_scale = 3.0  # a run resumed after one epoch past the bound
    assert cluster_sizes_phrase(tightening).endswith("34.5-fold (reg_m 1.35 since the bound was passed)")
    assert cluster_sizes_phrase(None) == ""


def test_the_epoch_that_stops_a_relaxation_says_so_in_a_line(tmp_path, capfd):
    """``labeler.relax_bound``: the epoch whose pseudo-labels ran past it gets one line saying the bound, what the
    pseudo-labels did, and from which epoch the sizes are held."""
    from types import SimpleNamespace

    from ncdlr.labeler import AdaptiveSelfLabeler
    from ncdlr.service.config import Config
    from ncdlr.service.console import EpochLog

    cfg = Config()
    cfg.run.output = str(tmp_path)
    log = EpochLog(cfg, rank=0)
    state = SimpleNamespace(epoch=2, model=SimpleNamespace(num_novel=35),
                            labeler=AdaptiveSelfLabeler(35, prior="uniform", reg_m=0.45, relax_bound=34.5))
    metrics = {"epoch_s": 1.0, "loss": 0.5, "tau": 1.0, "bad_images": 0.0, "steps_per_s": 9.0, "clusters_empty": 0.0}
    log.epoch(state, {**metrics, "cluster_imbalance": 20.0})
    log.epoch(state, {**metrics, "cluster_imbalance": 41.3, "sizes_held_from_epoch": 3.0})
    log.close()
    lines = capfd.readouterr().out.splitlines()
    stops = [line for line in lines if "relax_bound" in line]
    assert len(lines) == 3 and len(stops) == 1
    assert ("ran past labeler.relax_bound 34.5 in epoch 2" in stops[0] and "0 of 35 clusters" in stops[0]
            and "the largest holding 41× the smallest" in stops[0]
            and "held at the uniform prior's sizes from epoch 3 on" in stops[0])


def test_the_epoch_that_tightens_a_relaxation_says_so_in_a_line(tmp_path, capfd):
    """``labeler.relax_tighten``: the epoch whose pseudo-labels ran past the bound gets one line with the bound,
    what the pseudo-labels did, and the ``reg_m`` from the next epoch on."""
    from types import SimpleNamespace

    from ncdlr.labeler import AdaptiveSelfLabeler
    from ncdlr.service.config import Config
    from ncdlr.service.console import EpochLog

    cfg = Config()
    cfg.run.output = str(tmp_path)
    log = EpochLog(cfg, rank=0)
    labeler = AdaptiveSelfLabeler(35, prior="uniform", reg_m=0.45, relax_bound=34.5, relax_tighten=3.0)
    state = SimpleNamespace(epoch=2, model=SimpleNamespace(num_novel=35), labeler=labeler)
    metrics = {"epoch_s": 1.0, "loss": 0.5, "tau": 1.0, "bad_images": 0.0, "steps_per_s": 9.0, "clusters_empty": 1.0}
    log.epoch(state, {**metrics, "cluster_imbalance": 41.3, "sizes_tightened_from_epoch": 3.0, "reg_m_now": 1.35})
    log.close()
    lines = [line for line in capfd.readouterr().out.splitlines() if "relax_bound" in line]
    assert len(lines) == 1 and "1 of 35 clusters without a pseudo-label" in lines[0]
    assert "reg_m 1.35 (labeler.relax_tighten 3) from epoch 3 on" in lines[0] and "held at" not in lines[0]


def test_the_first_line_names_the_optional_loss_terms_that_are_on():
    """configs/openclipart.yaml turns on the block term and the class-balanced known loss (session 35): the first
    line says so; the paper's loss (both 0) adds nothing."""
    from ncdlr.service.console import loss_options_phrase

    assert loss_options_phrase(0.0, 0.0) == ""
    assert loss_options_phrase(1.0, 0.0) == "known-vs-novel term 1"
    assert loss_options_phrase(1.0, 1.0) == "known-vs-novel term 1, known rows weighted by class count^-1"
    assert loss_options_phrase(0.0, 0.5) == "known rows weighted by class count^-0.5"
    assert loss_options_phrase(0.0, 0.0, 1.0) == "novel rows weighted by cluster size^-1"


def test_a_last_epoch_with_soft_pseudo_labels_gets_a_note_and_a_sharp_one_none(tmp_path, capfd):
    """The last epoch's ``pseudo_label_confidence`` under ``SOFT_AT_END`` says the clusters were still forming
    (with the epoch before's value, and twice the epochs to try); an earlier soft epoch, or a last epoch at or above
    it, or one without the metric (no self-labeler) says nothing."""
    from types import SimpleNamespace

    from ncdlr.service.config import Config
    from ncdlr.service.console import SOFT_AT_END, EpochLog

    cfg = Config()
    cfg.run.output, cfg.optim.epochs = str(tmp_path), 3
    metrics = {"epoch_s": 1.0, "loss": 0.5, "tau": 1.0, "bad_images": 0.0, "steps_per_s": 9.0}
    notes = []
    for last in (0.82, SOFT_AT_END, None):
        log = EpochLog(cfg, rank=0)
        for epoch, confidence in ((1, 0.3), (2, 0.79), (3, last)):
            extra = {} if confidence is None else {"pseudo_label_confidence": confidence}
            log.epoch(SimpleNamespace(epoch=epoch, model=SimpleNamespace(num_novel=35)), {**metrics, **extra})
        log.close()
        lines = capfd.readouterr().out.splitlines()
        notes.append([line for line in lines if "note:" in line])
        assert len(lines) == 3 + len(notes[-1])
    assert [len(n) for n in notes] == [1, 0, 0]
    assert "confidence 0.82, 0.79 the epoch before" in notes[0][0] and "--optim.epochs 6" in notes[0][0]
