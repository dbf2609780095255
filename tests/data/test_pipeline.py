"""Streaming pipeline: transforms as plain functions, Ray Data over real shards (local and rclone S3), and
two Ray Train workers receiving disjoint shards."""

from __future__ import annotations

import json
import re
from dataclasses import replace
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq
import pytest
import torch
from ray.data.block import BlockAccessor

from ncdlr.data.pipeline import (
    DecodeSpec,
    PairedBatches,
    PipelineConfig,
    ShardDatasource,
    _read_tables,
    build_datasets,
    decoded_blocks,
    shuffled_rows,
    load_splits,
    object_store_limit,
    read_tasks_for,
    stream_cpu_limit,
    stream_options,
    to_torch,
    train_data_config,
    with_eval_view,
    with_train_views,
)
from ncdlr.data.records import ImageRecord
from ncdlr.data.manifest import DatasetFormatError
from ncdlr.data.shards import write_dataset
from ncdlr.data.transforms import (
    IMAGENET_MEAN,
    IMAGENET_STD,
    EvalView,
    TrainViews,
    _scale_and_shift,
    batch_scaling,
    normalise,
    normalise_chw_torch,
    normalise_views,
    random_resized_crop_box,
    split_valid,
)
from tests.fixtures.tiny_images import jpeg_bytes, make_tiny_dataset

SIZE = 32


@pytest.fixture(scope="session")
def data_ray():
    """A small local Ray for the data-plane tests (reused if another fixture already started one)."""
    import ray

    if ray.is_initialized():
        yield ray
        return
    ray.init(address="local", num_cpus=4, object_store_memory=256 * 1024**2, log_to_driver=False, include_dashboard=False)
    yield ray
    ray.shutdown()


def _batch(n: int = 4, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {"image": np.array([jpeg_bytes(rng, 64) for _ in range(n)], dtype=object),
            "label": np.arange(n, dtype=np.int32),
            "source_id": np.array([f"img{i}" for i in range(n)], dtype=object)}


def _corrupt(record: ImageRecord) -> ImageRecord:
    """Same record with its JPEG cut in half (header intact, data truncated)."""
    return ImageRecord(image=record.image[: len(record.image) // 2], label=record.label, split=record.split,
                       class_name=record.class_name, source_id=record.source_id)


# ------------------------------------------------------------------------------ transforms, no Ray needed


def test_train_views_have_the_right_shapes_and_dtypes_and_differ() -> None:
    out = TrainViews(size=SIZE, seed=0)(_batch())
    for name in ("view1", "view2"):
        assert out[name].shape == (4, 3, SIZE, SIZE) and out[name].dtype == np.float32
    assert out["valid"].dtype == bool and out["valid"].all()
    assert "image" not in out and list(out["source_id"]) == ["img0", "img1", "img2", "img3"]
    assert not np.allclose(out["view1"], out["view2"]), "two augmented views of an image must differ"


def test_train_views_are_reproducible_with_a_seed_and_fresh_without() -> None:
    batch = _batch()
    a, b = TrainViews(size=SIZE, seed=3)(batch), TrainViews(size=SIZE, seed=3)(batch)
    assert np.array_equal(a["view1"], b["view1"])
    c, d = TrainViews(size=SIZE)(batch), TrainViews(size=SIZE)(batch)
    assert not np.array_equal(c["view1"], d["view1"])


def test_threaded_decoding_gives_the_same_views_as_serial() -> None:
    batch = _batch(n=6)
    batch["image"][4] = b"junk"
    serial, threaded = TrainViews(size=SIZE, seed=7)(batch), TrainViews(size=SIZE, seed=7, threads=3)(batch)
    for key in ("view1", "view2", "valid"):
        assert np.array_equal(serial[key], threaded[key]), key
    assert threaded["valid"].tolist() == [True, True, True, True, False, True]
    with pytest.raises(ValueError, match="threads must be >= 1"):
        TrainViews(threads=0)


def test_eval_view_is_deterministic_and_shaped() -> None:
    batch = _batch()
    a, b = EvalView(size=SIZE)(batch), EvalView(size=SIZE)(batch)
    assert a["image"].shape == (4, 3, SIZE, SIZE) and a["image"].dtype == np.float32
    assert np.array_equal(a["image"], b["image"])
    assert EvalView(size=224).resize_to == 256


def test_scalings_match_their_definitions() -> None:
    from PIL import Image
    import io

    buf = io.BytesIO()
    Image.new("RGB", (40, 40), (127, 127, 127)).save(buf, format="PNG")  # lossless: exact pixel values
    batch = {"image": np.array([buf.getvalue()], dtype=object)}
    lite = EvalView(size=SIZE, scaling="lite")(batch)["image"]
    assert np.allclose(lite, 0.0)  # (127 - 127) / 128
    imagenet = EvalView(size=SIZE, scaling="imagenet")(batch)["image"]
    expected = (127 / 255 - np.array(IMAGENET_MEAN)) / np.array(IMAGENET_STD)
    assert np.allclose(imagenet[0, :, 0, 0], expected, atol=1e-5)


def test_normalise_gives_the_bits_of_the_plain_formula() -> None:
    pixels = np.random.default_rng(0).integers(0, 256, (3, 9, 7, 3), dtype=np.uint8)
    for scaling in ("imagenet", "lite"):
        scale, shift = _scale_and_shift(scaling)
        expected = pixels.transpose(0, 3, 1, 2).astype(np.float32) * scale + shift
        out = normalise(pixels, scaling)
        assert out.dtype == np.float32 and out.flags.c_contiguous and np.array_equal(out, expected)


@pytest.mark.parametrize("scaling", ["imagenet", "lite"])
def test_uint8_views_normalised_later_equal_the_float32_views(scaling: str) -> None:
    batch = _batch()
    batch["image"][3] = b"not an image at all"
    for make in (lambda dtype: TrainViews(size=SIZE, seed=5, scaling=scaling, dtype=dtype),
                 lambda dtype: EvalView(size=SIZE, scaling=scaling, dtype=dtype)):
        small, full = make("uint8")(batch), make("float32")(batch)
        keys = [k for k in ("view1", "view2", "image") if k in full]
        for key in keys:
            assert small[key].dtype == np.uint8 and small[key].shape == (4, 3, SIZE, SIZE)
        assert list(small["scaling"]) == [scaling] * 4 and "scaling" not in full
        later = normalise_views(small)
        assert "scaling" not in later and later["valid"].tolist() == [True, True, True, False]
        for key in keys:
            assert later[key].dtype == np.float32 and np.array_equal(later[key], full[key]), key
            assert not later[key][3].any(), "an undecodable image's views are zeros after normalisation too"
        as_torch = to_torch(small)
        assert "scaling" not in as_torch
        for key in keys:
            assert as_torch[key].dtype == torch.float32 and torch.equal(as_torch[key], torch.from_numpy(full[key]))
        # Deferred (a GPU consumer): uint8 tensors plus the scaling, normalised later by torch to the same bits.
        deferred = to_torch(small, normalise=False)
        assert deferred["scaling"] == [scaling] * 4
        for key in keys:
            assert deferred[key].dtype == torch.uint8
            on_device = normalise_chw_torch(deferred[key][:3], batch_scaling(deferred["scaling"]))
            assert on_device.dtype == torch.float32 and torch.equal(on_device, torch.from_numpy(full[key][:3])), key


def test_torch_normalisation_checks_its_input_and_scaling_column() -> None:
    with pytest.raises(ValueError, match="need uint8"):
        normalise_chw_torch(torch.zeros(2, 3, 4, 4), "imagenet")
    with pytest.raises(ValueError, match="scaling must be one of"):
        normalise_chw_torch(torch.zeros(2, 3, 4, 4, dtype=torch.uint8), "zscore")
    with pytest.raises(ValueError, match=r"mixes normalisations \['imagenet', 'lite'\]"):
        batch_scaling(["imagenet", "lite"])
    with pytest.raises(ValueError, match="names no normalisation"):
        batch_scaling([])


def test_normalise_views_refuses_mixed_scalings_and_passes_float_batches_through() -> None:
    batch = TrainViews(size=SIZE, seed=0, dtype="uint8")(_batch())
    batch["scaling"][1] = "lite"
    with pytest.raises(ValueError, match=r"mixes normalisations \['imagenet', 'lite'\]"):
        normalise_views(batch)
    full = TrainViews(size=SIZE, seed=0)(_batch())
    assert normalise_views(full) is full


def test_view_dtype_is_checked() -> None:
    with pytest.raises(ValueError, match="dtype must be one of"):
        TrainViews(dtype="float16")
    with pytest.raises(ValueError, match="dtype must be one of"):
        EvalView(dtype="int8")
    with pytest.raises(ValueError, match="transfer_dtype"):
        PipelineConfig(transfer_dtype="float16")


def test_random_resized_crop_box_stays_inside_the_image_with_area_in_scale() -> None:
    rng = np.random.default_rng(0)
    for width, height in [(64, 64), (300, 80), (50, 400)]:
        for _ in range(200):
            left, top, right, bottom = random_resized_crop_box(width, height, (0.5, 1.0), rng)
            assert 0 <= left < right <= width and 0 <= top < bottom <= height


def test_undecodable_image_is_kept_as_invalid_with_zero_views() -> None:
    batch = _batch()
    batch["image"][2] = batch["image"][2][:100]  # truncated JPEG
    batch["image"][3] = b"not an image at all"
    for out, keys in ((TrainViews(size=SIZE)(batch), ("view1", "view2")), (EvalView(size=SIZE)(batch), ("image",))):
        assert out["valid"].tolist() == [True, True, False, False]
        for key in keys:
            assert len(out[key]) == 4 and not out[key][2:].any() and out[key][:2].any()


def test_split_valid_drops_invalid_rows_and_names_them() -> None:
    out = TrainViews(size=SIZE)({**_batch(), "image": np.array([*_batch()["image"][:3], b"junk"], dtype=object)})
    kept, bad = split_valid(out)
    assert bad == ["img3"] and len(kept["view1"]) == 3 and kept["label"].tolist() == [0, 1, 2]
    as_torch = {"valid": torch.tensor([True, False]), "view1": torch.zeros(2, 3, 4, 4), "source_id": ["a", "b"]}
    kept_t, bad_t = split_valid(as_torch)
    assert bad_t == ["b"] and kept_t["view1"].shape == (1, 3, 4, 4) and kept_t["source_id"] == ["a"]


def test_pipeline_config_rejects_unknown_scaling_and_verify_mode() -> None:
    with pytest.raises(ValueError, match="scaling"):
        PipelineConfig(scaling="zscore")
    with pytest.raises(ValueError, match="verify"):
        PipelineConfig(verify="sometimes")


def test_load_splits_refuses_a_shard_whose_size_disagrees(tmp_path: Path) -> None:
    manifest = write_dataset(str(tmp_path / "ds"), *make_tiny_dataset(), progress=False)
    shard = next(s for s in manifest.shards if s.split == "novel")
    with open(tmp_path / "ds" / shard.path, "ab") as f:
        f.write(b"trailing junk")
    with pytest.raises(DatasetFormatError, match=rf"{shard.path}: size"):
        load_splits(str(tmp_path / "ds"), ["novel"])


def test_load_splits_refuses_a_shard_with_a_flipped_byte_by_default_naming_it(tmp_path: Path) -> None:
    manifest = write_dataset(str(tmp_path / "ds"), *make_tiny_dataset(), progress=False)
    shard = next(s for s in manifest.shards if s.split == "novel")
    victim = tmp_path / "ds" / shard.path
    data = bytearray(victim.read_bytes())
    data[len(data) // 2] ^= 0xFF  # same size, still a readable parquet file: "size" would pass it
    victim.write_bytes(bytes(data))
    assert PipelineConfig().verify == "stamp"  # what ncdlr train / embed use
    with pytest.raises(DatasetFormatError, match=rf"{shard.path}: sha256 .* re-prepare the dataset"):
        load_splits(str(tmp_path / "ds"), ["novel"])


def test_load_splits_hashes_an_intact_dataset_once_then_checks_only_the_stamp(
        tmp_path: Path, data_ray, monkeypatch: pytest.MonkeyPatch) -> None:
    from ncdlr.data import shards

    manifest = write_dataset(str(tmp_path / "ds"), *make_tiny_dataset(), progress=False)
    hashed = []
    monkeypatch.setattr(shards, "check_shard", lambda fs, path, shard, where, *, checksum: hashed.append(shard.path))
    load_splits(str(tmp_path / "ds"), ["known", "novel"])
    assert sorted(hashed) == sorted(s.path for s in manifest.shards if s.split in ("known", "novel"))
    assert (tmp_path / "ds" / shards.STAMP_NAME).is_file()
    hashed.clear()
    datasets = load_splits(str(tmp_path / "ds"), ["known", "novel"])
    assert hashed == [] and datasets["novel"].count() == manifest.split_counts["novel"]


def test_load_splits_refuses_an_empty_or_unknown_split(tmp_path: Path) -> None:
    write_dataset(str(tmp_path / "ds"), *make_tiny_dataset(), progress=False)
    with pytest.raises(ValueError, match=r"\['val'\] hold no rows"):
        load_splits(str(tmp_path / "ds"), ["val"])
    with pytest.raises(ValueError, match="unknown split"):
        load_splits(str(tmp_path / "ds"), ["train"])


# ------------------------------------------------------------------- read-and-decode tasks, no Ray needed


def _numbered_parquet(path: Path, rows: int, group_rows: int) -> None:
    pq.write_table(pa.table({"n": pa.array(range(rows), pa.int64())}), path, row_group_size=group_rows)


def test_read_tables_gives_exactly_the_row_range_across_row_groups(tmp_path: Path) -> None:
    _numbered_parquet(tmp_path / "a.parquet", rows=23, group_rows=5)  # row groups 0-4, 5-9, ..., 20-22
    fs, path = pafs.LocalFileSystem(), str(tmp_path / "a.parquet")

    def rows(pieces, limit=None) -> list[int]:
        return [n for t in _read_tables(fs, pieces, None, None, limit) for n in t.column("n").to_pylist()]

    assert rows([(path, 0, None)]) == list(range(23))
    assert rows([(path, 7, 16)]) == list(range(7, 16))
    assert rows([(path, 20, 23), (path, 0, 2)]) == [20, 21, 22, 0, 1]
    assert rows([(path, 3, 19)], limit=6) == [3, 4, 5, 6, 7, 8]
    # Only the row groups that overlap the range are read: 7-16 touches groups 1, 2, 3 (one table each).
    assert [t.num_rows for t in _read_tables(fs, [(path, 7, 16)], None, None, None)] == [3, 5, 1]


def test_shard_pieces_cover_each_file_once_in_ranges_of_about_rows_per_task() -> None:
    source = ShardDatasource(pafs.LocalFileSystem(), ["a", "b", "c"], rows=[10, 3, 0], sizes=[1000, 300, 0],
                             rows_per_task=4)
    pieces = source.pieces()
    # 10 rows at most 4 per task -> 3 ranges; 3 rows -> the whole file.
    assert [p for p, _, _ in pieces] == [("a", 0, 3), ("a", 3, 7), ("a", 7, 10), ("b", 0, None), ("c", 0, None)]
    assert [r for _, r, _ in pieces] == [3, 4, 3, 3, 0] and sum(b for _, _, b in pieces[:3]) == 1000
    # Without row counts (or with a split filter) a file is one piece.
    assert len(ShardDatasource(pafs.LocalFileSystem(), ["a"], rows_per_task=4).pieces()) == 1
    assert len(ShardDatasource(pafs.LocalFileSystem(), ["a"], rows=[10], split="known", rows_per_task=4).pieces()) == 1
    tasks = source.get_read_tasks(parallelism=len(pieces))
    assert len(tasks) == 5 and sorted(t.metadata.num_rows for t in tasks) == [0, 3, 3, 3, 4]
    with pytest.raises(ValueError, match="rows_per_task must be >= 1"):
        ShardDatasource(pafs.LocalFileSystem(), ["a"], rows_per_task=0)


def test_decoded_blocks_keep_row_order_and_match_one_serial_call_per_block() -> None:
    tables = [pa.table({"image": pa.array(list(_batch(n, seed)["image"]), pa.binary()),
                        "source_id": [f"t{seed}-{i}" for i in range(n)]}) for n, seed in ((7, 0), (3, 1))]
    views = TrainViews(size=SIZE, seed=5, dtype="uint8")
    blocks = list(decoded_blocks(iter(tables), DecodeSpec(views, rows_per_block=3, threads=2)))
    assert [b.num_rows for b in blocks] == [3, 3, 1, 3]
    assert [s for b in blocks for s in b.column("source_id").to_pylist()] == \
        [f"t0-{i}" for i in range(7)] + [f"t1-{i}" for i in range(3)]
    # Each block is exactly one serial transform call on its rows (threads change nothing).
    expected = views({"image": np.array(list(tables[0]["image"].to_pylist()[3:6]), dtype=object),
                      "source_id": np.array([f"t0-{i}" for i in range(3, 6)], dtype=object)})
    got = BlockAccessor.for_block(blocks[1]).to_batch_format("numpy")
    assert np.array_equal(got["view1"], expected["view1"]) and np.array_equal(got["view2"], expected["view2"])


def test_shuffled_rows_permutes_each_table_on_its_own() -> None:
    tables = [pa.table({"n": pa.array(range(lo, lo + 50), pa.int64())}) for lo in (0, 100)]
    out = [t.column("n").to_pylist() for t in shuffled_rows(iter(tables), np.random.default_rng(0))]
    assert sorted(out[0]) == list(range(50)) and sorted(out[1]) == list(range(100, 150))
    assert out[0] != list(range(50)) and out[1] != list(range(100, 150))


def test_a_failing_transform_stops_the_read_and_cancels_the_queued_blocks() -> None:
    calls = []

    def transform(batch):
        calls.append(len(batch["n"]))
        if len(calls) == 2:
            raise RuntimeError("decoder bug")
        return batch

    table = pa.table({"n": pa.array(range(40), pa.int64())})
    with pytest.raises(RuntimeError, match="decoder bug"):
        list(decoded_blocks(iter([table]), DecodeSpec(transform, rows_per_block=2, threads=1)))
    assert len(calls) <= 3, "blocks queued after the failure must not all run"


# ---------------------------------------------------------------------------------------- Ray Data


@pytest.mark.slow
def test_splits_stream_from_s3_with_views_and_labels(data_ray, s3_bucket: str) -> None:
    records, classes, info = make_tiny_dataset()
    uri = f"{s3_bucket}/tiny"
    write_dataset(uri, records, classes, info, target_shard_bytes=8 * 1024, progress=False)
    datasets = build_datasets(uri, PipelineConfig(image_size=SIZE, decode_batch_size=8, verify="checksum"))
    test_rows = list(datasets["test"].iter_rows())
    assert sorted(r["source_id"] for r in test_rows) == sorted(r.source_id for r in records if r.split == "test")
    assert all(r["image"].shape == (3, SIZE, SIZE) and r["valid"] for r in test_rows)
    novel = list(datasets["novel"].iter_rows())
    assert {r["label"] for r in novel} == {2, 3} and len(novel) == 14
    # Training views cross the object store as uint8 crops (transfer_dtype="uint8") ...
    assert all(r["view1"].dtype == np.uint8 and r["view1"].shape == (3, SIZE, SIZE) for r in novel)
    assert {r["scaling"] for r in novel} == {"imagenet"}
    # ... and reach the consumer normalised (ToTorch / PairedBatches).
    batch = next(iter(datasets["novel"].iter_batches(batch_size=4, batch_format="numpy")))
    views = to_torch(batch)["view1"]
    assert views.dtype == torch.float32 and views.shape == (4, 3, SIZE, SIZE)
    assert views.min() < -1.0 and views.max() > 1.0, "normalised values, not 0-255 pixels"


@pytest.mark.slow
def test_a_corrupt_jpeg_in_a_shard_is_skipped_and_counted(data_ray, tmp_path: Path) -> None:
    records, classes, info = make_tiny_dataset(train_counts=(8, 8, 8, 8), test_per_class=1)
    victim = next(r for r in records if r.split == "novel")
    records = [_corrupt(r) if r is victim else r for r in records]
    write_dataset(str(tmp_path / "ds"), records, classes, info, progress=False)
    datasets = build_datasets(str(tmp_path / "ds"), PipelineConfig(image_size=SIZE, decode_batch_size=4))
    batches = PairedBatches(datasets["known"], datasets["novel"], batch_size=4)
    steps = list(batches)
    batches.close()
    assert len(steps) == 4, "16 novel rows in batches of 4: nothing dropped silently"
    assert [i for s in steps for i in s["bad_source_ids"]] == [victim.source_id]
    novel_ids = [i for s in steps for i in s["novel"]["source_id"]]
    assert len(novel_ids) == 15 and victim.source_id not in novel_ids
    assert all(s["known"]["view1"].shape == (4, 3, SIZE, SIZE) for s in steps)
    assert all(s[side][view].dtype == torch.float32
               for s in steps for side in ("known", "novel") for view in ("view1", "view2"))
    assert all("scaling" not in s["novel"] and "valid" not in s["novel"] for s in steps)
    assert all(s["novel"]["label"].dtype == torch.int64 for s in steps)


def test_paired_batches_can_leave_views_for_the_device_to_normalise(data_ray, tmp_path: Path) -> None:
    """``PairedBatches(normalise=False)`` (what a GPU worker uses) yields uint8 views and their scaling; normalised
    by ``normalise_chw_torch`` they equal what the default (host-normalised) batches hold, row for row."""
    records, classes, info = make_tiny_dataset(train_counts=(8, 8, 8, 8), test_per_class=1)
    write_dataset(str(tmp_path / "ds"), records, classes, info, progress=False)
    cfg = PipelineConfig(image_size=SIZE, decode_batch_size=4, augment_seed=3, shuffle=False)
    datasets = build_datasets(str(tmp_path / "ds"), cfg)

    def rows(normalise: bool) -> dict[str, torch.Tensor]:
        batches = PairedBatches(datasets["known"], datasets["novel"], batch_size=4, normalise=normalise)
        out = {}
        for step in batches:
            side = step["novel"]
            views = side["view1"]
            if not normalise:
                assert views.dtype == torch.uint8 and side["scaling"] == ["imagenet"] * len(side["source_id"])
                views = normalise_chw_torch(views, batch_scaling(side["scaling"]))
            out.update(zip(side["source_id"], views))
        batches.close()
        return out

    host, device = rows(True), rows(False)
    assert len(host) == 16 and host.keys() == device.keys()
    assert all(torch.equal(host[k], device[k]) for k in host)


@pytest.mark.slow
def test_load_splits_datasets_decode_inside_their_read_tasks_and_others_get_a_map_step(data_ray, tmp_path: Path) -> None:
    write_dataset(str(tmp_path / "ds"), *make_tiny_dataset(), progress=False)  # known: 18 rows in one shard
    uri = str(tmp_path / "ds")

    def block_rows(dataset) -> list[int]:
        return [len(b["source_id"]) for b in dataset.iter_batches(batch_size=None, batch_format="numpy")]

    small = block_rows(load_splits(uri, ["known"], rows_per_block=4)["known"])
    assert sum(small) == 18 and len(small) == 5 and max(small) <= 4

    # 18 rows, 8 rows per read task -> 3 tasks of 6 rows; 4-row blocks -> 4 + 2 per task.
    cfg = PipelineConfig(image_size=SIZE, rows_per_read_task=8, rows_per_block=4, decode_batch_size=4)
    decoded = build_datasets(uri, cfg, train_splits=("known",), eval_splits=())["known"]
    assert sorted(block_rows(decoded)) == [2, 2, 2, 4, 4, 4], "each decoded block is stored as its own object"
    stats = decoded.stats()
    assert "ReadAndDecodeShards: 3 tasks executed" in stats
    assert "MapBatches" not in stats and "Repartition" not in stats
    # A dataset that did not come straight from load_splits is cut by a repartition step and decoded by
    # map tasks of decode_batch_size rows each.
    other = with_train_views(load_splits(uri, ["known"])["known"].limit(18), cfg)
    assert sum(block_rows(other)) == 18
    map_tasks = re.search(r"MapBatches\(TrainViews\): (\d+) tasks executed", other.stats())
    assert "Repartition" in other.stats() and map_tasks and int(map_tasks.group(1)) >= 4
    # decode_in_read_tasks=False: the read cuts 4-row blocks, so the map step needs no repartition.
    mapped = build_datasets(uri, replace(cfg, decode_in_read_tasks=False), train_splits=("known",), eval_splits=())
    assert sum(block_rows(mapped["known"])) == 18
    stats = mapped["known"].stats()
    map_tasks = re.search(r"MapBatches\(TrainViews\): (\d+) tasks executed", stats)
    assert "ReadShards" in stats and "Repartition" not in stats and map_tasks and int(map_tasks.group(1)) >= 4


@pytest.mark.slow
def test_decoding_in_read_tasks_gives_the_rows_a_map_step_gives(data_ray, tmp_path: Path) -> None:
    """The eval view is deterministic, so both decode paths must give the same pixels for every source_id."""
    write_dataset(str(tmp_path / "ds"), *make_tiny_dataset(), target_shard_bytes=4 * 1024, progress=False)
    uri = str(tmp_path / "ds")
    cfg = PipelineConfig(image_size=SIZE, rows_per_read_task=5, rows_per_block=3)
    raw = load_splits(uri, ["novel"])["novel"]

    def images(dataset) -> dict[str, np.ndarray]:
        return {str(r["source_id"]): r["image"] for r in dataset.iter_rows()}

    fused_ds, mapped_ds = with_eval_view(raw, cfg), with_eval_view(raw.limit(10**6), cfg)
    fused, mapped = images(fused_ds), images(mapped_ds)
    assert "ReadAndDecodeShards" in fused_ds.stats() and "MapBatches(EvalView)" in mapped_ds.stats()
    assert len(fused) == 14 and fused.keys() == mapped.keys()
    assert all(np.array_equal(fused[k], mapped[k]) for k in fused)


@pytest.mark.slow
def test_decoded_training_splits_see_their_rows_in_a_new_order_every_epoch(data_ray, tmp_path: Path) -> None:
    """One shard (so shard order cannot change it): the rows of its row groups are permuted afresh per epoch
    when ``cfg.shuffle`` is on, and keep the written order when it is off; every epoch is one full pass."""
    write_dataset(str(tmp_path / "ds"), *make_tiny_dataset(), progress=False)  # known: 18 rows in one shard
    for shuffle in (True, False):
        cfg = PipelineConfig(image_size=SIZE, rows_per_block=4, shuffle=shuffle)
        known = build_datasets(str(tmp_path / "ds"), cfg, train_splits=("known",), eval_splits=())["known"]
        orders = [tuple(r["source_id"] for r in known.iter_rows()) for _ in range(3)]
        assert all(sorted(o) == sorted(orders[0]) and len(o) == 18 for o in orders)
        assert (len(set(orders)) > 1) == shuffle, f"shuffle={shuffle}: orders {orders}"


@pytest.mark.slow
def test_training_splits_read_their_shards_in_a_new_order_every_epoch(data_ray, tmp_path: Path) -> None:
    manifest = write_dataset(str(tmp_path / "ds"), *make_tiny_dataset(), target_shard_bytes=2048, progress=False)
    assert sum(s.split == "known" for s in manifest.shards) >= 6
    known = load_splits(str(tmp_path / "ds"), ["known"])["known"]
    orders = [tuple(r["source_id"] for r in known.iter_rows()) for _ in range(3)]
    assert len(set(orders)) > 1, "three epochs in the same order"
    assert all(sorted(o) == sorted(orders[0]) and len(o) == 18 for o in orders), "every epoch is one full pass"


def _train_worker(config: dict) -> None:
    """Ray Train worker: one epoch of paired batches; write what this rank saw to a JSON file."""
    import ray.train

    from ncdlr.data.pipeline import PairedBatches

    rank = ray.train.get_context().get_world_rank()
    batches = PairedBatches(ray.train.get_dataset_shard("known"), ray.train.get_dataset_shard("novel"),
                            batch_size=config["batch_size"])
    seen = {"known": [], "novel": [], "bad": [], "shapes": []}
    for step in batches:
        seen["known"] += step["known"]["source_id"]
        seen["novel"] += step["novel"]["source_id"]
        seen["bad"] += step["bad_source_ids"]
        seen["shapes"].append(list(step["novel"]["view1"].shape))
        seen.setdefault("dtypes", []).append(str(step["novel"]["view1"].dtype))
    batches.close()
    Path(config["out_dir"], f"rank{rank}.json").write_text(json.dumps(seen))


@pytest.mark.slow
def test_two_train_workers_receive_disjoint_shards_covering_the_dataset(data_ray, tmp_path: Path) -> None:
    from ray.train import RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    # 16 known and 16 novel rows: two workers x two steps x B=4, one pass over each stream.
    records, classes, info = make_tiny_dataset(train_counts=(10, 6, 9, 7), test_per_class=1)
    victim = next(r for r in records if r.split == "novel")
    records = [_corrupt(r) if r is victim else r for r in records]
    write_dataset(str(tmp_path / "ds"), records, classes, info, target_shard_bytes=4 * 1024, progress=False)
    cfg = PipelineConfig(image_size=SIZE, batch_size=4, decode_batch_size=4)
    datasets = build_datasets(str(tmp_path / "ds"), cfg, eval_splits=())
    trainer = TorchTrainer(
        _train_worker,
        train_loop_config={"batch_size": cfg.batch_size, "out_dir": str(tmp_path)},
        datasets=datasets,
        dataset_config=train_data_config(cfg),
        # Fractional CPUs leave the Ray Data read/decode tasks CPUs to run on (see platform notes).
        scaling_config=ScalingConfig(num_workers=2, use_gpu=False, resources_per_worker={"CPU": 0.5}),
        run_config=RunConfig(storage_path=str(tmp_path / "runs"), name="disjoint"),
    )
    trainer.fit()
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    for split in ("known", "novel"):
        expected = {r.source_id for r in records if r.split == split}
        seen = [set(rank[split]) | (set(rank["bad"]) if split == "novel" else set()) for rank in ranks]
        assert seen[0].isdisjoint(seen[1]), f"{split}: workers overlap"
        assert seen[0] | seen[1] == expected, f"{split}: the union must be the whole split"
    assert sorted(ranks[0]["bad"] + ranks[1]["bad"]) == [victim.source_id]
    assert all(shape[1:] == [3, SIZE, SIZE] for rank in ranks for shape in rank["shapes"])
    assert {d for rank in ranks for d in rank["dtypes"]} == {"torch.float32"}


@pytest.mark.slow
@pytest.mark.parametrize("place, shipped", [("device", {"image", "label", "source_id"}),
                                            ("hybrid", {"pixels", "valid", "label", "source_id"})])
def test_device_decoding_streams_encoded_images_and_drops_a_corrupt_one_by_name(data_ray, tmp_path: Path, place,
                                                                                shipped) -> None:
    """``decode_on="device"``: the read tasks ship encoded bytes (``"hybrid"``: decoded, uncropped images) and
    ``PairedBatches(device_views=...)`` makes the two float32 views on the consumer's device (here the CPU
    device; the GPU run is in tests/test_gpu.py); a truncated JPEG is dropped and named like on the host path."""
    records, classes, info = make_tiny_dataset(train_counts=(8, 8, 8, 8), test_per_class=1)
    victim = next(r for r in records if r.split == "novel")
    records = [_corrupt(r) if r is victim else r for r in records]
    write_dataset(str(tmp_path / "ds"), records, classes, info, progress=False)
    cfg = PipelineConfig(image_size=SIZE, decode_on=place)
    datasets = build_datasets(str(tmp_path / "ds"), cfg)
    first = next(iter(datasets["novel"].iter_batches(batch_size=4, batch_format="numpy")))
    assert set(first) == shipped, "no crops cross the object store"
    batches = PairedBatches(datasets["known"], datasets["novel"], batch_size=4, device_views=cfg.device_views(),
                            device=torch.device("cpu"))
    steps = list(batches)
    batches.close()
    assert [i for s in steps for i in s["bad_source_ids"]] == [victim.source_id]
    novel_ids = [i for s in steps for i in s["novel"]["source_id"]]
    assert len(novel_ids) == 15 and victim.source_id not in novel_ids
    labels = {r.source_id: r.label for r in records}
    assert all(int(y) == labels[i] for s in steps for i, y in zip(s["novel"]["source_id"], s["novel"]["label"]))
    for s in steps:
        for side in ("known", "novel"):
            for view in ("view1", "view2"):
                x = s[side][view]
                assert x.dtype == torch.float32 and x.shape[1:] == (3, SIZE, SIZE)
                assert x.abs().max() <= 2.7 and x.std() > 0, "ImageNet-normalised values, not 0-255 pixels"
    assert not torch.equal(steps[0]["known"]["view1"], steps[0]["known"]["view2"]), "two different augmentations"


def test_pipeline_config_refuses_an_unknown_decode_place() -> None:
    with pytest.raises(ValueError, match="decode_on"):
        PipelineConfig(decode_on="gpu")


def test_read_tasks_are_sized_so_both_training_streams_use_every_free_cpu() -> None:
    cfg = PipelineConfig(rows_per_read_task=2048, rows_per_block=64)
    # 12 free CPUs, 2 streams: 6 tasks each; the smaller split (3000 rows) sets 500 rows per task
    assert read_tasks_for(cfg, {"known": 4000, "novel": 3000}, 12.0).rows_per_read_task == 500
    # a large dataset keeps its pieces of 2048 rows; a tiny one never goes below one block of rows
    assert read_tasks_for(cfg, {"known": 10**6, "novel": 10**6}, 12.0).rows_per_read_task == 2048
    assert read_tasks_for(cfg, {"known": 40, "novel": 40}, 12.0).rows_per_read_task == 64
    # tasks that reserve 2 CPUs each: half as many tasks, twice the rows
    wide = PipelineConfig(rows_per_read_task=2048, rows_per_block=64, decode_num_cpus=2.0)
    assert read_tasks_for(wide, {"known": 3000, "novel": 3000}, 12.0).rows_per_read_task == 1000
    assert read_tasks_for(cfg, {"known": 3000, "novel": 3000}, 0.5).rows_per_read_task == 2048, "at least one task"


def test_each_training_stream_may_hold_its_share_of_the_free_cpus() -> None:
    """The cap against the two streams' deadlock (``stream_cpu_limit``'s docstring): a stream holds at most its share
    of the free CPUs in whole tasks, and Ray Train's ``DataConfig`` passes it to every split stream. The deadlock
    itself is not reproduced here: seen once in a 10-epoch image-mode run, it did not show in small cases on a real
    local Ray (their read tasks ended before Ray Data stopped draining them)."""
    cfg = PipelineConfig()
    assert stream_cpu_limit(cfg, 2.0) == 1.0 and stream_cpu_limit(cfg, 12.0) == 6.0
    assert stream_cpu_limit(cfg, 0.5) == 1.0, "at least one task"
    assert stream_cpu_limit(PipelineConfig(decode_num_cpus=2.0), 12.0) == 6.0
    limits = stream_options(cfg, cpu_limit=3.0).resource_limits
    assert limits.cpu == 3.0 and limits.object_store_memory == cfg.object_store_limit_bytes
    options = train_data_config(cfg, cpu_limit=1.0)._resolve_execution_options("known")
    assert options.resource_limits.cpu == 1.0


def test_a_head_start_gives_the_first_epoch_every_novel_row_once_and_the_next_ones_too(data_ray, tmp_path: Path) -> None:
    """``PairedBatches.start()`` (what a worker calls before building its model) only moves the streams' start
    earlier: each epoch is still one pass over the novel rows, and the known stream still cycles."""
    records, classes, info = make_tiny_dataset(train_counts=(8, 4, 8, 8), test_per_class=1)
    write_dataset(str(tmp_path / "ds"), records, classes, info, progress=False)
    datasets = build_datasets(str(tmp_path / "ds"), PipelineConfig(image_size=SIZE))
    batches = PairedBatches(datasets["known"], datasets["novel"], batch_size=4)
    batches.start()
    novel = sorted(r.source_id for r in records if r.split == "novel")
    for _ in range(2):
        steps = list(batches)
        assert sorted(i for s in steps for i in s["novel"]["source_id"]) == novel
        assert all(len(s["known"]["source_id"]) == 4 for s in steps)
    assert batches.epochs_of_known >= 2, "12 known rows, 8 known batches of 4 drawn: the known stream cycled"
    batches.close()


@pytest.mark.slow
def test_several_epochs_per_execution_give_every_epoch_its_steps_and_every_row_once_per_epoch(data_ray,
                                                                                              tmp_path: Path) -> None:
    """``passes_per_execution=3`` + ``PairedBatches(steps_per_epoch=...)``: one Ray Data execution streams three
    re-shuffled passes, cut into epochs of exactly ``steps_per_epoch`` steps; over the three epochs every novel
    row is seen three times (one consumer) and the passes come in different orders."""
    records, classes, info = make_tiny_dataset(train_counts=(8, 4, 8, 8), test_per_class=1)
    write_dataset(str(tmp_path / "ds"), records, classes, info, progress=False)
    cfg = PipelineConfig(image_size=SIZE, passes_per_execution=3, rows_per_block=4)
    datasets = build_datasets(str(tmp_path / "ds"), cfg, eval_splits=())
    batches = PairedBatches(datasets["known"], datasets["novel"], batch_size=4, steps_per_epoch=4)
    batches.start()
    epochs = [[i for s in batches for i in s["novel"]["source_id"]] for _ in range(3)]
    batches.close()
    novel = sorted(r.source_id for r in records if r.split == "novel")
    assert [len(e) for e in epochs] == [16, 16, 16], "4 steps of 4 novel rows each epoch"
    seen = sorted(i for e in epochs for i in e)
    assert seen == sorted(novel * 3), "three passes, each row once per pass"
    assert len({tuple(e) for e in epochs}) == 3, "each pass in its own order"


def test_a_shard_source_with_passes_plans_one_task_per_piece_and_pass() -> None:
    source = ShardDatasource(pafs.LocalFileSystem(), ["a.parquet", "b.parquet"], rows=[10, 10], sizes=[100, 100],
                             shuffle=True, passes=3)
    tasks = source.get_read_tasks(parallelism=100)
    assert len(tasks) == 6 and sum(t.metadata.num_rows for t in tasks) == 60
    with pytest.raises(ValueError, match="passes"):
        ShardDatasource(pafs.LocalFileSystem(), ["a.parquet"], passes=0)
    with pytest.raises(ValueError, match="steps_per_epoch"):
        PairedBatches(None, None, batch_size=4, steps_per_epoch=0)


def test_several_passes_per_execution_lift_the_object_store_cap() -> None:
    """With 512 MiB per dataset and 4 passes Ray Data 2.60 back-pressured every read task and stopped delivering
    (bench_epochs.py): a multi-pass stream runs under Ray's own default cap instead."""
    assert object_store_limit(PipelineConfig(object_store_limit_bytes=512 * 2**20)) == 512 * 2**20
    assert object_store_limit(PipelineConfig(object_store_limit_bytes=512 * 2**20, passes_per_execution=4)) is None
    with pytest.raises(ValueError, match="passes_per_execution"):
        PipelineConfig(passes_per_execution=0)
