"""`python -m herald_client listen …`: the `herald` command."""
import sys

from herald_client.cli import main

sys.exit(main())
