"""The web process never imports torch or the runtime (DESIGN.md): it installs and runs without them."""

from __future__ import annotations

import subprocess
import sys


def test_the_app_and_cli_import_without_torch_or_the_runtime() -> None:
    code = (
        "import sys; import api.app, api.cli.main; api.app.create_app; "
        "bad = sorted(m for m in sys.modules if m == 'torch' or m.startswith(('torch.', 'executor.runtime', "
        "'executor.profile'))); "
        "print(bad); sys.exit(1 if bad else 0)"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
