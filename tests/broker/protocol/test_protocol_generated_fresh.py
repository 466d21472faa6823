"""The committed *_pb2 stubs are exactly what scripts/gen_protos.py produces."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import pytest

REPO_ROOT = Path(__file__).resolve().parents[3]
REGENERATE = "run `python scripts/gen_protos.py` and commit the result"


def _load_gen_protos() -> ModuleType:
    # scripts/ is not a package; load the script by path.
    path = REPO_ROOT / "scripts" / "gen_protos.py"
    spec = importlib.util.spec_from_file_location("gen_protos", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


gen_protos = _load_gen_protos()


def test_our_protos_are_found() -> None:
    protos = gen_protos.proto_files()
    for required in (
        "broker/protocol/protocol.proto",
        "broker/protocol/consumer.proto",
        "broker/protocol/recorded_op.proto",
    ):
        assert required in protos


def test_committed_stubs_match_a_fresh_generation(tmp_path: Path) -> None:
    protos = gen_protos.generate(tmp_path)
    expected = gen_protos.generated_files(protos)
    stale: list[str] = []
    for rel in expected:
        fresh = tmp_path / rel
        committed = REPO_ROOT / rel
        assert fresh.is_file(), f"protoc did not write {rel}"
        if not committed.is_file():
            stale.append(f"{rel} is missing")
        elif committed.read_bytes() != fresh.read_bytes():
            stale.append(f"{rel} differs")
    assert not stale, f"generated stubs are stale ({'; '.join(stale)}): {REGENERATE}"


def test_no_orphaned_stubs() -> None:
    # A stub whose .proto was deleted or renamed would still import and
    # register its messages: flag it.
    expected = set(gen_protos.generated_files(gen_protos.proto_files()))
    orphans: list[str] = []
    for rel_dir in gen_protos.PROTO_DIRS:
        directory = REPO_ROOT / rel_dir
        if not directory.is_dir():
            continue
        for path in sorted(directory.iterdir()):
            rel = path.relative_to(REPO_ROOT).as_posix()
            if rel.endswith(gen_protos.GENERATED_SUFFIXES) and rel not in expected:
                orphans.append(rel)
    assert not orphans, f"stubs without a .proto: {orphans}; delete them and {REGENERATE}"


def test_absent_or_empty_proto_dirs_are_skipped(tmp_path: Path) -> None:
    root = tmp_path / "repo"
    (root / "broker" / "protocol").mkdir(parents=True)  # Empty; etcdpb absent.
    assert gen_protos.proto_files(root) == []
    assert gen_protos.generate(tmp_path / "out", root) == []
    assert not (tmp_path / "out").exists()


def test_protoc_failure_is_a_typed_error_naming_the_file(tmp_path: Path) -> None:
    root = tmp_path / "repo"
    (root / "broker" / "protocol").mkdir(parents=True)
    (root / "broker" / "protocol" / "broken.proto").write_text('syntax = "proto3";\nmessage {\n')
    with pytest.raises(gen_protos.GenerationError, match=r"broken\.proto"):
        gen_protos.generate(tmp_path / "out", root)
