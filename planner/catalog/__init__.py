"""Catalogs of known models and GPUs: `planner.catalog.gpus` (GPU datasheets, which `planner.specs`
reads to check a cluster's GPU name) and `planner.catalog.models` (models by name, and the one entry
point that turns any model input into a ModelSpec).

Nothing is re-exported here: importing the GPU catalog must not import the model catalog, which
imports the specs (the specs import the GPU catalog).
"""
