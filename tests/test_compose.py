"""docker-compose.yml and the Dockerfile, checked without Docker: structure, commands, environment.

Docker itself does not run here. The file is parsed with PyYAML (anchors and merge keys resolved,
as Compose does), checked against SPEC §1, validated by docker-compose's own schema
(`docker-compose config -q`, from Debian's `docker-compose` package), and its environment is fed
to the real settings module to prove the values mean what they say.
"""
import json
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from testkit.local_server import LocalServer, QuietHandler

ROOT = Path(__file__).resolve().parent.parent
COMPOSE_FILE = ROOT / "docker-compose.yml"
DOCKERFILE = ROOT / "Dockerfile"
HERALD_SERVICES = ("migrate", "web", "worker", "beat")
LONG_RUNNING = ("postgres", "redis", "web", "worker", "beat")
METRICS_DIR = "/var/run/herald-metrics"
# SPEC §1: the command of each role.
ROLE_COMMANDS = {
    "migrate": ["python", "manage.py", "migrate"],
    "web": ["gunicorn", "config.wsgi"],
    "worker": ["celery", "-A", "config", "worker"],
    "beat": ["celery", "-A", "config", "beat"],
}
INTERPOLATION = re.compile(r"\$\{(\w+)(?::?([-?])([^}]*))?\}")
# What a user must set before `docker compose up` (`${VAR:?reason}`), as this module sets it.
REQUIRED = {"SECRET_KEY": "compose-test-secret-key-" + "k" * 40, "POSTGRES_PASSWORD": "pg" + "p" * 30,
            "REDIS_PASSWORD": "rd" + "r" * 30, "METRICS_TOKEN": "mt" + "m" * 30}


@pytest.fixture(scope="module")
def compose() -> dict:
    return yaml.safe_load(COMPOSE_FILE.read_text())


@pytest.fixture(scope="module")
def services(compose) -> dict:
    return compose["services"]


def _argv(command) -> list[str]:
    return shlex.split(command) if isinstance(command, str) else [str(part) for part in command]


def _defaults(value) -> str:
    """The value Compose gives `${VAR:-default}` when VAR is not set (no .env file), and `${VAR:?…}`
    when the user set VAR as REQUIRED does."""
    return INTERPOLATION.sub(lambda m: REQUIRED[m.group(1)] if m.group(2) == "?" else m.group(3) or "", str(value))


def _environment(service: dict) -> dict[str, str]:
    env = service.get("environment") or {}
    if isinstance(env, list):
        env = dict(item.split("=", 1) for item in env)
    return {name: _defaults(value) for name, value in env.items()}


def _dockerfile_instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs, with line continuations joined and comments dropped."""
    text = re.sub(r"\\\n", " ", DOCKERFILE.read_text())
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            instruction, _, rest = line.partition(" ")
            out.append((instruction.upper(), rest.strip()))
    return out


def test_every_service_exists(services):
    assert set(services) >= {"postgres", "redis", "migrate", "web", "worker", "beat"}


def test_long_running_services_restart_and_migrate_runs_once(services):
    for name in LONG_RUNNING:
        assert services[name].get("restart") in {"always", "unless-stopped", "on-failure"}, name
    assert services["migrate"].get("restart") == "no"


def test_postgres_redis_and_web_have_healthchecks(services):
    postgres = _argv(services["postgres"]["healthcheck"]["test"])
    assert postgres[0] == "CMD-SHELL" and "pg_isready" in postgres[1]
    redis = _argv(services["redis"]["healthcheck"]["test"])
    assert redis[0] == "CMD-SHELL" and "redis-cli ping" in redis[1]  # with its password (test below)
    web = _argv(services["web"]["healthcheck"]["test"])
    assert web[:2] == ["CMD", "python"], "the slim image has no curl"
    assert "/healthz" in " ".join(web)


def test_postgres_and_redis_match_what_herald_connects_to(services):
    postgres = services["postgres"]
    assert postgres["image"].startswith("postgres:15")
    # the credentials come from .env (the password is required); the user and database default to herald
    assert _environment(postgres) == {"POSTGRES_DB": "herald", "POSTGRES_USER": "herald",
                                      "POSTGRES_PASSWORD": REQUIRED["POSTGRES_PASSWORD"]}
    assert any(str(v).endswith(":/var/lib/postgresql/data") for v in postgres["volumes"]), "data on a volume"
    redis = services["redis"]
    assert redis["image"].startswith("redis:7")
    assert "--requirepass \"$$REDIS_PASSWORD\"" in _argv(redis["command"])[-1]  # $$: the container's variable
    assert _environment(redis) == {"REDIS_PASSWORD": REQUIRED["REDIS_PASSWORD"]}
    assert "REDISCLI_AUTH" in redis["healthcheck"]["test"][-1] and "PONG" in redis["healthcheck"]["test"][-1]
    env = _environment(services["web"])
    assert env["DATABASE_URL"] == f"postgres://herald:{REQUIRED['POSTGRES_PASSWORD']}@postgres:5432/herald"
    assert env["REDIS_URL"] == f"redis://:{REQUIRED['REDIS_PASSWORD']}@redis:6379/0"


def test_herald_services_share_one_image_and_one_environment(services):
    first = services[HERALD_SERVICES[0]]
    assert first.get("image"), "name the image so that it is built once and reused"
    for name in HERALD_SERVICES:
        service = services[name]
        assert service.get("image") == first["image"], name
        assert service.get("build", first.get("build")) == first.get("build"), name
        assert service["environment"] == first["environment"], name
    assert any(services[name].get("build") for name in HERALD_SERVICES), "one of them builds the image"


def test_each_command_is_the_spec_command_for_its_role(services):
    for name, prefix in ROLE_COMMANDS.items():
        argv = _argv(services[name]["command"])
        assert argv[:len(prefix)] == prefix, (name, argv)
        # and the executable is one the image installs from requirements.lock (or python itself)
        assert argv[0] == "python" or (Path(sys.executable).parent / argv[0]).exists(), argv[0]
    web = _argv(services["web"]["command"])
    assert web[web.index("--bind") + 1] == "0.0.0.0:8000"
    # the API is published by the proxy, which passes every request to the web service's port
    assert "ports" not in services["web"] and "8000" in [str(port) for port in services["web"]["expose"]]
    proxy = services["proxy"]
    assert "8000:8000" in [str(port) for port in proxy["ports"]]
    assert _environment(proxy)["HERALD_WEB"] == "web:8000"
    beat = _argv(services["beat"]["command"])
    assert beat[beat.index("--schedule") + 1].startswith("/tmp/"), "the non-root user can write it"


def test_migrate_runs_before_web_worker_and_beat(services):
    assert services["migrate"]["depends_on"]["postgres"]["condition"] == "service_healthy"
    for name in ("web", "worker", "beat"):
        depends = services[name]["depends_on"]
        assert depends["migrate"]["condition"] == "service_completed_successfully", name
        assert depends["redis"]["condition"] == "service_healthy", name
        assert depends["postgres"]["condition"] == "service_healthy", name


def test_the_environment_names_everything_herald_needs(services):
    env = _environment(services["web"])
    for name in ("DATABASE_URL", "REDIS_URL", "SECRET_KEY", "DEBUG", "ALLOWED_HOSTS",
                 "PROMETHEUS_MULTIPROC_DIR", "WEBHOOK_ALLOW_PRIVATE_NETWORKS"):
        assert env.get(name), name
    assert env["DEBUG"] == "false"
    assert env["WEBHOOK_ALLOW_PRIVATE_NETWORKS"] == "false"
    assert env["PROMETHEUS_MULTIPROC_DIR"] == METRICS_DIR


def test_the_environment_gives_production_settings():
    """Feed the compose environment (defaults resolved) to config.settings in a fresh interpreter."""
    env = _environment(yaml.safe_load(COMPOSE_FILE.read_text())["services"]["web"])
    probe = ("import json; from django.conf import settings as s; db = s.DATABASES['default']; "
             "print(json.dumps({'debug': s.DEBUG, 'hosts': s.ALLOWED_HOSTS, 'broker': s.CELERY_BROKER_URL, "
             "'db': [db['HOST'], db['PORT'], db['NAME'], db['USER'], db['PASSWORD']], "
             "'private': s.WEBHOOK_ALLOW_PRIVATE_NETWORKS, 'secret': s.SECRET_KEY, "
             "'trusted': s.HERALD_TRUSTED_PROXIES, 'metrics_token': s.METRICS_TOKEN}))")
    base = {key: value for key, value in __import__("os").environ.items()
            if key in {"PATH", "HOME", "LANG", "SYSTEMROOT"}}
    result = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, timeout=60,
                            env={**base, **env, "DJANGO_SETTINGS_MODULE": "config.settings"})
    assert result.returncode == 0, result.stderr
    settings = json.loads(result.stdout)
    assert settings["debug"] is False
    assert settings["private"] is False
    assert "localhost" in settings["hosts"], "the web healthcheck calls http://localhost:8000"
    assert settings["broker"] == f"redis://:{REQUIRED['REDIS_PASSWORD']}@redis:6379/0"
    assert [str(part) for part in settings["db"]] == ["postgres", "5432", "herald", "herald",
                                                     REQUIRED["POSTGRES_PASSWORD"]]
    assert settings["trusted"] == [compose_subnet()] and settings["metrics_token"] == REQUIRED["METRICS_TOKEN"]
    assert settings["secret"] == env["SECRET_KEY"] and len(settings["secret"]) >= 50


def test_web_and_worker_share_the_metrics_directory_on_a_named_volume(compose, services):
    mounts = {}
    for name in ("web", "worker"):
        for volume in services[name].get("volumes", []):
            source, target = str(volume).split(":")[:2]
            mounts.setdefault(name, set()).add((source, target))
    shared = mounts["web"] & mounts["worker"]
    assert any(target == METRICS_DIR for _, target in shared)
    (source,) = [source for source, target in shared if target == METRICS_DIR]
    assert source in (compose.get("volumes") or {}), "a named volume, not a host path"


@pytest.fixture
def health_server():
    """A local HTTP server whose /healthz answers with the status in `state['status']`."""
    state = {"status": 200}

    class Handler(QuietHandler):
        def do_GET(self):
            body = b'{"status": "ok"}'
            self.send_response(state["status"] if self.path == "/healthz" else 404)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    server = LocalServer(Handler)
    state["port"] = server.port
    yield state
    server.close()


def test_the_web_healthcheck_passes_on_200_and_fails_on_503(services, health_server):
    """Run the healthcheck's own command, pointed at a local server instead of the container's."""
    argv = _argv(services["web"]["healthcheck"]["test"])[1:]
    assert "localhost:8000" in argv[-1]
    argv[-1] = argv[-1].replace("localhost:8000", f"127.0.0.1:{health_server['port']}")
    argv[0] = sys.executable

    def check() -> int:
        return subprocess.run(argv, capture_output=True, timeout=30).returncode

    assert check() == 0
    health_server["status"] = 503
    assert check() != 0


def test_the_dockerfile_installs_the_lock_and_runs_gunicorn_as_a_non_root_user():
    steps = _dockerfile_instructions()
    assert steps[0] == ("FROM", "python:3.11-slim")
    runs = [args for instruction, args in steps if instruction == "RUN"]
    assert any(re.search(r"\bpip install (.* )?-r requirements\.lock\b", args) for args in runs)
    copy_lock = steps.index(("COPY", "requirements.lock ./"))
    install = next(i for i, (instruction, args) in enumerate(steps)
                   if instruction == "RUN" and "requirements.lock" in args)
    copy_all = steps.index(("COPY", ". ."))
    assert copy_lock < install < copy_all, "dependencies are a cached layer below the code"

    env = " ".join(args for instruction, args in steps if instruction == "ENV")
    assert "PYTHONUNBUFFERED=1" in env.split()
    assert f"PROMETHEUS_MULTIPROC_DIR={METRICS_DIR}" in env.split()
    assert any("mkdir" in args and "PROMETHEUS_MULTIPROC_DIR" in args and "chown" in args for args in runs)

    users = [args for instruction, args in steps if instruction == "USER"]
    assert users and users[-1].split(":")[0] not in {"root", "0"}
    cmd = json.loads([args for instruction, args in steps if instruction == "CMD"][-1])
    assert cmd[:2] == ["gunicorn", "config.wsgi"]
    assert cmd[cmd.index("--bind") + 1] == "0.0.0.0:8000"


def test_the_build_context_leaves_out_local_state():
    ignored = set((ROOT / ".dockerignore").read_text().split())
    assert {".git", ".venv", ".data"} <= ignored
    # everything the image needs is still in the context
    for needed in ("requirements.lock", "manage.py", "config", "intake", "webhooks"):
        assert needed not in ignored


def _docker_compose() -> str:
    binary = shutil.which("docker-compose")
    assert binary, ("docker-compose is missing: "
                    "apt-get install -y --no-install-recommends docker-compose (CI's .ci/run does)")
    return binary


def _compose_env(**changes) -> dict:
    env = {**__import__("os").environ, **REQUIRED, **changes}
    return {key: value for key, value in env.items() if value is not None}


def test_docker_compose_accepts_the_file():
    result = subprocess.run([_docker_compose(), "-f", str(COMPOSE_FILE), "config", "-q"], cwd=ROOT,
                            capture_output=True, text=True, timeout=60, env=_compose_env())
    assert result.returncode == 0, result.stderr


@pytest.mark.parametrize("name", sorted(REQUIRED))
def test_docker_compose_refuses_to_start_without_each_secret(name):
    for missing in (None, ""):
        result = subprocess.run([_docker_compose(), "-f", str(COMPOSE_FILE), "config", "-q"], cwd=ROOT,
                                capture_output=True, text=True, timeout=60, env=_compose_env(**{name: missing}))
        assert result.returncode != 0
        assert f"set {name}" in result.stderr, result.stderr


def compose_subnet() -> str:
    return _defaults(yaml.safe_load(COMPOSE_FILE.read_text())["networks"]["default"]["ipam"]["config"][0]["subnet"])


def test_the_web_trusts_only_its_own_network_and_the_proxy_keeps_operator_surfaces_to_admin_networks(services):
    assert _environment(services["web"])["HERALD_TRUSTED_PROXIES"] == compose_subnet() == "172.31.240.0/24"
    proxy = services["proxy"]
    env = _environment(proxy)
    assert env["HERALD_ADMIN_NETWORKS"] == ""  # unset: nobody
    assert env["HERALD_PUBLIC_URL"] == ""
    filtered = re.fullmatch(r"\^\((.*)\)\$\$?", proxy["environment"]["NGINX_ENVSUBST_FILTER"]).group(1).split("|")
    template = (ROOT / "deploy" / "nginx" / "herald.conf.template").read_text()
    assert set(filtered) == set(re.findall(r"\$\{(\w+)\}", template))  # every variable the template names
    mounts = {str(volume).split(":")[1]: str(volume).split(":")[0] for volume in proxy["volumes"]}
    script = mounts["/docker-entrypoint.d/15-herald-admin-networks.sh"]
    assert (ROOT / script).stat().st_mode & 0o111, "the image runs only executable scripts"


def test_docker_compose_validation_really_rejects_a_broken_file(tmp_path):
    """The check above is worth something only if the validator rejects mistakes."""
    broken = yaml.safe_load(COMPOSE_FILE.read_text())
    broken["services"]["web"]["depends_on"]["migrate"]["condition"] = "service_finished"
    path = tmp_path / "docker-compose.yml"
    path.write_text(yaml.safe_dump(broken))
    (tmp_path / "Dockerfile").write_text(DOCKERFILE.read_text())
    result = subprocess.run([_docker_compose(), "-f", str(path), "config", "-q"], cwd=tmp_path,
                            capture_output=True, text=True, timeout=60, env=_compose_env())
    assert result.returncode != 0
    assert "service_finished" in result.stderr


def test_workers_and_web_scale_with_compose(services):
    """`docker compose up --scale web=3 --scale worker=4` needs services with no fixed name and no published port."""
    for name in ("web", "worker"):
        assert "container_name" not in services[name] and "ports" not in services[name], name
    assert "container_name" not in services["beat"]  # beats may run side by side too (config/beat.py)
