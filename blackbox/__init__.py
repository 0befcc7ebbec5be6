"""Herald black-box suite: real processes, real faults, verdicts from the outside (see scripts/blackbox)."""
