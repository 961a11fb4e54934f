"""What runs next to the GPUs: the compiled-FSDP runtime, calibration profiling and launch bundles."""
