"""``ncdlr.data.import_patch``: a module patched now if loaded, else right after its first import, and once."""

from __future__ import annotations

import subprocess
import sys
import textwrap


def test_a_loaded_module_is_patched_now_and_a_later_one_on_its_first_import(tmp_path) -> None:
    """In a fresh interpreter with two throwaway modules on its path: ``json`` (loaded) is patched at once and the
    call returns the patch's value; ``later`` is patched only when imported, by the first registration alone."""
    (tmp_path / "later.py").write_text("VALUE = 1\n")
    code = textwrap.dedent("""
        import json, sys
        from ncdlr.data.import_patch import patch_when_imported
        seen = []
        print(patch_when_imported("json", lambda m: seen.append(m.__name__) or "now"))
        print(patch_when_imported("later", lambda m: seen.append(m.__name__)), "later" in sys.modules)
        patch_when_imported("later", lambda m: seen.append("second"))  # the first one waits already: no second
        import later
        print(seen, later.VALUE)
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == ["now", "None False", "['json', 'later'] 1"]
