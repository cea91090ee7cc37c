"""Checks on a WebRTC offer before a peer connection is made for it (pure: no I/O, no asyncio).

aiortc applies whatever it can parse and trusts the rest. An offer whose BUNDLE group names a
media id that no section has, or whose sections lack or share an `a=mid`, leaves its peer
connection with missing transports: answering it fails, and so does closing it, half way, which
leaks the transports not yet stopped (issue 16: 11 of 400 random mutations of a valid offer got a
500). Such offers are refused here, before any socket is opened, and so are offers large enough to
cost the server many sockets or to aim its connectivity checks at many addresses.
"""

from __future__ import annotations

from aiortc.sdp import SessionDescription

from voxgate.types import InvalidSdp

MAX_MEDIA_SECTIONS = 4  # a call needs two (the mic, the events channel); each one costs a transport
MAX_CANDIDATES = 32  # remote ICE candidates in all: each is a target of the server's checks
MAX_ERROR_CHARS = 200


def check_offer(sdp: str) -> SessionDescription:
    """The parsed offer, or `InvalidSdp` saying what makes it unusable."""
    if not sdp.lstrip().startswith("v=0"):
        raise InvalidSdp("the offer is not SDP (it must start with 'v=0')")
    try:
        description = SessionDescription.parse(sdp)
    except Exception as exc:  # aiortc's parser raises many kinds (asserts included) on hostile input
        raise InvalidSdp(f"the SDP offer could not be parsed: {describe_error(exc)}") from None
    media = description.media
    if not media:
        raise InvalidSdp("the offer has no media section")
    if len(media) > MAX_MEDIA_SECTIONS:
        raise InvalidSdp(f"the offer has {len(media)} media sections; at most {MAX_MEDIA_SECTIONS} are accepted")
    mids = [section.rtp.muxId for section in media]
    if not all(mids) or len(set(mids)) != len(mids):
        raise InvalidSdp("the SDP offer could not be applied: every media section needs its own 'a=mid'")
    for group in description.group:
        unknown = [item for item in group.items if str(item) not in mids]
        if group.semantic == "BUNDLE" and unknown:
            raise InvalidSdp(f"the SDP offer could not be applied: BUNDLE names unknown mids {_short(unknown)}")
    if not all(section.dtls is not None and section.dtls.fingerprints for section in media):
        # aiortc takes such an offer, then fails in a task of its own once ICE has run
        raise InvalidSdp("the SDP offer could not be applied: every media section needs 'a=setup' and 'a=fingerprint'")
    kinds = {section.kind for section in media}
    if "audio" not in kinds:
        raise InvalidSdp("the offer sends no audio: it needs an audio section (sendrecv) for the mic")
    if "application" not in kinds:  # the call's events come on it: without it the caller hears but sees nothing
        raise InvalidSdp("the offer has no data channel: the call needs one named 'events' (an m=application section)")
    candidates = sum(len(section.ice_candidates) for section in media)
    if candidates > MAX_CANDIDATES:
        raise InvalidSdp(f"the offer has {candidates} ICE candidates; at most {MAX_CANDIDATES} are accepted")
    return description


def describe_error(exc: BaseException) -> str:
    """An exception as one short line for an error message (hostile input makes long ones)."""
    return _short(f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__)


def _short(value: object) -> str:
    text = " ".join(str(value).split())
    return text if len(text) <= MAX_ERROR_CHARS else text[: MAX_ERROR_CHARS - 3] + "..."
