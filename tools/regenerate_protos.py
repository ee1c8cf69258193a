"""Regenerate protos/*_pb2.py and *_pb2.pyi from protos/*.proto.

Usage (from the repository root, with the dev venv):

    .venv/bin/python tools/regenerate_protos.py          # rewrite the generated files
    .venv/bin/python tools/regenerate_protos.py --check  # exit 1 if they are stale

It lives outside ``protos/`` so the wheel does not ship it; it needs the
``lancetx[protos]`` extra (part of ``dev``).

Runs ``python -m grpc_tools.protoc`` (protoc bundled with grpcio-tools) with
``--python_out`` and ``--mypy_out`` (mypy-protobuf's protoc-gen-mypy, taken
from the same bin directory as this interpreter), then post-processes the
output so it works as the package ``lancetx.protos``:

* protoc writes ``import file_pb2 as file__pb2`` for ``import "file.proto"``;
  imports of sibling modules become ``from . import file_pb2 as file__pb2``
  (in both .py and .pyi). Well-known types (``google/protobuf/*.proto``) keep
  their ``from google.protobuf import ...`` imports.
* the module name protoc bakes into ``BuildTopDescriptorsAndMessages`` (the
  bare ``table_pb2``) becomes ``__name__``, so message classes report
  ``lancetx.protos.table_pb2`` as their module (pickle can find them).

Protos are compiled from inside protos/ with ``-I.``, so the descriptor file
names registered in the protobuf pool are ``file.proto``, ``table.proto``,
... exactly as Lance names them, and no absolute path reaches the output.
The output depends only on the .proto text and the pinned grpcio-tools /
mypy-protobuf versions, so repeated runs produce identical bytes.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

#: The folder holding the .proto sources and the generated modules (``--proto-dir``).
PROTO_DIR = Path(__file__).resolve().parent.parent / "protos"
GENERATED_SUFFIXES = ("_pb2.py", "_pb2.pyi")


def _well_known_include() -> Path:
    import grpc_tools  # imported lazily: only needed when generating

    path = Path(grpc_tools.__file__).resolve().parent / "_proto"
    if not (path / "google" / "protobuf" / "any.proto").is_file():
        raise SystemExit(f"grpc_tools well-known protos not found under {path}")
    return path


def _mypy_plugin() -> Path:
    # Do not resolve sys.executable: in a venv it is a symlink whose own
    # directory (not the target's) holds the venv's console scripts.
    candidate = Path(sys.executable).parent / "protoc-gen-mypy"
    if candidate.is_file():
        return candidate
    found = shutil.which("protoc-gen-mypy")
    if found is None:
        raise SystemExit("protoc-gen-mypy not found; install mypy-protobuf (make venv)")
    return Path(found)


def proto_sources() -> list[str]:
    return sorted(p.name for p in PROTO_DIR.glob("*.proto"))


def generated_names(sources: list[str]) -> list[str]:
    return sorted(Path(s).stem + suffix for s in sources for suffix in GENERATED_SUFFIXES)


def _postprocess(text: str, siblings: set[str], *, stub: bool) -> str:
    def relative(match: re.Match[str]) -> str:
        module, alias = match.group(1), match.group(2)
        if module not in siblings:
            return match.group(0)
        return f"from . import {module} as {alias}"

    text = re.sub(r"^import (\w+_pb2) as (\w+)$", relative, text, flags=re.MULTILINE)
    if not stub:
        text = re.sub(
            r"(_builder\.BuildTopDescriptorsAndMessages\(DESCRIPTOR, )'\w+_pb2'",
            r"\1__name__",
            text,
        )
    text = text.replace("\r\n", "\n")
    return text.rstrip("\n") + "\n"


def generate(out_dir: Path) -> list[str]:
    """Compile every protos/*.proto into out_dir; return the generated file names."""
    sources = proto_sources()
    if not sources:
        raise SystemExit(f"no .proto files in {PROTO_DIR}")
    cmd = [
        sys.executable,
        "-m",
        "grpc_tools.protoc",
        "-I.",
        f"-I{_well_known_include()}",
        f"--plugin=protoc-gen-mypy={_mypy_plugin()}",
        f"--python_out={out_dir}",
        f"--mypy_out={out_dir}",
        *sources,
    ]
    proc = subprocess.run(cmd, cwd=PROTO_DIR, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        sys.stderr.write(proc.stdout + proc.stderr)
        raise SystemExit(f"protoc failed with exit code {proc.returncode}")

    siblings = {Path(s).stem + "_pb2" for s in sources}
    names = generated_names(sources)
    for name in names:
        path = out_dir / name
        if not path.is_file():
            raise SystemExit(f"protoc did not produce {name}")
        text = path.read_text(encoding="utf-8")
        text = _postprocess(text, siblings, stub=name.endswith(".pyi"))
        path.write_bytes(text.encode("utf-8"))
    return names


def _committed_generated() -> set[str]:
    return {
        p.name for suffix in GENERATED_SUFFIXES for p in PROTO_DIR.glob("*" + suffix) if p.is_file()
    }


def check() -> int:
    with tempfile.TemporaryDirectory(prefix="lancetx-protos-") as tmp:
        tmp_dir = Path(tmp)
        expected = generate(tmp_dir)
        problems: list[str] = []
        for name in expected:
            committed = PROTO_DIR / name
            if not committed.is_file():
                problems.append(f"missing: protos/{name}")
            elif committed.read_bytes() != (tmp_dir / name).read_bytes():
                problems.append(f"differs: protos/{name}")
        for name in sorted(_committed_generated() - set(expected)):
            problems.append(f"stale (no .proto): protos/{name}")
    if problems:
        print("Generated protobuf code is out of date with protos/*.proto:", file=sys.stderr)
        for line in problems:
            print(f"  {line}", file=sys.stderr)
        print(
            "Run `make protos` (or python tools/regenerate_protos.py) and commit.", file=sys.stderr
        )
        return 1
    print(f"protos up to date ({len(expected)} generated files)")
    return 0


def regenerate() -> int:
    with tempfile.TemporaryDirectory(prefix="lancetx-protos-") as tmp:
        tmp_dir = Path(tmp)
        names = generate(tmp_dir)
        for name in names:
            new = (tmp_dir / name).read_bytes()
            target = PROTO_DIR / name
            if target.is_file() and target.read_bytes() == new:
                continue  # leave mtime alone
            tmp_target = target.with_name(target.name + ".tmp")
            tmp_target.write_bytes(new)
            os.replace(tmp_target, target)
            print(f"wrote protos/{name}")
    for name in sorted(_committed_generated() - set(names)):
        (PROTO_DIR / name).unlink()
        print(f"removed stale protos/{name}")
    return 0


def main(argv: list[str] | None = None) -> int:
    global PROTO_DIR
    parser = argparse.ArgumentParser(
        description="Regenerate protos/*_pb2.py and *_pb2.pyi from protos/*.proto."
    )
    parser.add_argument(
        "--check",
        action="store_true",
        help="regenerate into a temp dir and fail if protos/ differs",
    )
    parser.add_argument(
        "--proto-dir",
        type=Path,
        default=PROTO_DIR,
        help="folder with the .proto sources and generated modules (default: protos/)",
    )
    args = parser.parse_args(argv)
    PROTO_DIR = args.proto_dir.resolve()
    return check() if args.check else regenerate()


if __name__ == "__main__":
    raise SystemExit(main())
