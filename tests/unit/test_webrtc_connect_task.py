"""aiortc's connect task, which aiortc does not keep, must not fail unheard (issue 16: a fresh-clone
run under load logged "Task exception was never retrieved" with a traceback when a mutated offer's
call was hung up while aiortc was still connecting it)."""

from __future__ import annotations

import asyncio
import gc
import logging

from aiortc.exceptions import InvalidStateError
from aiortc.rtcicetransport import RTCIceTransport

from tests.integration.test_agent_abuse import OFFER
from voxgate.agent.webrtc import PeerSession


def test_a_connect_that_fails_after_a_hang_up_is_retrieved_and_logged_not_left_to_the_loop(monkeypatch, caplog):
    async def closed(self, remote):  # what aiortc raises when the call was closed under it
        raise InvalidStateError("RTCIceTransport is closed")

    monkeypatch.setattr(RTCIceTransport, "start", closed)

    async def main() -> list[str]:
        unheard: list[str] = []
        asyncio.get_running_loop().set_exception_handler(lambda _, context: unheard.append(context["message"]))
        session, _, _ = await PeerSession.answer(OFFER)
        for _ in range(3000):  # until the connect task has run and failed (30 s: a busy machine)
            if "stopped connecting" in caplog.text:
                break
            await asyncio.sleep(0.01)
        await session.close()
        del session
        gc.collect()
        await asyncio.sleep(0)
        return unheard

    with caplog.at_level(logging.INFO, logger="voxgate.agent.webrtc"):
        assert asyncio.run(main()) == []
    assert "a peer connection stopped connecting: " in caplog.text and "RTCIceTransport is closed" in caplog.text
