"""Logit buffer: FIFO order, first-push fill, state round-trip (method.md §4.1)."""

import pytest
import torch

from ncdlr.buffer import LogitBuffer


def rows(start: int, n: int, k: int = 3) -> torch.Tensor:
    return torch.arange(start, start + n, dtype=torch.float32)[:, None].repeat(1, k)


def test_first_push_fills_by_repeating_the_first_batch_with_the_batch_last():
    buf = LogitBuffer(capacity=8, num_clusters=3)
    out = buf.push(rows(0, 3))
    assert out.shape == (8, 3) and len(buf) == 8
    assert out[:, 0].tolist() == [1, 2, 0, 1, 2, 0, 1, 2]
    torch.testing.assert_close(out[-3:], rows(0, 3))


def test_fifo_drops_the_oldest_rows_and_returns_newest_last():
    buf = LogitBuffer(capacity=6, num_clusters=3)
    buf.push(rows(0, 2))
    buf.push(rows(10, 2))
    out = buf.push(rows(20, 2))
    assert out[:, 0].tolist() == [0, 1, 10, 11, 20, 21]
    out = buf.push(rows(30, 4))
    assert out[:, 0].tolist() == [20, 21, 30, 31, 32, 33]


def test_batch_larger_than_capacity_is_returned_whole_and_the_last_rows_kept():
    buf = LogitBuffer(capacity=4, num_clusters=3)
    out = buf.push(rows(0, 6))
    assert out.shape == (6, 3)
    assert buf.rows[:, 0].tolist() == [2, 3, 4, 5]


def test_stored_rows_are_detached_copies():
    buf = LogitBuffer(capacity=4, num_clusters=3)
    x = rows(0, 4).requires_grad_(True)
    buf.push(x)
    assert not buf.rows.requires_grad
    with torch.no_grad():
        x.add_(100)
    assert buf.rows.max() < 100


def test_state_round_trip_restores_contents_and_order():
    a = LogitBuffer(capacity=5, num_clusters=3)
    a.push(rows(0, 2))
    a.push(rows(7, 2))
    b = LogitBuffer(capacity=5, num_clusters=3)
    b.load_state_dict(a.state_dict())
    torch.testing.assert_close(b.push(rows(50, 1)), a.push(rows(50, 1)))


def test_wrong_width_or_incompatible_state_is_a_clear_error():
    buf = LogitBuffer(capacity=4, num_clusters=3)
    with pytest.raises(ValueError, match=r"expected rows \[B, 3\]"):
        buf.push(torch.zeros(2, 4))
    other = LogitBuffer(capacity=4, num_clusters=5)
    other.push(torch.zeros(2, 5))
    with pytest.raises(ValueError, match="does not fit"):
        buf.load_state_dict(other.state_dict())
