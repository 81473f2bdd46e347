"""The README runs as written: the ``sh`` blocks of "The first ten minutes" and "Use the timeout
center from your service", in order, in one shell, against the processes ``make run`` starts
(the Procfile's ``web``, ``celery`` and ``reminders`` lines, with the Makefile's settings), and
every answer the README shows is checked.

What runs is the README's text. The shell gets only what a second terminal in the project's
directory would have under ``make run``: no ``DEBUG``, no ``SECRET_KEY``; the database, Redis and
``var/`` of this test in place of the embedded defaults; ``COUPONCENTER_URL`` (the README's
``COUPONCENTER_URL=${COUPONCENTER_URL:-http://127.0.0.1:8000}``) set to the web process's address.
``curl`` is wrapped only to write each answer's status to stderr (``-w '%{stderr}...'``), which
leaves its output as it was.

How the README shows an answer, on the line right under a command:

- ``# -> 201 {"status": "scheduled", ...}``: the status, then the answer's JSON, where ``...``
  stands for the other members of an object or elements of a list, for any value, or inside a
  string for any text. Members not shown and not covered by ``...`` must not be there.
- ``# in 10 s -> 200 {...}``: words before the arrow say the answer comes later: the command is run
  again until it gives that answer (or the test's deadline passes).
- ``# -> 200`` checks the status alone; an answer that is not JSON (no status: not a ``curl``) is
  matched as text, ``...`` standing for any text.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
import urllib.request
import uuid
from dataclasses import dataclass
from pathlib import Path

import pytest
from django.conf import settings

from couponcenter.core.redis import broker_queue_delete
from couponcenter.coupons.bench.http import database_url, free_port
from reminders.engine import leases
from tests.e2e.conftest import Stack
from tests.support.checkout import checkout

ROOT = Path(__file__).resolve().parents[1]
SECTIONS = ("### The first ten minutes", "## Use the timeout center from your service")
# The Procfile's processes the README's blocks talk to (the embedded Redis, the expiry sweeper and
# the welcome box are not needed here).
PROCESSES = ("web", "celery", "reminders")
STEP_TIMEOUT_S = 20  # one command
LATER_TIMEOUT_S = 90  # an answer that comes later ("in 45 s -> ..."): a coupon opening, a reminder
ANY = "\u2026any"  # what ``...`` stands for once the shown answer is parsed
ANSWER = re.compile(r"^# (?:(?P<when>.+?) )?-> (?P<answer>.*)$")
HEREDOC = re.compile(r"<<-?\s*['\"]?(\w+)['\"]?")


# --- the README's blocks -------------------------------------------------------------------------


@dataclass
class Step:
    command: str
    answer: str | None = None  # as shown: "201 {...}"
    later: bool = False  # shown as coming later: run again until it comes

    def __str__(self) -> str:
        return self.command


def readme_blocks(text: str) -> list[str]:
    """The ``sh`` blocks of the sections in ``SECTIONS``, in order; a section ends at the next
    heading of any level."""
    blocks: list[str] = []
    lines = text.splitlines()
    for heading in SECTIONS:
        at = lines.index(heading) + 1
        block: list[str] | None = None
        while at < len(lines) and (block is not None or not re.match(r"#{1,6} ", lines[at])):
            line = lines[at]
            if block is None and line == "```sh":
                block = []
            elif block is not None and line == "```":
                blocks.append("\n".join(block))
                block = None
            elif block is not None:
                block.append(line)
            at += 1
    return blocks


def steps_of(block: str) -> list[Step]:
    """A block's commands: comments dropped, a command's continuation lines, multi-line quotes and
    here-documents kept with it (bash decides where a command ends), the answer shown under it."""
    steps: list[Step] = []
    lines = block.splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        shown = ANSWER.match(line)
        if shown and steps and steps[-1].answer is None:
            steps[-1].answer, steps[-1].later = shown["answer"], bool(shown["when"])
            i += 1
            continue
        if not line.strip() or line.lstrip().startswith("#"):
            i += 1
            continue
        command = [line]
        i += 1
        while not _complete(command):
            assert i < len(lines), f"a command never ends:\n{chr(10).join(command)}"
            command.append(lines[i])
            i += 1
        steps.append(Step("\n".join(command)))
    return steps


def _complete(lines: list[str]) -> bool:
    if lines[-1].endswith("\\"):
        return False
    for at, line in enumerate(lines):
        heredoc = HEREDOC.search(line)
        if heredoc and (at == len(lines) - 1 or lines[-1] != heredoc[1]):
            return False  # bash -n takes a here-document cut short for a whole one
    checked = subprocess.run(["bash", "-n"], input="\n".join(lines), capture_output=True, text=True)
    return checked.returncode == 0


# --- the answers ---------------------------------------------------------------------------------


def parse_shown(text: str) -> object:
    """The JSON of a shown answer, its ``...`` made into ``ANY`` (a member ``ANY: ANY`` in an
    object, an element or a value elsewhere)."""
    out: list[str] = []
    stack: list[str] = []
    i = 0
    in_string = False
    while i < len(text):
        char = text[i]
        if in_string:
            out.append(char)
            if char == "\\":
                out.append(text[i + 1])
                i += 1
            elif char == '"':
                in_string = False
        elif text.startswith("...", i):
            previous = "".join(out).rstrip()[-1:]
            member = stack and stack[-1] == "{" and previous in ("{", ",")
            out.append(f'"{ANY}": "{ANY}"' if member else f'"{ANY}"')
            i += 3
            continue
        else:
            if char == '"':
                in_string = True
            elif char in "{[":
                stack.append(char)
            elif char in "}]":
                stack.pop()
            out.append(char)
        i += 1
    return json.loads("".join(out))


def matches(shown: object, actual: object) -> bool:
    if shown == ANY:
        return True
    if isinstance(shown, dict):
        if not isinstance(actual, dict):
            return False
        more = ANY in shown
        keys = set(shown) - {ANY}
        if not keys <= set(actual) or (not more and set(actual) != keys):
            return False
        return all(matches(shown[k], actual[k]) for k in keys)
    if isinstance(shown, list):
        if not isinstance(actual, list):
            return False
        more = bool(shown) and shown[-1] == ANY
        items = shown[:-1] if more else shown
        if len(actual) < len(items) or (not more and len(actual) != len(items)):
            return False
        return all(matches(s, a) for s, a in zip(items, actual, strict=False))
    if isinstance(shown, str) and "..." in shown:
        pattern = ".*".join(re.escape(part) for part in shown.split("..."))
        return isinstance(actual, str) and re.fullmatch(pattern, actual, re.DOTALL) is not None
    return shown == actual


def answer_matches(shown: str, out: str, statuses: list[int]) -> bool:
    status = re.match(r"(\d{3})\b\s*", shown)
    if status:
        if not statuses or statuses[-1] != int(status[1]):
            return False
        shown = shown[status.end() :]
    if not shown:
        return True
    if shown[0] in "{[":
        try:
            actual = json.loads(out)
        except ValueError:
            return False
        return matches(parse_shown(shown), actual)
    return matches(shown, out.strip())


def test_the_parser_reads_what_the_readme_shows():
    """The notation itself, so that a README answer cannot pass by a parsing accident."""
    shown = parse_shown('{"a": 1, "b": ..., "c": [{"t": "x ... z", ...}], ...}')
    assert matches(shown, {"a": 1, "b": None, "c": [{"t": "x y z", "u": 2}], "d": 3})
    assert not matches(shown, {"a": 2, "b": 1, "c": [{"t": "x y z"}]})
    assert not matches(shown, {"a": 1, "c": [{"t": "x y z"}]})  # b is missing
    assert not matches(shown, {"a": 1, "b": 1, "c": [{"t": "x y"}]})
    exact = parse_shown('{"marked": 1}')
    assert matches(exact, {"marked": 1}) and not matches(exact, {"marked": 1, "more": 0})
    assert not matches(parse_shown('{"results": []}'), {"results": [1]})
    assert answer_matches('409 {"code": "not_open", ...}', '{"code": "not_open", "x": 1}', [409])
    assert not answer_matches('409 {"code": "not_open", ...}', '{"code": "not_open"}', [400])
    steps = steps_of('A=1\n# -> 200\ncurl -d @- <<EOF\n{"x":\n 1}\nEOF\n# later -> 201 {...}\n')
    assert [(s.command, s.answer, s.later) for s in steps] == [
        ("A=1", "200", False),
        ('curl -d @- <<EOF\n{"x":\n 1}\nEOF', "201 {...}", True),
    ]


# --- the processes `make run` starts, and a second terminal --------------------------------------


def procfile() -> dict[str, str]:
    lines = (ROOT / "Procfile").read_text().splitlines()
    return dict(m.groups() for line in lines if (m := re.match(r"^([\w-]+):\s*(.+)$", line)))


class Shell:
    """One bash for every step, so what a block sets stays set for the next."""

    def __init__(self, cwd: Path, env: dict[str, str], log_dir: Path) -> None:
        self.log_dir = log_dir
        self.count = 0
        self.bash = subprocess.Popen(["bash", "--norc", "--noprofile"], cwd=cwd, env=env,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, text=True)  # fmt: skip
        self._send("curl() { command curl -w '%{stderr}\\nHTTP %{http_code}\\n' \"$@\"; }")

    def _send(self, script: str) -> int:
        marker = f"__step_{uuid.uuid4().hex}__"
        self.bash.stdin.write(f"{script}\necho {marker} $?\n")
        self.bash.stdin.flush()
        while True:
            line = self.bash.stdout.readline()
            assert line, "the shell exited"
            if line.startswith(marker):
                return int(line.split()[1])

    def run(self, command: str) -> tuple[int, str, list[int]]:
        """The step's exit status, its output and the statuses of its ``curl`` calls."""
        self.count += 1
        out, err = self.log_dir / f"step-{self.count}.out", self.log_dir / f"step-{self.count}.err"
        # stdin from /dev/null: a command reading it must not eat the steps that follow.
        code = self._send(f"{{\n{command}\n}} >{out} 2>{err} </dev/null")
        statuses = [int(s) for s in re.findall(r"^HTTP (\d{3})$", err.read_text(), re.MULTILINE)]
        return code, out.read_text(), statuses

    def close(self) -> None:
        self.bash.stdin.close()
        self.bash.wait(timeout=10)


@pytest.fixture
def make_run(redis_prefix, tmp_path):
    """The project's directory, and the processes ``make run`` starts there: its commands before
    honcho (the database is migrated already), then the Procfile's lines."""
    where = checkout(tmp_path / "checkout")
    port = free_port()
    queue = f"readme-{uuid.uuid4().hex[:10]}"
    env = {
        **os.environ,
        "DEBUG": "1",  # the Makefile exports it
        "DATABASE_URL": database_url(),
        "DB_CONN_MAX_AGE": "0",
        "REDIS_URL": settings.REDIS_URL,
        "REDIS_KEY_PREFIX": redis_prefix,
        "CELERY_BROKER_URL": settings.CELERY_BROKER_URL,
        "DELIVERY_QUEUE": queue,  # Celery's default queue: this test's own
        "COUPONCENTER_VAR_DIR": str(where / "var"),
        "COUPONCENTER_REDIS_AUTOSTART": "0",
        "PROMETHEUS_MULTIPROC_DIR": str(where / "var" / "prometheus"),
        "WEB_HOST": "127.0.0.1",
        "WEB_PORT": str(port),
        "PYTHONPATH": str(ROOT),
        "PYTHONUNBUFFERED": "1",
    }
    env.pop("SECRET_KEY", None)
    stack = Stack(queue=queue, log_dir=tmp_path, env=env, cwd=where)
    url = f"http://127.0.0.1:{port}"
    for argv in (["seed_demo", "--url", url], ["ensure_demo_admin", "--url", f"{url}/admin/"]):
        subprocess.run([".venv/bin/python", "manage.py", *argv], cwd=where, env=env, check=True,
                       capture_output=True, timeout=120)  # fmt: skip
    lines = procfile()
    procs = {name: stack._start(name, ["sh", "-c", lines[name]]) for name in PROCESSES}
    try:
        stack._wait(procs["web"], lambda: _serving(url), timeout=120)
        stack._wait(procs["celery"], lambda: " ready." in procs["celery"].output(), timeout=120)
        stack._wait(procs["reminders"], leases.list_workers, timeout=120)
        yield where, url, stack, procs
    finally:
        stack.stop()
        broker_queue_delete(queue)


def _serving(url: str) -> bool:
    try:
        with urllib.request.urlopen(url + "/healthz/live/", timeout=2) as response:
            return response.status == 200
    except OSError:
        return False


def terminal_env(url: str) -> dict[str, str]:
    """A second terminal's environment under ``make run``: nothing of the Makefile's (``DEBUG``),
    this test's database, Redis and ``var/`` (stand-ins for the embedded defaults), and where the
    web process serves."""
    env = {k: v for k, v in os.environ.items() if k not in {"DEBUG", "SECRET_KEY"}}
    env.update(
        DATABASE_URL=database_url(),
        REDIS_URL=settings.REDIS_URL,
        REDIS_KEY_PREFIX=settings.REDIS_KEY_PREFIX,
        COUPONCENTER_REDIS_AUTOSTART="0",
        PYTHONPATH=str(ROOT),
        COUPONCENTER_URL=url,
    )
    return env


# --- the test ------------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_the_readme_blocks_run_and_answer_as_shown(make_run, tmp_path):
    where, url, stack, procs = make_run
    env = terminal_env(url)
    env["COUPONCENTER_VAR_DIR"] = str(where / "var")
    steps = [step for block in readme_blocks((ROOT / "README.md").read_text())
             for step in steps_of(block)]  # fmt: skip
    assert sum(s.answer is not None for s in steps) >= 15, "the README shows its answers"
    logs = tmp_path / "steps"
    logs.mkdir()
    shell = Shell(where, env, logs)
    try:
        for step in steps:
            _run(shell, step, stack)
    finally:
        shell.close()
    # Under `make run`: Celery's warning against root is not shown (the Procfile silences it), and
    # the expected 409s the README met are no warnings.
    assert "SecurityWarning" not in procs["celery"].output()
    web = procs["web"].output().splitlines()
    assert any(" 409 " in line for line in web)
    assert not [line for line in web if "WARNING" in line and " 409 " in line]


def _run(shell: Shell, step: Step, stack: Stack) -> None:
    deadline = time.monotonic() + (LATER_TIMEOUT_S if step.later else STEP_TIMEOUT_S)
    while True:
        code, out, statuses = shell.run(step.command)
        if step.answer is None and code == 0:
            return
        if code == 0 and answer_matches(step.answer, out, statuses):
            return
        if not step.later or time.monotonic() > deadline:
            raise AssertionError(
                f"the README's\n{step}\nexited {code} with statuses {statuses} and answered\n"
                f"{out}\nwhere the README shows\n{step.answer}\n\n{stack.logs()}"
            )
        time.sleep(0.5)  # an answer shown as coming later: ask again
