"""Project-level promises: migrations match models, layering holds, the credential command works."""
import pathlib
import subprocess
import sys

import pytest
from django.core.management import call_command

from intake.credentials import credential_from_authorization
from intake.models import ApiCredential
from tests.conftest import subprocess_env

ROOT = pathlib.Path(__file__).resolve().parent.parent


@pytest.mark.django_db
def test_models_match_migrations():
    call_command("makemigrations", "--check", "--dry-run", verbosity=0)


def test_the_import_contracts_hold():
    """pyproject.toml's import-linter contracts: config > portal > intake > webhooks one way, webhooks' leaves
    below its delivery core, no cycle between sibling modules. (It reads the code, not the running program.)"""
    linted = subprocess.run([str(pathlib.Path(sys.executable).parent / "lint-imports"), "--no-cache"], cwd=ROOT,
                            capture_output=True, text=True, timeout=120)
    assert linted.returncode == 0, linted.stdout + linted.stderr
    assert "0 broken" in linted.stdout


@pytest.mark.django_db(transaction=True)
def test_create_credential_prints_the_token_last_and_stores_only_its_hash():
    result = subprocess.run([sys.executable, "manage.py", "create_credential", "--tenant", "initech"],
                            cwd=ROOT, capture_output=True, text=True, check=True, env=subprocess_env())
    token = result.stdout.strip().splitlines()[-1]
    credential = credential_from_authorization(f"Bearer {token}")
    assert credential is not None and credential.tenant.name == "initech"
    assert not ApiCredential.objects.filter(token_hash__contains=token).exists()
    assert token not in (credential.token_hash, credential.token_prefix)
    # a second credential for the same tenant reuses the tenant
    subprocess.run([sys.executable, "manage.py", "create_credential", "--tenant", "initech"], cwd=ROOT,
                   capture_output=True, check=True, env=subprocess_env())
    assert ApiCredential.objects.filter(tenant__name="initech").count() == 2
