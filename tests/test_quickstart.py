"""The docs' first steps (docs/getting-started.md), run as written: `mmq up` in a directory
laid out like the repository's root (its `.venv` and `mmq.toml`) on a fresh data dir, then
every command of that page's `<!-- quickstart -->` block in one shell, as a newcomer
pastes them. Each must exit 0 and print what its `# → ` lines say (`…`: anything). Then
the Python client's example (docs/api/client.md), as written, on the same deployment.

It runs in a network namespace of its own, so that `localhost:8000`, which the commands
name, is this deployment's and nothing else's. The deployment is the shipped one, the
default LLM (SmolLM2-135M-Instruct) included."""

from __future__ import annotations

import os
import re
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from harness.netns import PREFIX, Network, unavailable
from tuning.deployment import REPO

QUICKSTART = REPO / "docs" / "getting-started.md"
"""The page whose `<!-- quickstart -->` block these tests read and run."""
MARK = "<!-- quickstart -->"
EXPECT = "# → "
READY_TIMEOUT_S = 300.0
STEPS_TIMEOUT_S = 300.0
STOP_TIMEOUT_S = 30.0


@dataclass
class Step:
    command: str
    expected: list[str] = field(default_factory=list)


def quickstart_steps(page: str) -> list[Step]:
    """The commands of the page's quickstart block, each with its `# → ` lines."""
    start = page.index(MARK)
    body = page[start:].split("```sh\n", 1)[1].split("\n```", 1)[0]
    steps: list[Step] = []
    pending = ""
    for line in body.splitlines():
        if not pending and line.startswith(EXPECT):
            steps[-1].expected.append(line[len(EXPECT) :])
            continue
        if not pending and (not line.strip() or line.startswith("#")):
            continue
        pending = f"{pending}\n{line}" if pending else line
        if not _complete(pending):
            continue
        steps.append(Step(pending))
        pending = ""
    assert not pending, f"the quickstart block ends inside a command: {pending!r}"
    return steps


def _complete(command: str) -> bool:
    """Whether the shell would run `command` as it stands (no open quote, no `\\` at the
    end of its last line)."""
    if command.endswith("\\"):
        return False
    try:
        shlex.split(command, comments=True)
    except ValueError:  # "No closing quotation"
        return False
    return True


def pattern(expected: str) -> re.Pattern[str]:
    """What a `# →` line promises, `…` standing for anything; in any case, since a
    transcript's first letter is Whisper's choice (tiny.en wrote "the weather is nice
    today." once in a full run for Piper's "The weather is nice today."). Where its
    punctuation is too (Piper's synthesis varies: "Good morning, how" one run, "Good
    morning. How" another), the page itself writes `…` there."""
    parts = (re.escape(part) for part in expected.split("…"))
    return re.compile(".*".join(parts), re.DOTALL | re.IGNORECASE)


def test_the_readme_block_is_read_as_commands_and_their_output() -> None:
    steps = quickstart_steps(QUICKSTART.read_text())
    commands = [step.command.split()[0] for step in steps]
    assert commands[0] == "source" and {"curl", "mmq"} <= set(commands)
    chat = next(step for step in steps if "/v1/chat/completions" in step.command)
    assert "\n" in chat.command and chat.expected  # a command over several lines
    assert all(step.expected for step in steps if step.command.startswith("mmq keys"))
    assert pattern("a…c").fullmatch("a\nbbc") and not pattern("a…c").fullmatch("ab")


@pytest.fixture(scope="module")
def host() -> Iterator[Network]:
    why = unavailable()
    if why is not None:
        pytest.skip(reason=f"network namespaces: {why}")
    with Network(tag=f"{PREFIX}{os.getpid()}q") as network:
        network.add_host("quickstart")
        yield network


def test_the_readme_first_steps_work_as_written(host: Network, tmp_path: Path) -> None:
    steps = quickstart_steps(QUICKSTART.read_text())
    root = tmp_path / "repo"  # the repository's root as the commands see it
    root.mkdir()
    (root / ".venv").symlink_to(Path(sys.prefix))
    (root / "mmq.toml").symlink_to(REPO / "mmq.toml")
    env = {k: v for k, v in os.environ.items() if not k.startswith("MMQ_")}
    env.pop("VIRTUAL_ENV", None)
    env["PATH"] = ":".join(p for p in env["PATH"].split(":") if not p.startswith(sys.prefix))
    wrap = host.hosts["quickstart"].wrap()

    log_path = tmp_path / "up.log"
    with log_path.open("w") as log:
        up = subprocess.Popen(
            [*wrap, ".venv/bin/mmq", "up"], cwd=root, env=env, stdout=log,
            stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
    try:
        _wait_for_ready(up, log_path)
        script = _script(steps)
        done = subprocess.run(
            [*wrap, "bash", "-c", script], cwd=root, env=env, capture_output=True, text=True,
            timeout=STEPS_TIMEOUT_S,
        )  # fmt: skip
        outputs = _outputs(done.stdout)
        assert len(outputs) == len(steps), (done.stdout, done.stderr)
        for n, (step, (code, output)) in enumerate(zip(steps, outputs, strict=True)):
            said = f"step {n}: {step.command}\nexit {code}, printed:\n{output}\n{done.stderr}"
            assert code == 0, said
            for expected in step.expected:
                assert pattern(expected).search(output), f"{expected!r} not printed by {said}"
        # The Python client's example (docs/api/client.md), as written, on the same
        # deployment: a noop job, its events, its output.
        client = _python_example(REPO / "docs" / "api" / "client.md", "from mmq.client import")
        ran = subprocess.run(
            [*wrap, ".venv/bin/python", "-c", client], cwd=root, env=env, capture_output=True,
            text=True, timeout=STEPS_TIMEOUT_S,
        )  # fmt: skip
        assert ran.returncode == 0, ran.stdout + ran.stderr
        assert "status {'status': 'queued'}" in ran.stdout, ran.stdout
        assert ran.stdout.rstrip().endswith("{'payload': 'hi'}"), ran.stdout
    finally:
        _stop(up)
    assert up.returncode == 0, log_path.read_text()[-3000:]
    assert "ready" in log_path.read_text()


def _python_example(page: Path, marker: str) -> str:
    """The ```python block of `page` that holds `marker`."""
    blocks = re.findall(r"^```python\n(.*?)^```", page.read_text(), re.M | re.S)
    (code,) = [block for block in blocks if marker in block]
    return str(code)


def _script(steps: list[Step]) -> str:
    """One shell runs them all (`source` carries over), each followed by a line that
    marks where its output ends and its exit code."""
    lines = []
    for n, step in enumerate(steps):
        lines.append(step.command)
        lines.append(f"printf '\\n@@step {n} %s@@\\n' \"$?\"")
    return "\n".join(lines) + "\n"


def _outputs(stdout: str) -> list[tuple[int, str]]:
    found = []
    rest = stdout
    for match in re.finditer(r"\n@@step (\d+) (\d+)@@\n", stdout):
        output, rest = rest.split(match.group(0), 1)
        found.append((int(match.group(2)), output))
    return found


def _wait_for_ready(up: subprocess.Popen[bytes], log_path: Path) -> None:
    """Until `mmq up` prints its `ready` line (its /readyz answered 200)."""
    deadline = time.monotonic() + READY_TIMEOUT_S
    while time.monotonic() < deadline:
        if re.search(r"^ready\b", log_path.read_text(), re.MULTILINE):
            return
        if up.poll() is not None:
            pytest.fail(f"mmq up exited with {up.returncode}:\n{log_path.read_text()[-4000:]}")
        time.sleep(0.2)
    pytest.fail(f"mmq up not ready in {READY_TIMEOUT_S}s:\n{log_path.read_text()[-4000:]}")


def _stop(up: subprocess.Popen[bytes]) -> None:
    """Ctrl-C, as in the quick start; SIGKILL to the group if it does not stop in time."""
    if up.poll() is None:
        os.killpg(up.pid, signal.SIGINT)
        try:
            up.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            os.killpg(up.pid, signal.SIGKILL)
            up.wait(10)
