"""Data: one JSON file per source of measured training runs (schema: planner/fidelity/schema.py)."""
