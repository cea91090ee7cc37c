"""Every fused Triton kernel compiles for the GPU it is written for (sm_90: H100/H200), from a CPU.

The CPU suite runs the kernels in Triton's interpreter, which checks their arithmetic but not
whether Triton can lower them for a GPU: a layout, a dot's minimum shape, a masked histogram, an
undefined shift show up only there, and GPU time is scarce. So each wrapper is called here with
the 0.6B model's production shapes (bf16, the talker's and code predictor's sizes, the codec's
widths, one row and 128), its launch is caught by a pre-run hook before the interpreter runs it,
and the caught arguments (pointer dtypes, scalars, constexprs, warps and stages) are compiled
ahead of time for sm_90 with Triton's own ptxas. Integers compile unspecialised (i32), which
covers the specialised variants' code paths."""

from __future__ import annotations

import inspect
import json
import os
import subprocess
import sys

import pytest
import torch

from voxgate.engines.qwen3 import fused_sampler as fs
from voxgate.engines.qwen3 import gemv, kernels

if kernels.triton is None or os.environ.get("TRITON_INTERPRET") != "1":
    pytest.skip(
        "needs Triton, in its interpreter (on a GPU the kernels compile where they run)", allow_module_level=True
    )

BF16 = torch.bfloat16
TYPES = {torch.float32: "fp32", BF16: "bf16", torch.float16: "fp16", torch.int64: "i64", torch.int32: "i32",
         torch.bool: "i1", torch.uint8: "u8"}  # fmt: skip
OPTIONS = ("num_warps", "num_stages")
# Compiles the caught launches in a process of its own: under the interpreter, Triton's own
# library functions (tl.sum's combine, ...) are interpreted ones, which cannot be compiled.
COMPILER = """
import importlib, json, sys
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource, compile
for line in sys.stdin:
    spec = json.loads(line)
    fn = getattr(importlib.import_module(spec["module"]), spec["name"])
    try:
        k = compile(ASTSource(fn, spec["signature"], spec["constexprs"]), target=GPUTarget("cuda", 90, 32),
                    options=spec["options"])
        print(json.dumps({"id": spec["id"], "ok": bool(k.asm["cubin"])}), flush=True)
    except Exception as e:
        print(json.dumps({"id": spec["id"], "ok": False, "error": f"{type(e).__name__}: {e}"[-3000:]}), flush=True)
"""


class _Caught(Exception):
    """Raised by the hook: the launch's arguments, instead of an interpreted run."""

    def __init__(self, fn, args: tuple, kwargs: dict) -> None:
        super().__init__(fn.__name__)
        self.fn, self.args, self.kwargs = fn, args, kwargs


def _catch(call) -> _Caught:
    try:
        call()
    except _Caught as caught:
        return caught
    raise AssertionError("the wrapper launched no kernel")


@pytest.fixture(scope="module", autouse=True)
def _hooks():
    interpreted = [getattr(m, n) for m in (kernels, gemv, fs) for n in dir(m) if n.endswith("_kernel")]
    for fn in interpreted:

        def hook(*args, _fn=fn.fn, **kwargs):
            raise _Caught(_fn, args, kwargs)

        fn.add_pre_run_hook(hook)
    yield
    for fn in interpreted:
        fn.pre_run_hooks.clear()


def _spec(name: str, caught: _Caught) -> dict:
    """What the compiler process needs: the kernel, its argument types, constexprs and options."""
    params = list(inspect.signature(caught.fn).parameters.values())
    values = dict(zip([p.name for p in params], caught.args, strict=False)) | caught.kwargs
    signature, consts = {}, {}
    for p in params:
        value = values[p.name]
        if "constexpr" in str(p.annotation):
            signature[p.name], consts[p.name] = "constexpr", value
        elif isinstance(value, torch.Tensor):
            signature[p.name] = "*" + TYPES[value.dtype]
        elif isinstance(value, bool):
            signature[p.name] = "i1"
        elif isinstance(value, int):
            signature[p.name] = "i32" if -(2**31) <= value < 2**31 else "i64"
        else:
            signature[p.name] = "fp32"
    options = {k: v for k, v in caught.kwargs.items() if k in OPTIONS}
    return {"id": name, "module": caught.fn.__module__, "name": caught.fn.__name__, "signature": signature,
            "constexprs": consts, "options": options}  # fmt: skip


@pytest.fixture(scope="module")
def compiled() -> dict[str, dict]:
    specs = [json.dumps(_spec(name, _catch(call))) for name, call in LAUNCHES]
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    done = subprocess.run([sys.executable, "-c", COMPILER], input="\n".join(specs) + "\n", capture_output=True,
                          text=True, env=env, timeout=600)  # fmt: skip
    results = {r["id"]: r for r in map(json.loads, done.stdout.splitlines())}
    assert len(results) == len(specs), done.stderr[-3000:]
    return results


def _z(*shape: int, dtype: torch.dtype = BF16) -> torch.Tensor:
    return torch.zeros(*shape, dtype=dtype)


H, FF, HEADS, KV, D = 1024, 3072, 16, 8, 128  # the 0.6B talker's and code predictor's sizes


def _launches():
    b, cap = 128, 512
    yield "add_rms_norm", lambda: kernels.add_rms_norm(_z(b, 1, H), _z(b, 1, H), _z(H), 1e-6)
    positions = torch.zeros(b, dtype=torch.long)
    yield "qk_norm_rope_store", lambda: kernels.qk_norm_rope_store(
        _z(b, 1, (HEADS + 2 * KV) * D), _z(HEADS + KV, D), _z(cap, D), _z(cap, D), _z(b, KV, cap, D),
        _z(b, KV, cap, D), HEADS, KV, 1e-6, positions,
    )  # fmt: skip
    yield "silu_mul", lambda: kernels.silu_mul(_z(b, 1, 2 * FF))
    yield "snake_beta", lambda: kernels.snake_beta(_z(b, 8, 96), _z(96), _z(96))
    full = _z(b, 8 + 6 * 9, 96)
    yield "snake_beta strided", lambda: kernels.snake_beta(_z(b, 8, 96), _z(96), _z(96), out=full[:, -8:])
    for m in (1, 128):  # the one-row tiles and the wide ones
        yield f"conv_taps {m}", lambda m=m: kernels.conv_taps(_z(m, 8 + 6 * 9, 96), _z(7 * 96, 96), _z(96), 7, 9)
    yield "conv_taps 768 channels", lambda: kernels.conv_taps(_z(b, 8 + 6, 768), _z(7 * 768, 768), _z(768), 7, 1)
    moving = torch.ones(b, dtype=torch.bool)  # the codec pre-transformer: 16 heads of 64, a 72-frame window
    yield "window_step", lambda: kernels.window_step(_z(b, 48, 1, 64), _z(b, 32, 71, 64), positions, moving, 16, 0.125)
    x = _z(1, 1, H)
    yield "gemv plain", lambda: gemv.matvec(x, _z(4096, H))
    yield "gemv norm", lambda: gemv.norm_linear(x, _z(1, 1, H), _z(H), 1e-6, _z(2 * FF, H))
    yield "gemv silu", lambda: gemv.silu_linear(_z(1, 1, 2 * FF), _z(H, FF))
    yield from _sampler_launches(b)


def _sampler_launches(b: int):
    settings = fs.RowSettings(
        torch.ones(b, dtype=torch.bool), torch.ones(b, 1), torch.full((b,), 50), torch.ones(b)
    )  # fmt: skip
    codes, noise = torch.zeros(b, 16, dtype=torch.long), torch.zeros(b, 64)
    cp_v, talker_v = 2048, 3072
    yield "sampler, code predictor", lambda: fs.sample_codes(
        _z(b, cp_v, dtype=torch.float32), noise, settings, 50, True, codes[:, 3], _z(cp_v, H), _z(b, H),
        torch.zeros(b, H), fs.FRAME_ADD,
    )  # fmt: skip
    draws = torch.zeros(b, dtype=torch.long)
    seen, control = torch.zeros(b, talker_v, dtype=torch.bool), torch.zeros(talker_v, dtype=torch.bool)
    talker = fs.TalkerScores(seen, torch.ones(b, 1), draws, draws, control, 2150, torch.ones(b, dtype=torch.long))
    text = fs.TextRows(_z(b, 6, H), draws, draws, _z(H), _z(b, H))
    yield "sampler, talker", lambda: fs.sample_codes(
        _z(b, talker_v, dtype=torch.float32), noise, settings, 50, True, codes[:, 0], _z(talker_v, H), None,
        torch.zeros(b, H), fs.FRAME_SET, talker=talker, text=text,
    )  # fmt: skip


LAUNCHES = list(_launches())


@pytest.mark.parametrize("name", [n for n, _ in LAUNCHES])
def test_the_kernel_compiles_for_sm90_at_the_production_shapes(name, compiled):
    assert compiled[name]["ok"], compiled[name].get("error")


def test_every_kernel_is_compiled_by_some_case():
    """A new kernel must get a case above (or this fails)."""
    names = {n for m in (kernels, gemv, fs) for n in dir(m) if n.endswith("_kernel")}
    caught = {_catch(call).fn.__name__ for _, call in LAUNCHES}
    assert names == caught
