"""The contract between planner, launcher, runtime and service: standard library only.

What one side writes and another reads is declared here once: the device mesh (`contract.mesh`),
the Plan document the runtime reads, its schema version and the one upgrader of older schemas
(`contract.plan_document`), the calibration profile's version (`contract.calibration_profile`) and
the token dataset format (`contract.token_format`). Bundles carry this package beside the
runtime, so it imports nothing but the standard library (an import-linter contract checks it).
"""
