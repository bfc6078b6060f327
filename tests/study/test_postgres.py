"""A study on a real PostgreSQL server, started by the test from the Debian packages (initdb, pg_ctl):
two drivers in two processes, each with a local dir of its own for its log, share the study through the
server alone; every trial runs once and the result equals the SQLite study's. And a login the server
refuses is one line without the password.

Skipped, with one line naming what to install, without the server binaries (apt-get install postgresql;
`make install` installs them where apt is available) or the driver (pip install 'mars-harness[postgres]').
"""

from __future__ import annotations

import os
import pwd
import shutil
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from study_helpers import FAKE_COMMAND, REPO, driver_of, run_fake, smoke_spec, study_of, trials_of

pytestmark = pytest.mark.slow

PASSWORD = "pg-s3cret"
USER = "mars"


def _binary(name: str) -> str | None:
    for d in sorted(Path("/usr/lib/postgresql").glob("*/bin"), reverse=True):  # Debian's layout
        if (d / name).is_file():
            return str(d / name)
    return shutil.which(name)


def _as_server_user() -> list[str]:
    """initdb and postgres refuse to run as root: as root, run them as the Debian package's user."""
    if os.geteuid() != 0:
        return []
    try:
        pwd.getpwnam("postgres")
    except KeyError:
        pytest.skip(
            "running as root and there is no postgres user to run the server as (apt-get install postgresql)"
        )
    return ["runuser", "-u", "postgres", "--"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def server():
    """(host, port) of a PostgreSQL server in a temporary dir, password login for USER."""
    pytest.importorskip("psycopg", reason="psycopg is not installed: pip install 'mars-harness[postgres]'")
    initdb, pg_ctl = _binary("initdb"), _binary("pg_ctl")
    if not initdb or not pg_ctl:
        pytest.skip("the PostgreSQL server binaries (initdb, pg_ctl) are missing: apt-get install postgresql")
    as_user = _as_server_user()
    root = Path(
        tempfile.mkdtemp(prefix="mars-postgres-")
    )  # not under pytest's dirs, which only root can enter
    data, pwfile = root / "data", root / "pw"
    pwfile.write_text(PASSWORD + "\n")
    if as_user:
        shutil.chown(root, "postgres")
        shutil.chown(pwfile, "postgres")
    port = _free_port()

    def run(*args):
        proc = subprocess.run([*as_user, *args], capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, f"{args[0]}: {proc.stdout}{proc.stderr}"

    run(initdb, "-D", str(data), "-U", USER, f"--pwfile={pwfile}", "--auth=scram-sha-256", "-E", "UTF8")
    options = f"-p {port} -k {root} -c listen_addresses=127.0.0.1 -c fsync=off"
    run(pg_ctl, "-D", str(data), "-o", options, "-l", str(root / "server.log"), "-w", "start")
    try:
        import psycopg

        with psycopg.connect(
            host="127.0.0.1", port=port, user=USER, password=PASSWORD, dbname="postgres", autocommit=True
        ) as c:
            c.execute("CREATE DATABASE study")
        yield "127.0.0.1", port
    finally:
        subprocess.run([*as_user, pg_ctl, "-D", str(data), "-m", "immediate", "stop"], capture_output=True)
        shutil.rmtree(root, ignore_errors=True)


def test_two_drivers_in_two_processes_share_a_study_through_postgres(tmp_path, server, data_root):
    host, port = server
    url = f"postgresql://{USER}:{PASSWORD}@{host}:{port}/study"
    shared, ledger = tmp_path / "shared" / "study", tmp_path / "shared" / "ledger.txt"
    env = {**os.environ, "PYTHONPATH": str(REPO), "WANDB_MODE": "disabled", "OMP_NUM_THREADS": "1"}
    env.update(FAKE_SLEEP="0.3", FAKE_LEDGER=str(ledger))
    command = [
        sys.executable,
        str(REPO / "scripts" / "study.py"),
        "study=smoke",
        f"study.dir={shared}",
        f"study.storage={url}",
        f"data.root={data_root}",
        f"study.launcher.command=[{','.join(FAKE_COMMAND)}]",
    ]
    drivers = []
    for name in ("machine_a", "machine_b"):  # each driver's own local dir, its log in it
        local = tmp_path / name
        local.mkdir()
        log = open(local / "driver.log", "w")  # noqa: SIM115 (closed below)
        drivers.append(
            (subprocess.Popen(command, cwd=local, env=env, stdout=log, stderr=subprocess.STDOUT), log)
        )
    for proc, log in drivers:
        proc.wait(timeout=300)
        log.close()
    logs = [(tmp_path / n / "driver.log").read_text() for n in ("machine_a", "machine_b")]
    assert [p.returncode for p, _ in drivers] == [0, 0], logs
    assert PASSWORD not in logs[0] + logs[1]
    runs = [line.split()[:2] for line in ledger.read_text().splitlines()]  # (run dir, fresh | resume)
    assert len(runs) == len({d for d, _ in runs}) == 2 * (4 + 2)  # every trial once, the whole budget
    assert all(how == "fresh" for _, how in runs)
    assert not any(shared.glob(".*.lock")) and not (shared / ".drivers").exists()  # no lock files

    on_postgres = study_of(
        shared, storage=url, base=[*smoke_spec()["base"], f"data.root={data_root}"]
    )  # the same spec: the storage is not part of what a study finds
    assert trials_of(driver_of(on_postgres)) == trials_of(run_fake(study_of(tmp_path / "sqlite")))


def test_a_login_the_server_refuses_is_one_line_without_the_password(server):
    """(The command line prints a UserError as its one line: tests/study/test_study_spec.py.)"""
    from mars.errors import UserError
    from mars.study.storage import open_storage

    host, port = server
    with pytest.raises(UserError) as e:
        open_storage(f"postgresql://{USER}:wrong-{PASSWORD}@{host}:{port}/study")
    line = str(e.value)
    assert "\n" not in line and PASSWORD not in line and f"study.storage=postgresql://{USER}:***@" in line
    assert f"the server at {host}:{port} refused user 'mars'" in line
