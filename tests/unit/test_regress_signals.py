"""The regression harness's signal checks: each one quiet on good audio, loud on the fault it
exists for (voxgate.regress.signals, voxgate.regress.faults)."""

from __future__ import annotations

import numpy as np
import pytest

from tests.unit.regress_audio import GOOD, synthetic_speech, tone_speech
from voxgate.regress import faults, signals


@pytest.fixture(params=sorted(GOOD))
def good(request: pytest.FixtureRequest) -> tuple[np.ndarray, int]:
    return GOOD[request.param]()


def test_duration_rms_and_pcm_hash_follow_their_definitions():
    sr = 8000
    sine = 0.5 * np.sin(2 * np.pi * 100 * np.arange(sr) / sr)
    assert signals.duration_s(sine, sr) == 1.0
    assert signals.rms(sine) == pytest.approx(0.5 / np.sqrt(2), rel=1e-3)
    assert signals.rms(np.zeros(0)) == 0.0
    nudged = sine.copy()
    nudged[101] += 2 / 32767
    assert signals.pcm_hash(sine) == signals.pcm_hash(sine.astype(np.float32))
    assert signals.pcm_hash(sine) != signals.pcm_hash(nudged)


def test_good_audio_has_no_problems(good):
    assert signals.audio_problems(*good) == []


@pytest.mark.parametrize(
    ("make", "problem"),
    [
        (lambda x: x[:0], "empty"),
        (lambda x: np.where(np.arange(len(x)) == 50, np.nan, x), "non_finite"),
        (lambda x: np.where(np.arange(len(x)) == 50, np.inf, x), "non_finite"),
        (np.zeros_like, "silent"),
        (lambda x: x[:100], "too_short"),
    ],
)
def test_broken_audio_is_named_for_what_is_wrong(make, problem):
    x, sr = tone_speech()
    assert problem in signals.audio_problems(make(x), sr)


def test_clipping_counts_flat_tops_not_a_normalised_peak(good):
    x, sr = good
    normalised = x / np.abs(x).max()  # touches full scale at one sample
    assert signals.clipping_ratio(normalised) == 0.0
    assert signals.clipping_ratio(faults.clip(x, sr)) > 0.01


def test_click_score_is_low_for_speech_and_high_for_a_spike_or_a_dropped_piece(good):
    x, sr = good
    assert signals.click_score(x, sr).score < 15
    spiked = signals.click_score(faults.spike(x, sr), sr)
    assert spiked.score > 60 and spiked.count >= 1
    top = int(np.argmax(x))  # samples lost mid-waveform: from a crest straight to a trough
    trough = top + int(np.argmin(x[top : top + sr // 100]))
    dropped = np.concatenate([x[:top], x[trough:]])
    assert signals.click_score(dropped, sr).score > 30


def test_click_score_points_at_the_spike():
    x, sr = synthetic_speech()
    y = x.copy()
    y[sr] = 0.9
    assert signals.click_score(y, sr).worst_s == pytest.approx(1.0, abs=0.002)


def test_spikes_find_a_boom_over_quiet_speech_but_not_speech_itself(good):
    x, sr = good
    assert signals.spikes(x, sr).count == 0
    y = 0.3 * x
    at, n = len(y) // 3, round(0.04 * sr)
    y[at : at + n] += 0.9 * np.sin(2 * np.pi * 80 * np.arange(n) / sr)
    found = signals.spikes(y, sr)
    assert found.count >= 1 and found.first_s == pytest.approx(at / sr, abs=0.02)
    assert found.max_abs_peak > 0.8


def test_repeat_found_where_a_segment_is_said_twice(good):
    x, sr = good
    assert signals.find_repeat(x, sr).duration_s == 0.0
    found = signals.find_repeat(faults.repeat_segment(x, sr, seconds=0.6), sr)
    assert found.duration_s == pytest.approx(0.6, abs=0.08)
    assert found.second_s - found.first_s == pytest.approx(0.6, abs=0.03)


def test_repeat_shorter_than_the_minimum_is_not_reported():
    x, sr = synthetic_speech()
    assert signals.find_repeat(faults.repeat_segment(x, sr, seconds=0.2), sr, min_s=0.3).duration_s == 0.0


def test_silence_gap_counts_only_inside_speech(good):
    x, sr = good
    base = signals.max_silence_gap_s(x, sr)
    assert base < 0.3
    padded = np.concatenate([np.zeros(sr), x, np.zeros(sr)])  # leading/trailing silence
    assert signals.max_silence_gap_s(padded, sr) == pytest.approx(base, abs=0.011)
    assert signals.max_silence_gap_s(faults.insert_silence(x, sr, 0.8), sr) >= 0.79
    assert signals.max_silence_gap_s(np.zeros(sr), sr) == 0.0


def test_snr_is_capped_for_identical_audio_and_aligns_a_delay(good):
    x, sr = good
    assert signals.snr_db(x, x, sr) == signals.SNR_CAP_DB
    delayed = np.concatenate([np.zeros(round(0.01 * sr), dtype=x.dtype), x])
    assert signals.align_shift(x, delayed, round(0.05 * sr)) == round(0.01 * sr)
    assert signals.snr_db(x, delayed, sr) == signals.SNR_CAP_DB


def test_snr_measures_added_noise_and_penalises_missing_audio():
    x, sr = synthetic_speech()
    rng = np.random.default_rng(0)
    noise = rng.standard_normal(len(x))
    noise *= signals.rms(x) / signals.rms(noise) / 10  # 20 dB below the signal
    assert signals.snr_db(x, x + noise, sr) == pytest.approx(20.0, abs=0.3)
    assert signals.snr_db(x, x[: len(x) // 2], sr) < 6
    assert signals.snr_db(np.zeros(100), np.ones(100), sr) == -signals.SNR_CAP_DB


def test_pcm16_round_trip_is_what_a_stored_wav_gives_back():
    x, _ = tone_speech()
    from voxgate.audio import decode_wav, wav_bytes

    stored = decode_wav(wav_bytes(x, 24000))[0]
    assert signals.pcm_hash(stored) == signals.pcm_hash(x)
    assert np.array_equal(signals.as_pcm16(stored), signals.as_pcm16(x))


def _low_pass(x: np.ndarray, sr: int, cutoff: float = 3000.0) -> np.ndarray:
    spectrum = np.fft.rfft(x)
    spectrum[np.fft.rfftfreq(len(x), 1 / sr) > cutoff] = 0
    return np.fft.irfft(spectrum, len(x))


def test_mel_distance_and_hf_drop_are_zero_for_a_copy_and_grow_when_muffled():
    x, sr = synthetic_speech()
    assert signals.mel_distance_db(x, x, sr) == 0.0
    assert signals.hf_ratio_drop_db(x, x, sr) == 0.0
    muffled = _low_pass(x, sr)
    assert signals.mel_distance_db(x, muffled, sr) > 3.0
    assert signals.hf_ratio_drop_db(x, muffled, sr) > 20.0
    assert 0.0 < signals.hf_energy_ratio(x, sr) < 1.0
    assert signals.hf_energy_ratio(np.zeros(sr), sr) == 0.0


def test_log_mel_shape_and_floor():
    x, sr = synthetic_speech(seconds=1.0)
    mel = signals.log_mel(x, sr, n_mels=40)
    win, hop = round(0.032 * sr), round(0.010 * sr)
    assert mel.shape == (1 + (len(x) - win) // hop, 40)
    assert mel.min() >= -100.0
    assert signals.log_mel(np.zeros(10), sr).shape[0] == 0


def test_faults_keep_the_dtype_and_change_what_they_claim():
    x, sr = synthetic_speech()
    assert len(faults.insert_silence(x, sr, 1.0)) == len(x) + sr
    assert len(faults.repeat_segment(x, sr, 0.5)) == len(x) + round(0.5 * sr)
    assert len(faults.speed_up(x, sr, 1.25)) == round(len(x) / 1.25)
    assert faults.empty(x, sr).size == 0
    assert np.isnan(faults.nan(x, sr)).sum() == 1
    assert not np.array_equal(faults.noise(x, sr), faults.noise(x, sr))
    for fault in faults.FAULTS.values():
        assert fault(x, sr).dtype == x.dtype
    assert set(faults.EXPECTED_GATE) == set(faults.FAULTS)
