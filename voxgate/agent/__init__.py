"""The full-duplex voice agent: VAD, STT, the duplex turn controller and its drivers."""
