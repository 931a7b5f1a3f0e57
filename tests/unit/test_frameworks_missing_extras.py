"""A framework adapter asked for without its extra raises MissingExtra naming the extra."""

from __future__ import annotations

import sys

import pytest

from agent_client.frameworks import ADAPTERS, MissingExtra, adapter
from agent_client.remote import RemoteTool
from agent_client.toolset import RemoteToolset
from wire.models import ToolSpec

SPEC = ToolSpec(
    name="search", description="Search.", parameters={"type": "object", "properties": {}}
)


def test_locus_without_its_extra_raises_missing_extra_naming_toolexec_locus(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "locus", None)

    with pytest.raises(MissingExtra, match=r"pip install 'toolexec\[locus\]'"):
        RemoteTool(SPEC).as_locus()


def test_pydantic_ai_without_its_extra_raises_missing_extra_naming_toolexec_pydantic_ai(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "pydantic_ai", None)
    # The adapter imports pydantic-ai once, on its own first import: forget any earlier one.
    monkeypatch.delitem(sys.modules, "agent_client.frameworks.pydantic_ai", raising=False)

    with pytest.raises(MissingExtra, match=r"pip install 'toolexec\[pydantic-ai\]'"):
        RemoteTool(SPEC).as_pydantic_ai()


def test_lazybridge_without_its_extra_raises_missing_extra_naming_toolexec_lazybridge(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "lazybridge", None)
    monkeypatch.delitem(sys.modules, "agent_client.frameworks.lazybridge", raising=False)

    with pytest.raises(MissingExtra, match=r"pip install 'toolexec\[lazybridge\]'"):
        RemoteTool(SPEC).as_tools()


def test_the_lazybridge_test_helper_without_its_extra_raises_missing_extra_naming_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import importlib

    monkeypatch.setitem(sys.modules, "lazybridge", None)
    # agent_client.testing imports LazyBridge once, on its own first import: forget any earlier one.
    monkeypatch.delitem(sys.modules, "agent_client.testing", raising=False)

    with pytest.raises(MissingExtra, match=r"pip install 'toolexec\[lazybridge\]'") as raised:
        importlib.import_module("agent_client.testing")

    assert str(raised.value).startswith("agent_client.testing (scripted LazyBridge agents) support")


def test_require_names_the_framework_the_extra_and_the_module_it_could_not_import(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from agent_client.frameworks import require

    monkeypatch.setitem(sys.modules, "some_framework_pkg", None)

    with pytest.raises(MissingExtra) as raised:
        require("some_framework_pkg", extra="some-extra", framework="Some Framework")

    message = str(raised.value)
    assert message.startswith("Some Framework support needs the toolexec[some-extra] extra")
    assert "'some_framework_pkg'" in message
    assert isinstance(raised.value, ImportError)


def test_langchain_without_its_extra_raises_missing_extra_naming_toolexec_langchain(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "langchain_core", None)
    # The adapter imports langchain-core once, on its own first import: forget any earlier one.
    monkeypatch.delitem(sys.modules, "agent_client.frameworks.langchain", raising=False)

    with pytest.raises(MissingExtra, match=r"pip install 'toolexec\[langchain\]'"):
        RemoteTool(SPEC).as_langchain()

    with pytest.raises(MissingExtra, match=r"pip install 'toolexec\[langchain\]'"):
        RemoteToolset([RemoteTool(SPEC)]).as_langchain()


def test_openai_agents_without_its_extra_raises_missing_extra_naming_toolexec_openai_agents(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "agents", None)
    # The adapter imports the SDK once, on its own first import: forget any earlier one.
    monkeypatch.delitem(sys.modules, "agent_client.frameworks.openai_agents", raising=False)

    with pytest.raises(MissingExtra, match=r"pip install 'toolexec\[openai-agents\]'"):
        RemoteTool(SPEC).as_openai_agents()

    with pytest.raises(MissingExtra, match=r"pip install 'toolexec\[openai-agents\]'"):
        RemoteToolset([RemoteTool(SPEC)]).as_openai_agents()


def test_mcp_server_without_its_extra_raises_missing_extra_naming_toolexec_mcp(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import importlib

    from toolexec.cli import main

    monkeypatch.setitem(sys.modules, "mcp", None)
    # The server package imports mcp once, on its own first import: forget any earlier one.
    monkeypatch.delitem(sys.modules, "toolexec.mcp", raising=False)

    with pytest.raises(MissingExtra, match=r"pip install 'toolexec\[mcp\]'"):
        importlib.import_module("toolexec.mcp")

    assert main(["mcp"]) == 2
    assert "pip install 'toolexec[mcp]'" in capsys.readouterr().err


@pytest.mark.parametrize("framework", sorted(ADAPTERS))
def test_each_adapter_the_core_names_is_a_public_function_of_its_module(framework: str) -> None:
    # The core loads adapters by name (it imports none): each name must resolve, and be
    # what its module exports.
    module, function = ADAPTERS[framework]
    found = adapter(framework)

    assert callable(found) and found.__name__ == function
    assert function in sys.modules[module].__all__
