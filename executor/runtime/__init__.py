"""The compiled-FSDP trainer a launch bundle runs (`python -m executor.runtime.train --plan plan.json`).

Imports only the standard library and torch: a downloaded bundle must run on a machine that has
nothing but torch installed (tests/executor/test_import_borders.py checks it).
"""
