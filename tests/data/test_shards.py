"""Prepared-dataset format: shards + manifest written last, and readers that refuse anything inconsistent."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from ncdlr.data.manifest import FORMAT_VERSION, DatasetFormatError, read_manifest
from ncdlr.data.records import ClassInfo, ImageRecord
from ncdlr.data import shards as shards_module
from ncdlr.data.shards import (SCHEMA, STAMP_NAME, encode_shard, verify_dataset, verify_with_stamp,
                               write_dataset)
from ncdlr.data.storage import resolve
from ncdlr.data.storage import ObjectNotFoundError
from tests.fixtures.tiny_images import make_tiny_dataset

Parts = tuple[list[ImageRecord], list[ClassInfo], object]


def _rows(uri_dir: Path) -> list[dict]:
    table = pq.read_table(sorted(uri_dir.glob("shards/*/*.parquet")))
    return sorted(table.to_pylist(), key=lambda r: r["source_id"])


def test_write_then_read_round_trips_every_record(tmp_path: Path, tiny_dataset: Parts) -> None:
    records, classes, info = tiny_dataset
    manifest = write_dataset(str(tmp_path / "ds"), records, classes, info, target_shard_bytes=8 * 1024, progress=False)
    assert len(manifest.shards) > 1, "a small target must cut several shards"
    assert manifest.num_rows == len(records) == sum(manifest.split_counts.values())
    rows = _rows(tmp_path / "ds")
    expected = sorted(({"image": r.image, "label": r.label, "split": r.split, "class_name": r.class_name,
                        "source_id": r.source_id} for r in records), key=lambda r: r["source_id"])
    assert rows == expected
    assert pq.read_schema(next((tmp_path / "ds").glob("shards/*/*.parquet"))).remove_metadata() == SCHEMA
    again = verify_dataset(str(tmp_path / "ds"))
    assert again == read_manifest(str(tmp_path / "ds")) == manifest


def test_manifest_records_classes_counts_and_provenance(tmp_path: Path, tiny_dataset: Parts) -> None:
    records, classes, info = tiny_dataset
    manifest = write_dataset(str(tmp_path / "ds"), records, classes, info, progress=False)
    data = json.loads((tmp_path / "ds" / "manifest.json").read_text())
    assert data["format_version"] == FORMAT_VERSION
    assert [c["name"] for c in data["classes"]] == [c.name for c in classes]
    assert (data["num_known"], data["num_novel"]) == (2, 2)
    assert data["split_counts"] == {"known": 18, "novel": 14, "test": 8}
    assert manifest.train_counts == [12, 6, 10, 4] and data["seed"] == 0 and data["imbalance"]["known"] == 2.0


@pytest.mark.slow
def test_shards_round_trip_through_s3(s3_bucket: str, s3_server, tiny_dataset: Parts) -> None:
    records, classes, info = tiny_dataset
    uri = f"{s3_bucket}/tiny"
    manifest = write_dataset(uri, records, classes, info, target_shard_bytes=16 * 1024, progress=False)
    assert verify_dataset(uri) == manifest
    rows = _rows(s3_server.root_dir / s3_bucket.removeprefix("s3://") / "tiny")
    assert [r["source_id"] for r in rows] == sorted(r.source_id for r in records)
    assert {r["source_id"]: r["image"] for r in rows} == {r.source_id: r.image for r in records}


def test_a_crashed_build_leaves_no_dataset_a_reader_accepts(tmp_path: Path, tiny_dataset: Parts) -> None:
    records, classes, info = tiny_dataset

    def crashing():
        yield from records[:20]
        raise RuntimeError("source disk vanished")

    with pytest.raises(RuntimeError, match="vanished"):
        write_dataset(str(tmp_path / "ds"), crashing(), classes, info, target_shard_bytes=4096, progress=False)
    assert list((tmp_path / "ds" / "shards").rglob("*.parquet")), "shards were written before the crash"
    with pytest.raises(ObjectNotFoundError, match="manifest.json"):
        read_manifest(str(tmp_path / "ds"))


def test_missing_manifest_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(ObjectNotFoundError, match=r"nothing-here/manifest.json.*not a prepared dataset"):
        read_manifest(str(tmp_path / "nothing-here"))


@pytest.mark.slow
def test_missing_manifest_on_s3_is_a_clear_error(s3_bucket: str) -> None:
    with pytest.raises(ObjectNotFoundError, match=f"{s3_bucket}/absent/manifest.json"):
        read_manifest(f"{s3_bucket}/absent")


def test_unknown_manifest_version_is_refused_naming_the_file(tmp_path: Path, tiny_dataset: Parts) -> None:
    write_dataset(str(tmp_path / "ds"), *tiny_dataset, progress=False)
    path = tmp_path / "ds" / "manifest.json"
    data = json.loads(path.read_text())
    data["format_version"] = 2
    path.write_text(json.dumps(data))
    with pytest.raises(DatasetFormatError, match=r"ds/manifest.json: unsupported manifest format_version 2"):
        read_manifest(str(tmp_path / "ds"))


def test_shard_checksum_mismatch_is_refused_naming_the_shard(tmp_path: Path, tiny_dataset: Parts) -> None:
    manifest = write_dataset(str(tmp_path / "ds"), *tiny_dataset, target_shard_bytes=8 * 1024, progress=False)
    victim = tmp_path / "ds" / manifest.shards[1].path
    data = bytearray(victim.read_bytes())
    data[len(data) // 2] ^= 0xFF  # same size, different content
    victim.write_bytes(bytes(data))
    with pytest.raises(DatasetFormatError, match=rf"{manifest.shards[1].path}: sha256"):
        verify_dataset(str(tmp_path / "ds"))


def test_shard_row_count_mismatch_is_refused_naming_the_shard(tmp_path: Path, tiny_dataset: Parts) -> None:
    manifest = write_dataset(str(tmp_path / "ds"), *tiny_dataset, target_shard_bytes=8 * 1024, progress=False)
    shard = manifest.shards[0]
    victim = tmp_path / "ds" / shard.path
    # A well-formed shard with one row fewer, and a manifest whose size entry was "fixed" to match:
    # only the row count can tell.
    short = encode_shard(pq.read_table(victim).slice(1))
    victim.write_bytes(short)
    path = tmp_path / "ds" / "manifest.json"
    data = json.loads(path.read_text())
    data["shards"][0]["bytes"] = len(short)
    path.write_text(json.dumps(data))
    with pytest.raises(DatasetFormatError, match=rf"{shard.path}: {shard.rows - 1} rows, manifest says {shard.rows}"):
        verify_dataset(str(tmp_path / "ds"), checksum=False)


def test_a_missing_shard_is_refused_naming_it(tmp_path: Path, tiny_dataset: Parts) -> None:
    manifest = write_dataset(str(tmp_path / "ds"), *tiny_dataset, target_shard_bytes=8 * 1024, progress=False)
    (tmp_path / "ds" / manifest.shards[-1].path).unlink()
    with pytest.raises(DatasetFormatError, match=rf"{manifest.shards[-1].path}: shard listed in the manifest is missing"):
        verify_dataset(str(tmp_path / "ds"))


def test_train_count_disagreeing_with_rows_writes_no_manifest(tmp_path: Path, tiny_dataset: Parts) -> None:
    records, classes, info = tiny_dataset
    lying = [classes[0].__class__(label=0, name="class_0", group="known", train_count=99), *classes[1:]]
    with pytest.raises(ValueError, match="train_count disagrees"):
        write_dataset(str(tmp_path / "ds"), records, lying, info, progress=False)
    assert not (tmp_path / "ds" / "manifest.json").exists()


def test_record_with_wrong_class_name_is_refused_naming_its_source_id(tmp_path: Path, tiny_dataset: Parts) -> None:
    records, classes, info = tiny_dataset
    bad = ImageRecord(image=records[0].image, label=0, split="test", class_name="class_3", source_id="odd.jpg")
    with pytest.raises(ValueError, match="'odd.jpg'"):
        write_dataset(str(tmp_path / "ds"), [bad, *records], classes, info, progress=False)


def test_an_existing_dataset_is_not_overwritten_by_accident(tmp_path: Path, tiny_dataset: Parts) -> None:
    write_dataset(str(tmp_path / "ds"), *tiny_dataset, progress=False)
    with pytest.raises(FileExistsError, match="manifest.json"):
        write_dataset(str(tmp_path / "ds"), *tiny_dataset, progress=False)
    records, classes, info = make_tiny_dataset(train_counts=(3, 2, 3, 1), seed=1)
    manifest = write_dataset(str(tmp_path / "ds"), records, classes, info, progress=False, overwrite=True)
    assert verify_dataset(str(tmp_path / "ds")) == manifest and manifest.num_rows == len(records)


def test_every_shard_holds_the_rows_of_one_split(tmp_path: Path, tiny_dataset: Parts) -> None:
    manifest = write_dataset(str(tmp_path / "ds"), *tiny_dataset, target_shard_bytes=8 * 1024, progress=False)
    for shard in manifest.shards:
        splits = set(pq.read_table(tmp_path / "ds" / shard.path, columns=["split"]).column("split").to_pylist())
        assert splits == {shard.split} and shard.path.startswith(f"shards/{shard.split}/")
    assert {s.split for s in manifest.shards} == {"known", "novel", "test"}


def test_rows_of_a_class_sorted_source_are_permuted_within_shards_reproducibly(tmp_path: Path) -> None:
    records, classes, info = make_tiny_dataset()
    by_class = sorted(records, key=lambda r: (r.split, r.label, r.source_id))
    first = write_dataset(str(tmp_path / "a"), by_class, classes, info, progress=False)
    again = write_dataset(str(tmp_path / "b"), by_class, classes, info, progress=False)
    assert [s.sha256 for s in first.shards] == [s.sha256 for s in again.shards], "same seed, same bytes"
    known = next(s for s in first.shards if s.split == "known")
    labels = pq.read_table(tmp_path / "a" / known.path, columns=["label"]).column("label").to_pylist()
    assert sorted(labels) == [0] * 12 + [1] * 6 and labels != sorted(labels)


def _flip_one_byte(data: bytes) -> bytes:
    flipped = bytearray(data)
    flipped[len(flipped) // 2] ^= 0xFF  # inside the image bytes: same size, still a readable parquet file
    return bytes(flipped)


def _stamp_check(uri: str, manifest) -> list:
    fs, base = resolve(uri)
    return verify_with_stamp(uri, fs, base, manifest.shards)


def _counting_hashes(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    hashed: list[str] = []
    check = shards_module.check_shard

    def counting(fs, path, shard, where, *, checksum):
        hashed.append(shard.path)
        return check(fs, path, shard, where, checksum=checksum)

    monkeypatch.setattr(shards_module, "check_shard", counting)
    return hashed


def test_a_flipped_byte_is_refused_naming_the_shard_and_nothing_is_stamped(tmp_path: Path,
                                                                           tiny_dataset: Parts) -> None:
    manifest = write_dataset(str(tmp_path / "ds"), *tiny_dataset, target_shard_bytes=8 * 1024, progress=False)
    victim = tmp_path / "ds" / manifest.shards[1].path
    victim.write_bytes(_flip_one_byte(victim.read_bytes()))
    with pytest.raises(DatasetFormatError, match=rf"{manifest.shards[1].path}: sha256 .* re-prepare the dataset"):
        _stamp_check(str(tmp_path / "ds"), manifest)
    assert not (tmp_path / "ds" / STAMP_NAME).exists()


def test_shards_are_hashed_once_then_only_their_stamp_is_checked(tmp_path: Path, tiny_dataset: Parts,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    manifest = write_dataset(str(tmp_path / "ds"), *tiny_dataset, target_shard_bytes=8 * 1024, progress=False)
    hashed = _counting_hashes(monkeypatch)
    assert _stamp_check(str(tmp_path / "ds"), manifest) == list(manifest.shards)
    stamp = json.loads((tmp_path / "ds" / STAMP_NAME).read_text())["shards"]
    assert {path: entry["sha256"] for path, entry in stamp.items()} == {s.path: s.sha256 for s in manifest.shards}
    assert _stamp_check(str(tmp_path / "ds"), manifest) == []
    assert hashed == [s.path for s in manifest.shards], "the second check reads no shard"


def test_a_shard_rewritten_after_stamping_is_hashed_again_and_refused(tmp_path: Path, tiny_dataset: Parts) -> None:
    import os

    manifest = write_dataset(str(tmp_path / "ds"), *tiny_dataset, target_shard_bytes=8 * 1024, progress=False)
    _stamp_check(str(tmp_path / "ds"), manifest)
    victim = tmp_path / "ds" / manifest.shards[0].path
    before = victim.stat()
    victim.write_bytes(_flip_one_byte(victim.read_bytes()))
    os.utime(victim, ns=(before.st_atime_ns, before.st_mtime_ns + 1))  # a rewrite the same nanosecond is not one
    with pytest.raises(DatasetFormatError, match=rf"{manifest.shards[0].path}: sha256"):
        _stamp_check(str(tmp_path / "ds"), manifest)


@pytest.mark.slow
def test_the_stamp_works_on_s3_and_catches_an_object_rewritten_with_a_flipped_byte(
        s3_bucket: str, tiny_dataset: Parts, monkeypatch: pytest.MonkeyPatch) -> None:
    import time

    from ncdlr.data.storage import boto3_client

    uri = f"{s3_bucket}/tiny"
    manifest = write_dataset(uri, *tiny_dataset, target_shard_bytes=16 * 1024, progress=False)
    hashed = _counting_hashes(monkeypatch)
    assert _stamp_check(uri, manifest) == list(manifest.shards)
    assert _stamp_check(uri, manifest) == [] and len(hashed) == len(manifest.shards)
    client, bucket = boto3_client(), s3_bucket.removeprefix("s3://")
    key = f"tiny/{manifest.shards[0].path}"
    data = client.get_object(Bucket=bucket, Key=key)["Body"].read()
    time.sleep(1.1)  # S3's LastModified has 1 s resolution
    client.put_object(Bucket=bucket, Key=key, Body=_flip_one_byte(data))
    with pytest.raises(DatasetFormatError, match=rf"{uri}/{manifest.shards[0].path}: sha256"):
        _stamp_check(uri, manifest)


@pytest.mark.slow
def test_overwriting_a_stamped_dataset_on_s3_works_and_drops_the_stamp(s3_bucket: str, s3_server,
                                                                       tiny_dataset: Parts) -> None:
    """Deleting the old manifest and shards must write no directory marker (the rclone server refuses it)."""
    uri = f"{s3_bucket}/tiny"
    manifest = write_dataset(uri, *tiny_dataset, target_shard_bytes=16 * 1024, progress=False)
    _stamp_check(uri, manifest)
    again = write_dataset(uri, *tiny_dataset, target_shard_bytes=16 * 1024, progress=False, overwrite=True)
    assert verify_dataset(uri) == again
    assert not (s3_server.root_dir / s3_bucket.removeprefix("s3://") / "tiny" / STAMP_NAME).exists()
