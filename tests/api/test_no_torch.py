"""The web process never imports torch (DESIGN.md): the service installs and runs without it."""

from __future__ import annotations

import subprocess
import sys


def test_the_app_and_cli_import_without_torch() -> None:
    code = (
        "import sys; import api.app, api.cli.main; api.app.create_app; "
        "bad = sorted(m for m in sys.modules if m == 'torch' or m.startswith('torch.')); "
        "print(bad); sys.exit(1 if bad else 0)"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
