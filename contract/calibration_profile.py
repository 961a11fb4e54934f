"""The calibration profile's format version, declared once for its writer and its reader.

`executor/profile/run.py` writes a profile (`fsdp-planner calibrate` on the target GPUs);
`planner/calibration.py` reads it (pydantic `CalibrationProfile`) to fit the cost model. A change to a
field's meaning bumps the version here, and the reader refuses versions it does not know.
"""

from __future__ import annotations

from typing import Literal

ProfileSchemaVersion = Literal["1.0"]
"""The versions a reader understands."""
PROFILE_SCHEMA_VERSION: ProfileSchemaVersion = "1.0"
"""The version a profile states in `schema_version` (the writer writes this one)."""
