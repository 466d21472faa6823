"""The project's import graph: no cycles, and no layer importing one above it.

docs/architecture.md ("Layers") describes the layers; this test is the executable form. Imports
are read from the source (ast), at every level: a cycle hidden behind an import inside a function
is still a cycle a reader must untangle. Imports under `if TYPE_CHECKING:` do not count (they
never run). `from package import submodule` counts as importing the submodule only (the package
itself is always imported first, by whichever submodule is loaded).
"""

from __future__ import annotations

import ast
from collections.abc import Iterable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("broker", "gazette_consumer", "spark_integration", "examples")

# Bottom to top. A module belongs to the layer of its longest matching prefix; it may import its
# own layer and the ones below it. `ALLOWED_UNLAYERED` lists modules outside every layer.
LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    (
        "support",
        (
            "broker.logging",
            "broker.flag_types",
            "broker.gc_tuning",
            "broker.loop_slices",
            "broker.malloc_tuning",
            "broker.task_dump",
            "broker.grpc_transport",
            "broker.durable_file",
            "broker.disk_errors",
            "broker.lazy_exports",
        ),
    ),
    ("protocol", ("broker.protocol", "broker.auth", "broker.metrics", "broker.tls")),
    (
        "keyspace and fragments",
        (
            "broker.keyspace",
            "broker.fragment",
            # The quorum protocol's sans-IO core, and its term and members records in the keyspace.
            "broker.quorum",
            "broker.quorum_shell.term_record",
            "broker.quorum_shell.members_record",
        ),
    ),
    ("client", ("broker.client",)),
    (
        "replica and pipeline",
        (
            "broker.replica",
            "broker.slot",
            "broker.pipeline",
            "broker.pipeline_sync",
            "broker.peer_dialer",
            # The append machine: its driver, state object, and one module per phase.
            "broker.append_fsm",
            "broker.append_run",
            "broker.append_route",
            "broker.append_sync",
            "broker.append_preconditions",
            "broker.append_content",
            "broker.append_state",
            "broker.append_pulse",
            "broker.append_rate",
            "broker.append_rules",
            "broker.append_suspend",
            "broker.resolver",
            "broker.resolve_errors",
            "broker.topology",
            "broker.request_stream",
            "broker.proxy_retry",
            # The route clients are told of a quorum journal (the term's leader as primary):
            # the resolver builds it into every header.
            "broker.quorum_shell.leader_route",
        ),
    ),
    (
        "RPCs",
        (
            "broker.append_api",
            "broker.append_receive",
            "broker.read_api",
            "broker.read_resolve",
            "broker.read_serve",
            "broker.read_hole",
            "broker.read_staging",
            "broker.replicate_api",
            "broker.fragments_api",
            "broker.list_apply_api",
            "broker.apply_txn",
            "broker.journal_nesting",
            "broker.service_handlers",
            "broker.journal_service",
            "broker.http_gateway",
            "broker.http_journals",
            "broker.quorum_states",
            "broker.quorum_shell",
        ),
    ),
    (
        "server",
        (
            "broker.server",
            "broker.broker_config",
            "broker.hand_off",
            "broker.allocator",
            "broker.auth_server",
            "broker.auth_interceptor",
            "broker.readiness",
            "broker.rpc_tasks",
            "broker.security_flags",
        ),
    ),
    (
        "consumer",
        (
            "gazette_consumer",
            # The Sequencer's parts and the read-committed iterator's read-ahead (#18), named so
            # that a move out of the layer shows here.
            "gazette_consumer.sequencer.state",
            "gazette_consumer.sequencer.classify",
            "gazette_consumer.sequencer.fast_paths",
            "gazette_consumer.sequencer.dequeue",
            "gazette_consumer.sequencer.sequencer",
            "gazette_consumer.sequencer.read_ahead",
            "gazette_consumer.sequencer.retained",
            "gazette_consumer.sequencer.replays",
        ),
    ),
    (
        "Spark, CLI and tools",
        (
            "spark_integration",
            "broker.cli",
            "broker.serve_cli",
            "broker.serve_watchdog",
            "broker.demo",
            "broker.testing",
            "gazette_consumer.demo",
            "examples",
        ),
    ),
)
ALLOWED_UNLAYERED = frozenset({"broker", "gazette_consumer", "spark_integration", "examples"})


def _modules() -> dict[str, Path]:
    modules: dict[str, Path] = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            modules[".".join(parts)] = path
    return modules


def _is_type_checking(test: ast.expr) -> bool:
    return "TYPE_CHECKING" in ast.unparse(test)


def _imported(path: Path, module: str, modules: dict[str, Path]) -> set[str]:
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: set[str] = set()

    def visit(nodes: Iterable[ast.stmt]) -> None:
        for node in nodes:
            if isinstance(node, ast.If) and _is_type_checking(node.test):
                visit(node.orelse)
                continue
            if isinstance(node, ast.Import):
                found.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                    source = ".".join([*base, *([node.module] if node.module else [])])
                else:
                    source = node.module or ""
                submodules = [
                    f"{source}.{a.name}" for a in node.names if f"{source}.{a.name}" in modules
                ]
                found.update(submodules)
                if len(submodules) < len(node.names):
                    found.add(source)
            for child in ast.iter_child_nodes(node):
                if isinstance(child, ast.stmt):
                    visit([child])
            for field in ("handlers",):
                for handler in getattr(node, field, ()):
                    visit(handler.body)

    visit(ast.parse(path.read_text(), str(path)).body)
    return {name for name in found if name in modules and name != module}


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    return {module: _imported(path, module, modules) for module, path in modules.items()}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, successors = work[-1]
            for successor in successors:
                if successor not in index:
                    index[successor] = low[successor] = len(index)
                    stack.append(successor)
                    on_stack.add(successor)
                    work.append((successor, iter(sorted(graph[successor]))))
                    break
                if successor in on_stack:
                    low[node] = min(low[node], index[successor])
            else:
                work.pop()
                if work:
                    parent = work[-1][0]
                    low[parent] = min(low[parent], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        components.append(sorted(component))
    return components


def _layer(module: str) -> int | None:
    best: tuple[int, int] | None = None
    for rank, (_, prefixes) in enumerate(LAYERS):
        for prefix in prefixes:
            if (module == prefix or module.startswith(prefix + ".")) and (
                best is None or len(prefix) > best[1]
            ):
                best = (rank, len(prefix))
    return None if best is None else best[0]


def test_no_import_cycles() -> None:
    graph = _graph()
    cycles = _cycles(graph)
    described = [
        "; ".join(f"{a} -> {', '.join(sorted(graph[a] & set(cycle)))}" for a in cycle)
        for cycle in cycles
    ]
    assert described == []


def test_every_module_has_a_layer() -> None:
    unlayered = sorted(m for m in _modules() if _layer(m) is None and m not in ALLOWED_UNLAYERED)
    assert unlayered == []


def _upward(graph: dict[str, set[str]]) -> list[str]:
    upward = []
    for module, imported in sorted(graph.items()):
        own = _layer(module)
        for target in sorted(imported):
            theirs = _layer(target)
            if own is not None and theirs is not None and theirs > own:
                upward.append(f"{module} ({LAYERS[own][0]}) -> {target} ({LAYERS[theirs][0]})")
    return upward


def test_no_upward_imports() -> None:
    assert _upward(_graph()) == []


def test_the_checks_report_a_cycle_and_an_upward_import() -> None:
    """The checks themselves, on the real graph with two edges added: protocol importing the
    fragment uploader (upward, and a cycle, since the uploader imports protocol)."""
    graph = _graph()
    assert "broker.protocol.path_postfix" in graph["broker.fragment.upload"]
    assert _cycles(graph) == []
    graph["broker.protocol.path_postfix"] = graph["broker.protocol.path_postfix"] | {
        "broker.fragment.upload"
    }
    (cycle,) = _cycles(graph)  # Everything between them on import paths joins the cycle.
    assert {"broker.fragment.upload", "broker.protocol.path_postfix"} <= set(cycle)
    assert _upward(graph) == [
        "broker.protocol.path_postfix (protocol) -> broker.fragment.upload (keyspace and fragments)"
    ]
