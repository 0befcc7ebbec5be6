"""The fuzzers' seed: fresh each run, the same for every test process of a run, printed in pytest's header
(`fuzz seed: N`) so that a failure can be replayed with `HERALD_FUZZ_SEED=N scripts/test …`.

tests/conftest.py picks it (pytest_configure, in the controller, before xdist starts its workers, which
inherit the environment) unless HERALD_FUZZ_SEED is set already. The hypothesis tests take it with
`@seed(SEED)`; schemathesis with `--seed`. Past findings are kept as explicit `@example` cases beside the
fuzzers (tests/test_api_fuzz.py), so every run tries them whatever the seed; no example database is kept.
"""
import os
import secrets

ENV = "HERALD_FUZZ_SEED"


def ensure_seed() -> int:
    """The run's seed: HERALD_FUZZ_SEED if set, else a new one, put in the environment for workers and children."""
    if not os.environ.get(ENV):
        os.environ[ENV] = str(secrets.randbelow(2**31))
    return int(os.environ[ENV])


SEED = ensure_seed()
