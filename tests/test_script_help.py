"""Every script under ``benchmarks/`` and ``tuning/`` explains itself: ``--help`` exits 0 and prints its usage.

argparse formats each help text with ``%``, so a literal percent sign in a help string (``f"{0.2:.0%}"`` gives
``20%``) crashes ``--help`` with a TypeError; this caught one such crash in benchmarks/quality.py.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

#: one process for all scripts (their imports are shared): prints "<script> <exit code> <usage seen>" per script
_PROBE = """
import contextlib, io, runpy, sys
for script in sys.argv[1:]:
    sys.argv = [script, "--help"]
    out = io.StringIO()
    code = 0
    try:
        with contextlib.redirect_stdout(out):
            runpy.run_path(script, run_name="__main__")
    except SystemExit as done:
        code = done.code or 0
    except Exception as err:  # a crash while formatting the help
        code = f"{type(err).__name__}:{err}".replace(" ", "_")
    print(script, code, "usage:" in out.getvalue().lower())
"""


def test_every_benchmark_and_tuning_script_answers_help():
    scripts = sorted(str(p) for folder in ("benchmarks", "tuning") for p in (ROOT / folder).glob("*.py")
                     if not p.name.startswith("_"))
    assert len(scripts) > 10
    done = subprocess.run([sys.executable, "-c", _PROBE, *scripts], capture_output=True, text=True, cwd=ROOT,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    results = [line.rsplit(" ", 2) for line in done.stdout.splitlines() if line.startswith(str(ROOT))]
    assert [r[0] for r in results] == scripts
    failed = [f"{Path(s).relative_to(ROOT)}: exit {code}, usage printed {usage}" for s, code, usage in results
              if code != "0" or usage != "True"]
    assert not failed, "\n".join(failed)
