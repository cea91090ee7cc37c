"""A seeded corpus of LLM-like replies for checking the segmenter, and the check itself.

Replies are built from templates whose slots hold things no cut may fall inside (numbers,
dates, URLs, e-mail addresses, abbreviations, markdown, emoji, Latin terms in Chinese), so
every reply knows its protected spans. `check_corpus()` streams each reply through the
segmenter in random token-sized deltas and counts what went wrong; all counts should be 0.
Run `python -m voxgate.bridge.corpus` to print the report as JSON.
"""

from __future__ import annotations

import json
import random
import re
import string
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from itertools import pairwise
from pathlib import Path

from voxgate.bridge.cuts import (
    CJK_RIGHT,
    CLAUSE,
    IDEOGRAPH,
    SENTENCE,
    SPAN_OPENERS,
    Gap,
    held_until,
    scan,
    speakable,
    width,
)
from voxgate.bridge.segmenter import Segment, Segmenter, SegmenterConfig

REPLIES_FILE = Path(__file__).with_name("replies.jsonl")

_NAMES = ["alice", "bob", "chen", "maria", "li.wei", "support"]
_DOMAINS = ["example.com", "voxgate.dev", "docs.example.org", "mail.cn"]
_EMOJI = ["🎉", "👍🏽", "👨‍👩‍👧‍👦", "❤️", "🏳️‍🌈", "🇨🇳", "👩🏽‍💻", "😀", "1️⃣"]
_TERMS = ["PyTorch 2.1", "iPhone 15 Pro", "GPT-4o", "Qwen3-TTS", "CUDA Graph", "WebSocket", "API", "Wi-Fi"]
_ZH_TERMS = ["语音合成", "数据中心", "模型推理"]


def _number(rng: random.Random) -> str:
    forms = [
        lambda: f"{rng.randint(1, 99)}.{rng.randint(1, 99)}",
        lambda: f"{rng.randint(1, 999)},{rng.randint(0, 999):03d}",
        lambda: f"-{rng.randint(1, 9)}.{rng.randint(0, 9)}e{rng.randint(1, 9)}",
        lambda: "3.14",
        lambda: f"v{rng.randint(1, 9)}.{rng.randint(0, 9)}.{rng.randint(0, 9)}",
    ]
    return rng.choice(forms)()


def _url(rng: random.Random) -> str:
    path = rng.choice(["", "/docs", "/a/b.html", "/search?q=tts&lang=en", "/v1/audio#stream"])
    return rng.choice(["https://", "http://", "www."]) + rng.choice(_DOMAINS) + path


_FILLERS: dict[str, Callable[[random.Random], str]] = {
    "num": _number,
    "date": lambda r: f"{r.randint(2000, 2030)}-{r.randint(1, 12):02d}-{r.randint(1, 28):02d}",
    "time": lambda r: f"{r.randint(0, 23)}:{r.randint(0, 59):02d}",
    "pct": lambda r: r.choice([f"{r.randint(1, 100)}%", f"{r.randint(1, 99)}.5%"]),
    "money": lambda r: f"${r.randint(1, 99999):,}.{r.randint(0, 99):02d}",
    "url": _url,
    "email": lambda r: f"{r.choice(_NAMES)}@{r.choice(_DOMAINS)}",
    "person": lambda r: f"{r.choice(['Mr.', 'Mrs.', 'Ms.', 'Dr.', 'Prof.'])} {r.choice(['Smith', 'Chen', 'Garcia'])}",
    "abbr": lambda r: r.choice(["e.g.", "i.e.", "etc.", "vs.", "U.S.", "a.m.", "p.m."]),
    "code": lambda r: r.choice(["`pip install voxgate`", "`x = 1.5`", "`voxgate serve --port 8000`", "`ls -la`"]),
    "bold": lambda r: r.choice(["**very important**", "**Note:**", "**do not skip this step.**", "**非常重要**"]),
    "link": lambda r: f"[{r.choice(['the docs', 'this page', '文档'])}]({_url(r)})",
    "emoji": lambda r: r.choice(_EMOJI),
    "term": lambda r: r.choice(_TERMS),
}

_EN = [
    "Sure, I can help with that.",
    "Sure! The meeting with {person} is on {date} at {time}.",
    "Okay, so the total comes to {money}, which is about {pct} of the budget.",
    "The value is roughly {num}, {abbr} when you round it to two places.",
    "You can read more at {url} or email {email} if you have questions.",
    "To install it, run {code} and then check the logs {emoji}",
    "This is {bold} because the server restarts at {time} every night.",
    "See {link} for the details, and let me know if anything is unclear.",
    "Well, {person} thinks the numbers look fine; growth was {pct} last quarter.",
    "Hmm... that depends on the version, {abbr} {num} behaves differently.",
    "Great news {emoji} the release shipped on {date}!",
    "In short: use {code}, set the port, and restart the service.",
    "The answer is {num}. Let me explain why in a little more detail for you.",
    "I would suggest checking the configuration file first, then the network settings, "
    "and finally the firewall rules before anything else.",
    "There is no single right answer here but most teams start small and grow the system "
    "step by step as they learn more about their users",
    "Prices went from {money} to {money} — a change of {pct}.",
    'He said "it works on {date}." Then he left.',
    "Yes.",
    "Contact {person} at {email}, or call before {time} {abbr} tomorrow.",
]
_EN_LIST = "Here are the steps:\n{li} the package with {code}.\n{li} the server.\n{li} {link} {emoji}\n"

_ZH = [
    "好的，我来帮你看一下。",
    "嗯。没问题，会议定在{date} {time}，地点在三楼会议室。",
    "价格是{money}，比上个月上涨了{pct}。",
    "圆周率约等于{num}，在计算中经常用到。",
    "详情请访问{url}，或者发邮件到{email}。",
    "我们使用{term}来训练模型，效果提升了{pct}。",
    "运行{code}即可启动服务。",
    "这一点{bold}，请务必注意。",
    "太棒了{emoji}我们成功了！",
    "根据{person}的说法，这个方案是可行的。",
    "我觉得这个问题可以从三个不同的方面来进行深入的理解和分析",
    "首先我们需要安装依赖然后配置环境变量最后启动服务器并检查日志",
    "这个功能叫做{term}，主要用于实时{zh}场景。",
    "你可以参考{link}里的说明。",
    "当然可以！{term}支持多种语言，比如中文、英文、日文等等。",
    "今天天气非常好，我们一起去公园散步然后回家吃饭吧。",
    "好。",
    "结果是{num}，误差在{pct}以内；具体数据见附件。",
]
_ZH_LIST = "步骤如下：\n{li}装依赖\n{li}行{code}\n{li}看{link}\n"


@dataclass(frozen=True, slots=True)
class Reply:
    """One reply and the (start, end) spans no cut may fall strictly inside."""

    text: str
    spans: tuple[tuple[int, int], ...]
    language: str
    id: str = ""


def _is_han(ch: str) -> bool:
    return "\u4e00" <= ch <= "\u9fff"


def _render(template: str, rng: random.Random, zh: bool) -> tuple[str, list[tuple[int, int]]]:
    out, spans, items = "", [], 0
    for literal, field, _, _ in string.Formatter().parse(template):
        out += literal
        if field is None:
            continue
        if field == "li":
            items += 1
            value = f"{items}. " + ("安运查"[items - 1] if zh else rng.choice(["Install", "Start", "Read"]))
        elif field == "zh":
            value = rng.choice(_ZH_TERMS)
        else:
            value = _FILLERS[field](rng)
        spans.append((len(out), len(out) + len(value)))
        out += value
    return out, spans


def _glue_to_chinese(text: str, start: int, end: int) -> tuple[int, int]:
    """Widen a Latin term's span over an adjacent Chinese character (and a space before it)."""
    left = start - 1 if start > 0 and text[start - 1] == " " else start
    if left > 0 and _is_han(text[left - 1]):
        start = left - 1
    right = end + 1 if end < len(text) and text[end] == " " else end
    if right < len(text) and _is_han(text[right]):
        end = right + 1
    return start, end


def make_replies(n_en: int = 100, n_zh: int = 100, seed: int = 0) -> list[Reply]:
    """`n_en` English and `n_zh` Chinese/mixed replies of 1-6 sentences, some with a list."""
    rng = random.Random(seed)
    replies = []
    for language, count in (("en", n_en), ("zh", n_zh)):
        zh = language == "zh"
        templates, listing = (_ZH, _ZH_LIST) if zh else (_EN, _EN_LIST)
        for _ in range(count):
            parts = rng.sample(templates, rng.randint(1, 6))
            if rng.random() < 0.2:
                parts.insert(rng.randint(0, len(parts)), listing)
            text, spans = "", []
            for part in parts:
                sep = "" if zh or not text or text.endswith("\n") else " "
                body, local = _render(part, rng, zh)
                spans += [(len(text) + len(sep) + a, len(text) + len(sep) + b) for a, b in local]
                text += sep + body
            if zh:
                spans = [_glue_to_chinese(text, a, b) for a, b in spans]
            replies.append(Reply(text, tuple(spans), language))
    return replies


def split_reply(text: str, chunk_sizes: Iterable[int]) -> list[str]:
    """Cut `text` into consecutive deltas of the given sizes, cycling through them."""
    sizes = [max(1, s) for s in chunk_sizes] or [1]
    deltas, i, k = [], 0, 0
    while i < len(text):
        deltas.append(text[i : i + sizes[k % len(sizes)]])
        i += sizes[k % len(sizes)]
        k += 1
    return deltas


def segment_stream(deltas: Iterable[str], config: SegmenterConfig | None = None) -> list[Segment]:
    """Push every delta through a fresh segmenter and flush."""
    segmenter = Segmenter(config)
    out = [s for delta in deltas for s in segmenter.push(delta)]
    return out + segmenter.flush()


def load_replies(path: Path = REPLIES_FILE) -> list[Reply]:
    """The written corpus (`replies.jsonl`: 341 replies in en, zh, ja, ko and mixed, written
    apart from the segmenter and its generated corpus): ⟦ ⟧ mark the protected spans."""
    records = (json.loads(line) for line in path.read_text(encoding="utf-8").splitlines())
    return [marked_reply(r["text"], r["lang"], r["id"]) for r in records]


def marked_reply(marked: str, language: str, id: str = "") -> Reply:
    """A reply written with its protected spans between ⟦ and ⟧ ("办理⟦日本单次旅游签证⟧...")."""
    text, spans, open_at = "", [], -1
    for part in re.split("([⟦⟧])", marked):
        if part == "⟦":
            open_at = len(text)
        elif part == "⟧":
            spans.append((open_at, len(text)))
        else:
            text += part
    return Reply(text, tuple(spans), language, id)


STARTER_LAG = CJK_RIGHT  # characters a decision may read past its boundary (the CJK window)


def _over_bounds(text: str, starter: Segment, config: SegmenterConfig) -> bool:
    """A starter past its bound (`starter_max_words` x `starter_max_cjk`) although a boundary
    within the bound would have made a starter (not a fragment). With none, the first
    boundary is the starter: "気象庁によると、" has no word boundary before its comma."""
    full, cost = config.starter_max_words * config.starter_max_cjk, Segmenter(config).starter_cost
    if cost(starter.text) <= full:
        return False
    boundaries, _, _ = scan(text, 0, True, config.max_span_chars, hold=config.max_hold_words)
    return any(
        len(head := text[: c.pos].strip()) >= config.min_chars and speakable(head) and cost(head) <= full
        for c in boundaries
        if c.pos < len(starter.raw)
    )


def _starter_late(text: str, starter: Segment, config: SegmenterConfig, openers: list[str]) -> bool:
    """Whether the starter came out later than the text that decides it: streamed a character
    at a time, it must be out before `STARTER_LAG` characters past the boundary that decides
    it (the first after it that is a clause mark or past the bound: no longer starter fits)
    have arrived; after a span opener, past the words a span's closer may hold a boundary
    (`max_hold_words`), no more."""
    end, full = len(starter.raw), config.starter_max_words * config.starter_max_cjk
    cost = Segmenter(config).starter_cost
    boundaries, _, _ = scan(text, 0, True, config.max_span_chars, hold=config.max_hold_words)
    deciders = (c.pos for c in boundaries if c.pos > end and (c.gap >= Gap.CLAUSE or cost(text[: c.pos]) > full))
    decider = next(deciders, len(text))
    due = decider + STARTER_LAG
    for opener in (k for k in range(decider) if text[k] in SPAN_OPENERS):  # a span's closer may hold it a few words
        due = max(due, held_until(text, opener, decider, config.max_span_chars, config.max_hold_words) + STARTER_LAG)
    segmenter = Segmenter(config, openers)
    for seen, ch in enumerate(text, 1):
        if segmenter.push(ch):
            return seen > due
    return False


def _cached(segment: Segment, phrases: set[str]) -> bool:
    """A starter that is a cached opener ("嗯，"): short by design, its audio is in memory."""
    text = segment.text
    return segment.index == 0 and (text in phrases or (text[:-1] in phrases and text[-1:] in SENTENCE + CLAUSE))


def check_corpus(
    replies: list[Reply] | None = None,
    seed: int = 1,
    config: SegmenterConfig | None = None,
    openers: Iterable[str] = (),
) -> dict:
    """Stream every reply in random 1-4 character deltas and count the failures (all should be
    0): cuts inside protected spans; fragments a listener hears (a mid-reply segment with
    nothing to say, a length cut narrower than 2/3 of `main_min_width`, one or two CJK
    characters cut off before a punctuation mark, a segment under `min_chars`); starters over
    their bounds or late (more than `STARTER_LAG` characters after their end); text lost or
    duplicated; segments that depend on how the text was split. `failures` shows a few."""
    replies = make_replies() if replies is None else replies
    rng = random.Random(seed)
    config = config or SegmenterConfig()
    openers = list(openers)
    phrases = {p.strip() for p in openers}
    counts: Counter[str] = Counter()
    triggers: Counter[str] = Counter()
    failures: list[dict] = []
    for reply in replies:
        deltas = split_reply(reply.text, [rng.randint(1, 4) for _ in range(64)])
        segmenter = Segmenter(config, openers)
        segments = [s for d in deltas for s in segmenter.push(d)] + segmenter.flush()
        counts["segments"] += len(segments)
        triggers.update(s.trigger for s in segments)
        bad: Counter[str] = Counter()
        bad["lost_or_duplicated"] += "".join(s.raw for s in segments) != reply.text
        whole = Segmenter(config, openers)
        bad["split_dependent"] += segments != whole.push(reply.text) + whole.flush()
        cuts, pos = [], 0
        for s in segments[:-1]:
            pos += len(s.raw)
            cuts.append(pos)
        bad["protected_splits"] += sum(a < c < b for c in cuts for a, b in reply.spans)
        middle = segments[:-1]
        bad["unspeakable_segments"] += sum(not s.speakable for s in middle)
        bad["short_segments"] += sum(len(s.text) < config.min_chars and not _cached(s, phrases) for s in middle)
        bad["narrow_length_cuts"] += sum(
            s.trigger == "length" and width(s.text) < config.main_min_width * 2 // 3 for s in middle if s.index > 0
        )
        bad["cjk_orphans"] += sum(
            IDEOGRAPH.match(a.raw[-1:]) is not None and _ORPHAN.match(b.raw) is not None for a, b in pairwise(segments)
        )
        if segments and segments[0].kind == "starter":
            bad["starter_over_bounds"] += _over_bounds(reply.text, segments[0], config)
            bad["starter_late"] += _starter_late(reply.text, segments[0], config, openers)
        counts.update(bad)
        if +bad and len(failures) < 200:
            split = [reply.text[a:b] for c in cuts for a, b in reply.spans if a < c < b]
            failures.append(
                {"id": reply.id, "what": sorted(+bad), "split": split, "segments": [s.text for s in segments]}
            )
    keys = ("protected_splits", "unspeakable_segments", "short_segments", "narrow_length_cuts", "cjk_orphans",
            "starter_over_bounds", "starter_late", "lost_or_duplicated", "split_dependent")  # fmt: skip
    return {
        "replies": len(replies),
        "languages": dict(sorted(Counter(r.language for r in replies).items())),
        "segments": counts["segments"],
        "protected_spans": sum(len(r.spans) for r in replies),
        **{key: counts[key] for key in keys},
        "triggers": dict(sorted(triggers.items())),
        "failures": failures,
    }


_ORPHAN = re.compile(f"[{IDEOGRAPH.pattern[1:-1]}]{{1,2}}[{re.escape(SENTENCE + CLAUSE)}]")


if __name__ == "__main__":
    print(json.dumps(check_corpus(), indent=2))
