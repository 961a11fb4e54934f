"""Calibration micro-benchmarks (GEMMs, collectives, blocks) run next to the GPUs. stdlib + torch only."""
