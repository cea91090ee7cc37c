"""The package's layers import only downward (STYLE.md, issue 17's dependency rule).

Every `import` in voxgate, at any depth of a module (function-level imports too), read with
`ast`. Layers, lowest first: the base (types, config, audio, text, ...), engines, bridge
(pure: base only), the speech runtime (speech), then the product (agent, serving: neither
imports the other; the agent reaches its host through `agent/host.py`'s protocol), the Ray
Serve deployment (cluster) above the server; the
harness (bench, regress) and the command line sit on top, and nothing in the product imports
them.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

import voxgate

ROOT = Path(voxgate.__file__).parent
BASE = {"types", "config", "audio", "audio_decode", "audio_encode", "audio_tempo", "text", "stats", "runtime", "web"}
HARNESS = {"bench", "regress", "cli", "__main__"}
ALLOWED = {  # what each part may import besides itself
    **{part: BASE for part in BASE},
    "engines": BASE,
    "bridge": {"types", "text", "stats"},
    "speech": BASE | {"engines", "bridge"},
    "agent": BASE | {"engines", "bridge", "speech"},
    "serving": BASE | {"engines", "bridge", "speech", "agent"},
    "cluster": BASE | {"engines", "bridge", "speech", "agent", "serving"},  # Ray Serve, above the server
    "integrations": BASE,  # clients of the server (pipecat, LiveKit): they speak its wire protocol only
}


def _part(module: str) -> str:
    return module.split(".")[1] if module.count(".") else module


def _imports() -> dict[str, set[str]]:
    """voxgate module -> the voxgate modules it imports."""
    out: dict[str, set[str]] = defaultdict(set)
    for path in ROOT.rglob("*.py"):
        rel = path.relative_to(ROOT.parent).with_suffix("")
        module = ".".join(rel.parts).removesuffix(".__init__")
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                out[module] |= {a.name for a in node.names if a.name.startswith("voxgate.")}
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").startswith("voxgate."):
                out[module].add(node.module)
    return out


def test_every_part_imports_only_the_layers_below_it():
    wrong = []
    for module, targets in _imports().items():
        part = _part(module)
        if part in HARNESS:
            continue
        for target in targets:
            other = _part(target)
            if other != part and other not in ALLOWED[part]:
                wrong.append(f"{module} -> {target}")
    assert not wrong, "imports against the layers:\n" + "\n".join(sorted(wrong))


def test_nothing_in_the_product_imports_the_harness_or_the_command_line():
    wrong = [f"{m} -> {t}" for m, ts in _imports().items() if _part(m) not in HARNESS
             for t in ts if _part(t) in HARNESS]  # fmt: skip
    assert not wrong, "\n".join(sorted(wrong))


def test_the_server_state_is_a_host_the_agent_can_run_on():
    """The agent reaches the server only through `AgentHost`; the state must keep every member."""
    import dataclasses

    from voxgate.agent.host import AgentHost
    from voxgate.serving.state import ServerState

    wanted = set(AgentHost.__annotations__) | {n for n in vars(AgentHost) if not n.startswith("_")}
    present = {f.name for f in dataclasses.fields(ServerState)} | set(dir(ServerState))
    assert wanted - present == set()


def test_the_rule_sees_imports_inside_functions():
    """A guard that cannot fail is no guard: the app's lazy import of the agent is found."""
    assert "voxgate.agent.service" in _imports()["voxgate.serving.app"]
