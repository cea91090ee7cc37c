"""The agent's call-slot bookkeeping (`CallSlots`), offer checks (`check_offer`) and closing a peer
connection that a hostile offer left half made (`close_peer`): no server, no network."""

from __future__ import annotations

import asyncio

import pytest
from aiortc import RTCConfiguration, RTCPeerConnection, RTCSessionDescription

from tests.integration.test_agent_abuse import HOSTILE, OFFER
from voxgate.agent.sdp import MAX_ERROR_CHARS, check_offer, describe_error
from voxgate.agent.webrtc import close_peer
from voxgate.serving.agent_http import CallSlots
from voxgate.types import Busy, InvalidSdp, TooManyCalls


def test_a_client_at_its_limit_is_told_so_before_the_server_is_busy() -> None:
    slots = CallSlots(max_calls=3)
    slots.take("a", per_client=2)
    slots.take("a", per_client=2)
    with pytest.raises(TooManyCalls):
        slots.take("a", per_client=2)
    slots.take("b", per_client=2)
    with pytest.raises(Busy):
        slots.take("b", per_client=2)
    with pytest.raises(TooManyCalls):  # both limits reached: the client's own is named
        slots.take("a", per_client=2)
    assert (len(slots), slots.held_by("a"), slots.held_by("b")) == (3, 2, 1)


def test_a_slot_given_back_can_be_taken_again_and_never_twice() -> None:
    slots = CallSlots(max_calls=1)
    slots.take("a", per_client=1)
    slots.give_back("a")
    assert len(slots) == 0 and slots.held_by("a") == 0
    with pytest.raises(ValueError):
        slots.give_back("a")
    slots.take("b", per_client=1)
    assert slots.held_by("b") == 1


def test_a_valid_offer_passes_the_checks() -> None:
    description = check_offer(OFFER)
    assert [m.kind for m in description.media] == ["audio", "application"]


@pytest.mark.parametrize(
    "name", [n for n in HOSTILE if n not in ("audio_not_sent", "no_common_codec")]
)  # those two are valid SDP that aiortc refuses cleanly; the HTTP tests cover them
def test_offers_aiortc_would_mishandle_are_refused_before_a_peer_connection_is_made(name: str) -> None:
    with pytest.raises(InvalidSdp):
        check_offer(HOSTILE[name])


def test_an_error_description_is_one_bounded_line() -> None:
    text = describe_error(ValueError("line one\r\nline two " + "x" * 1000))
    assert text.startswith("ValueError: line one line two") and "\n" not in text
    assert len(text) == MAX_ERROR_CHARS and text.endswith("...")
    assert describe_error(AssertionError()) == "AssertionError"


def test_a_peer_connection_left_broken_by_an_offer_is_still_closed_whole() -> None:
    """aiortc applies a BUNDLE group naming an unknown mid (check_offer is bypassed here), then
    fails to answer it, and its own `close` raises half way; `close_peer` stops the rest."""

    async def run() -> None:
        pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))
        await pc.setRemoteDescription(RTCSessionDescription(sdp=HOSTILE["bundle_names_an_unknown_mid"], type="offer"))
        with pytest.raises(AttributeError):  # what made the 500s: nothing in our code saw it coming
            await pc.setLocalDescription(await pc.createAnswer())
        ice = [t.receiver.transport.transport for t in pc.getTransceivers()]
        assert ice and all(t.state != "closed" for t in ice)
        await close_peer(pc)
        assert all(t.state == "closed" for t in ice)
        async with asyncio.timeout(30):  # let anything the close scheduled run to its end
            while asyncio.all_tasks() != {asyncio.current_task()}:
                await asyncio.sleep(0.01)

    asyncio.run(run())
