"""Walk README.md as a newcomer does: every code block and command line, in order.

A fresh copy of the checkout runs `make demo` (its own venv). The Install section's
commands install the package, as a user's project would, into fresh venvs, and that
environment runs the service example and the command line in a project folder of its
own. The Spark snippet runs last, on the dev venv's Python (the one with pyspark), as a
script with nothing set for Spark's workers. The README's code is run as it is written:
the only substitution is the checkout's path for ``/path/to/mqstore``.

Every block the README holds is either walked here or skipped with its reason, so a new
block cannot slip past (test_every_block_of_the_readme_is_walked).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import attrs
import pytest

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
INSTALL_TIMEOUT_S = 600
RUN_TIMEOUT_S = 300

pytestmark = pytest.mark.slow


@attrs.frozen
class Block:
    section: str  # the nearest heading above the block
    kind: str  # "sh", "python", or "console" (an indented block of shell lines)
    lines: tuple[str, ...]

    @property
    def text(self) -> str:
        return "\n".join(self.lines) + "\n"


def readme_blocks(text: str) -> list[Block]:
    """The fenced blocks and the indented (4-space) command blocks, in order."""
    blocks: list[Block] = []
    section = ""
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("#"):
            section = line.lstrip("#").strip()
        elif line.startswith("```"):
            kind = line[3:].strip()
            end = lines.index("```", i + 1)
            blocks.append(Block(section, kind, tuple(lines[i + 1 : end])))
            i = end
        elif line.startswith("    ") and (i == 0 or not lines[i - 1].strip()):
            end = i
            while end < len(lines) and lines[end].startswith("    "):
                end += 1
            blocks.append(Block(section, "console", tuple(x[4:] for x in lines[i:end])))
            i = end - 1
        i += 1
    return blocks


BLOCKS = readme_blocks(README.read_text())
WALK = [  # (section, kind) of every block, in the README's order
    ("mqstore", "sh"),
    ("Install", "sh"),
    ("Use it inside a service", "python"),
    ("Command line", "console"),
    ("Serve it to other processes: Kafka's protocol", "python"),
    ("Spark", "python"),
]


def block(section: str) -> Block:
    (found,) = [b for b in BLOCKS if b.section == section]
    return found


def run(command: list[str] | str, cwd: Path, env: dict[str, str], timeout: float = RUN_TIMEOUT_S):
    result = subprocess.run(
        command,
        cwd=cwd,
        env=env,
        shell=isinstance(command, str),
        executable="/bin/bash" if isinstance(command, str) else None,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert result.returncode == 0, (command, result.stdout[-3000:], result.stderr[-3000:])
    return result


def clean_env(**extra: str) -> dict[str, str]:
    """A newcomer's shell: no venv active, nothing of ours or of Spark's set."""
    env = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith(("MQSTORE_", "PYSPARK_", "VIRTUAL_ENV", "PYTHON", "MAKE", "MFLAGS"))
    }
    venv_bin = str(Path(sys.executable).parent)
    env["PATH"] = os.pathsep.join(p for p in env["PATH"].split(os.pathsep) if p != venv_bin)
    return {**env, **extra}


@pytest.fixture(scope="module")
def newcomer(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Folders of one walk: a copy of the checkout, venvs, and a project folder."""
    base = tmp_path_factory.mktemp("newcomer")
    (base / "project").mkdir()
    return {"base": base, "project": base / "project"}


def test_every_block_of_the_readme_is_walked() -> None:
    assert [(b.section, b.kind) for b in BLOCKS] == WALK


def test_make_demo_on_a_fresh_copy(newcomer: dict[str, Path]) -> None:
    first = block("mqstore")
    assert first.lines[0].startswith("make demo")
    assert first.lines[1].startswith("make test")  # skipped: it is the command running this
    clone = newcomer["base"] / "clone"
    files = subprocess.run(
        ["git", "ls-files", "-co", "--exclude-standard", "-z"],
        cwd=ROOT,
        capture_output=True,
        check=True,
    ).stdout.split(b"\0")
    for name in filter(None, files):
        source = ROOT / os.fsdecode(name)
        if source.suffix == ".so" or not os.path.lexists(source):
            continue
        target = clone / os.fsdecode(name)
        target.parent.mkdir(parents=True, exist_ok=True)
        if source.is_symlink():
            os.symlink(os.readlink(source), target)
        else:
            shutil.copy2(source, target)
    out = run("make demo", clone, clean_env(), timeout=INSTALL_TIMEOUT_S).stdout
    assert out.splitlines()[-1] == "done", out[-2000:]  # the main job ran to its end
    assert (clone / "demo-data" / "commitlog").is_dir()
    # The demo installs the package alone: no dev tools, no Spark.
    python = clone / ".venv" / "bin" / "python"
    for absent in ("pytest", "pyspark"):
        probe = subprocess.run([python, "-c", f"import {absent}"], capture_output=True)
        assert probe.returncode != 0, f"make demo installed {absent}"


@pytest.mark.parametrize("line", [0, 2], ids=["from-a-checkout", "a-wheel"])
def test_install_into_a_fresh_environment(newcomer: dict[str, Path], line: int) -> None:
    """Line 1 (from a checkout) and line 3 (a wheel); line 2 adds the spark extra,
    which is what `make test` (running this) installs, and takes minutes to build."""
    command = block("Install").lines[line].replace("/path/to/mqstore", str(ROOT))
    venv = newcomer["base"] / f"venv{line}"
    run([sys.executable, "-m", "venv", str(venv)], newcomer["base"], clean_env())
    env = clean_env(PATH=f"{venv / 'bin'}{os.pathsep}{clean_env()['PATH']}")
    run(command, newcomer["base"], env, timeout=INSTALL_TIMEOUT_S)
    python = str(venv / "bin" / "python")
    native = "import mqstore.commitlog.native as n; assert n.NATIVE is not None"
    run([python, "-c", native], newcomer["base"], env)
    run([str(venv / "bin" / "mqstore"), "--help"], newcomer["base"], env)
    # One name of ours in site-packages (and the PySpark hook), none of other projects'.
    site = Path(run([python, "-c", "import site; print(site.getsitepackages()[0])"],
                    newcomer["base"], env).stdout.strip())  # fmt: skip
    ours = {p.name for p in site.iterdir() if p.name.startswith(("mqstore", "pyspark_mq"))}
    assert {n for n in ours if not n.endswith(".dist-info")} == {"mqstore", "pyspark_mqstore.py"}
    for room in ("commitlog", "consumequeue", "indexfile", "dispatch", "segmented"):
        assert not (site / room).exists(), room
        probe = subprocess.run([python, "-c", f"import {room}"], cwd=newcomer["base"],
                               env=env, capture_output=True)  # fmt: skip
        assert probe.returncode != 0, f"installing mqstore claimed the top-level name {room}"
    newcomer["python"] = Path(python)


def _user_env(newcomer: dict[str, Path]) -> dict[str, str]:
    if "python" not in newcomer:
        pytest.skip("the install step failed")
    bin_dir = newcomer["python"].parent
    return clean_env(PATH=f"{bin_dir}{os.pathsep}{clean_env()['PATH']}")


def test_the_service_example(newcomer: dict[str, Path]) -> None:
    env = _user_env(newcomer)
    script = newcomer["project"] / "service.py"
    script.write_text(block("Use it inside a service").text)
    run([str(newcomer["python"]), str(script)], newcomer["project"], env)
    verify = [str(newcomer["python"]), "-c", CHECK_SERVICE]
    assert run(verify, newcomer["project"], env).stdout.split() == ["1", "8"]


CHECK_SERVICE = """
from mqstore import MessageStore
with MessageStore.open("./data", read_only=True) as store:
    total = sum(store.max_offset("orders", q) for q in range(8))
    print(total, store.describe_topic("orders").partitions)
"""


def test_the_command_line(newcomer: dict[str, Path]) -> None:
    """Each line in one shell, as typed; the --follow consumer is stopped with Ctrl-C."""
    env = _user_env(newcomer)
    exports: list[str] = []
    for line in block("Command line").lines:
        if line.startswith("export "):
            exports.append(line)
            continue
        script = "set -euo pipefail\n" + "\n".join(exports) + "\n" + line + "\n"
        if "--follow" in line:
            process = subprocess.Popen(
                ["/bin/bash", "-c", script],
                cwd=newcomer["project"],
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                start_new_session=True,
            )
            time.sleep(3)
            os.killpg(process.pid, signal.SIGINT)  # Ctrl-C reaches the terminal's group
            out, err = process.communicate(timeout=60)
            assert process.returncode == 0, (line, out[-2000:], err[-2000:])
            continue
        run(script, newcomer["project"], env)

    # What the lines did: the file's records are found by key, and the --follow
    # consumer of group billing read every partition to its end and committed.
    def json_of(command: str) -> list[dict]:
        out = run("\n".join([*exports, command]), newcomer["project"], env).stdout
        return [json.loads(line) for line in out.splitlines()]

    (found,) = json_of("mqstore query-key orders order-42 --json")
    assert found["value"] == '{"amount": 7}'
    offsets = json_of("mqstore offsets orders --group billing --json")
    assert len(offsets) == 8
    assert all(row["committed"] == row["latest"] for row in offsets), offsets
    assert sum(row["latest"] for row in offsets) == 1 + 2 + 100  # service, file, seq


def test_the_broker_snippet(tmp_path: Path) -> None:
    """The embedded broker with a real Kafka client, on the dev venv's Python (the
    broker extra's codec and kafka-python are dev dependencies too)."""
    script = tmp_path / "broker.py"
    script.write_text(block("Serve it to other processes: Kafka's protocol").text)
    out = run([sys.executable, str(script)], tmp_path, clean_env()).stdout.splitlines()
    assert out[-2:] == ["[(b'user-7', b'home')]", "b'home'"], out


def test_the_spark_snippet(newcomer: dict[str, Path]) -> None:
    """The snippet as a script on the dev venv's Python (which has pyspark), with
    neither PYSPARK_PYTHON nor an activated venv: Spark's workers would run python3."""
    pytest.importorskip("pyspark")
    if not (newcomer["project"] / "data").exists():
        pytest.skip("the service example did not run")
    script = newcomer["project"] / "spark_job.py"
    script.write_text(
        block("Spark").text
        + "rows = df.select('value').collect()\n"
        + "print('rows', len(rows))\n"
        + "spark.stop()\n"
    )
    env = clean_env(SPARK_LOCAL_IP="127.0.0.1")
    out = run([sys.executable, str(script)], newcomer["project"], env).stdout
    counted = re.search(r"^rows (\d+)$", out, re.M)
    assert counted is not None, out
    assert int(counted.group(1)) >= 1 + 2 + 100  # the service's order, the file's, seq's
