"""Herald's PostgreSQL functions: each `.sql` file in this folder is the only current copy of one.

They are installed after every `manage.py migrate` (webhooks/apps.py connects `install` to `post_migrate`),
with `CREATE OR REPLACE FUNCTION`, so a change to the claim is a diff of `delivery_claim.sql` and takes
effect at the next migrate, without a migration that copies the whole function. tests/test_sql_functions.py
checks that what a migrated database runs is what these files say.

The trade-off, written down:
- A migration that needs a function while it runs (0016 creates the triggers that call
  `herald_delivery_counted`) installs the current files at that point (`migration_install`). Old migrations
  therefore create today's functions on a fresh database, not the ones of their day; that is safe because
  every function here is PL/pgSQL, whose body PostgreSQL checks only when it runs, and nothing runs them
  before the migrations are done. Keep them PL/pgSQL; `LANGUAGE sql` only for one that reads no table
  (its body is checked against the tables at creation, which an old migration's schema may not have).
- `CREATE OR REPLACE` cannot change a function's arguments or result type: a file that does must drop the
  old signature first (`DROP FUNCTION IF EXISTS name(old argument types);` at its top).
- Migrating backwards leaves the current functions in place, except that unapplying 0007 drops them all.
- A part of a statement whose rule a Python module owns is not copied into a file: the file says
  `{{name}}` and `text` puts in what `fragments` maps the name to (event_intake.sql's fan-out is
  webhooks/delivery/fanout.py's). What is installed, and compared, is the rendered text.
"""
from __future__ import annotations

import re
from pathlib import Path

from django.db import transaction

FOLDER = Path(__file__).resolve().parent
# Two migrate commands at once (two hosts deploying) would otherwise collide on the catalog row:
# "tuple concurrently updated". A transaction-level advisory lock of its own key ('hsql') orders them.
_LOCK = int.from_bytes(b"hsql", "big")


def files() -> list[Path]:
    return sorted(FOLDER.glob("*.sql"))


def fragments() -> dict[str, str]:
    """What each `{{name}}` of the files stands for. Imported when called (at migrate time, the models
    loaded), not with this module, which the app's config and the migrations import."""
    from webhooks.delivery import fanout

    return {"single_event": fanout.FAST_PATH_FANOUT}


def text(path: Path) -> str:
    """A file's statement as it is installed: its `{{name}}` placeholders put in (a name with no fragment
    is an error, not left in)."""
    source = path.read_text()
    if "{{" not in source:
        return source
    parts = fragments()
    return re.sub(r"\{\{(\w+)\}\}", lambda match: parts[match.group(1)], source)


def function_name(path: Path) -> str:
    """The function a file defines (`CREATE OR REPLACE FUNCTION name(`)."""
    return re.search(r"CREATE OR REPLACE FUNCTION (\w+)\(", path.read_text()).group(1)


def body(text: str) -> str:
    """What PostgreSQL keeps as the function's source (pg_proc.prosrc): the text between its dollar quotes."""
    match = re.search(r"AS (\$\w*\$)(.*)\1", text, re.S)
    return match.group(2)


def install(connection) -> None:
    """Create or replace every function, each file as one statement, in one transaction."""
    with transaction.atomic(using=connection.alias), connection.cursor() as cursor:
        cursor.execute("SELECT pg_advisory_xact_lock(%s)", [_LOCK])
        for path in files():
            cursor.execute(text(path))


def installed_bodies(connection) -> dict[str, str]:
    """The source of every function of this folder as the database has it, by name."""
    names = [function_name(path) for path in files()]
    with connection.cursor() as cursor:
        cursor.execute("SELECT proname, prosrc FROM pg_proc WHERE proname = ANY(%s)", [names])
        return dict(cursor.fetchall())


def settings(text: str) -> list[str]:
    """The settings a file gives its function (`SET name = value` lines before its body), as pg_proc.proconfig
    holds them (`name=value`)."""
    head = text[:re.search(r"AS (\$\w*\$)", text).start()]
    return [f"{name}={value}" for name, value in re.findall(r"^SET (\w+) = (\S+)$", head, re.M)]


def installed_settings(connection) -> dict[str, list[str]]:
    """The settings of every function of this folder as the database has them, by name."""
    names = [function_name(path) for path in files()]
    with connection.cursor() as cursor:
        cursor.execute("SELECT proname, coalesce(proconfig, '{}') FROM pg_proc WHERE proname = ANY(%s)", [names])
        return {name: list(config) for name, config in cursor.fetchall()}


def differences(connection) -> list[str]:
    """The functions whose installed source or settings are not their file's (or that are missing)."""
    installed, configured = installed_bodies(connection), installed_settings(connection)
    return [function_name(path) for path in files()
            if installed.get(function_name(path)) != body(text(path))
            or configured.get(function_name(path)) != settings(text(path))]


def after_migrate(sender, using="default", **kwargs) -> None:
    """post_migrate: every migrate leaves the functions equal to the files. Nothing is replaced when they
    are (a test's flush sends post_migrate too, and a replaced function drops every session's cached plans)."""
    from django.db import connections

    if differences(connections[using]):
        install(connections[using])


def migration_install(apps, schema_editor) -> None:
    """A migration step (RunPython) for a migration that needs the functions while it runs."""
    install(schema_editor.connection)


def migration_drop(apps, schema_editor) -> None:
    """The reverse of the first migration that installed them (0007): every function goes."""
    with schema_editor.connection.cursor() as cursor:
        for path in reversed(files()):
            cursor.execute(f"DROP FUNCTION IF EXISTS {function_name(path)} CASCADE")
