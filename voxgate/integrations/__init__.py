"""Voxgate inside the voice frameworks people already use: each module is a client of a running
`voxgate serve` over its WebSocket gateway (`/v1/tts/ws`), installed with its extra
(`pip install 'voxgate[pipecat]'`, `'voxgate[livekit]'`). Nothing here imports the server."""
