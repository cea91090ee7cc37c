"""The batched decoder and its runner, eagerly on the CPU: many streams stepped together give
each stream what it gets alone (greedy codes equal the reference path), per-row sampling,
priority, busy and cancel through the engine."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest
import torch

from voxgate.engines.qwen3.batch import BatchDecoder, attention_lengths
from voxgate.engines.qwen3.codec import DecoderState
from voxgate.engines.qwen3.config import SamplingParams
from voxgate.engines.qwen3.engine import Qwen3Engine
from voxgate.engines.qwen3.generate import generate_codes
from voxgate.engines.qwen3.prompt import PromptBuilder
from voxgate.engines.qwen3.runner import END, Job
from voxgate.engines.qwen3.sampling import hashed_gumbel, hashed_uniform, sample_rows
from voxgate.types import Busy, CancelToken, SynthesisRequest

TEXTS = ["Batched rows, same codes.", "A second stream joins later on.", "Third!"]


def _prompts(ck, stream_text=False):
    builder = PromptBuilder(ck.config, ck.tokenizer, ck.talker)
    speakers = ["vivian", "ryan", "serena"]
    pairs = zip(TEXTS, speakers, strict=True)
    return [builder.build(t, speaker=s, language="English", stream_text=stream_text) for t, s in pairs]


def _run(decoder, prompts, params, joins, frames, seeds=(0, 0, 0), holds=None):
    """Admit prompt i into row i at step joins[i]; step until each has `frames` frames.
    `holds` {i: steps}: at those steps stream i is held (in the bucket, not moving)."""
    holds = holds or {}
    codes = {i: [] for i in range(len(prompts))}
    pcm = {i: [] for i in range(len(prompts))}
    taken = dict.fromkeys(range(len(prompts)), 0)
    step = 0
    while any(n < frames for n in taken.values()):
        for i, join in enumerate(joins):
            if join == step:
                decoder.admit(i, prompts[i], params, seeds[i])
        started = [i for i, join in enumerate(joins) if join <= step and taken[i] < frames]
        if started:
            for i in started:
                decoder.hold(i, step in holds.get(i, ()))
            live = [i for i in started if step not in holds.get(i, ())]
            result = decoder.step(next(b for b in decoder.buckets if b > max(started)), live)
            for i in live:
                codes[i].append(torch.from_numpy(result.codes[i]))
                pcm[i].append(result.pcm[i])
                taken[i] += 1
                if taken[i] == frames:
                    decoder.release(i)
        step += 1
    return codes, pcm


@pytest.mark.parametrize("stream_text", [False, True])
def test_streams_stepped_together_draw_the_codes_each_draws_alone(ours, stream_text):
    ck = ours["cv06"]
    params = SamplingParams.greedy(max_new_tokens=40, min_new_tokens=40)  # EOS blocked: fixed length
    prompts = _prompts(ck, stream_text)
    decoder = BatchDecoder(ck.talker, ck.codec, slots=4, capacity=128)
    codes, pcm = _run(decoder, prompts, params, joins=[0, 3, 5], frames=12)
    for i, prompt in enumerate(prompts):
        alone = torch.stack(list(generate_codes(ck.talker, prompt, params)))[:12]
        assert torch.equal(torch.stack(codes[i]), alone), f"stream {i}"
        offline = ck.codec.decode(alone.T[None])[0].numpy()
        np.testing.assert_allclose(np.concatenate(pcm[i]), offline, atol=1e-5)


def test_a_row_reused_by_a_new_stream_starts_clean(ours):
    ck = ours["cv06"]
    params = SamplingParams.greedy(max_new_tokens=40, min_new_tokens=40)
    prompts = _prompts(ck)
    decoder = BatchDecoder(ck.talker, ck.codec, slots=2, capacity=128)
    _run(decoder, prompts[:1], params, joins=[0], frames=9)
    codes, _ = _run(decoder, prompts[1:2], params, joins=[0], frames=6)  # row 0 again
    alone = torch.stack(list(generate_codes(ck.talker, prompts[1], params)))[:6]
    assert torch.equal(torch.stack(codes[0]), alone)


@pytest.mark.parametrize("sampled", [False, True])
def test_a_held_row_resumes_exactly_where_it_stopped(ours, sampled):
    """Holding streams (the runner's deadline rule) must not change a note of their audio:
    held at any step, right after their prefill, or all at once, each stream draws the codes
    and decodes the PCM it gets never held, and the others are not disturbed."""
    ck = ours["cv06"]
    if sampled:  # repetition penalty on: a held row must not record the code it did not take
        params = SamplingParams(max_new_tokens=40, min_new_tokens=40, top_p=0.9, repetition_penalty=1.3)
    else:
        params = SamplingParams.greedy(max_new_tokens=40, min_new_tokens=40)
    prompts = _prompts(ck)
    decoder = BatchDecoder(ck.talker, ck.codec, slots=4, capacity=128, sampling=params)
    seeds = (5, 6, 7)
    plain_codes, plain_pcm = _run(decoder, prompts, params, joins=[0, 1, 2], frames=9, seeds=seeds)
    holds = {0: {1, 2, 5, 6, 7}, 1: {1, 4, 5}, 2: {2, 3, 5, 9}}  # step 5: every row held
    held_codes, held_pcm = _run(decoder, prompts, params, joins=[0, 1, 2], frames=9, seeds=seeds, holds=holds)
    for i in range(3):
        assert torch.equal(torch.stack(held_codes[i]), torch.stack(plain_codes[i])), f"stream {i}"
        np.testing.assert_allclose(np.concatenate(held_pcm[i]), np.concatenate(plain_pcm[i]), atol=1e-5)
    assert decoder.held == set()


def test_sampled_rows_follow_their_own_seed_whatever_else_is_in_the_batch(ours):
    ck = ours["cv06"]
    params = SamplingParams(max_new_tokens=40, min_new_tokens=40, top_p=0.9)
    prompts = _prompts(ck)
    decoder = BatchDecoder(ck.talker, ck.codec, slots=4, capacity=128, sampling=params)
    assert decoder.nucleus and decoder.sample_width == 50
    alone, _ = _run(decoder, prompts[:1], params, joins=[0], frames=8, seeds=(5,))
    crowd, _ = _run(decoder, prompts, params, joins=[0, 0, 2], frames=8, seeds=(5, 6, 7))
    assert torch.equal(torch.stack(alone[0]), torch.stack(crowd[0]))
    other, _ = _run(decoder, prompts[:1], params, joins=[0], frames=8, seeds=(6,))
    assert not torch.equal(torch.stack(alone[0]), torch.stack(other[0]))


def test_settings_outside_the_captured_sampler_are_refused(ours):
    ck = ours["cv06"]
    decoder = BatchDecoder(ck.talker, ck.codec, slots=2, capacity=128, sampling=SamplingParams(top_k=20))
    prompt = _prompts(ck)[0]
    with pytest.raises(ValueError, match="top_k"):
        decoder.admit(0, prompt, SamplingParams(top_k=0), seed=1)
    with pytest.raises(ValueError, match="top_p"):
        decoder.admit(0, prompt, SamplingParams(top_k=20, subtalker_top_k=20, top_p=0.5), seed=1)


def test_attention_lengths_double_up_to_the_capacity():
    assert attention_lengths(2048) == (256, 512, 1024, 2048)
    assert attention_lengths(600) == (256, 512, 600)


def test_hashed_noise_is_uniform_and_counter_based():
    seeds = torch.tensor([1, 2])
    counters = torch.arange(32).view(2, 16)
    u = hashed_uniform(seeds, counters, 4096)
    assert u.shape == (2, 16, 4096) and u.min() > 0 and u.max() < 1
    assert abs(u.mean().item() - 0.5) < 0.01 and abs(u.var().item() - 1 / 12) < 0.005
    assert torch.equal(u[0], hashed_uniform(seeds[:1], counters[:1], 4096)[0])  # row-independent
    assert not torch.equal(u[0, 0], u[0, 1])


def test_per_row_sampling_settings():
    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0]]).repeat(4, 1)
    n = 20000
    counters = torch.arange(n)[:, None]
    gumbel = hashed_gumbel(torch.full((n,), 3), counters, 4)[:, 0]

    def draws(do_sample, top_k, top_p, temperature=1.0, width=0):
        rows = logits[:1].repeat(n, 1)
        return sample_rows(
            rows,
            gumbel,
            torch.full((n,), do_sample),
            torch.full((n, 1), temperature),
            torch.full((n,), top_k),
            torch.full((n,), top_p),
            width,
        )

    freq = torch.bincount(draws(True, 0, 1.0), minlength=4).float() / n
    assert torch.allclose(freq, torch.softmax(logits[0], dim=0), atol=0.015)  # Gumbel-max = softmax
    assert set(draws(True, 2, 1.0).tolist()) == {0, 1}  # top-k
    assert torch.equal(draws(True, 2, 1.0, width=2), draws(True, 2, 1.0))  # only the top-2 ranked: same draws
    assert set(draws(True, 3, 1.0, width=3).tolist()) == {0, 1, 2}
    assert set(draws(True, 0, 0.7).tolist()) == {0, 1}  # top-p: 0.64 < 0.7 needs the second id
    assert set(draws(True, 0, 0.5).tolist()) == {0}
    assert set(draws(False, 0, 1.0).tolist()) == {0}  # greedy
    cold = torch.bincount(draws(True, 0, 1.0, temperature=0.25), minlength=4).float() / n
    assert cold[0] > 0.97


# ------------------------------------------------------------------ the engine in batched mode


def _engine(ours, **kw):
    params = SamplingParams.greedy(max_new_tokens=40, min_new_tokens=40)
    return Qwen3Engine(ours["cv06"], sampling=params, batched=True, kv_capacity=256, **kw)


def _speak(engine, text, voice="vivian", cancel=None, priority=0):
    request = SynthesisRequest(text=text, voice=voice, language="en", priority=priority)
    return [c.samples for c in engine.stream(request, cancel or CancelToken())]


def test_a_stream_opens_at_once_only_where_its_prompt_is_token_ids(ours, tiny_dirs):
    """`opens_at_once` (the server opens such streams on its event loop): batched with a text
    table, a CustomVoice stream's open is ids and a queue put; a built prompt (no table) is
    model work, a Base model's cloned voice is GPU work, and the eager engine has no polled path.
    The server's `VOXGATE_QWEN3_TEXT_TABLE` reaches the engine (on a CPU it is off by default)."""
    from voxgate.config import Settings
    from voxgate.engines.qwen3.engine import create

    served = {"engine": "qwen3", "qwen3_model_dir": tiny_dirs["cv06"], "qwen3_batched": True, "qwen3_kv_capacity": 256}
    cases = [(_engine(ours, text_table=True), True), (_engine(ours, text_table=False), False),
             (Qwen3Engine(ours["b06"], batched=True, kv_capacity=256, text_table=True), False),
             (Qwen3Engine(ours["cv06"]), False), (create(Settings(**served, qwen3_text_table=True)), True),
             (create(Settings(**served)), False)]  # fmt: skip
    try:
        assert [engine.opens_at_once for engine, _ in cases] == [want for _, want in cases]
    finally:
        for engine, _ in cases:
            engine.close()


@pytest.mark.parametrize(("prompt_thread", "text_table"), [(False, False), (True, False), (False, True)])
def test_concurrent_requests_each_get_what_they_get_alone(ours, prompt_thread, text_table):
    """Batched streams sound as each does alone, whether their prompts come built or as plans
    the runner embeds together (`text_table`, the GPU default)."""
    eager = Qwen3Engine(ours["cv06"], sampling=SamplingParams.greedy(max_new_tokens=12, min_new_tokens=12))
    batched = Qwen3Engine(
        ours["cv06"], sampling=SamplingParams.greedy(max_new_tokens=12, min_new_tokens=12), batched=True, max_streams=4,
        prompt_thread=prompt_thread, text_table=text_table,
    )  # fmt: skip
    assert (batched.runner.decoder.text_table is not None) == text_table
    try:
        expected = {t: np.concatenate(_speak(eager, t)) for t in TEXTS}
        got: dict[str, np.ndarray] = {}

        def speak(text):
            got[text] = np.concatenate(_speak(batched, text))

        threads = [threading.Thread(target=speak, args=(t,)) for t in TEXTS]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=120)
        for text in TEXTS:
            assert len(got[text]) == 11 * 1920  # 12 draws: the last yields no frame
            np.testing.assert_allclose(got[text], expected[text], atol=1e-5)
        assert batched.counters()["streams"]["admitted"] == 3
        assert batched.runner.load() == (0, 0)
    finally:
        batched.close()


def _job(engine, name, text, voice, play_at=None):
    prompt = engine.prompts.build(text, speaker=voice, language="english")
    return Job(name, prompt, engine.sampling, 1, 40, CancelToken(), play_at=play_at)


def _frames(job):
    frames = []
    while (item := job.frames.get(timeout=120)) is not END:
        assert not isinstance(item, BaseException), item
        pcm, pcm16 = item
        assert pcm16 is None  # the runner makes 16-bit PCM only when asked (`pcm16_step`)
        frames.append(pcm)
    return np.concatenate(frames)


def test_a_stream_far_ahead_of_its_listener_waits_while_one_that_is_due_runs(ours):
    """The deadline rule end to end: submitted together, a stream needed in a quarter of an
    hour is held for every step of a stream needed now (so that one's steps carry it alone),
    then runs, and its audio is what it is never held."""
    engine = _engine(ours, max_streams=2)
    runner = engine.runner
    try:
        alone = _frames(_submitted(runner, _job(engine, "alone", "Far ahead.", "vivian")))
        assert runner.stats.rows_held == 0
        due = _job(engine, "due", "Needed right now.", "ryan")
        ahead = _job(engine, "ahead", "Far ahead.", "vivian", play_at=time.perf_counter() + 900)
        with runner._lock:  # both in the runner's first plan (the lock is re-entrant)
            runner.submit(due)
            runner.submit(ahead)
        due_audio, ahead_audio = _frames(due), _frames(ahead)
        assert len(due_audio) == len(alone) == 39 * 1920
        np.testing.assert_allclose(ahead_audio, alone, atol=1e-5)
        assert runner.stats.rows_held >= 39  # held in each of the due stream's steps
        assert ahead.first_frame_at > due.first_frame_at
    finally:
        engine.close()


class _Listener:
    """A listener's clock standing still: it needs its next audio at `at`."""

    def __init__(self, at, absent=False):
        self.at, self.absent = at, absent

    def due(self, now):
        return self.at


def test_what_the_listener_has_decides_a_hold_not_what_the_runner_made(ours):
    """With the listener's clock on the job, the lead is the audio the listener has in hand: a
    listener with a quarter of an hour buffered is held behind a due stream, one that is starved
    is never held, however far its frames ran ahead of `play_at`."""
    engine = _engine(ours, max_streams=2)
    runner = engine.runner
    try:
        for shift, held in ((900, True), (-900, False)):
            before, now = runner.stats.rows_held - runner.stats.rows_stalled, time.perf_counter()
            due = _job(engine, f"due-{held}", "Needed right now.", "ryan")
            # play_at alone would say the opposite: needed at once (-> never held), or in 900 s (-> held)
            listened = _job(engine, f"listened-{held}", "Far ahead.", "vivian", play_at=now - shift)
            listened.listener = _Listener(now + shift)
            with runner._lock:
                runner.submit(due)
                runner.submit(listened)
            _frames(due), _frames(listened)
            # Held by the deadline rule (not for `listened`'s frames waiting, unread, while `due` is read).
            by_deadline = runner.stats.rows_held - runner.stats.rows_stalled - before
            assert by_deadline >= 39 if held else by_deadline == 0
    finally:
        engine.close()


def test_a_stream_whose_reader_stops_is_held_until_it_reads_again(ours):
    """A job nobody reads is held once its reader is `backlog` frames behind (not run to its
    end into memory), the others go on as if it were not there, and it moves again when read:
    its audio is what it is never held."""
    engine = _engine(ours, max_streams=2)
    runner = engine.runner
    try:
        # The reference, never held: its 39 frames are fewer than the default backlog (whether the
        # reader keeps up is the threads' timing, so no test rests on it).
        assert runner.backlog_frames is not None and runner.backlog_frames > 40
        alone = _frames(_submitted(runner, _job(engine, "alone", "Far ahead.", "vivian")))
        runner.backlog_frames = 5
        unread = _submitted(runner, _job(engine, "unread", "Far ahead.", "vivian"))
        other = _frames(_submitted(runner, _job(engine, "other", "Needed right now.", "ryan")))
        assert len(other) == 39 * 1920
        # Held at 5 frames behind; the step already launched when it was held may add one more.
        assert unread.frames.qsize() <= 6 and runner.stats.rows_stalled > 0
        np.testing.assert_allclose(_frames(unread), alone, atol=1e-5)
    finally:
        engine.close()


def _submitted(runner, job):
    runner.submit(job)
    return job


def test_cancel_frees_the_row_and_a_full_queue_says_busy(ours):
    engine = _engine(ours, max_streams=1, max_waiting=1)
    try:
        cancel = CancelToken()
        first = engine.stream(SynthesisRequest(text="Hold the only row.", voice="vivian"), cancel)
        next(first)  # running
        second = engine.stream(SynthesisRequest(text="Wait in line.", voice="ryan"), CancelToken())
        waiter = threading.Thread(target=lambda: list(second))
        waiter.start()
        for _ in range(3000):  # until the second request is queued (30 s: a busy machine)
            if engine.runner.load() == (1, 1):
                break
            threading.Event().wait(0.01)
        assert engine.runner.load() == (1, 1)
        with pytest.raises(Busy):
            list(engine.stream(SynthesisRequest(text="No room.", voice="serena"), CancelToken()))
        cancel.cancel()
        assert len(list(first)) <= 2  # the stream ends within a step or two, not after its 40 frames
        waiter.join(timeout=120)
        assert not waiter.is_alive()
        assert engine.runner.stats.cancelled == 1 and engine.runner.load() == (0, 0)
    finally:
        engine.close()


def test_higher_priority_is_served_first(ours):
    engine = _engine(ours, max_streams=1)
    try:
        order: list[str] = []
        hold = CancelToken()
        first = engine.stream(SynthesisRequest(text="Hold the row.", voice="vivian"), hold)
        next(first)

        def speak(name, priority):
            _speak(engine, name, priority=priority)
            order.append(name)

        low = threading.Thread(target=speak, args=("background", 0))
        low.start()
        while engine.runner.load()[1] < 1:
            threading.Event().wait(0.01)
        high = threading.Thread(target=speak, args=("live turn", 10))
        high.start()
        while engine.runner.load()[1] < 2:
            threading.Event().wait(0.01)
        hold.cancel()
        list(first)
        low.join(timeout=120)
        high.join(timeout=120)
        assert order == ["live turn", "background"]
    finally:
        engine.close()


def test_a_dropped_reader_frees_its_row(ours):
    engine = _engine(ours, max_streams=2)
    try:
        stream = engine.stream(SynthesisRequest(text="Nobody reads me.", voice="vivian"), CancelToken())
        next(stream)
        stream.close()  # the generator is closed without a cancel (client gone)
        for _ in range(3000):  # 30 s: a busy machine
            if engine.runner.load() == (0, 0):
                break
            threading.Event().wait(0.01)
        assert engine.runner.load() == (0, 0)
    finally:
        engine.close()


def test_the_codec_state_keeps_rows_apart(ours):
    codec = ours["cv06"].codec
    codes = torch.randint(0, 2048, (2, 16, 6), generator=torch.Generator().manual_seed(3))
    state = DecoderState()
    codec.decode(torch.zeros(2, 16, 1, dtype=torch.long), state)
    state.freeze_rows(torch.device("cpu"), 2)
    state.start_row(1)
    out = []
    for t in range(6):
        if t == 2:
            state.start_row(1)  # row 1 starts over mid-way; row 0 carries on
        out.append(codec.decode(codes[:, :, t : t + 1], state.rows(2)))
    out = torch.cat(out, dim=-1)
    torch.testing.assert_close(out[0], codec.decode(codes[:1])[0], atol=1e-5, rtol=0)
    torch.testing.assert_close(out[1, 2 * 1920 :], codec.decode(codes[1:, :, 2:])[0], atol=1e-5, rtol=0)


def test_the_fused_fast_path_computes_what_the_reference_path_does(ours):
    """`Talker.fuse()` (used on GPUs): one q/k/v and one gate/up projection, RoPE tables, masks
    once per step. On the CPU it must give the same codes and nearly the same numbers."""
    import copy

    ck = ours["cv06"]
    fused = copy.deepcopy(ck.talker)
    fused.fuse()
    assert fused.model.rope_table is not None and fused.model.layers[0].self_attn.qkv is not None
    params = SamplingParams.greedy(max_new_tokens=40, min_new_tokens=40)
    prompt = _prompts(ck)[1]
    expected = torch.stack(list(generate_codes(ck.talker, prompt, params)))[:10]
    assert torch.equal(torch.stack(list(generate_codes(fused, prompt, params)))[:10], expected)
    plain = BatchDecoder(ck.talker, ck.codec, slots=2, capacity=128)
    fast = BatchDecoder(fused, ck.codec, slots=2, capacity=128)
    a, _ = _run(plain, [prompt], params, joins=[0], frames=10)
    b, _ = _run(fast, [prompt], params, joins=[0], frames=10)
    assert torch.equal(torch.stack(a[0]), torch.stack(b[0])) and torch.equal(torch.stack(b[0]), expected)
    torch.testing.assert_close(fast.hidden, plain.hidden, atol=1e-4, rtol=1e-4)


def test_rope_by_rotation_matrix_is_rotate_half_exactly():
    from voxgate.engines.qwen3 import ops

    x = torch.randn(2, 3, 4, 8, generator=torch.Generator().manual_seed(1)).bfloat16()
    rot = ops.rotation(8, torch.bfloat16, torch.device("cpu"))
    assert torch.equal(x @ rot, torch.cat([-x[..., 4:], x[..., :4]], dim=-1))


def test_failures_reach_the_reader_typed_and_the_runner_recovers_or_says_it_stopped(ours):
    """Fault injection (the decoder's methods replaced by ones that raise): a failing prefill or
    step fails its streams with a typed error and the runner carries on; if the loop itself
    breaks, every stream gets a typed error and new ones are refused instead of waiting forever."""
    from voxgate.types import EngineFailure

    engine = _engine(ours, max_streams=2)
    decoder = engine.runner.decoder
    request = SynthesisRequest(text="Faults, then speech.", voice="vivian")
    try:
        real_admit, real_launch = decoder.admit_many, decoder.launch

        def bad_admit(admissions):
            real_admit(admissions)  # rows half-started, then the failure
            raise RuntimeError("injected prefill fault")

        decoder.admit_many = bad_admit
        with pytest.raises(EngineFailure, match="prefill failed"):
            list(engine.stream(request, CancelToken()))
        assert int(decoder.active.sum()) == 0  # the half-started row does not keep moving
        decoder.admit_many = real_admit
        decoder.launch = lambda b, rows: (_ for _ in ()).throw(RuntimeError("injected step fault"))
        with pytest.raises(EngineFailure, match="decode step failed"):
            list(engine.stream(request, CancelToken()))
        decoder.launch = real_launch
        assert len(_speak(engine, request.text)) == 39  # the runner carries on
        engine.runner.scheduler.plan = lambda: (_ for _ in ()).throw(RuntimeError("injected loop fault"))
        with pytest.raises(EngineFailure):
            list(engine.stream(request, CancelToken()))
        with pytest.raises(EngineFailure, match="closed"):
            list(engine.stream(request, CancelToken()))
    finally:
        engine.close()


@pytest.mark.parametrize("packet_frames", [1, 3])
def test_the_runner_hands_out_16_bit_pcm_once_per_step_when_asked(ours, packet_frames):
    """`pcm16_step`: every chunk carries its samples as 16-bit PCM, exactly `to_pcm16` of its
    float samples (converted once per step for every row); off, chunks carry none."""
    from voxgate.audio import to_pcm16
    from voxgate.speech.stream import join_chunks

    params = SamplingParams.greedy(max_new_tokens=8, min_new_tokens=8)
    request = SynthesisRequest(text="Sixteen bits.", voice="vivian", language="en")
    on = Qwen3Engine(ours["cv06"], packet_frames, sampling=params, batched=True, kv_capacity=256, pcm16_step=True)
    off = Qwen3Engine(ours["cv06"], packet_frames, sampling=params, batched=True, kv_capacity=256)
    try:
        chunks = list(on.stream(request, CancelToken()))
        plain = list(off.stream(request, CancelToken()))
        assert len(chunks) == len(plain) >= 2 and all(c.pcm16 is None for c in plain)
        for chunk, other in zip(chunks, plain, strict=True):
            assert chunk.pcm16 is not None and chunk.pcm16.dtype == np.int16
            assert np.array_equal(chunk.pcm16, to_pcm16(chunk.samples))
            np.testing.assert_allclose(chunk.samples, other.samples, atol=1e-5)
        joined = join_chunks(chunks)
        assert np.array_equal(joined.pcm16, to_pcm16(joined.samples))
        assert join_chunks([chunks[0], plain[1]]).pcm16 is None  # not every part has it: none
    finally:
        on.close()
        off.close()


def _polled_run(engine, text, polled, cancel_after=0, voice="vivian"):
    """One stream through `EngineStream` on a pool with `polled` (its own event loop)."""
    import asyncio

    from voxgate.speech.stream import EngineStream
    from voxgate.speech.workers import EnginePool

    async def main():
        pool = EnginePool(8)
        pool.polled = polled
        stream = EngineStream(engine, SynthesisRequest(text=text, voice=voice, language="en"), pool)
        out = []
        try:
            while (chunk := await stream.next()) is not None:
                if stream._source is not None:  # the runner's clocks ride on the first chunk only
                    if not out:
                        m = chunk.marks
                        assert m is not None and m["submitted"] <= m["first_step"] <= m["first_frame"] <= chunk.t_ready
                    else:
                        assert chunk.marks is None
                out.append(chunk.samples)
                if cancel_after and len(out) == cancel_after:
                    break
        finally:
            stream.cancel("done")
        return out, stream._source is not None, stream.exhausted

    return asyncio.run(main())


@pytest.mark.parametrize("text_table", [False, True])
def test_polled_streams_sound_as_threaded_ones_and_give_their_rows_back(ours, text_table):
    """`EnginePool.polled`: the runner wakes the reader's loop instead of a thread per stream;
    the audio is the same, streams that run together still sound as alone, a stream left
    after two chunks frees its row, and a refusal reaches the reader typed; with a text table
    the streams open on the event loop (`opens_at_once`), the same in every respect."""
    from concurrent.futures import ThreadPoolExecutor

    from voxgate.types import UnknownVoice

    engine = _engine(ours, max_streams=4, text_table=text_table)
    assert engine.opens_at_once is text_table
    try:
        threaded, via_source, _ = _polled_run(engine, TEXTS[0], polled=False)
        assert not via_source
        polled, via_source, exhausted = _polled_run(engine, TEXTS[0], polled=True)
        assert via_source and exhausted and len(polled) == len(threaded) == 39
        np.testing.assert_allclose(np.concatenate(polled), np.concatenate(threaded), atol=1e-5)
        alone = {t: np.concatenate(_polled_run(engine, t, polled=False)[0]) for t in TEXTS}
        with ThreadPoolExecutor(len(TEXTS)) as pool:  # three loops, one runner: batched together
            runs = pool.map(lambda t: _polled_run(engine, t, polled=True)[0], TEXTS)
            together = dict(zip(TEXTS, runs, strict=True))
        for text in TEXTS:
            np.testing.assert_allclose(np.concatenate(together[text]), alone[text], atol=1e-5)
        cut, _, exhausted = _polled_run(engine, TEXTS[1], polled=True, cancel_after=2)
        assert len(cut) == 2 and not exhausted
        deadline = time.monotonic() + 60  # the runner frees a closed job's row at its next step
        while engine.runner.load() != (0, 0) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert engine.runner.load() == (0, 0)
        with pytest.raises(UnknownVoice):
            _polled_run(engine, TEXTS[0], polled=True, voice="nobody")
    finally:
        engine.close()


def test_a_stream_nobody_listens_to_gives_its_row_to_one_somebody_does(ours):
    """One row: a stream whose listener is absent (a dropped WebSocket session) is running when
    a stream somebody listens to arrives; the absent one is stopped with `Preempted` (its row
    freed, never handed out again) and the newcomer runs to its end, sounding as it does alone."""
    from voxgate.types import Preempted

    params = SamplingParams.greedy(max_new_tokens=300, min_new_tokens=300)  # no EOS: it cannot end first
    engine = Qwen3Engine(ours["cv06"], sampling=params, batched=True, kv_capacity=512, max_streams=1)
    runner = engine.runner
    try:
        gone = Job("gone", engine.prompts.build("Nobody hears this.", speaker="vivian", language="english"),
                   params, 1, 300, CancelToken(), play_at=time.perf_counter())  # fmt: skip
        gone.listener = _Listener(time.perf_counter(), absent=True)
        runner.submit(gone)
        first = gone.frames.get(timeout=120)  # running in the one row (unread, it stops 4 s of frames on)
        assert not isinstance(first, BaseException)
        here = _job(engine, "here", "Somebody hears this.", "ryan", play_at=time.perf_counter())
        here.listener = _Listener(time.perf_counter())
        runner.submit(here)
        heard = _frames(here)
        while (item := gone.frames.get(timeout=120)) is not END and not isinstance(item, BaseException):
            pass
        assert isinstance(item, Preempted) and gone.ended and runner.stats.preempted == 1 and runner.stats.failed == 0
        assert engine.counters()["streams"]["preempted_no_listener"] == 1
        alone = _job(engine, "alone", "Somebody hears this.", "ryan")
        runner.submit(alone)
        np.testing.assert_allclose(heard, _frames(alone), atol=1e-5)
        assert runner.load() == (0, 0)
    finally:
        engine.close()


def test_an_admission_sets_each_rows_own_state_and_settings_and_touches_no_other_row(ours):
    """The per-row state lives in three tables (one per dtype) written in one copy each: every
    field lands in its own row view, distinct main and code-predictor settings included, the
    other rows keep theirs, and holding or releasing a row changes only its `active`."""
    from voxgate.engines.qwen3.batch import Admission

    ck = ours["cv06"]
    prompt = PromptBuilder(ck.config, ck.tokenizer, ck.talker).build("State.", speaker="vivian", language="English",
                                                                        stream_text=True)  # fmt: skip
    params = SamplingParams(do_sample=True, subtalker_do_sample=False, temperature=0.7, subtalker_temperature=0.3,
                            top_k=11, subtalker_top_k=13, top_p=0.8, subtalker_top_p=0.6, repetition_penalty=1.2,
                            min_new_tokens=5)  # fmt: skip
    decoder = BatchDecoder(ck.talker, ck.codec, slots=3, capacity=256, sampling=SamplingParams(top_p=0.9))
    names = ["position", "draws", "active", "trailing_len", "seeds", "top_k", "sub_top_k", "min_new", "do_sample",
             "sub_do_sample", "temperature", "sub_temperature", "top_p", "sub_top_p", "penalty"]  # fmt: skip
    before = {n: getattr(decoder, n).clone() for n in names}
    decoder.admit_many([Admission(1, prompt, params, 2**40 + 9)])
    got = {n: getattr(decoder, n)[1].item() for n in names}
    want = {"position": prompt.length, "draws": 0, "active": 1, "seeds": (2**40 + 9) & 0x7FFFFFFF,
            "trailing_len": min(prompt.trailing_rows, decoder.max_text_rows), "top_k": 11, "sub_top_k": 13,
            "min_new": 5, "do_sample": True, "sub_do_sample": False}  # fmt: skip
    floats = {"temperature": 0.7, "sub_temperature": 0.3, "top_p": 0.8, "sub_top_p": 0.6, "penalty": 1.2}
    assert {n: got[n] for n in want} == want
    assert {n: got[n] for n in floats} == pytest.approx(floats)  # float32 in the table
    for n in names:  # rows 0 and 2 as they were
        assert torch.equal(getattr(decoder, n)[[0, 2]], before[n][[0, 2]]), n
    decoder.hold(1, True)
    assert decoder.active.tolist() == [0, 0, 0] and decoder.draws[1].item() == 0
    decoder.hold(1, False)
    decoder.release(1)
    assert decoder.active.tolist() == [0, 0, 0] and decoder.top_k[1].item() == 11


def test_admitting_more_prompts_together_issues_no_more_operations_outside_the_model(ours):
    """A burst's admissions go into the prefill buffers and the rows' text in a few copies
    whatever their number (the runner does this holding the GIL the event loop wants): admitting
    8 prompts together issues as many operations outside the talker's forward as admitting 2.
    Counted on the CPU, where the fixed-shape path the GPU replays as graphs runs eagerly."""
    from voxgate.bench.op_count import count_ops
    from voxgate.engines.qwen3.batch import Admission

    ck = ours["cv06"]
    builder = PromptBuilder(ck.config, ck.tokenizer, ck.talker)
    texts = [f"Prompt number {i} of a burst." for i in range(8)]
    prompts = [builder.build(t, speaker="vivian", language="English", stream_text=True) for t in texts]
    params = SamplingParams.greedy()

    def outside_the_model(n: int) -> int:
        decoder = BatchDecoder(ck.talker, ck.codec, slots=8, capacity=256)
        with count_ops({"model": ck.talker.model, "head": ck.talker.codec_head}) as count:
            decoder.admit_many([Admission(i, prompts[i], params, i) for i in range(n)])
        assert count.ops["model"] > 0  # the forward ran through the counted module
        return count.ops["other"]

    assert outside_the_model(8) == outside_the_model(2) <= 49  # 60 before the per-row state tables
