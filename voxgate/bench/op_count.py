"""Count the aten operations a call issues, by the part of a module tree that issued them.

On a GPU a small-batch decode step is bound by how many kernels it launches, and each aten op
that does work (a cat, a copy, an elementwise product) is at least one kernel. Counting them is
deterministic, so a change that removes kernels can be checked on the CPU and in tests, where
timing cannot. Views (transpose, slice, unfold), metadata ops and ops on zero-size tensors are
counted apart: they launch nothing. Count outside inference mode (under no_grad): inside it,
composite ops such as a reshape that must copy reach the counter undecomposed, as views.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

# Ops that only make metadata (no kernel on a GPU) besides those flagged as views in their schema.
_FREE = {"aten.detach", "aten.lift_fresh", "aten.empty", "aten.empty_like", "aten.empty_strided", "aten.new_empty",
         "aten.alias", "aten.sym_size", "aten.sym_stride", "aten.sym_numel", "aten.is_same_size",
         "aten._unsafe_view", "aten._reshape_alias"}  # fmt: skip


@dataclass
class OpCount:
    """Ops that do work (`ops`) and free ones (views, metadata, zero-size results) per part,
    and each part's working ops by name."""

    ops: Counter[str] = field(default_factory=Counter)
    free: Counter[str] = field(default_factory=Counter)
    names: dict[str, Counter[str]] = field(default_factory=dict)

    @property
    def total(self) -> int:
        return sum(self.ops.values())


_MISSING = object()


class _Counter(TorchDispatchMode):
    def __init__(self, part: Callable[[], str], count: OpCount) -> None:
        super().__init__()
        self.part, self.count = part, count

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        name = func.overloadpacket.__name__ if hasattr(func, "overloadpacket") else str(func)
        out = func(*args, **(kwargs or {}))
        outputs = [t for t in (out if isinstance(out, (tuple, list)) else [out]) if isinstance(t, torch.Tensor)]
        empty = bool(outputs) and all(t.numel() == 0 for t in outputs)  # a GPU launches nothing for it
        part = self.part()
        if func.is_view or f"aten.{name}" in _FREE or empty:
            self.count.free[part] += 1
        else:
            self.count.ops[part] += 1
            self.count.names.setdefault(part, Counter())[name] += 1
        return out


@contextmanager
def count_ops(
    parts: dict[str, nn.Module | list[nn.Module]],
    inner: dict[type, str] | None = None,
    functions: dict[str, tuple[Any, str]] | None = None,
) -> Iterator[OpCount]:
    """Count the ops issued inside the block. Each op goes to the innermost running module
    listed in `inner` (by type, e.g. activations) or function in `functions` (label ->
    (owner, attribute name), e.g. state writes), else to the outermost running module of
    `parts` (label -> modules), else to "other"."""
    count = OpCount()
    stack: list[str] = []
    undo: list[Callable[[], None]] = []

    def leave(*_: Any) -> None:  # a forward hook returning None leaves the module's output as it is
        stack.pop()

    def hook(module: nn.Module, label: str) -> None:
        pre = module.register_forward_pre_hook(lambda *_: stack.append(label))
        post = module.register_forward_hook(leave)
        undo.extend((pre.remove, post.remove))

    def wrap(owner: Any, attr: str, label: str) -> None:
        original = getattr(owner, attr)

        def tagged(*args: Any, **kwargs: Any) -> Any:
            stack.append(label)
            try:
                return original(*args, **kwargs)
            finally:
                stack.pop()

        saved = vars(owner).get(attr, _MISSING)  # restored as it was (an instance's or class's own)
        setattr(owner, attr, tagged)
        undo.append(lambda: delattr(owner, attr) if saved is _MISSING else setattr(owner, attr, saved))

    for name, modules in parts.items():
        for module in modules if isinstance(modules, list) else [modules]:
            hook(module, f"part:{name}")
            for sub in module.modules():
                if type(sub) in (inner or {}):
                    hook(sub, f"inner:{(inner or {})[type(sub)]}")
    for name, (owner, attr) in (functions or {}).items():
        wrap(owner, attr, f"inner:{name}")

    def part() -> str:
        for label in reversed(stack):
            if label.startswith("inner:"):
                return label[6:]
        return next((label[5:] for label in stack if label.startswith("part:")), "other")

    try:
        with _Counter(part, count):
            yield count
    finally:
        for step in reversed(undo):
            step()
