"""Commands the CLI and the dashboard tell a person to run, spelled once.

fsdp-planner is installed from a checkout of its repository (no package index has it), into the
`.venv` that `scripts/serve.sh` and `scripts/test.sh` make there, so every hint is a command that
works in that checkout.
"""

from __future__ import annotations

EXECUTOR_EXTRA_INSTALL = ".venv/bin/pip install '.[executor]'"
"""Adds the `executor` extra (torch, numpy) to the checkout's .venv: what `calibrate`, `validate`,
`trace` and a launch bundle run on this machine need. Run in the checkout."""
CLI_ACTIVATE = ". .venv/bin/activate"
"""Puts the checkout's `fsdp-planner` command on this shell's PATH (or call `.venv/bin/fsdp-planner`)."""
