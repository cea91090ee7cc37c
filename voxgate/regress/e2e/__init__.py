"""`voxgate regress e2e`: end-to-end voice calls judged by machine, no one listening.

A case (`cases.py`, `cases/cases.json`) is what a user says in one fresh call: Piper-made
speech at a mic's level, with noise at a set SNR or an anomaly injected (`speech.py`,
`inject.py`). `call.py` plays it into the agent over real WebRTC with the `AgentBot`;
`probe.py` cuts what came back into replies by their `reply.start`/`reply.end` events (trace
id; the run adds case id and reply sequence) and classes each capture; `metrics.py` measures
three rings (transport, quality against the agent's own pre-transport capture aligned by
`align.py`, latency); `judge.py` turns them into gates (`gates.toml`, evaluated by
`voxgate.regress.gates`); `runner.py` orchestrates, `report.py` writes the run folder,
`baseline.py` freezes the PRIMARY KPI's reference, `stability.py` suggests thresholds.

One peer, two roles: the seeds ran a user bot and a probe bot in a cloud room. voxgate's
agent is itself the WebRTC peer of a 1:1 call, so there is no room for a second listener:
the bot that speaks is also the probe, and what it receives is the post-transport audio
(Opus, RTP, jitter buffer). Their two-sided ready barrier becomes: the agent's
`call.started` event and the first frame of its track, both before the user speaks. The
pre-transport audio is what the agent enqueued on its track, saved per trace id by the
driver (`VOXGATE_AGENT_CAPTURE_DIR`, in the reply's `finally`).
"""
