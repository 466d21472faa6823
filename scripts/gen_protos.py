"""Regenerate the committed protobuf and gRPC stubs.

Run from anywhere: ``python scripts/gen_protos.py [--out DIR]``.

Every ``*.proto`` under the directories in ``PROTO_DIRS`` is compiled in one
``grpc_tools.protoc`` invocation run from the repository root with ``-I .``,
so that import paths inside the protos (``broker/protocol/protocol.proto``)
and the generated Python imports (``from broker.protocol import ...``) both
resolve against the repository root. ``--out`` lets the freshness test
generate into a scratch directory and compare byte-for-byte with the
committed files.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent

# Directories (relative to the repository root) whose protos we compile. A
# missing or empty directory is skipped: the etcd API protos arrive later.
PROTO_DIRS = ("broker/protocol", "broker/keyspace/etcdpb")

# Suffixes of the files protoc writes for each proto; the freshness test
# compares exactly these.
GENERATED_SUFFIXES = ("_pb2.py", "_pb2.pyi", "_pb2_grpc.py")


class GenerationError(RuntimeError):
    """protoc failed; the message carries its stderr."""


def proto_files(root: Path = REPO_ROOT) -> list[str]:
    """Repository-relative paths of every proto to compile, sorted."""
    found: list[str] = []
    for rel_dir in PROTO_DIRS:
        directory = root / rel_dir
        if not directory.is_dir():
            continue
        found.extend(p.relative_to(root).as_posix() for p in sorted(directory.glob("*.proto")))
    return found


def generated_files(protos: list[str]) -> list[str]:
    """Repository-relative paths protoc writes for `protos`."""
    return [proto[: -len(".proto")] + suffix for proto in protos for suffix in GENERATED_SUFFIXES]


def generate(out_dir: Path, root: Path = REPO_ROOT) -> list[str]:
    """Compile every proto into `out_dir`; return the protos compiled."""
    protos = proto_files(root)
    if not protos:
        return []
    out_dir.mkdir(parents=True, exist_ok=True)
    out = str(out_dir.resolve())
    command = [
        sys.executable,
        "-m",
        "grpc_tools.protoc",
        "-I",
        ".",
        f"--python_out={out}",
        f"--pyi_out={out}",
        f"--grpc_python_out={out}",
        *protos,
    ]
    result = subprocess.run(command, cwd=root, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise GenerationError(
            f"protoc exited with {result.returncode} for {protos}:\n{result.stderr}"
        )
    return protos


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--out",
        type=Path,
        default=REPO_ROOT,
        help="output root (default: the repository root, i.e. in place)",
    )
    args = parser.parse_args(argv)
    protos = generate(args.out)
    for proto in protos:
        print(f"generated {proto}")
    if not protos:
        print("no .proto files found", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
