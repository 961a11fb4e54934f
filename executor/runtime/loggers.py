"""Optional experiment trackers: TensorBoard (`--tensorboard DIR`) and Weights & Biases
(`--wandb-project NAME`), on rank 0 only.

Neither is a dependency of the runtime: a bundle runs where only torch is installed. When the
package a tracker needs is missing (or it fails to start), the trainer prints one warning line and
trains on; the metrics file (`--metrics-file`) always has everything.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, Protocol


class Tracker(Protocol):
    def log(self, values: dict[str, float], step: int) -> None: ...

    def close(self) -> None: ...


class TensorBoardTracker:
    def __init__(self, writer: Any) -> None:
        self.writer = writer

    def log(self, values: dict[str, float], step: int) -> None:
        for name, value in values.items():
            self.writer.add_scalar(name, value, step)
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


class WandbTracker:
    def __init__(self, run: Any) -> None:
        self.run = run

    def log(self, values: dict[str, float], step: int) -> None:
        self.run.log(values, step=step)

    def close(self) -> None:
        self.run.finish()


def _warn(message: str) -> None:
    print(f"warning: {message}", file=sys.stderr, flush=True)


def open_trackers(
    *, tensorboard: Path | None, wandb_project: str | None, run_name: str, config: dict[str, Any]
) -> list[Tracker]:
    """The trackers asked for that can start (rank 0 calls this; the others need none)."""
    trackers: list[Tracker] = []
    if tensorboard is not None:
        try:
            # torch's own module; it needs the `tensorboard` package, which torch does not require.
            from torch.utils.tensorboard import SummaryWriter
        except ImportError as exc:
            _warn(f"--tensorboard: TensorBoard is not installed here ({exc}); `pip install tensorboard` "
                  "to log there. Training goes on (see --metrics-file)")
        else:
            try:
                trackers.append(TensorBoardTracker(SummaryWriter(log_dir=str(tensorboard))))
            except Exception as exc:
                _warn(f"--tensorboard {tensorboard}: cannot start TensorBoard ({exc}); training goes on")
    if wandb_project:
        try:
            # Optional: allowed in the runtime only here (tests/executor/test_import_borders.py).
            import wandb
        except ImportError:
            _warn("--wandb-project: Weights & Biases is not installed here; `pip install wandb` to log "
                  "there. Training goes on (see --metrics-file)")
        else:
            try:
                trackers.append(WandbTracker(wandb.init(project=wandb_project, name=run_name, config=config)))
            except Exception as exc:  # not logged in, no network, ...
                _warn(f"--wandb-project {wandb_project}: cannot start a W&B run ({exc}); training goes on")
    return trackers
