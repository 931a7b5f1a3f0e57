"""``toolexec cancel`` and the exit code of a cancelled call."""

from __future__ import annotations

import io

import pytest

from agent_client import ToolCancelled
from toolexec.commands.call import exit_code_for
from toolexec.commands.cancel import cancel_call_command
from toolexec.commands.exits import CommandFailed, ExitCode


def test_a_cancelled_call_exits_nine() -> None:
    assert exit_code_for(ToolCancelled("search")) is ExitCode.CANCELLED == 9


def test_a_blank_call_id_is_bad_usage_before_anything_is_sent() -> None:
    with pytest.raises(CommandFailed, match="give the call's id") as failed:
        cancel_call_command(None, "  ", as_json=False, out=io.StringIO())  # type: ignore[arg-type]
    assert failed.value.code is ExitCode.BAD_ARGUMENTS
