"""The `gpufleet` command."""
