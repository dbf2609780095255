"""A run's fitted post-hoc fix on disk: written when the run is evaluated, read by ``ncdlr predict``.

``method.posthoc`` (``la``, ``crt``, ``la+crt``) changes a run's predictions after training
(:class:`ncdlr.methods.PosthocFix`), and its prior and re-trained prototypes come from the run's training rows.
``ncdlr evaluate`` (and the evaluation at the end of ``ncdlr train``) fits it on those rows; this module keeps
what it fitted beside the run (``posthoc-<kind>.pt``, tied to the checkpoint it was fitted for), so that
predicting on new images applies the same fix without reading the training data again.
"""

from __future__ import annotations

from pathlib import Path

import torch

from ncdlr.methods import PosthocFix

#: the file of a run's fitted fix of kind ``kind`` (``la+crt`` → ``posthoc-la+crt.pt``)
FILE = "posthoc-{kind}.pt"


def fix_path(run_dir: str | Path, kind: str) -> Path:
    return Path(run_dir) / FILE.format(kind=kind)


def save_fix(run_dir: str | Path, checkpoint: str, fix: PosthocFix) -> Path:
    """Write ``fix`` (fitted for ``checkpoint``) into the run directory; returns its path."""
    path = fix_path(run_dir, fix.kind)
    tmp = path.with_suffix(".tmp")
    torch.save({"checkpoint": str(checkpoint), **fix.state()}, tmp)
    tmp.replace(path)  # a reader never sees half a file
    return path


def load_fix(run_dir: str | Path, kind: str, checkpoint: str) -> PosthocFix:
    """The run's fix ``kind`` fitted for ``checkpoint`` (``none``: the identity, no file).

    Raises:
        FileNotFoundError: the run has no such fix, or it was fitted for another checkpoint; the message names
            the command that fits it (``ncdlr evaluate RUN --checkpoint …``).
    """
    if kind == "none":
        return PosthocFix("none")
    path = fix_path(run_dir, kind)
    pointer = Path(run_dir) / "checkpoint.txt"
    last = pointer.read_text().strip() if pointer.is_file() else ""
    hint = f"`ncdlr evaluate {run_dir} --posthoc {kind}" + (f" --checkpoint {checkpoint}`" if checkpoint != last else "`")
    if not path.is_file():
        raise FileNotFoundError(f"run {str(run_dir)!r} predicts with method.posthoc {kind}, but its fix was never "
                                f"fitted ({path.name} missing): {hint} fits it on the run's training rows")
    state = torch.load(path, map_location="cpu", weights_only=True)
    if state.get("checkpoint") != str(checkpoint):
        raise FileNotFoundError(f"{path} was fitted for checkpoint {state.get('checkpoint')!r}, not {checkpoint!r}: "
                                f"{hint} fits it for this one")
    return PosthocFix.from_state(state)
