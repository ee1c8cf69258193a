"""What a user gets from ``pip install``: the wheel, its dependencies, its entry points.

The wheel is built once per session from a copy of the source tree and installed
into one fresh virtualenv the way a user on a Spark/EMR image would: a newer
boto3 is there first, then ``pip install lancetx`` (no extras), later
``lancetx[embedded]``. pip's cache keeps this to about a minute.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tomllib
import venv
import zipfile
from dataclasses import dataclass
from pathlib import Path

import pytest

from lancetx.demo.embedded import EmbeddedAws

ROOT = Path(__file__).resolve().parent.parent
PROBE = Path(__file__).resolve().parent / "support" / "sync_commit_probe.py"
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
VERSION = PYPROJECT["project"]["version"]
#: What a Spark/EMR/Glue image may already hold (newer than [async]'s narrow pin).
PREINSTALLED_BOTO3 = "1.44.*"
#: The folders the wheel is built from (everything pyproject.toml maps into it).
SOURCES = (
    "pyproject.toml",
    "README.md",
    "LICENSE",
    "lancetx",
    "protos",
    "commit",
    "externalstore",
    "demo",
    "pyspark_lancetx",
)

pytestmark = pytest.mark.slow


def _run(cmd: list[str], *, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    # Run outside the source tree: from its root, ``lancetx/`` would shadow the install.
    # Nor may the test session's PYTHONPATH leak in (the Spark tests put the checkout on
    # it for their Python workers): a user's venv sees only what was installed into it.
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    return subprocess.run(
        cmd,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        cwd=cwd or Path.home(),
        env=env,
    )


def _ok(proc: subprocess.CompletedProcess[str]) -> str:
    assert proc.returncode == 0, f"{proc.args}\n{proc.stdout}\n{proc.stderr}"
    return proc.stdout


@pytest.fixture(scope="session")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The wheel of this source tree (built from a copy, so the tree stays clean)."""
    src = tmp_path_factory.mktemp("src")
    for name in SOURCES:
        path = ROOT / name
        if path.is_dir():
            shutil.copytree(path, src / name, ignore=shutil.ignore_patterns("__pycache__"))
        elif path.exists():
            shutil.copy2(path, src / name)
    out = tmp_path_factory.mktemp("dist")
    _ok(_run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(out), str(src)]))
    (built,) = out.glob("lancetx-*.whl")
    return built


@dataclass
class UserVenv:
    """A virtualenv outside the project, with lancetx installed from the wheel."""

    path: Path
    wheel: Path

    @property
    def python(self) -> str:
        return str(self.path / "bin" / "python")

    def pip(self, *args: str) -> str:
        return _ok(_run([self.python, "-m", "pip", "install", "-q", "--no-compile", *args]))

    def version_of(self, package: str) -> str | None:
        code = (
            "import importlib.metadata as m, sys\n"
            "try: print(m.version(sys.argv[1]))\n"
            "except m.PackageNotFoundError: print('-')"
        )
        found = _ok(_run([self.python, "-c", code, package])).strip()
        return None if found == "-" else found


@pytest.fixture(scope="session")
def user_venv(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> UserVenv:
    """boto3 1.44 installed first, then ``pip install lancetx`` with no extras."""
    path = tmp_path_factory.mktemp("user") / "venv"
    venv.create(path, with_pip=True)
    env = UserVenv(path, wheel)
    env.pip(f"boto3=={PREINSTALLED_BOTO3}")
    env.pip(str(wheel))
    return env


# ------------------------------------------------------------------------- the wheel


def test_wheel_ships_the_packages_license_and_type_markers_but_no_dev_scripts(
    wheel: Path,
) -> None:
    names = set(zipfile.ZipFile(wheel).namelist())
    packages = {"lancetx", "lancetx/commit", "lancetx/externalstore", "lancetx/protos"}
    for package in packages:
        assert f"{package}/py.typed" in names, package
    assert f"lancetx-{VERSION}.dist-info/licenses/LICENSE" in names
    assert not [n for n in names if "regenerate" in n or n.startswith(("tests/", "tools/"))]
    assert not [n for n in names if n.startswith(("benchmarks/", "localstack/"))]


def test_wheel_ships_every_package_of_the_source_tree(wheel: Path) -> None:
    """pyproject.toml lists packages by hand: a new subpackage must be added there."""
    names = set(zipfile.ZipFile(wheel).namelist())
    folders = {
        "lancetx": "lancetx",
        "commit": "lancetx/commit",
        "externalstore": "lancetx/externalstore",
        "demo": "lancetx/demo",
        "protos": "lancetx/protos",
        "pyspark_lancetx": "pyspark_lancetx",
    }
    missing = [
        str(init.relative_to(ROOT))
        for folder, installed in folders.items()
        for init in (ROOT / folder).rglob("__init__.py")
        if f"{installed}/{init.parent.relative_to(ROOT / folder).as_posix()}/__init__.py".replace(
            "/./", "/"
        )
        not in names
    ]
    assert not missing, f"add to [tool.setuptools] packages in pyproject.toml: {missing}"


def test_wheel_requires_aioboto3_only_for_the_async_extra(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as zf:
        metadata = zf.read(f"lancetx-{VERSION}.dist-info/METADATA").decode()
    requires = [
        line[len("Requires-Dist: ") :]
        for line in metadata.splitlines()
        if line.startswith("Requires-Dist: ")
    ]
    core = [r for r in requires if "extra ==" not in r]
    assert not [r for r in core if r.startswith(("aioboto3", "aiohttp", "moto", "grpcio"))], core
    assert "boto3<2,>=1.40" in core, core
    assert any(r.startswith("aioboto3") and 'extra == "async"' in r for r in requires), requires
    assert any(r.startswith("grpcio-tools") and 'extra == "protos"' in r for r in requires)


# ------------------------------------------------------------- installed, no extras


@pytest.mark.long_only  # builds a user's venv from the wheel: CI's long pass
def test_install_keeps_a_newer_preinstalled_boto3(user_venv: UserVenv) -> None:
    installed = user_venv.version_of("boto3")
    assert installed is not None and installed.startswith("1.44."), installed


@pytest.mark.long_only  # builds a user's venv from the wheel: CI's long pass
def test_install_without_extras_brings_no_async_or_server_packages(user_venv: UserVenv) -> None:
    for package in ("aioboto3", "aiobotocore", "aiohttp", "moto", "grpcio-tools"):
        assert user_venv.version_of(package) is None, package


@pytest.mark.long_only  # builds a user's venv from the wheel: CI's long pass
def test_installed_package_reports_its_version(user_venv: UserVenv) -> None:
    out = _ok(_run([user_venv.python, "-c", "import lancetx; print(lancetx.__version__)"]))
    assert out.strip() == VERSION


@pytest.mark.long_only  # builds a user's venv from the wheel: CI's long pass
def test_installed_sync_api_commits_through_dynamodb(
    user_venv: UserVenv, aws: EmbeddedAws, bucket: str, ddb_table_name: str
) -> None:
    """The sync API of the bare install commits against the embedded server (run by
    this test process: the user's venv has no moto)."""
    out = _ok(
        _run(
            [
                user_venv.python,
                str(PROBE),
                aws.endpoint,
                aws.endpoint,
                f"{bucket}-u",
                ddb_table_name,
            ],
        )
    )
    report = json.loads(out.strip().splitlines()[-1])
    assert report["version"] == 2 and report["rows"] == 3, report
    assert report["async_modules"] == [] and report["boto3"].startswith("1.44."), report


@pytest.mark.long_only  # builds a user's venv from the wheel: CI's long pass
def test_async_module_names_the_extra_when_missing(user_venv: UserVenv) -> None:
    proc = _run([user_venv.python, "-c", "import lancetx.commit.storage.s3store_async"])
    assert proc.returncode == 1
    last = proc.stderr.strip().splitlines()[-1]
    assert "MissingExtraError" in last and "pip install 'lancetx[async]'" in last, proc.stderr


@pytest.mark.long_only  # builds a user's venv from the wheel: CI's long pass
def test_demo_without_the_embedded_extra_prints_one_line_and_exits_2(user_venv: UserVenv) -> None:
    proc = _run([str(user_venv.path / "bin" / "lancetx-demo")])
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stdout == ""
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "pip install 'lancetx[embedded]'" in lines[0], proc.stderr


# ------------------------------------------------------------ with [embedded] added


@pytest.mark.long_only  # builds a user's venv from the wheel: CI's long pass
def test_demo_runs_with_the_embedded_extra(user_venv: UserVenv) -> None:
    user_venv.pip(f"{user_venv.wheel}[embedded]")
    assert (user_venv.version_of("boto3") or "").startswith("1.44.")
    assert user_venv.version_of("aioboto3") is None
    proc = _run(
        [
            str(user_venv.path / "bin" / "lancetx-demo"),
            "--lancetx-writers",
            "2",
            "--appends",
            "2",
            "--rows",
            "10",
        ],
        cwd=user_venv.path,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "pylance sees versions 1..7: linear, no gap" in proc.stdout, proc.stdout


# ------------------------------------------------------- the dev venv, imports blocked


@pytest.mark.long_only  # builds a user's venv from the wheel: CI's long pass
def test_sync_api_never_imports_the_async_packages(
    aws: EmbeddedAws, bucket: str, ddb_table_name: str
) -> None:
    """Quick twin of the installed test: in this venv (which has aioboto3), any import
    of aioboto3/aiobotocore/aiohttp raises, and a sync commit still succeeds."""
    out = _ok(
        _run(
            [
                sys.executable,
                str(PROBE),
                aws.endpoint,
                aws.endpoint,
                f"{bucket}-b",
                ddb_table_name,
                "--block-async",
            ],
        )
    )
    report = json.loads(out.strip().splitlines()[-1])
    assert report == {
        "version": 2,
        "rows": 3,
        "async_modules": [],
        "lancetx": report["lancetx"],
        "boto3": report["boto3"],
    }
