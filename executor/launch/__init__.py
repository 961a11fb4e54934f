"""Renders launch bundles (torchrun script, SLURM batch file, Kubernetes manifests) from a Plan.

Pure: no torch, no I/O beyond what `write_bundle` is asked to write, so the web service can serve
the same archive the CLI writes.
"""
