"""Herald benchmarks: intake and delivery measured against floors of the same stack, in one run."""
