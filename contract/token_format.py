"""The token dataset format, declared once for its writer and its reader (standard library only).

A dataset is a directory of raw little-endian token shards (`train-00000.bin`, ..., `eval-00000.bin`)
and an `index.json` written last. `executor/runtime/prepare_data.py` writes it (`fsdp-planner
prepare-data`); `executor/runtime/data.py` reads it in the trainer. No torch here, so that the writer
(and the CLI that runs it) need none.
"""

from __future__ import annotations

import re

FORMAT = "fsdp-planner-tokens"
"""The `format` of index.json."""
FORMAT_VERSION = 1
"""The index.json version written, and the newest the reader understands."""
INDEX = "index.json"
"""The index file's name inside a dataset directory."""
DTYPE_LIMITS = {"uint16": 2**16, "uint32": 2**32}
"""Token dtypes of the shards, with the vocabulary size each holds."""
SHARD_NAME = re.compile(r"^(train|eval)-\d{5,}\.bin$")
"""A shard's file name."""
