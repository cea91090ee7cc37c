"""`voxgate bench parity` on tiny checkpoints (CPU): the figures mean what they say, teacher
forcing keeps voxgate and the official implementation on the same codes, and a run worse
than the bf16 yardstick is flagged."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

from voxgate.bench.parity_measure import Tolerance, agreement, clear_margin, measure, snr_db, verdict
from voxgate.cli import main

pytestmark = pytest.mark.slow


def _logits(rows: int = 50, vocab: int = 300, seed: int = 0) -> torch.Tensor:
    return 3 * torch.randn(rows, vocab, generator=torch.Generator().manual_seed(seed))


def test_identical_logits_agree_exactly():
    logits = _logits()
    a = agreement(logits, logits.clone())
    assert a.rows == 50 and a.kl_max < 1e-12 and a.top1 == 1.0 and a.topk == 1.0


def test_a_perturbed_logit_vector_is_flagged():
    reference = _logits()
    perturbed = reference.clone()
    top = int(reference[7].argmax())
    perturbed[7, top] -= 20  # row 7's best code becomes unlikely
    a = agreement(reference, perturbed)
    assert a.top1 == pytest.approx(49 / 50) and a.kl_max > 0.1 and a.kl_p99 > 0.01
    small = agreement(reference, reference + 1e-3 * _logits(seed=1))  # rounding-sized noise stays small
    assert small.kl_max < 1e-4 and small.kl_max < a.kl_max / 1000


def test_snr_of_pcm():
    t = np.arange(24000) / 24000
    clean = np.sin(2 * np.pi * 220 * t).astype(np.float32)
    assert math.isinf(snr_db(clean, clean.copy()))
    noisy = clean + 0.01 * np.random.default_rng(0).standard_normal(len(clean)).astype(np.float32)
    assert snr_db(clean, noisy) == pytest.approx(10 * math.log10(0.5 / 1e-4), abs=0.3)  # ~37 dB


def test_a_near_tie_flipped_by_rounding_is_not_a_clear_disagreement():
    reference = _logits()
    best = reference.topk(2, -1)
    near = reference.clone()
    near[3, best.indices[3, 0]] = best.values[3, 1] + 0.01  # row 3: the lead is 0.01
    near[5, best.indices[5, 0]] += 5  # row 5: a clear lead
    flipped = near.clone()
    flipped[3, best.indices[3, 1]] += 0.02  # rounding-sized: row 3's runner-up now wins
    clear = near.clone()
    clear[5, best.indices[5, 0]] -= 20  # row 5 loses its best code
    top2 = near.topk(2, -1).values
    leads = int((top2[:, 0] - top2[:, 1] > 0.1).sum())
    assert 0 < leads < 50
    tie = agreement(near, flipped, margin=0.1)
    assert tie.top1 == pytest.approx(49 / 50)  # counted over all rows
    assert tie.top1_clear == 1.0 and tie.clear_rows == leads  # ... but not over the clear ones
    real = agreement(near, clear, margin=0.1)
    assert real.top1_clear == pytest.approx((leads - 1) / leads)
    assert clear_margin(reference, reference) == 0.0
    noisy = reference + 0.05 * _logits(seed=2) / 3  # RMS error 0.05
    assert clear_margin(reference, noisy) == pytest.approx(4 * 0.05, rel=0.05)


def _figures(kl: float, top1: float, snr: float) -> dict:
    part = {"kl_mean": kl, "top1": top1, "top1_clear": top1}
    return {"code0": part, "predictor": part, "pcm_snr_db": snr}


def test_verdict_flags_a_run_worse_than_the_yardstick():
    yardstick, tol = _figures(1e-4, 0.95, 40.0), Tolerance()
    assert all(verdict(_figures(1.2e-4, 0.94, 39.0), yardstick, tol).values())
    worse = verdict(_figures(3e-4, 0.80, 30.0), yardstick, tol)
    assert not any(worse.values())
    assert verdict(_figures(0.0, 1.0, 120.0), _figures(0.0, 1.0, 120.0), tol)["code0_kl"]  # both exact


def test_fp32_voxgate_matches_the_official_fp32_frame_by_frame(tiny_dirs):
    """fp32 against fp32, teacher-forced: KL ~0 and every top-1 equal, alone and in a bucket,
    while the official bf16 run shows a real (nonzero) error: the comparison can see one."""
    result = measure(tiny_dirs["cv06"], "cpu", torch.float32, frames=8, seed=3, bucket=4)
    assert result["frames"] == 24 and result["cases"] == ["speaker-en", "dialect-zh", "streamed-text"]
    for figures in (result["voxgate"], result["bucket"]["vs_fp32"], result["bucket"]["vs_alone"]):
        for part in ("code0", "predictor"):
            assert figures[part]["kl_max"] < 1e-9 and figures[part]["top1"] == 1.0
        assert figures["pcm_snr_db"] > 80
    yardstick = result["official_bf16"]
    assert 1e-7 < yardstick["code0"]["kl_mean"] < 1e-2 and yardstick["pcm_snr_db"] < 80
    assert all(result["holds"].values())


@pytest.mark.parametrize(("model", "cases"), [("b06", ["clone-xvector", "clone-icl"]),
                                              ("vd17", ["design-warm", "design-bright"])])  # fmt: skip
def test_clones_and_designed_voices_are_forced_alike(tiny_dirs, model, cases):
    result = measure(tiny_dirs[model], "cpu", torch.float32, frames=6, seed=5)
    assert result["cases"] == cases and "bucket" not in result
    assert result["voxgate"]["predictor"]["kl_max"] < 1e-9 and result["voxgate"]["code0"]["top1"] == 1.0


def test_the_command_writes_json_and_exits_nonzero_only_when_parity_fails(tiny_dirs, tmp_path, capsys):
    out = tmp_path / "parity.json"
    argv = ["bench", "parity", "--model-dir", str(tiny_dirs["cv06"]), "--device", "cpu", "--dtype", "float32",
            "--frames", "4", "--bucket", "2", "--output-json", str(out)]  # fmt: skip
    assert main(argv) == 0  # the lean codec path holds (in fp32 its PCM is the plain path's)
    report = json.loads(out.read_text())
    assert report["bench"] == "parity" and report["frames"] == 12 and report["bucket"]["rows"] == 2
    assert report["codec_lean"] is True  # by default the path the server runs (VOXGATE_QWEN3_CODEC_LEAN)
    printed = capsys.readouterr().out
    assert "official fp32 speaker-en" in printed and "holds: code0_kl yes" in printed
