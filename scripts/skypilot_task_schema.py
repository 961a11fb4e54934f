"""Write the SkyPilot task schema that tests/executor/test_launch_skypilot.py validates skypilot.yaml against.

SkyPilot pins click<8.2 and uvicorn<0.36, which the service's own pins exclude, so the package cannot join
the test environment; its schemas are copied from it instead, by this script, run where SkyPilot is
installed (a throwaway virtual environment):

    python -m venv /tmp/sky && /tmp/sky/bin/pip install skypilot==0.14.1
    /tmp/sky/bin/python scripts/skypilot_task_schema.py > tests/executor/schemas/skypilot_task_schema.json

The file holds the version it came from and the two schemas `sky.Task.from_yaml` checks a task with:
the task's (`sky.utils.schemas.get_task_schema`) and its resources' (`get_resources_schema`).
"""

from __future__ import annotations

import json
import sys

import sky
from sky.utils import schemas


def main() -> None:
    document = {
        "skypilot_version": sky.__version__,
        "task": schemas.get_task_schema(),
        "resources": schemas.get_resources_schema(),
    }
    json.dump(document, sys.stdout, indent=1, sort_keys=True)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
