"""docker-compose.yml and the Dockerfile, read as data (Docker does not run here).

Each service's command is parsed by the ``toolexec`` command's own parser (typer), so a
renamed option or a pool that does not exist fails here, not on a server.
``tests/integration/test_compose_services.py`` runs each service's command on this
machine.
"""

from __future__ import annotations

import re
import shlex
import tomllib
from pathlib import Path
from typing import Any

import pytest
import typer
import yaml

import executor
from executor.seams.app import import_tool_modules
from toolexec.cli import app
from wire.settings import Settings

ROOT = Path(__file__).resolve().parents[2]
COMPOSE_TEXT = (ROOT / "docker-compose.yml").read_text()
COMPOSE: dict[str, Any] = yaml.safe_load(COMPOSE_TEXT)
SERVICES: dict[str, dict[str, Any]] = COMPOSE["services"]
DOCKERFILE = (ROOT / "Dockerfile").read_text()


def toolexec_context(words: list[str]) -> tuple[str, dict[str, Any]]:
    """Parse ``toolexec WORDS`` with the command's parser: (subcommand, its parameters).

    Raises:
        typer's UsageError: An unknown command or option, or a bad value.
    """
    group = typer.main.get_command(app)
    parent = group.make_context("toolexec", list(words), resilient_parsing=True)
    name, command, rest = group.resolve_command(parent, list(words))  # type: ignore[attr-defined]
    assert command is not None and name is not None, f"toolexec has no command {words[0]!r}"
    context = command.make_context(name, rest, parent=parent)
    return name, dict(context.params)


def shell_words(test: list[str]) -> list[str]:
    """A healthcheck's command as words (``CMD`` or ``CMD-SHELL``), up to a redirection."""
    kind, *rest = test
    if kind == "CMD":
        return rest
    assert kind == "CMD-SHELL"
    words = shlex.split(rest[0].replace("$$", "$"))
    return words[: next((i for i, w in enumerate(words) if w in (">", "|", "&&")), len(words))]


def worker_services() -> dict[str, dict[str, Any]]:
    """Services whose command is ``toolexec worker ...``, by name."""
    return {
        name: s
        for name, s in SERVICES.items()
        if s.get("command", [])[:2] == ["toolexec", "worker"]
    }


def test_every_service_has_a_healthcheck() -> None:
    for name, service in SERVICES.items():
        check = service.get("healthcheck")
        assert check and check.get("test"), f"{name} has no healthcheck"
        assert check["test"][0] in ("CMD", "CMD-SHELL"), name


def test_redis_keeps_an_append_only_file_and_takes_its_password_from_the_environment() -> None:
    redis = SERVICES["redis"]
    command = redis["command"]

    assert command[0] == "redis-server"
    assert command[command.index("--appendonly") + 1] == "yes"
    assert command[command.index("--requirepass") + 1].startswith("${REDIS_PASSWORD:?")
    assert command[command.index("--maxmemory-policy") + 1] == "noeviction"
    assert any(
        volume.endswith(":/data") for volume in redis["volumes"]
    )  # the AOF outlives the container
    assert "$$REDIS_PASSWORD" in redis["healthcheck"]["test"][1]
    assert redis["environment"]["REDIS_PASSWORD"].startswith("${REDIS_PASSWORD:?")


def test_every_toolexec_process_reaches_redis_with_the_password_from_the_environment() -> None:
    for name, service in SERVICES.items():
        url = service.get("environment", {}).get("TOOLEXEC_BROKER_URL")
        if name != "redis":
            assert url is not None, name
            assert re.fullmatch(r"redis://:\$\{REDIS_PASSWORD(:\?[^}]*)?\}@redis:6379/\d+", url), (
                url
            )


def test_every_published_port_is_bound_to_127_0_0_1() -> None:
    published = {name: s.get("ports", []) for name, s in SERVICES.items()}

    assert published["flower"] == ["127.0.0.1:5555:5555"]
    for name, ports in published.items():
        assert all(str(port).startswith("127.0.0.1:") for port in ports), name


def test_no_pickle_anywhere() -> None:
    assert "pickle" not in COMPOSE_TEXT.lower()
    assert "pickle" not in DOCKERFILE.lower()


def test_each_queue_has_its_own_worker_service_with_limits() -> None:
    queues: dict[str, str] = {}
    for name, service in worker_services().items():
        command, params = toolexec_context(service["command"][1:])
        assert command == "worker"
        assert params["queues"], f"{name} must name its queue"
        for queue in params["queues"]:
            assert queue not in queues, f"{queue} is consumed by {queues[queue]} and {name}"
            queues[queue] = name
        limits = service["deploy"]["resources"]["limits"]
        assert float(limits["cpus"]) > 0 and limits["memory"], name
        assert params["concurrency"] is not None, f"{name} must size its pool"

    assert {"default", "payments"} <= set(queues)
    assert len(worker_services()) >= 2


def test_every_queue_a_served_tool_names_has_a_worker_service() -> None:
    modules = {s["environment"]["TOOLEXEC_TOOL_MODULES"] for s in worker_services().values()}
    assert len(modules) == 1, "every worker must serve the same tools"
    settings = Settings.from_env({"TOOLEXEC_TOOL_MODULES": modules.pop()})
    import_tool_modules(settings)
    consumed = {
        q
        for s in worker_services().values()
        for q in toolexec_context(s["command"][1:])[1]["queues"]
    }

    # Only the tools these modules register: another test in this process may have
    # registered tools of its own (e.g. the deploy tests' queue).
    named = {
        definition.spec.queue
        for definition in executor.registered_tools().values()
        if any(
            definition.func.__module__ == module
            or definition.func.__module__.startswith(f"{module}.")
            for module in settings.tool_modules
        )
    }
    assert named, "the served modules register no tool"

    assert named <= consumed


@pytest.mark.parametrize("name", sorted(SERVICES))
def test_each_command_and_healthcheck_that_runs_toolexec_parses_with_its_cli(name: str) -> None:
    service = SERVICES[name]
    commands = [service.get("command", []), shell_words(service["healthcheck"]["test"])]
    for words in commands:
        if words[:1] == ["toolexec"]:
            toolexec_context(words[1:])  # raises on an unknown command, option or value
        elif words[:1] == ["celery"]:
            assert words[1:3] == ["-A", "executor"], words


def test_worker_healthchecks_ask_status_for_this_containers_worker() -> None:
    for name, service in worker_services().items():
        command, params = toolexec_context(shell_words(service["healthcheck"]["test"])[1:])
        assert (command, params["only"]) == ("status", "$HOSTNAME"), name
        node = toolexec_context(service["command"][1:])[1]["hostname"]
        assert node.endswith("@%h"), (
            f"{name}: the node name must carry the host name status matches"
        )


def test_every_worker_serves_metrics_on_every_interface_of_its_container_and_publishes_no_port() -> (  # noqa: E501
    None
):
    for name, service in worker_services().items():
        params = toolexec_context(service["command"][1:])[1]
        settings = Settings.from_env(
            {**service["environment"], "TOOLEXEC_BROKER_URL": "redis://redis:6379/0"}
        )
        assert params["metrics_port"] is not None, f"{name} serves no metrics"
        # The container's interfaces: a Prometheus on the compose network can scrape it.
        assert (params["metrics_host"] or settings.metrics_host) == "0.0.0.0", name
        assert "ports" not in service, f"{name} publishes a port on the host"


#: pip options that take a value as the next word.
PIP_VALUE_OPTIONS = {
    "--wheel-dir",
    "-w",
    "--find-links",
    "-f",
    "--target",
    "-t",
    "--index-url",
    "-i",
}


def pip_requirements() -> list[str]:
    """What each ``pip install`` and ``pip wheel`` of the Dockerfile's RUN steps installs."""
    steps = re.sub(r"\\\n", " ", DOCKERFILE)  # join continued lines
    found = []
    for line in steps.splitlines():
        if not line.startswith("RUN "):
            continue
        for segment in line.split("&&"):
            words = shlex.split(segment)
            if "pip" not in words or words[words.index("pip") + 1 :][:1] not in (
                ["install"],
                ["wheel"],
            ):
                continue
            rest = words[words.index("pip") + 2 :]
            skip = False
            for word in rest:
                if skip:
                    skip = False
                elif word.startswith("-"):
                    skip = word in PIP_VALUE_OPTIONS
                else:
                    found.append(word)
    return found


def test_the_dockerfile_installs_the_project_from_its_metadata_and_no_hand_list() -> None:
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]
    requirements = pip_requirements()

    assert requirements, "the Dockerfile installs nothing with pip"
    for requirement in requirements:
        match = re.fullmatch(r"(\.|toolexec)(\[([\w,-]+)\])?", requirement)
        assert match, f"{requirement!r} is not the project itself"
        for extra in (match.group(3) or "").split(","):
            assert not extra or extra in extras, f"no extra {extra!r} in pyproject.toml"
    assert "COPY pyproject.toml" in DOCKERFILE
