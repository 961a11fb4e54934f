"""Pure planning: specs, catalogs, cost model, search and calibration fitting.

Imports only the standard library and pydantic, so that the web process and the
CLI can plan without torch, and so that planning is deterministic and fast.
"""

__version__ = "0.8.0"
PLANNER_VERSION = __version__
"""Part of every plan hash: a new cost or memory model never answers with a plan the old one made."""
