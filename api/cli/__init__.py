"""The `fsdp-planner` command line."""
